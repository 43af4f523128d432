//! The promise as nine invariants, judged on the history and the ledger
//! alone: pure functions, no network. Each names the intents that break it.
//!
//! The ledger's refunds name no intent: a refund is the run's when it pays
//! back from one of the run's captures, and a refund intent's when it is of
//! its charge's capture and its amount (the workload gives each refund of a
//! charge another amount).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::history::{History, Intent, Purpose, Request};
use super::workload::{is_reused, reused_amount};
use crate::sim::{LedgerCapture, LedgerRefund};
use crate::timeline::instance_name;

/// The statuses the contract names for `POST /v1/charges`.
const CHARGE_STATUSES: [u16; 12] = [201, 400, 401, 402, 409, 410, 413, 415, 422, 502, 503, 504];
/// ... for `POST /v1/charges/{id}/refunds`.
const REFUND_STATUSES: [u16; 11] = [201, 400, 401, 404, 409, 410, 413, 415, 422, 503, 504];
/// ... and for `GET /v1/idempotency-keys/{key}`.
const KEY_READ_STATUSES: [u16; 5] = [200, 400, 401, 404, 503];

/// The names, in the order they are reported.
pub const NAMES: [&str; 9] = [
    "one-capture-per-intent",
    "one-refund-per-refund-intent",
    "refunds-within-capture",
    "answers-agree-with-ledger",
    "replays-identical",
    "reuse-is-422",
    "contract-statuses",
    "settles",
    "in-flight-is-fast",
];

/// The invariants whose counterexample is told by a charge's refund intents
/// (its own requests are only the start of the story).
pub const ABOUT_REFUNDS: [&str; 2] = ["one-refund-per-refund-intent", "refunds-within-capture"];

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
    /// The ledger's refunds of those captures.
    pub refunds: &'a [LedgerRefund],
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

    /// The refunds by the order of the capture they pay back from.
    fn refunds_of(&self) -> HashMap<i64, Vec<&LedgerRefund>> {
        let order_of: HashMap<&str, i64> = self
            .captures
            .iter()
            .map(|c| (c.reference.as_str(), c.order_id))
            .collect();
        let mut by_order: HashMap<i64, Vec<&LedgerRefund>> = HashMap::new();
        for r in self.refunds {
            if let Some(order) = order_of.get(r.capture_reference.as_str()) {
                by_order.entry(*order).or_default().push(r);
            }
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

/// What one intent is judged on.
struct Case<'a> {
    intent: &'a Intent,
    /// Its requests, in the order they were sent.
    requests: &'a [&'a Request],
    /// The ledger's captures of its order (a refund's: of the charge it refunds).
    captures: &'a [&'a LedgerCapture],
    /// A charge's: every refund the ledger paid back from its captures. A
    /// refund intent's: those of them that are its own (of its amount).
    refunds: Vec<&'a LedgerRefund>,
    /// A charge's refund intents, each with its requests (none for a refund).
    refund_intents: Vec<(&'a Intent, &'a [&'a Request])>,
}

impl Case<'_> {
    /// Whether this is a refund intent that was never sent: its charge was
    /// not captured during the workload, and nothing is asked of it.
    fn is_unsent_refund(&self) -> bool {
        self.intent.is_refund() && self.requests.is_empty()
    }
}

/// One invariant judged on one intent: why it breaks, if it does.
type Judge = dyn Fn(&Case) -> Option<String>;

/// Every invariant's verdict, in [`NAMES`]' order.
pub fn judge(evidence: &Evidence) -> Vec<Verdict> {
    let captures = evidence.captures_of();
    let refunds = evidence.refunds_of();
    let requests = evidence.requests_by_intent();
    let intents = &evidence.history.intents;
    let (no_captures, no_refunds) = (Vec::new(), Vec::new());
    let cases: Vec<Case> = intents
        .iter()
        .map(|intent| {
            let of_order = refunds.get(&intent.order_id).unwrap_or(&no_refunds);
            Case {
                intent,
                requests: &requests[intent.index],
                captures: captures.get(&intent.order_id).unwrap_or(&no_captures),
                refunds: of_order
                    .iter()
                    .copied()
                    .filter(|r| !intent.is_refund() || r.amount_cents == intent.amount_cents)
                    .collect(),
                refund_intents: evidence
                    .history
                    .refunds_of(intent.index)
                    .filter(|_| !intent.is_refund())
                    .map(|r| (r, requests[r.index].as_slice()))
                    .collect(),
            }
        })
        .collect();
    let per_intent = |check: &Judge| {
        cases
            .iter()
            .filter_map(|case| {
                check(case).map(|why| Counterexample {
                    intent: case.intent.index,
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
    let charges = intents.iter().filter(|i| !i.is_refund()).count();
    let refunds_sent = cases
        .iter()
        .filter(|c| c.intent.is_refund() && !c.requests.is_empty())
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
                "{charges} intents, {} captures in the ledger",
                evidence.captures.len()
            ),
        ),
        (
            per_intent(&one_refund),
            format!(
                "{refunds_sent} refund intents sent, {} refunds in the ledger",
                evidence.refunds.len()
            ),
        ),
        (per_intent(&refunds_within_capture), sums_detail(&cases)),
        (
            per_intent(&answers_agree),
            format!("{answered} answers against the ledger"),
        ),
        (per_intent(&replays_identical), replay_detail(&cases)),
        (
            per_intent(&reuse_is_422),
            format!("{reused} keys reused with another amount"),
        ),
        (
            per_intent(&contract_statuses),
            format!("{answered} answers, none a 500"),
        ),
        (
            per_intent(&settles),
            format!("{charges} intents, {refunds_sent} refund intents"),
        ),
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

fn one_capture(case: &Case) -> Option<String> {
    let captures = case.captures;
    (!case.intent.is_refund() && captures.len() > 1).then(|| {
        let refs: Vec<&str> = captures.iter().map(|c| c.reference.as_str()).collect();
        format!(
            "captured {} times (references {})",
            captures.len(),
            refs.join(", ")
        )
    })
}

/// A refund intent has at most one refund in the ledger, and one when it
/// was answered `201`; a charge has no refund that none of its refund
/// intents asked for.
fn one_refund(case: &Case) -> Option<String> {
    if !case.intent.is_refund() {
        return stray_refund(case);
    }
    let refunds = &case.refunds;
    let amount = case.intent.amount_cents;
    if refunds.len() > 1 {
        let refs: Vec<&str> = refunds.iter().map(|r| r.reference.as_str()).collect();
        return Some(format!(
            "refunded {} times (references {})",
            refunds.len(),
            refs.join(", ")
        ));
    }
    if case.is_unsent_refund() {
        return refunds.first().map(|r| {
            format!(
                "never sent, yet the ledger paid back its {amount} cents ({})",
                r.reference
            )
        });
    }
    if !refunds.is_empty() {
        return None;
    }
    let created = case
        .requests
        .iter()
        .find(|r| outcome_said(case.intent, r) == Some(201))?;
    Some(format!(
        "{} said refunded; the ledger has no refund of {amount} cents from its charge's capture",
        describe(created)
    ))
}

/// A refund of the charge's capture whose amount none of its refund intents
/// asked for.
fn stray_refund(case: &Case) -> Option<String> {
    let asked: Vec<i64> = case
        .refund_intents
        .iter()
        .map(|(r, _)| r.amount_cents)
        .collect();
    let stray = case
        .refunds
        .iter()
        .find(|r| !asked.contains(&r.amount_cents))?;
    Some(format!(
        "the ledger paid back {} cents from its capture ({}, reference {}), which no refund intent asked for",
        stray.amount_cents, stray.refund_id, stray.reference
    ))
}

/// A charge's refunds answered `201` (each refund id once) sum to no more
/// than the charge, and the ledger's refunds of each of its captures to no
/// more than that capture.
fn refunds_within_capture(case: &Case) -> Option<String> {
    if case.intent.is_refund() {
        return None;
    }
    let mut past = Vec::new();
    let answered = answered_refunds(case);
    let total: i64 = answered.iter().map(|(_, cents)| cents).sum();
    if total > case.intent.amount_cents {
        past.push(format!(
            "its refunds answered 201 sum to {total} cents ({}), more than the charge's {}",
            listed(answered.iter().map(|(id, cents)| (id.as_str(), *cents))),
            case.intent.amount_cents
        ));
    }
    for capture in case.captures {
        let paid: Vec<&&LedgerRefund> = case
            .refunds
            .iter()
            .filter(|r| r.capture_reference == capture.reference)
            .collect();
        let total: i64 = paid.iter().map(|r| r.amount_cents).sum();
        if total > capture.amount_cents {
            past.push(format!(
                "the ledger paid back {total} cents from {} ({}), more than its {}",
                capture.capture_id,
                listed(paid.iter().map(|r| (r.refund_id.as_str(), r.amount_cents))),
                capture.amount_cents
            ));
        }
    }
    (!past.is_empty()).then(|| past.join("; "))
}

/// The refunds a charge's refund intents were answered `201` with: each
/// refund id once (the first answer's amount), in the intents' order.
fn answered_refunds(case: &Case) -> Vec<(String, i64)> {
    let mut answered: Vec<(String, i64)> = Vec::new();
    for (refund, requests) in &case.refund_intents {
        for r in requests
            .iter()
            .filter(|r| r.purpose.sends_the_intent() && r.status == Some(201))
        {
            let id = r.json_str("id").unwrap_or_else(|| refund.key.clone());
            if answered.iter().all(|(seen, _)| *seen != id) {
                let cents = r.json("amount_cents").and_then(|v| v.as_i64());
                answered.push((id, cents.unwrap_or(refund.amount_cents)));
            }
        }
    }
    answered
}

/// `re_1 1250, re_2 15003`.
fn listed<'a>(parts: impl Iterator<Item = (&'a str, i64)>) -> String {
    parts
        .map(|(id, cents)| format!("{id} {cents}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn sums_detail(cases: &[Case]) -> String {
    let refunded = cases
        .iter()
        .filter(|c| c.refund_intents.iter().any(|(_, rs)| !rs.is_empty()))
        .count();
    let answered: usize = cases.iter().map(|c| answered_refunds(c).len()).sum();
    format!("{refunded} refunded charges, {answered} refunds answered 201")
}

fn answers_agree(case: &Case) -> Option<String> {
    if case.intent.is_refund() {
        return refund_answers_agree(case);
    }
    let captures = case.captures;
    for r in case.requests {
        let what = describe(r);
        match outcome_said(case.intent, r) {
            Some(201) if captures.is_empty() => {
                return Some(format!("{what} said captured; the ledger has no capture"))
            }
            Some(201) => {
                if let Some(reference) = r.json_str("acquirer_reference") {
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

/// Every `201` to a refund names the reference of its refund in the ledger
/// (a `201` with no refund there is `one-refund-per-refund-intent`'s to
/// tell); the acquirer's stored refusal, and a refusal for more than the
/// charge has left that no `201` followed, have none.
fn refund_answers_agree(case: &Case) -> Option<String> {
    let refunds = &case.refunds;
    let paid = refunds.first()?;
    let mut said_refunded = false;
    for r in case.requests {
        let what = describe(r);
        match outcome_said(case.intent, r) {
            Some(201) => {
                said_refunded = true;
                if let Some(reference) = r.json_str("acquirer_reference") {
                    if !refunds.iter().any(|l| l.reference == reference) {
                        return Some(format!(
                            "{what} names reference {reference}; the ledger's refund has {}",
                            paid.reference
                        ));
                    }
                }
            }
            Some(422) => {
                return Some(format!(
                    "{what} said the acquirer refused it; the ledger paid it back ({})",
                    paid.reference
                ))
            }
            _ => {}
        }
    }
    let refused = case
        .requests
        .iter()
        .find(|r| r.purpose.sends_the_intent() && r.is_past_capture());
    match refused {
        Some(r) if !said_refunded => Some(format!(
            "{} said it was more than the charge has left, and no answer said refunded; the ledger paid it back ({})",
            describe(r),
            paid.reference
        )),
        _ => None,
    }
}

/// The outcome an answer states for its intent, if it states one: the
/// status of the intent's own final answer, or the stored status a key read
/// reports for a completed key.
fn outcome_said(intent: &Intent, r: &Request) -> Option<u16> {
    match r.purpose {
        p if p.sends_the_intent() && intent.is_final(r) => r.status,
        Purpose::KeyRead if r.status == Some(200) => completed_status(r),
        _ => None,
    }
}

/// The stored status a key read reports for a completed key.
fn completed_status(r: &Request) -> Option<u16> {
    if r.json_str("state")? != "completed" {
        return None;
    }
    u16::try_from(r.json("status")?.as_u64()?).ok()
}

/// The intent's first final answer to arrive.
fn first_final<'a>(intent: &Intent, requests: &[&'a Request]) -> Option<&'a Request> {
    requests
        .iter()
        .copied()
        .filter(|r| r.purpose.sends_the_intent() && intent.is_final(r))
        .min_by(|a, b| a.received_ms.total_cmp(&b.received_ms))
}

/// Every final answer is the first's, and so is every answer to a request
/// sent after the first arrived, but the contract's "try later" answers
/// (`409`, `503`): they state no outcome, and a client that follows their
/// `Retry-After` is answered with the stored one. (idem's in-flight memo may
/// answer `409` for up to a second after another instance finished: the
/// detail line counts those.) A refund refused for more than the charge has
/// left is not stored, so answers before the first final one are free to
/// differ from it.
fn replays_identical(case: &Case) -> Option<String> {
    let first = first_final(case.intent, case.requests)?;
    case.requests
        .iter()
        .filter(|r| r.purpose.sends_the_intent() && r.status.is_some())
        .filter(|r| case.intent.is_final(r) || (r.sent_ms > first.received_ms && !is_try_later(r)))
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
fn replay_detail(cases: &[Case]) -> String {
    let (mut later, mut stale, mut stalest) = (0, 0, 0.0_f64);
    for case in cases {
        let Some(first) = first_final(case.intent, case.requests) else {
            continue;
        };
        for r in case.requests.iter().filter(|r| {
            r.purpose.sends_the_intent() && r.status.is_some() && r.sent_ms > first.received_ms
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

fn reuse_is_422(case: &Case) -> Option<String> {
    let (intent, requests) = (case.intent, case.requests);
    if !is_reused(intent) {
        return None;
    }
    let other = reused_amount(intent);
    if let Some(c) = case.captures.iter().find(|c| c.amount_cents == other) {
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
    let settled = first_final(intent, requests).is_some();
    (settled && !reuses.iter().any(|r| r.status == Some(422)))
        .then(|| "the reuse of its key was never answered 422".to_owned())
}

fn contract_statuses(case: &Case) -> Option<String> {
    case.requests.iter().find_map(|r| {
        let status = r.status?;
        let (named, route): (&[u16], &str) = match r.purpose {
            Purpose::KeyRead => (&KEY_READ_STATUSES, "its route"),
            _ if case.intent.is_refund() => (&REFUND_STATUSES, "a refund"),
            _ => (&CHARGE_STATUSES, "a charge"),
        };
        (!named.contains(&status)).then(|| {
            let kind = if status == 500 {
                "a 500: a bug, by the contract's own words".to_owned()
            } else {
                format!("a status the contract does not name for {route}")
            };
            format!("{} answered {status}, {kind}", describe(r))
        })
    })
}

fn settles(case: &Case) -> Option<String> {
    let (intent, requests) = (case.intent, case.requests);
    if case.is_unsent_refund() {
        return None;
    }
    let sent: Vec<&&Request> = requests
        .iter()
        .filter(|r| r.purpose.sends_the_intent())
        .collect();
    if sent.iter().any(|r| intent.is_settled_by(r)) {
        return None;
    }
    let settling = if intent.is_refund() {
        "201, 422 refund-failed or 422 refund-exceeds-captured"
    } else {
        "201 or 402"
    };
    let last = sent
        .iter()
        .max_by(|a, b| a.received_ms.total_cmp(&b.received_ms));
    Some(match last {
        Some(r) => format!(
            "never answered {settling}; {} requests, the last {} answered {}",
            sent.len(),
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
        Purpose::Charge | Purpose::Refund if r.copy > 0 => {
            format!("copy {} attempt {}", r.copy + 1, r.attempt + 1)
        }
        Purpose::Charge | Purpose::Refund => format!("attempt {}", r.attempt + 1),
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
            refund_of: None,
        }
    }

    /// A refund intent of `amount_cents` of the charge intent `charge`.
    fn refund_intent(index: usize, charge: usize, amount_cents: i64) -> Intent {
        Intent {
            refund_of: Some(charge),
            order_id: 100 + charge as i64,
            amount_cents,
            ..intent(index)
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

    fn refund(capture_reference: &str, reference: &str, amount_cents: i64) -> LedgerRefund {
        LedgerRefund {
            refund_id: format!("rf_{reference}"),
            reference: reference.to_owned(),
            capture_reference: capture_reference.to_owned(),
            capture_id: format!("cap_{capture_reference}"),
            merchant: "m".to_owned(),
            amount_cents,
            currency: "BRL".to_owned(),
            at_micros: 0,
            traceparent: None,
        }
    }

    const CHARGE: &str = r#"{"id":"ch_1","acquirer_reference":"r1"}"#;
    const EXCEEDS: &str =
        r#"{"type":"urn:idem:problem:refund-exceeds-captured","remaining_cents":175}"#;
    const FAILED: &str = r#"{"type":"urn:idem:problem:refund-failed","refund":{}}"#;

    /// A refund's `201` body: its id, reference and amount.
    fn refunded(id: &str, reference: &str, amount_cents: i64) -> String {
        format!(
            r#"{{"id":"{id}","acquirer_reference":"{reference}","amount_cents":{amount_cents},"status":"succeeded"}}"#
        )
    }

    /// The history's intents: charges 0 to 3, refund intents 4, 5 and 6 of
    /// charge 1 (25, 300 and 301 of its 500 cents), and 7 of charge 2 (never
    /// sent: as when the charge was declined).
    fn intents() -> Vec<Intent> {
        let mut all: Vec<Intent> = (0..4).map(intent).collect();
        all.push(refund_intent(4, 1, 25));
        all.push(refund_intent(5, 1, 300));
        all.push(refund_intent(6, 1, 301));
        all.push(refund_intent(7, 2, 40));
        all
    }

    /// The verdicts of a history of [`intents`], by name.
    fn judged(
        requests: Vec<Request>,
        ledger: (Vec<LedgerCapture>, Vec<LedgerRefund>),
    ) -> HashMap<&'static str, Verdict> {
        let history = History {
            run: "t".to_owned(),
            intents: intents(),
            requests,
            faults: Vec::new(),
        };
        let (captures, refunds) = ledger;
        let evidence = Evidence {
            history: &history,
            captures: &captures,
            refunds: &refunds,
            in_flight_p99: Duration::from_millis(100),
        };
        judge(&evidence).into_iter().map(|v| (v.name, v)).collect()
    }

    type Ledger = (Vec<LedgerCapture>, Vec<LedgerRefund>);

    /// A run where every charge settles once, with a replay, and 3's reuse is
    /// 422; charge 1's small refund and one of its raced refunds are paid,
    /// the other raced one refused for more than the charge has left.
    fn healthy() -> (Vec<Request>, Ledger) {
        let mut requests = Vec::new();
        let mut captures = Vec::new();
        for i in 0..4 {
            let body = CHARGE.replace("r1", &format!("r{i}"));
            requests.push(answer(i, Purpose::Charge, 0.0, 201, &body));
            requests.push(answer(i, Purpose::LateReplay, 50.0, 201, &body));
            captures.push(capture(100 + i as i64, &format!("r{i}"), 500));
        }
        requests.push(answer(3, Purpose::Reuse, 10.0, 422, "{}"));
        for (i, body) in [
            (4, refunded("re_s", "s1", 25)),
            (5, refunded("re_a", "a1", 300)),
            (6, EXCEEDS.to_owned()),
        ] {
            requests.push(answer(i, Purpose::Refund, 5.0, body_status(&body), &body));
            requests.push(answer(
                i,
                Purpose::LateReplay,
                60.0,
                body_status(&body),
                &body,
            ));
        }
        let refunds = vec![refund("r1", "s1", 25), refund("r1", "a1", 300)];
        (requests, (captures, refunds))
    }

    fn body_status(body: &str) -> u16 {
        if body.contains("urn:idem:problem") {
            422
        } else {
            201
        }
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
        let (requests, ledger) = healthy();
        let verdicts = judged(requests, ledger);
        assert_eq!(broken(&verdicts), Vec::<&str>::new(), "{verdicts:#?}");
        assert_eq!(
            verdicts["refunds-within-capture"].detail,
            "1 refunded charges, 2 refunds answered 201"
        );
        assert_eq!(
            verdicts["one-refund-per-refund-intent"].detail,
            "3 refund intents sent, 2 refunds in the ledger"
        );
    }

    /// A change to a healthy history that breaks one invariant.
    type Mutation = dyn Fn(&mut Vec<Request>, &mut Ledger);

    /// Replaces the answers to intent `i` with `body` (its status from it).
    fn answers_of(requests: &mut [Request], i: usize, body: &str) {
        for r in requests.iter_mut().filter(|r| r.intent == i) {
            *r = answer(i, r.purpose, r.sent_ms, body_status(body), body);
        }
    }

    #[test]
    fn each_break_is_named_alone() {
        let cases: Vec<(&[&str], Box<Mutation>)> = vec![
            (
                &["one-capture-per-intent"],
                Box::new(|_, (c, _)| c.push(capture(101, "r9", 500))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|_, (c, _)| c.retain(|c| c.order_id != 102)),
            ),
            (
                &["replays-identical"],
                Box::new(|r, _| r[1].body_sha256 = Some(digest(b"other"))),
            ),
            (
                &["reuse-is-422"],
                Box::new(|r, _| {
                    let reuse = r.iter_mut().find(|r| r.purpose == Purpose::Reuse).unwrap();
                    reuse.status = Some(201);
                }),
            ),
            (
                &["contract-statuses"],
                Box::new(|r, _| r.push(answer(1, Purpose::Charge, 0.5, 500, "{}"))),
            ),
            (
                &["settles"],
                Box::new(|r, (c, _)| {
                    r.retain(|r| r.intent != 2);
                    r.push(answer(2, Purpose::Charge, 0.0, 409, "{}"));
                    c.retain(|c| c.order_id != 102);
                }),
            ),
            (
                &["in-flight-is-fast"],
                Box::new(|r, _| {
                    let mut slow = answer(1, Purpose::Charge, 0.5, 409, "{}");
                    slow.received_ms = 150.0;
                    r.push(slow);
                }),
            ),
            // Refunds.
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, (_, f)| f.push(refund("r1", "s2", 25))),
            ),
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, (_, f)| f.retain(|f| f.reference != "s1")),
            ),
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, (_, f)| f.push(refund("r2", "x1", 7))),
            ),
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, (_, f)| f.push(refund("r2", "x1", 40))),
            ),
            (
                &["refunds-within-capture"],
                Box::new(|r, (_, f)| {
                    answers_of(r, 6, &refunded("re_b", "b1", 301));
                    f.push(refund("r1", "b1", 301));
                }),
            ),
            // Said paid, and past the charge: the ledger has neither.
            (
                &["one-refund-per-refund-intent", "refunds-within-capture"],
                Box::new(|r, _| answers_of(r, 6, &refunded("re_b", "b1", 301))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|r, _| answers_of(r, 5, &refunded("re_a", "a9", 300))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|r, _| answers_of(r, 5, FAILED)),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|r, _| answers_of(r, 5, EXCEEDS)),
            ),
            (
                &["replays-identical"],
                Box::new(|r, _| {
                    let replay = r
                        .iter_mut()
                        .find(|r| r.intent == 4 && r.purpose == Purpose::LateReplay)
                        .unwrap();
                    *replay = answer(4, Purpose::LateReplay, 60.0, 422, EXCEEDS);
                }),
            ),
            (
                &["contract-statuses"],
                Box::new(|r, _| r.push(answer(5, Purpose::Refund, 0.5, 402, "{}"))),
            ),
            (
                &["settles"],
                Box::new(|r, (_, f)| {
                    r.retain(|r| r.intent != 4);
                    r.push(answer(4, Purpose::Refund, 0.0, 409, "{}"));
                    r.push(answer(4, Purpose::Settle, 9.0, 422, "{}"));
                    f.retain(|f| f.reference != "s1");
                }),
            ),
        ];
        for (names, mutate) in cases {
            let (mut requests, mut ledger) = healthy();
            mutate(&mut requests, &mut ledger);
            let verdicts = judged(requests, ledger);
            assert_eq!(broken(&verdicts), names, "{verdicts:#?}");
            assert!(names
                .iter()
                .all(|name| !verdicts[name].counterexamples.is_empty()));
        }
    }

    #[test]
    fn an_answer_in_flight_when_the_first_arrived_is_not_a_replay() {
        let (mut requests, ledger) = healthy();
        // Sent before the first 201 arrived, answered 409 after it: a burst's copy.
        let mut late_409 = answer(0, Purpose::Charge, 1.0, 409, "{}");
        late_409.received_ms = 3.0;
        requests.push(late_409);
        // A 503 after it settled: the contract's "try later", not a changed
        // answer; so is a 409 from a memory that has not heard yet.
        requests.push(answer(0, Purpose::LateReplay, 60.0, 503, "{}"));
        requests.push(answer(0, Purpose::Settle, 70.0, 409, "{}"));
        let verdicts = judged(requests, ledger);
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
        let (mut requests, ledger) = healthy();
        requests[0] = answer(0, Purpose::Charge, 0.0, 402, "{}");
        requests[1] = answer(0, Purpose::LateReplay, 50.0, 402, "{}");
        let verdicts = judged(requests, ledger);
        assert_eq!(broken(&verdicts), vec!["answers-agree-with-ledger"]);
    }

    #[test]
    fn a_refund_refused_for_the_sum_then_paid_is_not_a_changed_replay() {
        // The raced refund was refused while the other one held the charge's
        // amount; once that one failed, the same key was free and paid.
        let (mut requests, (captures, mut refunds)) = healthy();
        answers_of(&mut requests, 5, FAILED);
        refunds.retain(|f| f.reference != "a1");
        requests.retain(|r| !(r.intent == 6 && r.purpose == Purpose::LateReplay));
        let paid = refunded("re_b", "b1", 301);
        requests.push(answer(6, Purpose::LateReplay, 60.0, 201, &paid));
        refunds.push(refund("r1", "b1", 301));
        let verdicts = judged(requests, (captures, refunds));
        assert_eq!(broken(&verdicts), Vec::<&str>::new(), "{verdicts:#?}");
    }

    #[test]
    fn an_over_refund_shows_every_refund_it_adds_up() {
        let (mut requests, (captures, mut refunds)) = healthy();
        answers_of(&mut requests, 6, &refunded("re_b", "b1", 301));
        refunds.push(refund("r1", "b1", 301));
        let verdicts = judged(requests, (captures, refunds));
        let over = &verdicts["refunds-within-capture"].counterexamples;
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].intent, 1, "the charge");
        assert_eq!(
            over[0].why,
            "its refunds answered 201 sum to 626 cents (re_s 25, re_a 300, re_b 301), more than \
             the charge's 500; the ledger paid back 626 cents from cap_r1 (rf_s1 25, rf_a1 300, \
             rf_b1 301), more than its 500"
        );
    }
}
