//! The promise as seven invariants, judged on the history and the ledger
//! alone: pure functions, no network. Each names the intents that break it.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::history::{History, Intent, Purpose, Request};
use super::workload::{is_reused, reused_amount};
use crate::sim::LedgerCapture;
use crate::timeline::instance_name;

/// The statuses the contract names for `POST /v1/charges`.
const CHARGE_STATUSES: [u16; 12] = [201, 400, 401, 402, 409, 410, 413, 415, 422, 502, 503, 504];
/// ... and for `GET /v1/idempotency-keys/{key}`.
const KEY_READ_STATUSES: [u16; 5] = [200, 400, 401, 404, 503];

/// The names, in the order they are reported.
pub const NAMES: [&str; 7] = [
    "one-capture-per-intent",
    "answers-agree-with-ledger",
    "replays-identical",
    "reuse-is-422",
    "contract-statuses",
    "settles",
    "in-flight-is-fast",
];

/// One intent that breaks an invariant, and how.
#[derive(Debug, Clone, Serialize)]
pub struct Counterexample {
    pub intent: usize,
    pub why: String,
}

/// An invariant's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub name: &'static str,
    pub holds: bool,
    /// What was checked, in figures.
    pub detail: String,
    /// Every intent that breaks it (empty when it holds).
    pub counterexamples: Vec<Counterexample>,
}

/// What the judges read.
pub struct Evidence<'a> {
    pub history: &'a History,
    /// The run's captures from the ledger.
    pub captures: &'a [LedgerCapture],
    /// The `409` answers' p99 must be under this.
    pub in_flight_p99: Duration,
}

impl Evidence<'_> {
    fn captures_of(&self) -> HashMap<i64, Vec<&LedgerCapture>> {
        let mut by_order: HashMap<i64, Vec<&LedgerCapture>> = HashMap::new();
        for c in self.captures {
            by_order.entry(c.order_id).or_default().push(c);
        }
        by_order
    }

    fn requests_by_intent(&self) -> Vec<Vec<&Request>> {
        let mut by_intent = vec![Vec::new(); self.history.intents.len()];
        for r in &self.history.requests {
            if let Some(list) = by_intent.get_mut(r.intent) {
                list.push(r);
            }
        }
        for list in &mut by_intent {
            list.sort_by(|a: &&Request, b: &&Request| a.sent_ms.total_cmp(&b.sent_ms));
        }
        by_intent
    }
}

/// One invariant judged on one intent: its requests in the order sent, its
/// captures; why it breaks, if it does.
type Judge = dyn Fn(&Intent, &[&Request], &[&LedgerCapture]) -> Option<String>;

/// Every invariant's verdict, in [`NAMES`]' order.
pub fn judge(evidence: &Evidence) -> Vec<Verdict> {
    let captures = evidence.captures_of();
    let requests = evidence.requests_by_intent();
    let intents = &evidence.history.intents;
    let none = Vec::new();
    let per_intent = |check: &Judge| {
        intents
            .iter()
            .filter_map(|intent| {
                let mine = captures.get(&intent.order_id).unwrap_or(&none);
                check(intent, &requests[intent.index], mine).map(|why| Counterexample {
                    intent: intent.index,
                    why,
                })
            })
            .collect::<Vec<_>>()
    };
    let answered = evidence
        .history
        .requests
        .iter()
        .filter(|r| r.status.is_some())
        .count();
    let reused = intents.iter().filter(|i| is_reused(i)).count();
    let (p99, conflicts) = conflict_p99(&evidence.history.requests);
    let p99_limit = evidence.in_flight_p99.as_secs_f64() * 1000.0;
    let slow_conflicts: Vec<Counterexample> = if p99 < p99_limit {
        Vec::new()
    } else {
        slowest_conflicts(&requests, p99_limit)
    };
    let verdicts = [
        (
            per_intent(&one_capture),
            format!(
                "{} intents, {} captures in the ledger",
                intents.len(),
                evidence.captures.len()
            ),
        ),
        (
            per_intent(&answers_agree),
            format!("{answered} answers against the ledger"),
        ),
        (per_intent(&replays_identical), replay_detail(&requests)),
        (
            per_intent(&reuse_is_422),
            format!("{reused} keys reused with another amount"),
        ),
        (
            per_intent(&contract_statuses),
            format!("{answered} answers, none a 500"),
        ),
        (per_intent(&settles), format!("{} intents", intents.len())),
        (
            slow_conflicts,
            format!("409 p99 {p99:.1} ms over {conflicts} answers (limit {p99_limit:.0} ms)"),
        ),
    ];
    NAMES
        .iter()
        .zip(verdicts)
        .map(|(name, (counterexamples, detail))| Verdict {
            name,
            holds: counterexamples.is_empty(),
            detail,
            counterexamples,
        })
        .collect()
}

fn one_capture(_: &Intent, _: &[&Request], captures: &[&LedgerCapture]) -> Option<String> {
    (captures.len() > 1).then(|| {
        let refs: Vec<&str> = captures.iter().map(|c| c.reference.as_str()).collect();
        format!(
            "captured {} times (references {})",
            captures.len(),
            refs.join(", ")
        )
    })
}

fn answers_agree(_: &Intent, requests: &[&Request], captures: &[&LedgerCapture]) -> Option<String> {
    for r in requests {
        let said = match (r.purpose, r.status) {
            (p, Some(s)) if p.is_the_charge() => Some(s),
            (Purpose::KeyRead, Some(200)) => completed_status(r),
            _ => None,
        };
        let what = describe(r);
        match said {
            Some(201) if captures.is_empty() => {
                return Some(format!("{what} said captured; the ledger has no capture"))
            }
            Some(201) => {
                if let Some(reference) = json_field(r, "acquirer_reference") {
                    if !captures.iter().any(|c| c.reference == reference) {
                        return Some(format!(
                            "{what} names reference {reference}; the ledger's capture has {}",
                            captures[0].reference
                        ));
                    }
                }
            }
            Some(402) if !captures.is_empty() => {
                return Some(format!(
                    "{what} said declined; the ledger has {} capture(s)",
                    captures.len()
                ))
            }
            _ => {}
        }
    }
    None
}

/// The stored status a key read reports for a completed key.
fn completed_status(r: &Request) -> Option<u16> {
    let body: serde_json::Value = serde_json::from_str(r.body.as_deref()?).ok()?;
    if body.get("state")?.as_str()? != "completed" {
        return None;
    }
    u16::try_from(body.get("status")?.as_u64()?).ok()
}

fn json_field(r: &Request, field: &str) -> Option<String> {
    let body: serde_json::Value = serde_json::from_str(r.body.as_deref()?).ok()?;
    body.get(field)?.as_str().map(str::to_owned)
}

/// The intent's first final answer to arrive.
fn first_final<'a>(requests: &[&'a Request]) -> Option<&'a Request> {
    requests
        .iter()
        .copied()
        .filter(|r| r.purpose.is_the_charge() && r.is_final())
        .min_by(|a, b| a.received_ms.total_cmp(&b.received_ms))
}

/// Every final answer is the first's, and so is every answer to a request
/// sent after the first arrived, but the contract's "try later" answers
/// (`409`, `503`): they state no outcome, and a client that follows their
/// `Retry-After` is answered with the stored one. (idem's in-flight memo may
/// answer `409` for up to a second after another instance finished: the
/// detail line counts those.)
fn replays_identical(_: &Intent, requests: &[&Request], _: &[&LedgerCapture]) -> Option<String> {
    let first = first_final(requests)?;
    requests
        .iter()
        .filter(|r| r.purpose.is_the_charge() && r.status.is_some())
        .filter(|r| r.is_final() || (r.sent_ms > first.received_ms && !is_try_later(r)))
        .find(|r| r.status != first.status || r.body_sha256 != first.body_sha256)
        .map(|r| {
            format!(
                "{} answered {} with other bytes than the first answer, {} at {:.1} ms",
                describe(r),
                r.outcome(),
                first.outcome(),
                first.received_ms
            )
        })
}

/// `409` and `503`: try later, the outcome (if any) unchanged.
fn is_try_later(r: &Request) -> bool {
    matches!(r.status, Some(409 | 503))
}

/// How many answers came to settled intents, and how many of them were a
/// `409` (and how late the latest was, after the outcome was first seen).
fn replay_detail(requests: &[Vec<&Request>]) -> String {
    let (mut later, mut stale, mut stalest) = (0, 0, 0.0_f64);
    for rs in requests {
        let Some(first) = first_final(rs) else {
            continue;
        };
        for r in rs.iter().filter(|r| {
            r.purpose.is_the_charge() && r.status.is_some() && r.sent_ms > first.received_ms
        }) {
            later += 1;
            if r.status == Some(409) {
                stale += 1;
                stalest = stalest.max(r.sent_ms - first.received_ms);
            }
        }
    }
    let stale = if stale == 0 {
        String::new()
    } else {
        let were = if stale == 1 { "was" } else { "were" };
        format!(" ({stale} {were} a 409 sent after the outcome was seen, the latest {stalest:.0} ms after)")
    };
    format!("{later} answers to settled intents{stale}")
}

fn reuse_is_422(
    intent: &Intent,
    requests: &[&Request],
    captures: &[&LedgerCapture],
) -> Option<String> {
    if !is_reused(intent) {
        return None;
    }
    let other = reused_amount(intent);
    if let Some(c) = captures.iter().find(|c| c.amount_cents == other) {
        return Some(format!(
            "the reuse with amount {other} was captured ({})",
            c.reference
        ));
    }
    let reuses: Vec<&&Request> = requests
        .iter()
        .filter(|r| r.purpose == Purpose::Reuse)
        .collect();
    if let Some(r) = reuses
        .iter()
        .find(|r| r.status.is_some_and(|s| s != 422 && s != 503 && s != 409))
    {
        return Some(format!("{} answered {}, not 422", describe(r), r.outcome()));
    }
    let settled = first_final(requests).is_some();
    (settled && !reuses.iter().any(|r| r.status == Some(422)))
        .then(|| "the reuse of its key was never answered 422".to_owned())
}

fn contract_statuses(_: &Intent, requests: &[&Request], _: &[&LedgerCapture]) -> Option<String> {
    requests.iter().find_map(|r| {
        let status = r.status?;
        let named: &[u16] = if r.purpose == Purpose::KeyRead {
            &KEY_READ_STATUSES
        } else {
            &CHARGE_STATUSES
        };
        (!named.contains(&status)).then(|| {
            let kind = if status == 500 {
                "a 500: a bug, by the contract's own words"
            } else {
                "a status the contract does not name"
            };
            format!("{} answered {status}, {kind}", describe(r))
        })
    })
}

fn settles(_: &Intent, requests: &[&Request], _: &[&LedgerCapture]) -> Option<String> {
    if first_final(requests).is_some() {
        return None;
    }
    let last = requests
        .iter()
        .filter(|r| r.purpose.is_the_charge())
        .max_by(|a, b| a.received_ms.total_cmp(&b.received_ms));
    Some(match last {
        Some(r) => format!(
            "never answered 201 or 402; {} requests, the last {} answered {}",
            requests
                .iter()
                .filter(|r| r.purpose.is_the_charge())
                .count(),
            describe(r),
            r.outcome()
        ),
        None => "never sent".to_owned(),
    })
}

/// The `409` answers' p99 latency in ms, and how many there were.
fn conflict_p99(requests: &[Request]) -> (f64, usize) {
    let mut latencies: Vec<f64> = requests
        .iter()
        .filter(|r| r.status == Some(409))
        .map(Request::latency_ms)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len();
    if n == 0 {
        return (0.0, 0);
    }
    let rank = ((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1;
    (latencies[rank], n)
}

/// The intents whose `409`s took `limit_ms` or more, slowest first.
fn slowest_conflicts(requests: &[Vec<&Request>], limit_ms: f64) -> Vec<Counterexample> {
    let mut slow: Vec<(f64, Counterexample)> = requests
        .iter()
        .filter_map(|rs| {
            let worst = rs
                .iter()
                .filter(|r| r.status == Some(409))
                .max_by(|a, b| a.latency_ms().total_cmp(&b.latency_ms()))?;
            let ms = worst.latency_ms();
            (ms >= limit_ms).then(|| {
                (
                    ms,
                    Counterexample {
                        intent: worst.intent,
                        why: format!("{} took {ms:.1} ms to answer 409", describe(worst)),
                    },
                )
            })
        })
        .collect();
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    slow.into_iter().map(|(_, c)| c).collect()
}

/// A request in a few words: what it was, which attempt, where, when.
pub fn describe(r: &Request) -> String {
    format!("{} at {:.1} ms", what(r), r.sent_ms)
}

/// What a request was and where it went: `copy 2 attempt 3 to B`.
pub fn what(r: &Request) -> String {
    let what = match r.purpose {
        Purpose::Charge if r.copy > 0 => format!("copy {} attempt {}", r.copy + 1, r.attempt + 1),
        Purpose::Charge => format!("attempt {}", r.attempt + 1),
        Purpose::Settle => format!("settling attempt {}", r.attempt + 1),
        Purpose::LateReplay => "the late replay".to_owned(),
        Purpose::Reuse => "the reuse with another amount".to_owned(),
        Purpose::KeyRead => "a key read".to_owned(),
    };
    format!("{what} to {}", instance_name(r.instance))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::history::{digest, Kind};

    fn intent(index: usize) -> Intent {
        Intent {
            index,
            kind: Kind::Retried,
            key: format!("k{index}"),
            order_id: 100 + index as i64,
            amount_cents: 500,
            body: "{}".to_owned(),
        }
    }

    fn answer(intent: usize, purpose: Purpose, sent: f64, status: u16, body: &str) -> Request {
        Request {
            intent,
            purpose,
            copy: 0,
            attempt: 0,
            instance: 0,
            sent_ms: sent,
            received_ms: sent + 2.0,
            status: Some(status),
            error: None,
            body_sha256: Some(digest(body.as_bytes())),
            body: Some(body.to_owned()),
            headers: Default::default(),
        }
    }

    fn capture(order_id: i64, reference: &str, amount_cents: i64) -> LedgerCapture {
        LedgerCapture {
            traceparent: None,
            capture_id: format!("cap_{reference}"),
            reference: reference.to_owned(),
            merchant: "m".to_owned(),
            order_id,
            amount_cents,
            currency: "BRL".to_owned(),
            at_micros: 0,
        }
    }

    const CHARGE: &str = r#"{"id":"ch_1","acquirer_reference":"r1"}"#;

    /// The verdicts of a history of intent 0 (and 3, reused), by name.
    fn judged(
        requests: Vec<Request>,
        captures: Vec<LedgerCapture>,
    ) -> HashMap<&'static str, Verdict> {
        let history = History {
            run: "t".to_owned(),
            intents: (0..4).map(intent).collect(),
            requests,
            faults: Vec::new(),
        };
        let evidence = Evidence {
            history: &history,
            captures: &captures,
            in_flight_p99: Duration::from_millis(100),
        };
        judge(&evidence).into_iter().map(|v| (v.name, v)).collect()
    }

    /// A run where every intent settles once, with a replay, and 3's reuse is 422.
    fn healthy() -> (Vec<Request>, Vec<LedgerCapture>) {
        let mut requests = Vec::new();
        let mut captures = Vec::new();
        for i in 0..4 {
            let body = CHARGE.replace("r1", &format!("r{i}"));
            requests.push(answer(i, Purpose::Charge, 0.0, 201, &body));
            requests.push(answer(i, Purpose::LateReplay, 50.0, 201, &body));
            captures.push(capture(100 + i as i64, &format!("r{i}"), 500));
        }
        requests.push(answer(3, Purpose::Reuse, 10.0, 422, "{}"));
        (requests, captures)
    }

    fn broken(verdicts: &HashMap<&'static str, Verdict>) -> Vec<&'static str> {
        let mut names: Vec<_> = verdicts
            .values()
            .filter(|v| !v.holds)
            .map(|v| v.name)
            .collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn a_healthy_history_holds_every_invariant() {
        let (requests, captures) = healthy();
        assert_eq!(broken(&judged(requests, captures)), Vec::<&str>::new());
    }

    /// A change to a healthy history that breaks one invariant.
    type Mutation = dyn Fn(&mut Vec<Request>, &mut Vec<LedgerCapture>);

    #[test]
    fn each_break_is_named_alone() {
        let cases: Vec<(&str, Box<Mutation>)> = vec![
            (
                "one-capture-per-intent",
                Box::new(|_, c| c.push(capture(101, "r9", 500))),
            ),
            (
                "answers-agree-with-ledger",
                Box::new(|_, c| c.retain(|c| c.order_id != 102)),
            ),
            (
                "replays-identical",
                Box::new(|r, _| r[1].body_sha256 = Some(digest(b"other"))),
            ),
            (
                "reuse-is-422",
                Box::new(|r, _| r.last_mut().unwrap().status = Some(201)),
            ),
            (
                "contract-statuses",
                Box::new(|r, _| r.push(answer(1, Purpose::Charge, 0.5, 500, "{}"))),
            ),
            (
                "settles",
                Box::new(|r, c| {
                    r.retain(|r| r.intent != 2);
                    r.push(answer(2, Purpose::Charge, 0.0, 409, "{}"));
                    c.retain(|c| c.order_id != 102);
                }),
            ),
            (
                "in-flight-is-fast",
                Box::new(|r, _| {
                    let mut slow = answer(1, Purpose::Charge, 0.5, 409, "{}");
                    slow.received_ms = 150.0;
                    r.push(slow);
                }),
            ),
        ];
        for (name, mutate) in cases {
            let (mut requests, mut captures) = healthy();
            mutate(&mut requests, &mut captures);
            let verdicts = judged(requests, captures);
            assert_eq!(broken(&verdicts), vec![name], "{verdicts:#?}");
            assert!(!verdicts[name].counterexamples.is_empty());
        }
    }

    #[test]
    fn an_answer_in_flight_when_the_first_arrived_is_not_a_replay() {
        let (mut requests, captures) = healthy();
        // Sent before the first 201 arrived, answered 409 after it: a burst's copy.
        let mut late_409 = answer(0, Purpose::Charge, 1.0, 409, "{}");
        late_409.received_ms = 3.0;
        requests.push(late_409);
        // A 503 after it settled: the contract's "try later", not a changed
        // answer; so is a 409 from a memory that has not heard yet.
        requests.push(answer(0, Purpose::LateReplay, 60.0, 503, "{}"));
        requests.push(answer(0, Purpose::Settle, 70.0, 409, "{}"));
        let verdicts = judged(requests, captures);
        assert_eq!(broken(&verdicts), Vec::<&str>::new());
        assert!(
            verdicts["replays-identical"]
                .detail
                .contains("1 was a 409 sent after the outcome was seen, the latest 68 ms after"),
            "{}",
            verdicts["replays-identical"].detail
        );
    }

    #[test]
    fn a_decline_with_a_capture_disagrees() {
        let (mut requests, captures) = healthy();
        requests[0] = answer(0, Purpose::Charge, 0.0, 402, "{}");
        requests[1] = answer(0, Purpose::LateReplay, 50.0, 402, "{}");
        let verdicts = judged(requests, captures);
        assert_eq!(broken(&verdicts), vec!["answers-agree-with-ledger"]);
    }
}
