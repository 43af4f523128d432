//! What the verifier sends: each intent by a client that retries the way the
//! contract says (the same key, the next URL, `Retry-After` honoured), some as
//! bursts of simultaneous copies, some with their key reused for another
//! amount, some with their key's state read; then, once the faults stop, the
//! unsettled intents again until they settle; then a late replay of each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::Rng;
use tokio::sync::Semaphore;

use super::client::{retry_after, Client, Turn};
use super::history::{Intent, Kind, Purpose, Request};

/// Every how many intents one is a burst of simultaneous copies.
const BURST_EVERY: usize = 8;
/// Every how many intents one has its key reused with another amount once
/// it settled.
const REUSE_EVERY: usize = 7;
/// Every how many intents one has its key's state read while it is sent and
/// after it settled.
const READ_EVERY: usize = 4;

/// The first wait between attempts that got no answer, doubled up to
/// [`MAX_BACKOFF`], with full jitter.
const BASE_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// How long a workload client keeps retrying one intent before it leaves it
/// to the settle phase: a client that gives up, as real ones do.
pub fn workload_patience(client_timeout: Duration) -> Duration {
    (client_timeout * 20).max(Duration::from_secs(10))
}

/// The first `--concurrency` intents start this far apart: a ramp of a
/// third of a second for 32 clients, rather than every client in the same
/// millisecond on instances that may have just started (whose first requests
/// each open a database connection).
const RAMP_STEP: Duration = Duration::from_millis(10);

/// How long the late replay of one settled intent may take.
const REPLAY_PATIENCE: Duration = Duration::from_secs(10);

/// The run's intents: keys, order ids and descriptions carry the run's id.
pub fn intents(run: u64, count: usize, duplicates: usize) -> Vec<Intent> {
    (0..count)
        .map(|index| {
            let order_id = order_base(run) + i64::try_from(index).unwrap_or(0) + 1;
            let amount_cents = 25_000 + i64::try_from(index % 100).unwrap_or(0);
            Intent {
                index,
                kind: if duplicates > 1 && index % BURST_EVERY == 0 {
                    Kind::Burst
                } else {
                    Kind::Retried
                },
                key: format!("verify-{run}-{index}"),
                order_id,
                amount_cents,
                body: body(order_id, amount_cents, run, index),
            }
        })
        .collect()
}

/// The most intents a run may have: they share the run's block of order ids.
pub const MAX_INTENTS: usize = 999_999;

/// The run's order ids are `run * 1,000,000 + 1 ..`: a capture in the ledger
/// is the run's when its order id divided by a million is the run's id.
pub fn order_base(run: u64) -> i64 {
    i64::try_from(run).unwrap_or(0) * 1_000_000
}

/// Whether an order id is one of the run's.
pub fn is_runs(run: u64, order_id: i64) -> bool {
    order_id > order_base(run) && order_id <= order_base(run) + MAX_INTENTS as i64
}

fn body(order_id: i64, amount_cents: i64, run: u64, index: usize) -> String {
    serde_json::json!({
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "BRL",
        "description": format!("idem verify run {run}, intent {index}"),
    })
    .to_string()
}

/// The amount a reuse of the intent's key asks for.
pub fn reused_amount(intent: &Intent) -> i64 {
    intent.amount_cents + 1
}

/// The intent's own body with another amount.
fn reuse_body(intent: &Intent) -> String {
    let mut body: serde_json::Value =
        serde_json::from_str(&intent.body).unwrap_or_else(|_| serde_json::json!({}));
    body["amount_cents"] = reused_amount(intent).into();
    body.to_string()
}

/// Whether the workload reuses this intent's key.
pub fn is_reused(intent: &Intent) -> bool {
    intent.index % REUSE_EVERY == 3
}

/// How one client's session with an intent ended.
enum End {
    /// A final answer (for a reuse: any answer that is not "try later").
    Done(Request),
    /// An answer a client must not retry (another `4xx`).
    Refused,
    /// Its patience ran out.
    GaveUp,
}

/// Sends the intent's `body` until an answer ends it or `deadline` passes:
/// each attempt on the next URL after the last.
async fn session(
    client: &Client,
    intent: &Intent,
    body: &str,
    purpose: Purpose,
    copy: usize,
    first: usize,
    deadline: Instant,
) -> End {
    let mut backoff = BASE_BACKOFF;
    for attempt in 0.. {
        if Instant::now() >= deadline {
            break;
        }
        let turn = Turn {
            purpose,
            copy,
            attempt,
            instance: (first + attempt) % client.instances(),
        };
        let answer = client.charge(intent, body, turn).await;
        let wait = match answer.status {
            // Try later: the key is in flight, the outcome unknown, the
            // instance busy or its database away (or a bug, which the
            // contract says is safe to retry).
            Some(409 | 429 | 500 | 503 | 504) => retry_after(&answer),
            Some(502) if !answer.is_final() => None,
            Some(_) if purpose == Purpose::Reuse || answer.is_final() => return End::Done(answer),
            Some(_) => return End::Refused,
            // No answer: the next URL at once, as a client behind a load
            // balancer would; after a failed connection, a short pause.
            None => None,
        };
        // Full jitter on the backoff; on top of a Retry-After, so that the
        // clients one answer told to wait do not all come back at once.
        let jitter = rand::rng().random_range(Duration::ZERO..=backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
        let wait = wait.map_or(jitter, |asked| asked + jitter);
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(wait.min(left)).await;
    }
    End::GaveUp
}

/// What the workload learnt about one intent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    /// The URL that gave its final answer, if it has one.
    pub settled_on: Option<usize>,
    /// Refused with a `4xx` a client must not retry: sending it again is no use.
    pub refused: bool,
}

/// The workload: every intent, `concurrency` at a time. `done` counts the
/// intents whose clients have finished.
pub async fn run(
    client: &Client,
    intents: &[Intent],
    concurrency: usize,
    duplicates: usize,
    patience: Duration,
    done: &AtomicUsize,
) -> Vec<Progress> {
    let permits = Semaphore::new(concurrency.max(1));
    let started = &AtomicUsize::new(0);
    let sessions = intents.iter().map(|intent| {
        let permits = &permits;
        async move {
            let _permit = permits.acquire().await;
            // The first clients arrive over a moment, not in one millisecond.
            let nth = started.fetch_add(1, Ordering::SeqCst);
            if (1..concurrency).contains(&nth) {
                tokio::time::sleep(RAMP_STEP * u32::try_from(nth).unwrap_or(0)).await;
            }
            let deadline = Instant::now() + patience;
            let copies = match intent.kind {
                Kind::Retried => 1,
                Kind::Burst => duplicates,
            };
            let first = intent.index % client.instances();
            let sends = (0..copies).map(|copy| {
                let start = (first + copy) % client.instances();
                session(
                    client,
                    intent,
                    &intent.body,
                    Purpose::Charge,
                    copy,
                    start,
                    deadline,
                )
            });
            let read_while_sent = async {
                if intent.index % READ_EVERY == 0 {
                    read_key(client, intent, first + 1).await;
                }
            };
            let (ends, ()) = tokio::join!(join_all(sends), read_while_sent);
            let progress = progress_of(&ends);
            if let Some(on) = progress.settled_on {
                after_settling(client, intent, on).await;
            }
            done.fetch_add(1, Ordering::SeqCst);
            progress
        }
    });
    join_all(sessions).await
}

fn progress_of(ends: &[End]) -> Progress {
    let mut progress = Progress::default();
    for end in ends {
        match end {
            End::Done(answer) => progress.settled_on = Some(answer.instance),
            End::Refused => progress.refused = true,
            End::GaveUp => {}
        }
    }
    progress
}

/// Once an intent settled: its key reused with another amount, and its
/// state read, for some intents.
async fn after_settling(client: &Client, intent: &Intent, settled_on: usize) {
    let next = settled_on + 1;
    if is_reused(intent) {
        let other = reuse_body(intent);
        let deadline = Instant::now() + REPLAY_PATIENCE;
        session(client, intent, &other, Purpose::Reuse, 0, next, deadline).await;
    }
    if intent.index % READ_EVERY == 1 {
        read_key(client, intent, next).await;
    }
}

async fn read_key(client: &Client, intent: &Intent, instance: usize) {
    let turn = Turn {
        purpose: Purpose::KeyRead,
        copy: 0,
        attempt: 0,
        instance: instance % client.instances(),
    };
    client.read_key(intent.index, &intent.key, turn).await;
}

/// After the faults stopped: the intents without a final answer, sent again
/// until each settles or `deadline` passes. Returns how many settled.
pub async fn settle(
    client: &Client,
    intents: &[Intent],
    progress: &mut [Progress],
    concurrency: usize,
    deadline: Instant,
) -> usize {
    let permits = Semaphore::new(concurrency.max(1));
    let open: Vec<usize> = (0..intents.len())
        .filter(|&i| progress[i].settled_on.is_none() && !progress[i].refused)
        .collect();
    let sessions = open.iter().map(|&i| {
        let (permits, intent) = (&permits, &intents[i]);
        async move {
            let _permit = permits.acquire().await;
            let first = (intent.index + 1) % client.instances();
            let end = session(
                client,
                intent,
                &intent.body,
                Purpose::Settle,
                0,
                first,
                deadline,
            )
            .await;
            (i, end)
        }
    });
    let mut settled = 0;
    for (i, end) in join_all(sessions).await {
        match end {
            End::Done(answer) => {
                progress[i].settled_on = Some(answer.instance);
                settled += 1;
            }
            End::Refused => progress[i].refused = true,
            End::GaveUp => {}
        }
    }
    settled
}

/// Each settled intent sent once more, on the URL after the one that settled
/// it: a late replay, which must be answered with the same bytes.
pub async fn replay(
    client: &Client,
    intents: &[Intent],
    progress: &[Progress],
    concurrency: usize,
) -> usize {
    let permits = Semaphore::new(concurrency.max(1));
    let replays = intents.iter().zip(progress).filter_map(|(intent, p)| {
        let on = p.settled_on?;
        let permits = &permits;
        Some(async move {
            let _permit = permits.acquire().await;
            let deadline = Instant::now() + REPLAY_PATIENCE;
            session(
                client,
                intent,
                &intent.body,
                Purpose::LateReplay,
                0,
                on + 1,
                deadline,
            )
            .await;
        })
    });
    join_all(replays).await.len()
}

/// A run's id: random, and small enough that its block of order ids fits an
/// `i64`.
pub fn new_run_id() -> u64 {
    rand::rng().random_range(1..9_000_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_order_ids_are_its_own() {
        let run = 8_999_999_999_999;
        let all = intents(run, 3, 5);
        assert!(all.iter().all(|i| is_runs(run, i.order_id)));
        assert!(!is_runs(run + 1, all[0].order_id));
        assert!(!is_runs(run, order_base(run)));
        let reused: serde_json::Value = serde_json::from_str(&reuse_body(&all[2])).expect("json");
        assert_eq!(reused["amount_cents"], all[2].amount_cents + 1);
        assert_eq!(reused["order_id"], all[2].order_id);
        assert_eq!(all[0].kind, Kind::Burst);
        assert_eq!(all[1].kind, Kind::Retried);
        let body: serde_json::Value = serde_json::from_str(&all[1].body).expect("json");
        assert_eq!(body["order_id"], all[1].order_id);
        assert!(body["description"]
            .as_str()
            .is_some_and(|d| d.contains(&run.to_string())));
        assert!(intents(run, 9, 1).iter().all(|i| i.kind == Kind::Retried));
    }
}
