//! Which of a strategy's intents the demo draws, and what each drawing's
//! heading says. Every sample is picked from the recorded data, never named in
//! advance: a double charge under check-then-act, a retry stuck behind the
//! lock under hold-transaction, a retry answered `409` at once under idem.
//! The drawing itself is [`crate::timeline`]'s.

use super::Strategy;
use crate::timeline::{self, AttemptEnd, IntentKind, IntentTrace};

/// How telling an intent is for its strategy; the highest of each kind is drawn.
fn score(strategy: Strategy, t: &IntentTrace) -> i64 {
    let captures = t.captures_ms.len() as i64;
    let telling = match strategy {
        Strategy::CheckThenAct => captures >= 2,
        Strategy::HoldTransaction => captures == 1 && t.has_retry_timed_out(),
        Strategy::Idem => {
            captures == 1
                && t.has_status(409)
                && t.attempts.iter().any(|a| a.number > 0)
                && t.attempts
                    .iter()
                    .all(|a| a.end != AttemptEnd::Timeout || a.number == 0)
        }
    };
    // Then the fewest attempts: the story is easier to read with fewer lanes.
    i64::from(telling) * 1_000_000 - t.attempts.len() as i64
}

/// A few intents of one strategy worth drawing: the most telling retried
/// intent and the most telling burst.
pub(super) fn pick_samples(strategy: Strategy, traces: &[IntentTrace]) -> Vec<IntentTrace> {
    [IntentKind::Retried, IntentKind::Burst]
        .into_iter()
        .filter_map(|kind| {
            traces
                .iter()
                .filter(|t| t.kind == kind && !t.attempts.is_empty())
                .max_by_key(|t| (score(strategy, t), -t.order_id))
                .cloned()
        })
        .collect()
}

/// What the sample's heading says happened.
fn headline(strategy: Strategy, t: &IntentTrace) -> String {
    let kind = match t.kind {
        IntentKind::Retried => "a client that timed out and retried on the next instance",
        IntentKind::Burst => "simultaneous duplicates from several clients",
    };
    let captures = t.captures_ms.len();
    let outcome = match captures {
        0 => "never captured".to_owned(),
        1 => "captured once".to_owned(),
        n => format!("captured {n} times: a double charge"),
    };
    let why = match strategy {
        Strategy::CheckThenAct if captures > 1 => {
            let checks = t.checks_before_first_insert();
            format!("; {checks} checks found no row before the first insert")
        }
        Strategy::HoldTransaction if t.has_retry_timed_out() => {
            "; its retries waited on the lock held across the acquirer call until the client gave up".to_owned()
        }
        Strategy::Idem if t.has_status(409) => {
            "; a retry in flight is answered 409 at once, then the stored answer".to_owned()
        }
        _ => String::new(),
    };
    format!("order {} — {kind}: {outcome}{why}", t.order_id)
}

/// One sample as a figure, headed by what happened to it.
pub(super) fn sample_svg(strategy: Strategy, t: &IntentTrace) -> String {
    timeline::sample_svg(&headline(strategy, t), strategy.name(), t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::tests::{span, trace};
    use crate::timeline::ServerStep;

    #[test]
    fn the_double_charge_is_picked_under_check_then_act() {
        let once = trace(1, vec![span(0, 0, 0.0, 5.0, AttemptEnd::Status(201))], 1);
        let twice = trace(
            2,
            vec![
                span(0, 0, 0.0, 250.0, AttemptEnd::Timeout),
                span(0, 1, 270.0, 880.0, AttemptEnd::Status(201)),
            ],
            2,
        );
        let picked = pick_samples(Strategy::CheckThenAct, &[once, twice]);
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].order_id, 2);
    }

    #[test]
    fn a_retry_answered_409_is_picked_under_idem() {
        let plain = trace(1, vec![span(0, 0, 0.0, 600.0, AttemptEnd::Status(201))], 1);
        let retried = trace(
            2,
            vec![
                span(0, 0, 0.0, 250.0, AttemptEnd::Timeout),
                span(0, 1, 270.0, 272.0, AttemptEnd::Status(409)),
                span(0, 2, 300.0, 302.0, AttemptEnd::Status(201)),
            ],
            1,
        );
        let picked = pick_samples(Strategy::Idem, &[plain, retried]);
        assert_eq!(picked[0].order_id, 2);
        let svg = sample_svg(Strategy::Idem, &picked[0]);
        assert_eq!(svg.matches("class=\"lane attempt\"").count(), 3);
        assert!(svg.contains(">409</text>") && svg.contains("class=\"capture\""));
    }

    #[test]
    fn the_window_is_drawn_when_two_checks_precede_the_first_insert() {
        let mut t = trace(
            3,
            vec![
                span(0, 0, 0.0, 620.0, AttemptEnd::Status(201)),
                span(1, 0, 1.0, 622.0, AttemptEnd::Status(201)),
            ],
            2,
        );
        t.kind = IntentKind::Burst;
        t.server = vec![
            (ServerStep::CheckedEmpty, 1.0),
            (ServerStep::CheckedEmpty, 2.0),
            (ServerStep::Inserted, 21.0),
            (ServerStep::Inserted, 22.0),
        ];
        let svg = sample_svg(Strategy::CheckThenAct, &t);
        assert!(svg.contains("class=\"window\""), "{svg}");
        assert!(svg.contains("2 checks found no row before the first insert"));
        assert!(svg.contains("data-captures=\"2\""));
    }
}
