//! The promise as twelve invariants, judged on the history and the ledger
//! alone: pure functions, no network. Each names the intents that break it.
//!
//! The ledger's refunds name no intent: a refund is the run's when it pays
//! back from one of the run's captures, and a refund intent's when it is of
//! its charge's capture and its amount (the workload gives each refund of a
//! charge another amount). So with two-step payments: an authorization is
//! the run's by its order id, a capture of it or a void the run's when it
//! names one of the run's authorizations, and a capture intent's when it is
//! of its authorization and its amount (each capture of an authorization
//! asks for another amount); the workload sends at most one void intent per
//! authorization, whose voids in the ledger are its own.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::history::{History, Intent, Purpose, Request};
use super::workload::{is_reused, reused_amount};
use crate::sim::{
    LedgerAuthorization, LedgerAuthorizationCapture, LedgerCapture, LedgerRefund, LedgerVoid,
};
use crate::timeline::instance_name;

/// The statuses the contract names for `POST /v1/charges`.
const CHARGE_STATUSES: [u16; 12] = [201, 400, 401, 402, 409, 410, 413, 415, 422, 502, 503, 504];
/// ... for `POST /v1/charges/{id}/refunds`.
const REFUND_STATUSES: [u16; 11] = [201, 400, 401, 404, 409, 410, 413, 415, 422, 503, 504];
/// ... for `POST /v1/charges/{id}/captures` and `POST /v1/charges/{id}/void`.
const STEP_STATUSES: [u16; 11] = [201, 400, 401, 404, 409, 410, 413, 415, 422, 503, 504];
/// ... and for `GET /v1/idempotency-keys/{key}`.
const KEY_READ_STATUSES: [u16; 5] = [200, 400, 401, 404, 503];

/// The names, in the order they are reported.
pub const NAMES: [&str; 12] = [
    "one-capture-per-intent",
    "one-refund-per-refund-intent",
    "refunds-within-capture",
    "one-capture-per-capture-intent",
    "captures-within-authorization",
    "nothing-captured-after-void",
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

/// ... and those told by an authorization's step intents (its captures and
/// its void).
pub const ABOUT_STEPS: [&str; 3] = [
    "one-capture-per-capture-intent",
    "captures-within-authorization",
    "nothing-captured-after-void",
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
    /// The ledger's refunds of those captures.
    pub refunds: &'a [LedgerRefund],
    /// The run's authorizations from the ledger.
    pub authorizations: &'a [LedgerAuthorization],
    /// The ledger's captures of those authorizations.
    pub authorization_captures: &'a [LedgerAuthorizationCapture],
    /// The ledger's voids of those authorizations.
    pub voids: &'a [LedgerVoid],
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

    fn authorizations_of(&self) -> HashMap<i64, Vec<&LedgerAuthorization>> {
        let mut by_order: HashMap<i64, Vec<&LedgerAuthorization>> = HashMap::new();
        for a in self.authorizations {
            by_order.entry(a.order_id).or_default().push(a);
        }
        by_order
    }

    /// The order of each authorization, by its reference.
    fn authorization_orders(&self) -> HashMap<&str, i64> {
        self.authorizations
            .iter()
            .map(|a| (a.reference.as_str(), a.order_id))
            .collect()
    }

    /// The captures of authorizations by the order of the authorization
    /// they capture from.
    fn parts_of(&self) -> HashMap<i64, Vec<&LedgerAuthorizationCapture>> {
        let order_of = self.authorization_orders();
        let mut by_order: HashMap<i64, Vec<&LedgerAuthorizationCapture>> = HashMap::new();
        for c in self.authorization_captures {
            if let Some(order) = order_of.get(c.authorization_reference.as_str()) {
                by_order.entry(*order).or_default().push(c);
            }
        }
        by_order
    }

    /// The voids by the order of the authorization they void.
    fn voids_of(&self) -> HashMap<i64, Vec<&LedgerVoid>> {
        let order_of = self.authorization_orders();
        let mut by_order: HashMap<i64, Vec<&LedgerVoid>> = HashMap::new();
        for v in self.voids {
            if let Some(order) = order_of.get(v.authorization_reference.as_str()) {
                by_order.entry(*order).or_default().push(v);
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
    /// The ledger's authorizations of its order (a step's: of the
    /// authorization it acts on).
    authorizations: &'a [&'a LedgerAuthorization],
    /// An authorization intent's: every capture the ledger made of its
    /// authorizations. A capture intent's: those of them that are its own
    /// (of its amount). None for another intent.
    parts: Vec<&'a LedgerAuthorizationCapture>,
    /// An authorization intent's and a void intent's: the ledger's voids of
    /// its authorizations. None for another intent.
    voids: &'a [&'a LedgerVoid],
    /// An authorization's step intents, each with its requests.
    step_intents: Vec<(&'a Intent, &'a [&'a Request])>,
}

impl Case<'_> {
    /// Whether this is a refund or a step intent that was never sent: its
    /// charge was not captured (or authorized) during the workload, and
    /// nothing is asked of it.
    fn is_unsent(&self) -> bool {
        self.intent.parent().is_some() && self.requests.is_empty()
    }

    /// The capture intents among an authorization's step intents.
    fn capture_intents(&self) -> impl Iterator<Item = &(&Intent, &[&Request])> {
        self.step_intents.iter().filter(|(i, _)| i.is_capture())
    }
}

/// One invariant judged on one intent: why it breaks, if it does.
type Judge = dyn Fn(&Case) -> Option<String>;

/// Every invariant's verdict, in [`NAMES`]' order.
pub fn judge(evidence: &Evidence) -> Vec<Verdict> {
    let captures = evidence.captures_of();
    let refunds = evidence.refunds_of();
    let authorizations = evidence.authorizations_of();
    let parts = evidence.parts_of();
    let voids = evidence.voids_of();
    let requests = evidence.requests_by_intent();
    let intents = &evidence.history.intents;
    let (no_captures, no_refunds) = (Vec::new(), Vec::new());
    let (no_authorizations, no_parts, no_voids) = (Vec::new(), Vec::new(), Vec::new());
    let cases: Vec<Case> = intents
        .iter()
        .map(|intent| {
            let of_order = refunds.get(&intent.order_id).unwrap_or(&no_refunds);
            let parts_of_order = parts.get(&intent.order_id).unwrap_or(&no_parts);
            let two_step = intent.authorize || intent.is_step();
            Case {
                intent,
                requests: &requests[intent.index],
                captures: captures.get(&intent.order_id).unwrap_or(&no_captures),
                refunds: of_order
                    .iter()
                    .copied()
                    .filter(|_| !intent.is_step())
                    .filter(|r| !intent.is_refund() || r.amount_cents == intent.amount_cents)
                    .collect(),
                refund_intents: evidence
                    .history
                    .refunds_of(intent.index)
                    .filter(|_| intent.is_charge())
                    .map(|r| (r, requests[r.index].as_slice()))
                    .collect(),
                authorizations: authorizations
                    .get(&intent.order_id)
                    .filter(|_| two_step)
                    .unwrap_or(&no_authorizations),
                parts: parts_of_order
                    .iter()
                    .copied()
                    .filter(|_| intent.authorize || intent.is_capture())
                    .filter(|c| !intent.is_capture() || c.amount_cents == intent.amount_cents)
                    .collect(),
                voids: voids
                    .get(&intent.order_id)
                    .filter(|_| intent.authorize || intent.is_void())
                    .unwrap_or(&no_voids),
                step_intents: evidence
                    .history
                    .steps_of(intent.index)
                    .filter(|_| intent.authorize)
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
    let charges = intents.iter().filter(|i| i.is_charge()).count();
    let sent = |what: fn(&Intent) -> bool| {
        cases
            .iter()
            .filter(|c| what(c.intent) && !c.requests.is_empty())
            .count()
    };
    let refunds_sent = sent(Intent::is_refund);
    let captures_sent = sent(Intent::is_capture);
    let voids_sent = sent(Intent::is_void);
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
                "{charges} intents, {} captures and {} authorizations in the ledger",
                evidence.captures.len(),
                evidence.authorizations.len()
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
            per_intent(&one_capture_per_capture_intent),
            format!(
                "{captures_sent} capture intents sent, {} captures of authorizations in the ledger",
                evidence.authorization_captures.len()
            ),
        ),
        (
            per_intent(&captures_within_authorization),
            captured_sums_detail(&cases),
        ),
        (
            per_intent(&nothing_captured_after_void),
            voids_detail(evidence, voids_sent),
        ),
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
            format!(
                "{charges} intents, {refunds_sent} refund intents, {} capture and void intents",
                captures_sent + voids_sent
            ),
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
    if !case.intent.is_charge() {
        return None;
    }
    if case.intent.authorize {
        return one_authorization(case);
    }
    (captures.len() > 1).then(|| {
        let refs: Vec<&str> = captures.iter().map(|c| c.reference.as_str()).collect();
        format!(
            "captured {} times (references {})",
            captures.len(),
            refs.join(", ")
        )
    })
}

/// An authorization intent has at most one authorization in the ledger,
/// and no capture made at once.
fn one_authorization(case: &Case) -> Option<String> {
    if !case.captures.is_empty() {
        let refs: Vec<&str> = case.captures.iter().map(|c| c.reference.as_str()).collect();
        return Some(format!(
            "sent with \"capture\": false, yet captured at once {} time(s) (references {})",
            refs.len(),
            refs.join(", ")
        ));
    }
    let authorizations = case.authorizations;
    (authorizations.len() > 1).then(|| {
        let refs: Vec<&str> = authorizations
            .iter()
            .map(|a| a.reference.as_str())
            .collect();
        format!(
            "authorized {} times (references {})",
            authorizations.len(),
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
    if case.is_unsent() {
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
    answered(case.refund_intents.iter())
}

/// What `intents` were answered `201` with: each id once (the first
/// answer's amount, or the intent's when the answer names none), in the
/// intents' order.
fn answered<'a>(
    intents: impl Iterator<Item = &'a (&'a Intent, &'a [&'a Request])>,
) -> Vec<(String, i64)> {
    let mut answered: Vec<(String, i64)> = Vec::new();
    for (intent, requests) in intents {
        for r in requests
            .iter()
            .filter(|r| r.purpose.sends_the_intent() && r.status == Some(201))
        {
            let id = r.json_str("id").unwrap_or_else(|| intent.key.clone());
            if answered.iter().all(|(seen, _)| *seen != id) {
                let cents = r.json("amount_cents").and_then(|v| v.as_i64());
                answered.push((id, cents.unwrap_or(intent.amount_cents)));
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

/// A capture intent has at most one capture in the ledger, and exactly one,
/// under the reference its answer names, when it was answered `201`; an
/// authorization has no capture that none of its capture intents asked for.
fn one_capture_per_capture_intent(case: &Case) -> Option<String> {
    if case.intent.authorize {
        return stray_capture(case);
    }
    if !case.intent.is_capture() {
        return None;
    }
    let parts = &case.parts;
    let amount = case.intent.amount_cents;
    if parts.len() > 1 {
        let refs: Vec<&str> = parts.iter().map(|c| c.reference.as_str()).collect();
        return Some(format!(
            "captured {} times (references {})",
            parts.len(),
            refs.join(", ")
        ));
    }
    if case.is_unsent() {
        return parts.first().map(|c| {
            format!(
                "never sent, yet the ledger captured its {amount} cents from its authorization \
                 ({}, reference {})",
                c.capture_id, c.reference
            )
        });
    }
    let mut said = case
        .requests
        .iter()
        .filter(|r| outcome_said(case.intent, r) == Some(201));
    let created = said.clone().next()?;
    let Some(part) = parts.first() else {
        return Some(format!(
            "{} said captured; the ledger has no capture of {amount} cents from its authorization",
            describe(created)
        ));
    };
    said.find_map(|r| {
        let reference = r.json_str("acquirer_reference")?;
        (reference != part.reference).then(|| {
            format!(
                "{} names reference {reference}; the ledger's capture of its {amount} cents ({}) \
                 has {}",
                describe(r),
                part.capture_id,
                part.reference
            )
        })
    })
}

/// A capture of the authorization whose amount none of its capture intents
/// asked for.
fn stray_capture(case: &Case) -> Option<String> {
    let asked: Vec<i64> = case
        .capture_intents()
        .map(|(c, _)| c.amount_cents)
        .collect();
    let stray = case
        .parts
        .iter()
        .find(|c| !asked.contains(&c.amount_cents))?;
    Some(format!(
        "the ledger captured {} cents from its authorization ({}, reference {}), which no \
         capture intent asked for",
        stray.amount_cents, stray.capture_id, stray.reference
    ))
}

/// An authorization's captures answered `201` (each capture id once) sum
/// to no more than the authorization, and the ledger's captures of each of
/// its authorizations to no more than that authorization.
fn captures_within_authorization(case: &Case) -> Option<String> {
    if !case.intent.authorize {
        return None;
    }
    let mut past = Vec::new();
    let answered = answered(case.capture_intents());
    let total: i64 = answered.iter().map(|(_, cents)| cents).sum();
    if total > case.intent.amount_cents {
        past.push(format!(
            "its captures answered 201 sum to {total} cents ({}), more than the authorization's {}",
            listed(answered.iter().map(|(id, cents)| (id.as_str(), *cents))),
            case.intent.amount_cents
        ));
    }
    for authorization in case.authorizations {
        let parts = parts_of(case, authorization);
        let total: i64 = parts.iter().map(|c| c.amount_cents).sum();
        if total > authorization.amount_cents {
            past.push(format!(
                "the ledger captured {total} cents from {} ({}), more than its {}",
                authorization.authorization_id,
                listed(
                    parts
                        .iter()
                        .map(|c| (c.capture_id.as_str(), c.amount_cents))
                ),
                authorization.amount_cents
            ));
        }
    }
    (!past.is_empty()).then(|| past.join("; "))
}

/// The ledger's captures of `authorization`, among the case's.
fn parts_of<'a>(
    case: &Case<'a>,
    authorization: &LedgerAuthorization,
) -> Vec<&'a LedgerAuthorizationCapture> {
    case.parts
        .iter()
        .copied()
        .filter(|c| c.authorization_reference == authorization.reference)
        .collect()
}

/// No capture of an authorization in the ledger after a void of it (by
/// their `at_micros`, when the ledger has times); none at all of one whose
/// void released all it held (in the ledger, or by the void's `201`): that
/// void says nothing was captured.
fn nothing_captured_after_void(case: &Case) -> Option<String> {
    if !case.intent.authorize {
        return None;
    }
    let mut wrong = Vec::new();
    for void in case.voids {
        let Some(authorization) = case
            .authorizations
            .iter()
            .find(|a| a.reference == void.authorization_reference)
        else {
            continue;
        };
        let parts = parts_of(case, authorization);
        let after: Vec<&&LedgerAuthorizationCapture> = parts
            .iter()
            .filter(|c| void.at_micros > 0 && c.at_micros > void.at_micros)
            .collect();
        if !after.is_empty() {
            let list: Vec<String> = after
                .iter()
                .map(|c| {
                    format!(
                        "{} of {} at {:.1} ms",
                        c.capture_id,
                        c.amount_cents,
                        c.at_micros as f64 / 1000.0
                    )
                })
                .collect();
            wrong.push(format!(
                "the ledger captured from {} after {} voided it at {:.1} ms (the acquirer's \
                 clock): {}",
                authorization.authorization_id,
                void.void_id,
                void.at_micros as f64 / 1000.0,
                list.join(", ")
            ));
        } else if void.released_cents >= authorization.amount_cents && !parts.is_empty() {
            wrong.push(format!(
                "the ledger's {} released all {} cents of {}, so nothing was captured; yet the \
                 ledger captured from it ({})",
                void.void_id,
                authorization.amount_cents,
                authorization.authorization_id,
                listed(
                    parts
                        .iter()
                        .map(|c| (c.capture_id.as_str(), c.amount_cents))
                )
            ));
        }
    }
    if wrong.is_empty() && !case.parts.is_empty() {
        // The void's own word: it released everything, so nothing was or
        // will be captured.
        let released_all = case
            .step_intents
            .iter()
            .filter(|(i, _)| i.is_void())
            .flat_map(|(_, requests)| requests.iter())
            .find(|r| {
                r.purpose.sends_the_intent()
                    && r.status == Some(201)
                    && r.json("amount_cents").and_then(|v| v.as_i64())
                        == Some(case.intent.amount_cents)
            });
        if let Some(r) = released_all {
            wrong.push(format!(
                "{} said the void released all {} cents, so nothing was captured; yet the ledger \
                 captured from it ({})",
                describe(r),
                case.intent.amount_cents,
                listed(
                    case.parts
                        .iter()
                        .map(|c| (c.capture_id.as_str(), c.amount_cents))
                )
            ));
        }
    }
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

fn captured_sums_detail(cases: &[Case]) -> String {
    let captured = cases
        .iter()
        .filter(|c| c.capture_intents().any(|(_, rs)| !rs.is_empty()))
        .count();
    let answered: usize = cases
        .iter()
        .map(|c| answered(c.capture_intents()).len())
        .sum();
    format!("{captured} authorizations whose captures were sent, {answered} captures answered 201")
}

fn voids_detail(evidence: &Evidence, voids_sent: usize) -> String {
    let partly = evidence
        .voids
        .iter()
        .filter(|v| {
            evidence
                .authorization_captures
                .iter()
                .any(|c| c.authorization_reference == v.authorization_reference)
        })
        .count();
    format!(
        "{voids_sent} void intents sent, {} voids in the ledger ({partly} after a partial capture)",
        evidence.voids.len()
    )
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
    let intent = case.intent;
    if intent.is_refund() {
        return refund_answers_agree(case);
    }
    if intent.is_capture() {
        return capture_answers_agree(case);
    }
    if intent.is_void() {
        return void_answers_agree(case);
    }
    let (made, noun, verb): (Vec<&str>, _, _) = if intent.authorize {
        let made = case.authorizations.iter().map(|a| a.reference.as_str());
        (made.collect(), "authorization", "authorized")
    } else {
        let made = case.captures.iter().map(|c| c.reference.as_str());
        (made.collect(), "capture", "captured")
    };
    for r in case.requests {
        let what = describe(r);
        match outcome_said(intent, r) {
            Some(201) if made.is_empty() => {
                return Some(format!("{what} said {verb}; the ledger has no {noun}"))
            }
            Some(201) => {
                if let Some(reference) = r.json_str("acquirer_reference") {
                    if !made.contains(&reference.as_str()) {
                        return Some(format!(
                            "{what} names reference {reference}; the ledger's {noun} has {}",
                            made[0]
                        ));
                    }
                }
            }
            Some(402) if !made.is_empty() => {
                return Some(format!(
                    "{what} said declined; the ledger has {} {noun}(s)",
                    made.len()
                ))
            }
            _ => {}
        }
    }
    None
}

/// A capture the acquirer refused (stored), or one refused for what the
/// authorization has left or for an authorization already closed that no
/// `201` followed, has no capture in the ledger. (A `201` is
/// `one-capture-per-capture-intent`'s to tell.)
fn capture_answers_agree(case: &Case) -> Option<String> {
    let made = case.parts.first()?;
    let said_captured = case
        .requests
        .iter()
        .any(|r| outcome_said(case.intent, r) == Some(201));
    if let Some(r) = case
        .requests
        .iter()
        .find(|r| outcome_said(case.intent, r) == Some(422))
    {
        return Some(format!(
            "{} said the acquirer refused it; the ledger captured it ({}, reference {})",
            describe(r),
            made.capture_id,
            made.reference
        ));
    }
    let refused = case.requests.iter().find(|r| {
        r.purpose.sends_the_intent() && (r.is_past_authorization() || r.is_not_authorized())
    });
    match refused {
        Some(r) if !said_captured => Some(format!(
            "{} refused it ({}), and no answer said captured; the ledger captured it ({}, \
             reference {})",
            describe(r),
            r.problem_type().unwrap_or_default(),
            made.capture_id,
            made.reference
        )),
        _ => None,
    }
}

/// A void answered `201` names the reference of a void of its authorization
/// in the ledger; one the acquirer refused (stored), or one refused for an
/// authorization already closed that no `201` followed, has none.
fn void_answers_agree(case: &Case) -> Option<String> {
    let voids = case.voids;
    let mut said_voided = false;
    for r in case.requests {
        let what = describe(r);
        match outcome_said(case.intent, r) {
            Some(201) if voids.is_empty() => {
                return Some(format!(
                    "{what} said voided; the ledger has no void of its authorization"
                ))
            }
            Some(201) => {
                said_voided = true;
                if let Some(reference) = r.json_str("acquirer_reference") {
                    if !voids.iter().any(|v| v.reference == reference) {
                        return Some(format!(
                            "{what} names reference {reference}; the ledger's void has {}",
                            voids[0].reference
                        ));
                    }
                }
            }
            Some(422) if !voids.is_empty() => {
                return Some(format!(
                    "{what} said the acquirer refused it; the ledger voided its authorization ({})",
                    voids[0].void_id
                ))
            }
            _ => {}
        }
    }
    let refused = case
        .requests
        .iter()
        .find(|r| r.purpose.sends_the_intent() && r.is_not_authorized());
    match (refused, voids.first()) {
        (Some(r), Some(void)) if !said_voided => Some(format!(
            "{} said the charge was no open authorization, and no answer said voided; the \
             ledger voided it ({})",
            describe(r),
            void.void_id
        )),
        _ => None,
    }
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
    if let Some(a) = case.authorizations.iter().find(|a| a.amount_cents == other) {
        return Some(format!(
            "the reuse with amount {other} was authorized ({})",
            a.reference
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
            _ if case.intent.is_capture() => (&STEP_STATUSES, "a capture"),
            _ if case.intent.is_void() => (&STEP_STATUSES, "a void"),
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
    if case.is_unsent() {
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
    } else if intent.is_capture() {
        "201, 422 capture-failed, 422 capture-exceeds-authorization or 422 charge-not-authorized"
    } else if intent.is_void() {
        "201, 422 void-failed or 422 charge-not-authorized"
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
        Purpose::Charge | Purpose::Refund | Purpose::Capture | Purpose::Void if r.copy > 0 => {
            format!("copy {} attempt {}", r.copy + 1, r.attempt + 1)
        }
        Purpose::Charge | Purpose::Refund | Purpose::Capture | Purpose::Void => {
            format!("attempt {}", r.attempt + 1)
        }
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
            authorize: false,
            capture_of: None,
            void_of: None,
        }
    }

    /// An authorization intent of 500 cents.
    fn authorization_intent(index: usize) -> Intent {
        Intent {
            authorize: true,
            ..intent(index)
        }
    }

    /// A capture intent of `amount_cents` of the authorization intent
    /// `authorization`, final or not.
    fn capture_intent(
        index: usize,
        authorization: usize,
        amount_cents: i64,
        final_capture: bool,
    ) -> Intent {
        Intent {
            capture_of: Some(authorization),
            order_id: 100 + authorization as i64,
            amount_cents,
            body: format!(r#"{{"amount_cents":{amount_cents},"final":{final_capture}}}"#),
            ..intent(index)
        }
    }

    /// The void intent of the authorization intent `authorization`.
    fn void_intent(index: usize, authorization: usize) -> Intent {
        Intent {
            void_of: Some(authorization),
            order_id: 100 + authorization as i64,
            amount_cents: 0,
            ..intent(index)
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

    /// An authorization in the ledger, of 500 cents.
    fn authorization(order_id: i64, reference: &str) -> LedgerAuthorization {
        LedgerAuthorization {
            authorization_id: format!("auth_{reference}"),
            reference: reference.to_owned(),
            merchant: "m".to_owned(),
            order_id,
            amount_cents: 500,
            currency: "BRL".to_owned(),
            at_micros: 1,
            traceparent: None,
        }
    }

    /// A capture of the authorization `authorization_reference` (of the order
    /// `100 + its number`), made at `at_micros`.
    fn part(
        authorization_reference: &str,
        reference: &str,
        amount_cents: i64,
        at_micros: u64,
    ) -> LedgerAuthorizationCapture {
        LedgerAuthorizationCapture {
            capture_id: format!("cap_{reference}"),
            reference: reference.to_owned(),
            authorization_reference: authorization_reference.to_owned(),
            authorization_id: format!("auth_{authorization_reference}"),
            merchant: "m".to_owned(),
            order_id: 100 + authorization_reference[1..].parse::<i64>().unwrap(),
            amount_cents,
            currency: "BRL".to_owned(),
            final_capture: false,
            released_cents: 0,
            at_micros,
            traceparent: None,
        }
    }

    fn void(
        authorization_reference: &str,
        reference: &str,
        released_cents: i64,
        at_micros: u64,
    ) -> LedgerVoid {
        LedgerVoid {
            void_id: format!("void_{reference}"),
            reference: reference.to_owned(),
            authorization_reference: authorization_reference.to_owned(),
            authorization_id: format!("auth_{authorization_reference}"),
            merchant: "m".to_owned(),
            order_id: 100 + authorization_reference[1..].parse::<i64>().unwrap(),
            released_cents,
            at_micros,
            traceparent: None,
        }
    }

    const CHARGE: &str = r#"{"id":"ch_1","acquirer_reference":"r1"}"#;
    const PAST_AUTHORIZATION: &str =
        r#"{"type":"urn:idem:problem:capture-exceeds-authorization","remaining_cents":175}"#;
    const NOT_AUTHORIZED: &str = r#"{"type":"urn:idem:problem:charge-not-authorized"}"#;
    const CAPTURE_FAILED: &str = r#"{"type":"urn:idem:problem:capture-failed","capture":{}}"#;

    /// A step's `201` body: its id, reference and amount (a void's: what it
    /// released).
    fn stepped(id: &str, reference: &str, amount_cents: i64) -> String {
        format!(
            r#"{{"id":"{id}","acquirer_reference":"{reference}","amount_cents":{amount_cents},"status":"succeeded"}}"#
        )
    }
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
    /// sent: as when the charge was declined); authorization 8, with capture
    /// intents 9, 10 and 11 (25, 300 and 301 of its 500 cents) and 12 (a
    /// final 50); authorization 13, with capture intent 14 (150) raced by
    /// void intent 15, then capture intent 16 (a final 25); authorization
    /// 17 (declined), with capture intent 18 (never sent).
    fn intents() -> Vec<Intent> {
        let mut all: Vec<Intent> = (0..4).map(intent).collect();
        all.push(refund_intent(4, 1, 25));
        all.push(refund_intent(5, 1, 300));
        all.push(refund_intent(6, 1, 301));
        all.push(refund_intent(7, 2, 40));
        all.push(authorization_intent(8));
        all.push(capture_intent(9, 8, 25, false));
        all.push(capture_intent(10, 8, 300, false));
        all.push(capture_intent(11, 8, 301, false));
        all.push(capture_intent(12, 8, 50, true));
        all.push(authorization_intent(13));
        all.push(capture_intent(14, 13, 150, false));
        all.push(void_intent(15, 13));
        all.push(capture_intent(16, 13, 25, true));
        all.push(authorization_intent(17));
        all.push(capture_intent(18, 17, 60, false));
        all
    }

    /// The verdicts of a history of [`intents`], by name.
    fn judged(requests: Vec<Request>, ledger: Ledger) -> HashMap<&'static str, Verdict> {
        let history = History {
            run: "t".to_owned(),
            intents: intents(),
            requests,
            faults: Vec::new(),
        };
        let evidence = Evidence {
            history: &history,
            captures: &ledger.captures,
            refunds: &ledger.refunds,
            authorizations: &ledger.authorizations,
            authorization_captures: &ledger.parts,
            voids: &ledger.voids,
            in_flight_p99: Duration::from_millis(100),
        };
        judge(&evidence).into_iter().map(|v| (v.name, v)).collect()
    }

    /// What the ledger holds.
    #[derive(Default)]
    struct Ledger {
        captures: Vec<LedgerCapture>,
        refunds: Vec<LedgerRefund>,
        authorizations: Vec<LedgerAuthorization>,
        parts: Vec<LedgerAuthorizationCapture>,
        voids: Vec<LedgerVoid>,
    }

    /// A run where every charge settles once, with a replay, and 3's reuse is
    /// 422; charge 1's small refund and one of its raced refunds are paid,
    /// the other raced one refused for more than the charge has left;
    /// authorization 8's small capture and one of its raced captures are
    /// made, the other raced one refused for more than it has left, and its
    /// final capture made; authorization 13's capture is made, then its void
    /// (which releases the rest), and its final capture refused; 17 declined.
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
        for i in [8, 13] {
            let body =
                format!(r#"{{"id":"ch_{i}","acquirer_reference":"a{i}","status":"authorized"}}"#);
            requests.push(answer(i, Purpose::Charge, 0.0, 201, &body));
            requests.push(answer(i, Purpose::LateReplay, 50.0, 201, &body));
        }
        let declined = r#"{"type":"urn:idem:problem:charge-declined"}"#;
        requests.push(answer(17, Purpose::Charge, 0.0, 402, declined));
        requests.push(answer(17, Purpose::Reuse, 10.0, 422, "{}"));
        for (i, purpose, body) in [
            (9, Purpose::Capture, stepped("cp_9", "p9", 25)),
            (10, Purpose::Capture, stepped("cp_10", "p10", 300)),
            (11, Purpose::Capture, PAST_AUTHORIZATION.to_owned()),
            (12, Purpose::Capture, stepped("cp_12", "p12", 50)),
            (14, Purpose::Capture, stepped("cp_14", "p14", 150)),
            (15, Purpose::Void, stepped("vd_15", "v15", 350)),
            (16, Purpose::Capture, NOT_AUTHORIZED.to_owned()),
        ] {
            requests.push(answer(i, purpose, 5.0, body_status(&body), &body));
            requests.push(answer(
                i,
                Purpose::LateReplay,
                60.0,
                body_status(&body),
                &body,
            ));
        }
        let ledger = Ledger {
            captures,
            refunds,
            authorizations: vec![authorization(108, "a8"), authorization(113, "a13")],
            parts: vec![
                part("a8", "p9", 25, 10),
                part("a8", "p10", 300, 11),
                part("a8", "p12", 50, 30),
                part("a13", "p14", 150, 10),
            ],
            voids: vec![void("a13", "v15", 350, 20)],
        };
        (requests, ledger)
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
        let detail = |name: &str| verdicts[name].detail.as_str();
        assert_eq!(
            detail("one-capture-per-intent"),
            "7 intents, 4 captures and 2 authorizations in the ledger"
        );
        assert_eq!(
            detail("one-capture-per-capture-intent"),
            "6 capture intents sent, 4 captures of authorizations in the ledger"
        );
        assert_eq!(
            detail("captures-within-authorization"),
            "2 authorizations whose captures were sent, 4 captures answered 201"
        );
        assert_eq!(
            detail("nothing-captured-after-void"),
            "1 void intents sent, 1 voids in the ledger (1 after a partial capture)"
        );
        assert_eq!(
            detail("settles"),
            "7 intents, 3 refund intents, 7 capture and void intents"
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
                Box::new(|_, Ledger { captures: c, .. }| c.push(capture(101, "r9", 500))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|_, Ledger { captures: c, .. }| c.retain(|c| c.order_id != 102)),
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
                Box::new(|r, Ledger { captures: c, .. }| {
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
                Box::new(|_, Ledger { refunds: f, .. }| f.push(refund("r1", "s2", 25))),
            ),
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, Ledger { refunds: f, .. }| f.retain(|f| f.reference != "s1")),
            ),
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, Ledger { refunds: f, .. }| f.push(refund("r2", "x1", 7))),
            ),
            (
                &["one-refund-per-refund-intent"],
                Box::new(|_, Ledger { refunds: f, .. }| f.push(refund("r2", "x1", 40))),
            ),
            (
                &["refunds-within-capture"],
                Box::new(|r, Ledger { refunds: f, .. }| {
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
                Box::new(|r, Ledger { refunds: f, .. }| {
                    r.retain(|r| r.intent != 4);
                    r.push(answer(4, Purpose::Refund, 0.0, 409, "{}"));
                    r.push(answer(4, Purpose::Settle, 9.0, 422, "{}"));
                    f.retain(|f| f.reference != "s1");
                }),
            ),
            // Two-step payments.
            (
                &["one-capture-per-intent"],
                Box::new(|_, l| l.authorizations.push(authorization(108, "a8b"))),
            ),
            (
                &["one-capture-per-intent"],
                Box::new(|_, l| l.captures.push(capture(108, "x8", 500))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|_, l| l.authorizations.push(authorization(117, "a17"))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|r, _| {
                    let other = r#"{"id":"ch_8","acquirer_reference":"a9","status":"authorized"}"#;
                    answers_of(r, 8, other);
                }),
            ),
            // A retry sent under a new reference: captured twice.
            (
                &["one-capture-per-capture-intent"],
                Box::new(|_, l| l.parts.push(part("a8", "p9b", 25, 12))),
            ),
            // Said captured, never captured.
            (
                &["one-capture-per-capture-intent"],
                Box::new(|_, l| l.parts.retain(|c| c.reference != "p10")),
            ),
            // Said captured under another reference than the ledger's.
            (
                &["one-capture-per-capture-intent"],
                Box::new(|r, _| answers_of(r, 10, &stepped("cp_10", "p99", 300))),
            ),
            // Captured at an amount nobody asked for.
            (
                &["one-capture-per-capture-intent"],
                Box::new(|_, l| l.parts.push(part("a8", "x1", 7, 12))),
            ),
            // Check then capture: both raced captures made.
            (
                &["captures-within-authorization"],
                Box::new(|r, l| {
                    answers_of(r, 11, &stepped("cp_11", "p11", 301));
                    l.parts.push(part("a8", "p11", 301, 12));
                }),
            ),
            // Said captured past the authorization; the ledger has neither.
            (
                &[
                    "captures-within-authorization",
                    "one-capture-per-capture-intent",
                ],
                Box::new(|r, _| answers_of(r, 11, &stepped("cp_11", "p11", 301))),
            ),
            // The final capture made after the void.
            (
                &["nothing-captured-after-void"],
                Box::new(|r, l| {
                    answers_of(r, 16, &stepped("cp_16", "p16", 25));
                    l.parts.push(part("a13", "p16", 25, 30));
                }),
            ),
            // The void released everything, yet a capture was made.
            (
                &["nothing-captured-after-void"],
                Box::new(|r, l| {
                    answers_of(r, 15, &stepped("vd_15", "v15", 500));
                    l.voids[0].released_cents = 500;
                }),
            ),
            (
                &["nothing-captured-after-void"],
                Box::new(|r, _| answers_of(r, 15, &stepped("vd_15", "v15", 500))),
            ),
            // The capture refused for a closed authorization, yet made
            // (before the void).
            (
                &["answers-agree-with-ledger"],
                Box::new(|_, l| l.parts.push(part("a13", "p16", 25, 15))),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|r, _| answers_of(r, 12, CAPTURE_FAILED)),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|_, l| l.voids.clear()),
            ),
            (
                &["answers-agree-with-ledger"],
                Box::new(|r, _| answers_of(r, 15, &stepped("vd_15", "v99", 350))),
            ),
            (
                &["replays-identical"],
                Box::new(|r, _| {
                    let replay = r
                        .iter_mut()
                        .find(|r| r.intent == 9 && r.purpose == Purpose::LateReplay)
                        .unwrap();
                    replay.body_sha256 = Some(digest(b"other"));
                }),
            ),
            (
                &["contract-statuses"],
                Box::new(|r, _| r.push(answer(15, Purpose::Void, 0.5, 402, "{}"))),
            ),
            (
                &["settles"],
                Box::new(|r, _| {
                    r.retain(|r| r.intent != 16);
                    r.push(answer(16, Purpose::Capture, 0.0, 409, "{}"));
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
        let (mut requests, mut ledger) = healthy();
        answers_of(&mut requests, 5, FAILED);
        ledger.refunds.retain(|f| f.reference != "a1");
        requests.retain(|r| !(r.intent == 6 && r.purpose == Purpose::LateReplay));
        let paid = refunded("re_b", "b1", 301);
        requests.push(answer(6, Purpose::LateReplay, 60.0, 201, &paid));
        ledger.refunds.push(refund("r1", "b1", 301));
        let verdicts = judged(requests, ledger);
        assert_eq!(broken(&verdicts), Vec::<&str>::new(), "{verdicts:#?}");
    }

    #[test]
    fn an_over_capture_shows_every_capture_it_adds_up() {
        let (mut requests, mut ledger) = healthy();
        answers_of(&mut requests, 11, &stepped("cp_11", "p11", 301));
        ledger.parts.push(part("a8", "p11", 301, 12));
        let verdicts = judged(requests, ledger);
        let over = &verdicts["captures-within-authorization"].counterexamples;
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].intent, 8, "the authorization");
        assert_eq!(
            over[0].why,
            "its captures answered 201 sum to 676 cents (cp_9 25, cp_10 300, cp_11 301, cp_12 \
             50), more than the authorization's 500; the ledger captured 676 cents from auth_a8 \
             (cap_p9 25, cap_p10 300, cap_p12 50, cap_p11 301), more than its 500"
        );
    }

    #[test]
    fn a_capture_after_a_void_is_told_by_the_ledgers_clock() {
        let (mut requests, mut ledger) = healthy();
        answers_of(&mut requests, 16, &stepped("cp_16", "p16", 25));
        ledger.voids[0].at_micros = 20_000;
        ledger.parts.push(part("a13", "p16", 25, 30_500));
        let verdicts = judged(requests, ledger);
        let after = &verdicts["nothing-captured-after-void"].counterexamples;
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].intent, 13, "the authorization");
        assert_eq!(
            after[0].why,
            "the ledger captured from auth_a13 after void_v15 voided it at 20.0 ms (the \
             acquirer's clock): cap_p16 of 25 at 30.5 ms"
        );
        // A ledger without times cannot order them: a void that released
        // only what was left says nothing against a capture.
        let (mut requests, mut ledger) = healthy();
        answers_of(&mut requests, 16, &stepped("cp_16", "p16", 25));
        ledger.voids[0].at_micros = 0;
        ledger.parts.push(part("a13", "p16", 25, 0));
        let verdicts = judged(requests, ledger);
        assert!(verdicts["nothing-captured-after-void"].holds);
    }

    #[test]
    fn a_void_that_won_the_race_leaves_nothing_captured() {
        // The void first: it released all 500 cents, and the capture it
        // raced was refused for an authorization already closed.
        let (mut requests, mut ledger) = healthy();
        answers_of(&mut requests, 14, NOT_AUTHORIZED);
        answers_of(&mut requests, 15, &stepped("vd_15", "v15", 500));
        ledger.parts.retain(|c| c.reference != "p14");
        ledger.voids[0].released_cents = 500;
        let verdicts = judged(requests, ledger);
        assert_eq!(broken(&verdicts), Vec::<&str>::new(), "{verdicts:#?}");
    }

    #[test]
    fn an_over_refund_shows_every_refund_it_adds_up() {
        let (mut requests, mut ledger) = healthy();
        answers_of(&mut requests, 6, &refunded("re_b", "b1", 301));
        ledger.refunds.push(refund("r1", "b1", 301));
        let verdicts = judged(requests, ledger);
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
