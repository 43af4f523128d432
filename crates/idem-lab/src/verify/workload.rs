//! What the verifier sends: each intent by a client that retries the way the
//! contract says (the same key, the next URL, `Retry-After` honoured), some as
//! bursts of simultaneous copies, some with their key reused for another
//! amount, some with their key's state read; some captured charges refunded
//! the same way, with refunds that race for what the charge has left; some
//! charges only authorized, then captured in parts and voided the same way,
//! with captures that race for what the authorization has left and a void
//! that races a capture; then, once the faults stop, the unsettled intents
//! again until they settle; then a late replay of each.

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

/// Every how many charges one is refunded once it is captured: few enough
/// that the run takes about as long as the charges alone.
const REFUND_EVERY: usize = 10;
/// Which charge of each [`REFUND_EVERY`]: one that is not a burst (those are
/// `index % 8 == 0`), so that its refunds start as soon as its one client
/// has the `201`.
const REFUNDED: usize = 5;

/// A refunded charge's refunds, in hundredths of its amount, all sent at
/// once: a small one as a burst, and two of 60 % (the second a cent more:
/// see [`refund_amounts`]) by one client each, which together ask for more
/// than the charge. The sum rule decides which of the two is paid; the small
/// one fits beside either, and so do a few copies of it, so that a server
/// that pays a burst's copies each shows it in the ledger even when the
/// acquirer keeps the sum itself.
const SMALL_REFUND: i64 = 5;
const RACED_REFUND: i64 = 60;

/// Every how many charges one is sent with `"capture": false`: an
/// authorization, captured and voided by its step intents once authorized.
const AUTHORIZE_EVERY: usize = 10;
/// Which charge of each [`AUTHORIZE_EVERY`]: neither a burst (those are
/// `index % 8 == 0`) nor a refunded one ([`REFUNDED`]).
const AUTHORIZED: usize = 7;

/// One step of an authorization's plan: a capture of so many hundredths of
/// it (plus `extra` cents), final or not, or its void; sent by one client,
/// or as a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planned {
    Capture {
        percent: i64,
        extra: i64,
        final_capture: bool,
        burst: bool,
    },
    Void {
        burst: bool,
    },
}

/// A capture in an authorization's plan ([`step_plan`]).
const fn capture(percent: i64, extra: i64, final_capture: bool, burst: bool) -> Planned {
    Planned::Capture {
        percent,
        extra,
        final_capture,
        burst,
    }
}

/// What each authorization gets once authorized, by turns. Every capture
/// that is not final, and the void, are sent at once; the final capture once
/// they all settled.
///
/// - The captures race: a small partial capture as a burst, and two of 60 %
///   (the second a cent more), one client each, which together ask for more
///   than the authorization: its sum rule decides which is captured, and the
///   other must be refused `422 capture-exceeds-authorization`. Then a final
///   capture of 10 %, which fits beside either and closes the authorization.
/// - A void races a capture: a partial capture of 30 % and a void (a burst)
///   at once. Whichever the deployment orders first is made; the other waits
///   (`409`) or is refused. Then a final capture of 5 %, after the void: it
///   must be refused (`422 charge-not-authorized`), and nothing captured.
///
/// Every amount of one authorization differs from its others: the ledger's
/// captures, which name no intent, are told apart by their amounts.
fn step_plan(authorization_index: usize) -> &'static [Planned] {
    const CAPTURES_RACE: [Planned; 4] = [
        capture(5, 0, false, true),
        capture(60, 0, false, false),
        capture(60, 1, false, false),
        capture(10, 0, true, false),
    ];
    const VOID_RACES_A_CAPTURE: [Planned; 3] = [
        capture(30, 0, false, false),
        Planned::Void { burst: true },
        capture(5, 0, true, false),
    ];
    if (authorization_index / AUTHORIZE_EVERY).is_multiple_of(2) {
        &CAPTURES_RACE
    } else {
        &VOID_RACES_A_CAPTURE
    }
}

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

/// The run's intents: `count` charges (one in ten an authorization only),
/// then the refund intents of one charge in ten (sent only if it is
/// captured), then the step intents of each authorization (sent only if it
/// is authorized). Keys, order ids and descriptions carry the run's id.
pub fn intents(run: u64, count: usize, duplicates: usize) -> Vec<Intent> {
    let charges: Vec<Intent> = (0..count)
        .map(|index| {
            let order_id = order_base(run) + i64::try_from(index).unwrap_or(0) + 1;
            let amount_cents = 25_000 + i64::try_from(index % 100).unwrap_or(0);
            let authorize = index % AUTHORIZE_EVERY == AUTHORIZED;
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
                body: body(order_id, amount_cents, run, index, authorize),
                refund_of: None,
                authorize,
                capture_of: None,
                void_of: None,
            }
        })
        .collect();
    let refunds: Vec<Intent> = charges
        .iter()
        .filter(|c| c.index % REFUND_EVERY == REFUNDED)
        .flat_map(|charge| {
            refund_amounts(charge.amount_cents)
                .into_iter()
                .enumerate()
                .map(move |(nth, amount)| (charge, nth, amount))
        })
        .enumerate()
        .map(|(i, (charge, nth, amount_cents))| Intent {
            index: count + i,
            kind: if duplicates > 1 && nth == 0 {
                Kind::Burst
            } else {
                Kind::Retried
            },
            key: format!("verify-{run}-{}-refund-{nth}", charge.index),
            order_id: charge.order_id,
            amount_cents,
            body: refund_body(amount_cents, run, charge.index, nth),
            refund_of: Some(charge.index),
            authorize: false,
            capture_of: None,
            void_of: None,
        })
        .collect();
    let first_step = count + refunds.len();
    let steps: Vec<Intent> = charges
        .iter()
        .filter(|c| c.authorize)
        .flat_map(|authorization| {
            step_plan(authorization.index)
                .iter()
                .enumerate()
                .map(move |(nth, planned)| (authorization, nth, *planned))
        })
        .enumerate()
        .map(|(i, (authorization, nth, planned))| {
            step_intent(run, first_step + i, authorization, nth, planned, duplicates)
        })
        .collect();
    charges.into_iter().chain(refunds).chain(steps).collect()
}

/// The `nth` step intent of `authorization`, as `planned`.
fn step_intent(
    run: u64,
    index: usize,
    authorization: &Intent,
    nth: usize,
    planned: Planned,
    duplicates: usize,
) -> Intent {
    let kind = |burst: bool| {
        if duplicates > 1 && burst {
            Kind::Burst
        } else {
            Kind::Retried
        }
    };
    let on = authorization.index;
    let step = Intent {
        index,
        kind: Kind::Retried,
        key: String::new(),
        order_id: authorization.order_id,
        amount_cents: 0,
        body: "{}".to_owned(),
        refund_of: None,
        authorize: false,
        capture_of: None,
        void_of: None,
    };
    match planned {
        Planned::Capture {
            percent,
            extra,
            final_capture,
            burst,
        } => {
            let amount_cents = authorization.amount_cents * percent / 100 + extra;
            Intent {
                kind: kind(burst),
                key: format!("verify-{run}-{on}-capture-{nth}"),
                amount_cents,
                body: serde_json::json!({"amount_cents": amount_cents, "final": final_capture})
                    .to_string(),
                capture_of: Some(on),
                ..step
            }
        }
        Planned::Void { burst } => Intent {
            kind: kind(burst),
            key: format!("verify-{run}-{on}-void-{nth}"),
            void_of: Some(on),
            ..step
        },
    }
}

/// The amounts of a charge's refunds ([`SMALL_REFUND`], [`RACED_REFUND`]):
/// each different, so that the ledger's refunds of its capture, which name
/// no intent, are told apart by their amounts.
fn refund_amounts(charge_cents: i64) -> [i64; 3] {
    let raced = charge_cents * RACED_REFUND / 100;
    [charge_cents * SMALL_REFUND / 100, raced, raced + 1]
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

fn body(order_id: i64, amount_cents: i64, run: u64, index: usize, authorize: bool) -> String {
    let mut body = serde_json::json!({
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "BRL",
        "description": format!("idem verify run {run}, intent {index}"),
    });
    if authorize {
        body["capture"] = false.into();
    }
    body.to_string()
}

fn refund_body(amount_cents: i64, run: u64, charge: usize, nth: usize) -> String {
    serde_json::json!({
        "amount_cents": amount_cents,
        "reason": "requested_by_customer",
        "description": format!("idem verify run {run}, refund {nth} of intent {charge}"),
    })
    .to_string()
}

/// Where a charge intent's requests go.
const CHARGES: &str = "/v1/charges";

/// Where an intent's requests go: a charge's to [`CHARGES`], a refund's or
/// a step's to the charge `charge_id` (`None` until the charge was captured
/// or authorized).
fn path_to(intent: &Intent, charge_id: Option<&str>) -> Option<String> {
    if intent.is_charge() {
        return Some(CHARGES.to_owned());
    }
    let charge_id = charge_id?;
    let what = if intent.is_refund() {
        "refunds"
    } else if intent.is_capture() {
        "captures"
    } else {
        "void"
    };
    Some(format!("/v1/charges/{charge_id}/{what}"))
}

/// Where an intent's requests go; for a refund or a step, `None` until its
/// charge was captured or authorized.
fn path(intent: &Intent, progress: &[Progress]) -> Option<String> {
    let charge_id = match intent.parent() {
        None => None,
        Some(charge) => Some(progress.get(charge)?.charge_id.as_deref()?),
    };
    path_to(intent, charge_id)
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

/// Whether the workload reuses this intent's key (charges only).
pub fn is_reused(intent: &Intent) -> bool {
    intent.is_charge() && intent.index % REUSE_EVERY == 3
}

/// How one client's session with an intent ended.
enum End {
    /// An answer that settles the intent (for a reuse: any answer that is
    /// not "try later").
    Done(Request),
    /// An answer a client must not retry (another `4xx`).
    Refused,
    /// Its patience ran out.
    GaveUp,
}

/// What one session sends, and where.
#[derive(Clone, Copy)]
struct Send<'a> {
    intent: &'a Intent,
    path: &'a str,
    body: &'a str,
    purpose: Purpose,
}

/// Sends `what` until an answer ends it or `deadline` passes: each attempt on
/// the next URL after the last.
async fn session(
    client: &Client,
    what: Send<'_>,
    copy: usize,
    first: usize,
    deadline: Instant,
) -> End {
    let Send {
        intent,
        path,
        body,
        purpose,
    } = what;
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
        let answer = client.post(intent, path, body, turn).await;
        let wait = match answer.status {
            // Try later: the key is in flight, the outcome unknown, the
            // instance busy or its database away (or a bug, which the
            // contract says is safe to retry).
            Some(409 | 429 | 500 | 503 | 504) => retry_after(&answer),
            Some(502) if !intent.is_final(&answer) => None,
            Some(_) if purpose == Purpose::Reuse || intent.is_settled_by(&answer) => {
                return End::Done(answer)
            }
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
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Sent during the workload: every charge, a refund once its charge was
    /// captured, a step once its charge was authorized.
    pub sent: bool,
    /// The URL that gave the answer that settled it, if one did.
    pub settled_on: Option<usize>,
    /// Refused with a `4xx` a client must not retry: sending it again is no use.
    pub refused: bool,
    /// A captured or authorized charge's id, from its `201`: where its
    /// refunds, or its captures and void, go.
    pub charge_id: Option<String>,
}

/// The workload: every charge intent, `concurrency` at a time, each followed
/// by its refund intents once it is captured, or its step intents once it is
/// authorized. `done` counts the charges whose clients have finished. What
/// it learnt, by intent.
pub async fn run<'a>(
    client: &'a Client,
    intents: &'a [Intent],
    concurrency: usize,
    duplicates: usize,
    patience: Duration,
    done: &AtomicUsize,
) -> Vec<Progress> {
    let permits = Semaphore::new(concurrency.max(1));
    let started = &AtomicUsize::new(0);
    let charges = intents.iter().filter(|i| i.is_charge());
    let sessions = charges.map(|charge| {
        let permits = &permits;
        async move {
            let _permit = permits.acquire().await;
            // The first clients arrive over a moment, not in one millisecond.
            let nth = started.fetch_add(1, Ordering::SeqCst);
            if (1..concurrency).contains(&nth) {
                tokio::time::sleep(RAMP_STEP * u32::try_from(nth).unwrap_or(0)).await;
            }
            let progress = send(client, charge, CHARGES, duplicates, patience).await;
            let mut learnt = vec![(charge.index, progress.clone())];
            if let Some(charge_id) = progress.charge_id.as_deref() {
                let then = |intent: &'a Intent| async move {
                    let path = path_to(intent, Some(charge_id)).unwrap_or_default();
                    let progress = send(client, intent, &path, duplicates, patience).await;
                    (intent.index, progress)
                };
                // Its refunds at once; or its steps that race at once, then
                // its final captures once those settled.
                let (last, raced): (Vec<&Intent>, Vec<&Intent>) = intents
                    .iter()
                    .filter(|i| i.parent() == Some(charge.index))
                    .partition(|i| i.is_final_capture());
                learnt.extend(join_all(raced.into_iter().map(then)).await);
                learnt.extend(join_all(last.into_iter().map(then)).await);
            }
            done.fetch_add(1, Ordering::SeqCst);
            learnt
        }
    });
    let mut progress = vec![Progress::default(); intents.len()];
    for (index, learnt) in join_all(sessions).await.into_iter().flatten() {
        progress[index] = learnt;
    }
    progress
}

/// One intent during the workload: sent to `path` by its client, or by a
/// burst's copies at once (each starting on another URL), with its key read
/// while it is sent and after it settled, and reused, for some intents.
async fn send(
    client: &Client,
    intent: &Intent,
    path: &str,
    duplicates: usize,
    patience: Duration,
) -> Progress {
    let deadline = Instant::now() + patience;
    let copies = match intent.kind {
        Kind::Retried => 1,
        Kind::Burst => duplicates,
    };
    let what = Send {
        intent,
        path,
        body: &intent.body,
        purpose: if intent.is_refund() {
            Purpose::Refund
        } else if intent.is_capture() {
            Purpose::Capture
        } else if intent.is_void() {
            Purpose::Void
        } else {
            Purpose::Charge
        },
    };
    let first = intent.index % client.instances();
    let sends = (0..copies).map(|copy| {
        let start = (first + copy) % client.instances();
        session(client, what, copy, start, deadline)
    });
    let read_while_sent = async {
        if intent.index.is_multiple_of(READ_EVERY) {
            read_key(client, intent, first + 1).await;
        }
    };
    let (ends, ()) = tokio::join!(join_all(sends), read_while_sent);
    let progress = progress_of(intent, &ends);
    if let Some(on) = progress.settled_on {
        after_settling(client, intent, path, on).await;
    }
    progress
}

fn progress_of(intent: &Intent, ends: &[End]) -> Progress {
    let mut progress = Progress {
        sent: true,
        ..Progress::default()
    };
    for end in ends {
        match end {
            End::Done(answer) => {
                progress.settled_on = Some(answer.instance);
                if intent.is_charge() && answer.status == Some(201) {
                    progress.charge_id = answer.json_str("id").or(progress.charge_id);
                }
            }
            End::Refused => progress.refused = true,
            End::GaveUp => {}
        }
    }
    progress
}

/// Once an intent settled: its key reused with another amount, and its
/// state read, for some intents.
async fn after_settling(client: &Client, intent: &Intent, path: &str, settled_on: usize) {
    let next = settled_on + 1;
    if is_reused(intent) {
        let other = reuse_body(intent);
        let reuse = Send {
            intent,
            path,
            body: &other,
            purpose: Purpose::Reuse,
        };
        let deadline = Instant::now() + REPLAY_PATIENCE;
        session(client, reuse, 0, next, deadline).await;
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
    let open: Vec<(&Intent, String)> = intents
        .iter()
        .filter(|i| {
            let p = &progress[i.index];
            p.sent && p.settled_on.is_none() && !p.refused
        })
        .filter_map(|i| Some((i, path(i, progress)?)))
        .collect();
    let sessions = open.iter().map(|(intent, path)| {
        let permits = &permits;
        async move {
            let _permit = permits.acquire().await;
            let first = (intent.index + 1) % client.instances();
            let settle = Send {
                intent,
                path,
                body: &intent.body,
                purpose: Purpose::Settle,
            };
            let end = session(client, settle, 0, first, deadline).await;
            (intent.index, end)
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
    let replays = intents.iter().filter_map(|intent| {
        let on = progress[intent.index].settled_on?;
        let path = path(intent, progress)?;
        let permits = &permits;
        Some(async move {
            let _permit = permits.acquire().await;
            let deadline = Instant::now() + REPLAY_PATIENCE;
            let replay = Send {
                intent,
                path: &path,
                body: &intent.body,
                purpose: Purpose::LateReplay,
            };
            session(client, replay, 0, on + 1, deadline).await;
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

    #[test]
    fn one_charge_in_ten_gets_refunds_that_race_for_it() {
        let run = 7;
        let all = intents(run, 20, 5);
        let refunds: Vec<&Intent> = all.iter().filter(|i| i.is_refund()).collect();
        assert_eq!(
            all.len(),
            20 + 6 + 7,
            "three refunds of charges 5 and 15, four steps of 7 and three of 17"
        );
        assert!(all.iter().enumerate().all(|(i, intent)| intent.index == i));
        for refund in &refunds {
            let charge = &all[refund.refund_of.expect("a refund")];
            assert_eq!(refund.order_id, charge.order_id);
            assert!(refund.key.starts_with(&format!("{}-refund-", charge.key)));
            assert!(!is_reused(refund));
        }
        let of_5: Vec<&&Intent> = refunds.iter().filter(|r| r.refund_of == Some(5)).collect();
        let amounts: Vec<i64> = of_5.iter().map(|r| r.amount_cents).collect();
        let charge = all[5].amount_cents;
        assert_eq!(amounts, vec![1250, 15003, 15004], "{charge}");
        assert!(amounts[1] + amounts[2] > charge, "the two big ones race");
        assert!(
            amounts[0] * 5 + amounts[2] <= charge,
            "the burst's copies fit"
        );
        assert_eq!(of_5[0].kind, Kind::Burst);
        assert_eq!(of_5[1].kind, Kind::Retried);
        let body: serde_json::Value = serde_json::from_str(&of_5[1].body).expect("json");
        assert_eq!(body["amount_cents"], 15003);
        assert_eq!(
            path(of_5[1], &[]),
            None,
            "no path until the charge is captured"
        );
        let mut progress = vec![Progress::default(); all.len()];
        progress[5].charge_id = Some("ch_1".to_owned());
        assert_eq!(
            path(of_5[1], &progress).as_deref(),
            Some("/v1/charges/ch_1/refunds")
        );
        assert_eq!(path(&all[5], &progress).as_deref(), Some(CHARGES));
    }

    #[test]
    fn one_charge_in_ten_is_authorized_then_captured_in_parts_or_voided() {
        let run = 7;
        let all = intents(run, 30, 5);
        let authorizations: Vec<usize> = all
            .iter()
            .filter(|i| i.authorize)
            .map(|i| i.index)
            .collect();
        assert_eq!(authorizations, vec![7, 17, 27]);
        assert!(all.iter().enumerate().all(|(i, intent)| intent.index == i));
        let body: serde_json::Value = serde_json::from_str(&all[7].body).expect("json");
        assert_eq!(body["capture"], false);
        let one_step: serde_json::Value = serde_json::from_str(&all[6].body).expect("json");
        assert!(
            one_step.get("capture").is_none(),
            "one-step bodies as before"
        );
        assert!(all[7].is_charge() && !all[7].is_step());
        let steps =
            |a: usize| -> Vec<&Intent> { all.iter().filter(|i| i.step_of() == Some(a)).collect() };
        // 7: the captures race, then a final capture.
        let of_7 = steps(7);
        let amounts: Vec<i64> = of_7.iter().map(|i| i.amount_cents).collect();
        let authorized = all[7].amount_cents;
        assert_eq!(amounts, vec![1250, 15004, 15005, 2500], "{authorized}");
        assert!(
            amounts[1] + amounts[2] > authorized,
            "the two big ones race"
        );
        assert!(
            amounts[0] + amounts[2] + amounts[3] <= authorized,
            "the others fit"
        );
        assert_eq!(
            of_7.iter()
                .map(|i| i.is_final_capture())
                .collect::<Vec<_>>(),
            [false, false, false, true]
        );
        assert_eq!(of_7[0].kind, Kind::Burst);
        assert_eq!(of_7[1].kind, Kind::Retried);
        assert!(of_7
            .iter()
            .all(|i| i.is_capture() && i.order_id == all[7].order_id));
        assert_eq!(of_7[1].key, format!("verify-{run}-7-capture-1"));
        let body: serde_json::Value = serde_json::from_str(&of_7[3].body).expect("json");
        assert_eq!(
            body,
            serde_json::json!({"amount_cents": 2500, "final": true})
        );
        // 17: a void races a capture, then a final capture after it.
        let of_17 = steps(17);
        assert_eq!(
            of_17
                .iter()
                .map(|i| (i.noun(), i.amount_cents))
                .collect::<Vec<_>>(),
            [("capture", 7505), ("void", 0), ("capture", 1250)]
        );
        assert_eq!(of_17[1].kind, Kind::Burst);
        assert_eq!(of_17[1].body, "{}");
        assert!(of_17[2].is_final_capture() && !of_17[0].is_final_capture());
        assert!(all.iter().filter(|i| i.is_step()).all(|i| !is_reused(i)));
        assert_eq!(path(of_17[1], &[]), None, "no path until authorized");
        let mut progress = vec![Progress::default(); all.len()];
        progress[17].charge_id = Some("ch_9".to_owned());
        assert_eq!(
            path(of_17[1], &progress).as_deref(),
            Some("/v1/charges/ch_9/void")
        );
        assert_eq!(
            path(of_17[0], &progress).as_deref(),
            Some("/v1/charges/ch_9/captures")
        );
        // 27: the captures race again.
        assert_eq!(steps(27).len(), 4);
        assert!(intents(run, 7, 5).iter().all(|i| !i.authorize));
    }
}
