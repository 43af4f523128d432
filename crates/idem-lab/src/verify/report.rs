//! The verdicts, for a terminal (one line per invariant, then a few
//! counterexamples with the intent's requests and what the ledger holds for
//! it), as JSON, and as an HTML page that draws each violating intent on a
//! time axis. A charge's counterexample for a refund invariant also shows its
//! refund intents, whose requests tell that story; an authorization's for a
//! capture or void invariant, its capture and void intents.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::history::{History, Intent, Kind, Request};
use super::invariants::{what, Verdict, ABOUT_REFUNDS, ABOUT_STEPS};
use super::{all_hold, Outcome, Phases, VerifyConfig};
use crate::sim::{LedgerCapture, LedgerRefund};
use crate::timeline::{
    self, escape, instance_name, AttemptEnd, AttemptSpan, IntentKind, IntentTrace,
};

/// Counterexamples the terminal shows per broken invariant (the HTML shows more).
const SHOWN: usize = 3;
/// Counterexamples the HTML page draws per broken invariant.
const DRAWN: usize = 10;

/// A run's figures and verdicts (`--json` prints this).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run: String,
    #[serde(skip)]
    pub run_id: u64,
    pub urls: Vec<String>,
    pub ledger: String,
    /// Charge intents.
    pub intents: usize,
    /// Of them, those sent with `"capture": false`: authorizations.
    pub authorizations: usize,
    /// Refund intents sent (those of the charges captured during the workload).
    pub refund_intents: usize,
    /// Capture and void intents sent (those of the authorizations made during
    /// the workload).
    pub step_intents: usize,
    pub requests: usize,
    pub fault_cmd_runs: usize,
    pub fault_cmd_failed: usize,
    pub simulator_steps: usize,
    pub unsettled_after_workload: usize,
    pub settled_later: usize,
    pub late_replays: usize,
    pub seconds: f64,
    pub verdicts: Vec<Verdict>,
    /// Every invariant held.
    pub holds: bool,
}

impl Report {
    pub(super) fn new(
        run_id: u64,
        config: &VerifyConfig,
        history: &History,
        verdicts: &[Verdict],
        phases: Phases,
        took: Duration,
    ) -> Self {
        let runs = |source: &'static str| history.faults.iter().filter(move |f| f.source == source);
        let sent = |what: fn(&Intent) -> bool| {
            history
                .intents
                .iter()
                .filter(|i| what(i) && history.requests.iter().any(|r| r.intent == i.index))
                .count()
        };
        Self {
            run: run_id.to_string(),
            run_id,
            urls: config.urls.clone(),
            ledger: config.ledger_url.clone(),
            intents: history.intents.iter().filter(|i| i.is_charge()).count(),
            authorizations: history.intents.iter().filter(|i| i.authorize).count(),
            refund_intents: sent(Intent::is_refund),
            step_intents: sent(Intent::is_step),
            requests: history.requests.len(),
            fault_cmd_runs: runs("fault-cmd").count(),
            fault_cmd_failed: runs("fault-cmd").filter(|f| !f.ok).count(),
            simulator_steps: runs("simulator").count(),
            unsettled_after_workload: phases.unsettled_after_workload,
            settled_later: phases.settled_later,
            late_replays: phases.late_replays,
            seconds: took.as_secs_f64(),
            verdicts: verdicts.to_vec(),
            holds: all_hold(verdicts),
        }
    }

    /// The last line: all hold, or which do not.
    pub fn verdict_line(&self) -> String {
        let broken: Vec<&str> = self
            .verdicts
            .iter()
            .filter(|v| !v.holds)
            .map(|v| v.name)
            .collect();
        if broken.is_empty() {
            format!(
                "verdict: all {} invariants hold (run {}, {:.1} s)",
                self.verdicts.len(),
                self.run,
                self.seconds
            )
        } else {
            format!(
                "verdict: BROKEN, {} of {} invariants do not hold: {} (run {}, {:.1} s)",
                broken.len(),
                self.verdicts.len(),
                broken.join(", "),
                self.run,
                self.seconds
            )
        }
    }
}

/// What happened, one line per invariant, the counterexamples, the verdict.
pub(super) fn text(outcome: &Outcome) -> String {
    let r = &outcome.report;
    let mut out = String::new();
    for (i, url) in r.urls.iter().enumerate() {
        let _ = writeln!(out, "{} = {url}", instance_name(i));
    }
    let failed = if r.fault_cmd_failed == 0 {
        "none failed".to_owned()
    } else {
        let last = outcome
            .history
            .faults
            .iter()
            .rfind(|f| f.source == "fault-cmd" && !f.ok)
            .map_or(String::new(), |f| format!(", the last: {}", f.what));
        format!("{} FAILED{last}", r.fault_cmd_failed)
    };
    let _ = writeln!(
        out,
        "faults: --fault-cmd ran {} times ({failed}); the simulator's script took {} steps",
        r.fault_cmd_runs, r.simulator_steps
    );
    let _ = writeln!(
        out,
        "requests: {} for {} intents ({} authorizations), {} refund intents and {} capture and void intents; {} without a final answer when the faults stopped, {} of them settled after; {} late replays\n",
        r.requests,
        r.intents,
        r.authorizations,
        r.refund_intents,
        r.step_intents,
        r.unsettled_after_workload,
        r.settled_later,
        r.late_replays
    );
    let width = r.verdicts.iter().map(|v| v.name.len()).max().unwrap_or(0);
    for v in &r.verdicts {
        let _ = writeln!(
            out,
            "{:<width$} {:<7} {}{}",
            v.name,
            if v.holds { "holds" } else { "BROKEN" },
            v.detail,
            if v.holds {
                String::new()
            } else {
                format!("; {} intent(s) break it", v.counterexamples.len())
            }
        );
    }
    for v in r.verdicts.iter().filter(|v| !v.holds) {
        let _ = writeln!(out, "\n{}:", v.name);
        for c in v.counterexamples.iter().take(SHOWN) {
            out.push_str(&counterexample_text(outcome, v.name, c.intent, &c.why));
        }
        if v.counterexamples.len() > SHOWN {
            let _ = writeln!(
                out,
                "  ... and {} more (the HTML report and --history have them all)",
                v.counterexamples.len() - SHOWN
            );
        }
    }
    let _ = writeln!(out, "\n{}", r.verdict_line());
    out
}

/// One intent that broke an invariant: why, its requests in time order (for
/// a charge and a refund invariant, its refund intents' too; for an
/// authorization and a capture or void invariant, its step intents'), what
/// the ledger holds for it.
fn counterexample_text(outcome: &Outcome, invariant: &str, index: usize, why: &str) -> String {
    let Some(intent) = outcome.history.intents.get(index) else {
        return String::new();
    };
    let what = match intent.parent() {
        Some(charge) => format!("intent {index}, a {} of intent {charge}", intent.noun()),
        None if intent.authorize => format!("intent {index}, an authorization"),
        None => format!("intent {index}"),
    };
    let mut out = format!(
        "  {what} (key {}, order {}{}): {why}\n",
        intent.key,
        intent.order_id,
        cents(intent)
    );
    for r in outcome.history.of(index) {
        let _ = writeln!(out, "    {}", request_line(r));
    }
    for told in told_by(outcome, invariant, intent) {
        let _ = writeln!(
            out,
            "    {} intent {} (key {}{}):",
            told.noun(),
            told.index,
            told.key,
            cents(told)
        );
        for r in outcome.history.of(told.index) {
            let _ = writeln!(out, "      {}", request_line(r));
        }
    }
    if intent.authorize || intent.is_step() {
        out.push_str(&two_step_ledger(outcome, intent.order_id));
        return out;
    }
    let captures = captures_of(outcome, intent.order_id);
    if captures.is_empty() {
        out.push_str("    ledger: no capture\n");
    }
    for (c, at) in captures {
        let _ = writeln!(
            out,
            "    ledger: {} of {} {}, reference {}{}",
            c.capture_id,
            c.amount_cents,
            c.currency,
            c.reference,
            at_ms(at)
        );
    }
    for (f, at) in refunds_of(outcome, intent.order_id) {
        let _ = writeln!(
            out,
            "    ledger: {} of {} {} from {}, reference {}{}",
            f.refund_id,
            f.amount_cents,
            f.currency,
            f.capture_id,
            f.reference,
            at_ms(at)
        );
    }
    out
}

/// `, 25005 cents` (nothing for a void, which names no amount).
fn cents(intent: &Intent) -> String {
    if intent.is_void() {
        String::new()
    } else {
        format!(", {} cents", intent.amount_cents)
    }
}

/// What the ledger holds for the authorization of `order_id`: the
/// authorization, its captures and its voids.
fn two_step_ledger(outcome: &Outcome, order_id: i64) -> String {
    let mut out = String::new();
    let authorizations: Vec<_> = outcome
        .authorizations()
        .into_iter()
        .filter(|(a, _)| a.order_id == order_id)
        .collect();
    if authorizations.is_empty() {
        out.push_str("    ledger: no authorization\n");
    }
    for (a, at) in &authorizations {
        let _ = writeln!(
            out,
            "    ledger: {} of {} {} authorized, reference {}{}",
            a.authorization_id,
            a.amount_cents,
            a.currency,
            a.reference,
            at_ms(*at)
        );
    }
    let references: Vec<&str> = authorizations
        .iter()
        .map(|(a, _)| a.reference.as_str())
        .collect();
    for (c, at) in outcome.authorization_captures() {
        if references.contains(&c.authorization_reference.as_str()) {
            let _ = writeln!(
                out,
                "    ledger: {} of {} {} from {}{}, reference {}{}",
                c.capture_id,
                c.amount_cents,
                c.currency,
                c.authorization_id,
                if c.final_capture { ", final" } else { "" },
                c.reference,
                at_ms(at)
            );
        }
    }
    for (v, at) in outcome.voids() {
        if references.contains(&v.authorization_reference.as_str()) {
            let _ = writeln!(
                out,
                "    ledger: {} of {}, released {} cents, reference {}{}",
                v.void_id,
                v.authorization_id,
                v.released_cents,
                v.reference,
                at_ms(at)
            );
        }
    }
    for (c, at) in captures_of(outcome, order_id) {
        let _ = writeln!(
            out,
            "    ledger: {} of {} {} captured at once, reference {}{}",
            c.capture_id,
            c.amount_cents,
            c.currency,
            c.reference,
            at_ms(at)
        );
    }
    out
}

fn at_ms(at: Option<f64>) -> String {
    at.map_or(String::new(), |ms| format!(" at {ms:.1} ms"))
}

/// The intents that tell a charge's story for a refund invariant (its
/// refund intents), or an authorization's for a capture or void invariant
/// (its step intents); none for another intent, or another invariant.
fn told_by<'a>(outcome: &'a Outcome, invariant: &str, intent: &Intent) -> Vec<&'a Intent> {
    if !intent.is_charge() {
        return Vec::new();
    }
    if ABOUT_REFUNDS.contains(&invariant) {
        return outcome.history.refunds_of(intent.index).collect();
    }
    if intent.authorize && ABOUT_STEPS.contains(&invariant) {
        return outcome.history.steps_of(intent.index).collect();
    }
    Vec::new()
}

fn request_line(r: &Request) -> String {
    let digest = r.body_sha256.as_deref().map_or(String::new(), |d| {
        format!(", body sha256 {}", &d[..12.min(d.len())])
    });
    let error = match (&r.error, r.status) {
        (Some(e), None) if e != super::history::TIMEOUT => format!(" ({e})"),
        _ => String::new(),
    };
    format!(
        "{:>9.1} ms  {}: {}{error} after {:.1} ms{digest}",
        r.sent_ms,
        what(r),
        r.outcome(),
        r.latency_ms()
    )
}

fn captures_of(outcome: &Outcome, order_id: i64) -> Vec<(&LedgerCapture, Option<f64>)> {
    outcome
        .captures()
        .into_iter()
        .filter(|(c, _)| c.order_id == order_id)
        .collect()
}

/// The ledger's refunds of the captures of `order_id`.
fn refunds_of(outcome: &Outcome, order_id: i64) -> Vec<(&LedgerRefund, Option<f64>)> {
    let references: Vec<&str> = captures_of(outcome, order_id)
        .into_iter()
        .map(|(c, _)| c.reference.as_str())
        .collect();
    outcome
        .refunds()
        .into_iter()
        .filter(|(f, _)| references.contains(&f.capture_reference.as_str()))
        .collect()
}

/// The intent as the timeline draws it: its requests (for a charge and a
/// refund invariant, its refund intents', a lane per client; for an
/// authorization and a capture or void invariant, its step intents') and
/// where the money moved (its captures; for a refund, or a charge and a
/// refund invariant, the refunds; for an authorization, its authorization,
/// or its captures and voids).
fn trace(outcome: &Outcome, invariant: &str, index: usize) -> Option<IntentTrace> {
    let intent = outcome.history.intents.get(index)?;
    let told = told_by(outcome, invariant, intent);
    let (kind, attempts, money_ms) = if told.is_empty() {
        let money: Vec<Option<f64>> = if intent.is_refund() {
            refunds_of(outcome, intent.order_id)
                .into_iter()
                .filter(|(f, _)| f.amount_cents == intent.amount_cents)
                .map(|(_, at)| at)
                .collect()
        } else if intent.is_capture() {
            step_moves(outcome, intent.order_id)
                .into_iter()
                .filter(|(cents, _)| *cents == Some(intent.amount_cents))
                .map(|(_, at)| at)
                .collect()
        } else if intent.is_void() {
            step_moves(outcome, intent.order_id)
                .into_iter()
                .filter(|(cents, _)| cents.is_none())
                .map(|(_, at)| at)
                .collect()
        } else if intent.authorize {
            outcome
                .authorizations()
                .into_iter()
                .filter(|(a, _)| a.order_id == intent.order_id)
                .map(|(_, at)| at)
                .collect()
        } else {
            captures_of(outcome, intent.order_id)
                .into_iter()
                .map(|(_, at)| at)
                .collect()
        };
        (intent.kind, spans(outcome, index, 0).0, money)
    } else {
        // Each refund or step intent's clients on lanes of their own.
        let mut attempts = Vec::new();
        let mut lanes = 0;
        for other in &told {
            let (mine, clients) = spans(outcome, other.index, lanes);
            attempts.extend(mine);
            lanes += clients;
        }
        let money = if intent.authorize {
            step_moves(outcome, intent.order_id)
                .into_iter()
                .map(|(_, at)| at)
                .collect()
        } else {
            refunds_of(outcome, intent.order_id)
                .into_iter()
                .map(|(_, at)| at)
                .collect()
        };
        (Kind::Burst, attempts, money)
    };
    Some(IntentTrace {
        kind: match kind {
            Kind::Retried => IntentKind::Retried,
            Kind::Burst => IntentKind::Burst,
        },
        order_id: intent.order_id,
        attempts,
        captures_ms: money_ms.into_iter().flatten().collect(),
        server: Vec::new(),
    })
}

/// The ledger's captures (with their amount) and voids (`None`) of the
/// authorization of `order_id`, each with when it was made.
fn step_moves(outcome: &Outcome, order_id: i64) -> Vec<(Option<i64>, Option<f64>)> {
    let captures = outcome
        .authorization_captures()
        .into_iter()
        .filter(|(c, _)| c.order_id == order_id)
        .map(|(c, at)| (Some(c.amount_cents), at));
    let voids = outcome
        .voids()
        .into_iter()
        .filter(|(v, _)| v.order_id == order_id)
        .map(|(_, at)| (None, at));
    captures.chain(voids).collect()
}

/// The intent's requests as the timeline's attempts, its clients numbered
/// from `first_lane`; and how many clients it had.
fn spans(outcome: &Outcome, index: usize, first_lane: usize) -> (Vec<AttemptSpan>, usize) {
    let mut per_copy = std::collections::HashMap::<usize, usize>::new();
    let attempts: Vec<AttemptSpan> = outcome
        .history
        .of(index)
        .into_iter()
        .filter(|r| r.purpose.sends_the_intent())
        .map(|r| {
            let number = per_copy.entry(r.copy).or_default();
            let span = AttemptSpan {
                copy: first_lane + r.copy,
                number: *number,
                instance: r.instance,
                sent_ms: r.sent_ms,
                ended_ms: r.received_ms,
                end: match (r.status, r.error.as_deref()) {
                    (Some(s), _) => AttemptEnd::Status(s),
                    (None, Some(super::history::TIMEOUT)) => AttemptEnd::Timeout,
                    (None, _) => AttemptEnd::Failed,
                },
            };
            *number += 1;
            span
        })
        .collect();
    let clients = per_copy.keys().max().map_or(0, |c| c + 1);
    (attempts, clients)
}

pub(super) fn write_html(outcome: &Outcome, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, html(outcome))?;
    Ok(())
}

fn html(outcome: &Outcome) -> String {
    let r = &outcome.report;
    let mut out = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>idem-lab verify: run {run}</title><style>\
         body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse}}td,th{{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}}\
         .broken{{color:#c0392b;font-weight:bold}}.holds{{color:#1e8449}}\
         pre{{background:#f6f6f6;padding:6px;overflow-x:auto;font-size:12px}}\
         </style></head><body><h1>idem-lab verify: run {run}</h1><p class=\"verdict\">{verdict}</p>\
         <p>{intents} intents ({authorizations} authorizations), {refund_intents} refund intents and {step_intents} capture and void intents, {requests} requests against {urls}; ledger {ledger}. \
         --fault-cmd ran {runs} times ({failed} failed); the simulator's script took {steps} steps.</p>\
         <table><tr><th>invariant</th><th>verdict</th><th>checked</th><th>intents that break it</th></tr>",
        run = escape(&r.run),
        verdict = escape(&r.verdict_line()),
        intents = r.intents,
        authorizations = r.authorizations,
        refund_intents = r.refund_intents,
        step_intents = r.step_intents,
        requests = r.requests,
        urls = escape(
            &r.urls
                .iter()
                .enumerate()
                .map(|(i, u)| format!("{} = {u}", instance_name(i)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ledger = escape(&r.ledger),
        runs = r.fault_cmd_runs,
        failed = r.fault_cmd_failed,
        steps = r.simulator_steps,
    );
    for v in &r.verdicts {
        let class = if v.holds { "holds" } else { "broken" };
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(v.name),
            if v.holds { "holds" } else { "BROKEN" },
            escape(&v.detail),
            v.counterexamples.len()
        );
    }
    out.push_str("</table>");
    if !r.holds {
        out.push_str(
            "<h2>Counterexamples</h2><p>Each intent that broke an invariant, on the run's clock \
             (ms since it began): one lane per request as the client saw it (for a charge's \
             refunds, one per refund client; for an authorization's captures and void, one per \
             capture or void client), the acquirer's captures (or refunds, authorizations, \
             voids) below.</p>",
        );
        out.push_str(&timeline::legend(false));
    }
    for v in r.verdicts.iter().filter(|v| !v.holds) {
        let _ = write!(
            out,
            "<section class=\"invariant\" data-name=\"{0}\"><h3>{0}</h3>",
            escape(v.name)
        );
        for c in v.counterexamples.iter().take(DRAWN) {
            if let Some(t) = trace(outcome, v.name, c.intent) {
                let caption = format!("intent {}: {}", c.intent, c.why);
                out.push_str(&timeline::sample_svg(&caption, v.name, &t));
            }
            let _ = write!(
                out,
                "<pre>{}</pre>",
                escape(&counterexample_text(outcome, v.name, c.intent, &c.why))
            );
        }
        if v.counterexamples.len() > DRAWN {
            let _ = write!(
                out,
                "<p>... and {} more in --history.</p>",
                v.counterexamples.len() - DRAWN
            );
        }
        out.push_str("</section>");
    }
    out.push_str("</body></html>\n");
    out
}
