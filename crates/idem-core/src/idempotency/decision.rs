//! The engine's decisions as pure functions, so every branch is tested here,
//! without a database or an acquirer; the engine carries them out.
//!
//! - [`found`]: what a request does with the key record it found when its
//!   claim lost, from the record and the request's fingerprint. The lease's
//!   remaining time is read on the database's clock (the one clock every
//!   instance shares), so no clock of this process takes part.
//! - [`verdict`]: what the attempt holding a record does with the acquirer's
//!   answer: store a final outcome, release the record for later, or hand
//!   the charge to a person.

use std::time::Duration;

use super::operation::{Final, Said};
use crate::acquirer::{AcquirerError, Contradiction, Unknown};
use crate::domain::Fingerprint;
use crate::store::{KeyState, Reschedule};

/// What a client is told to wait after an unknown outcome, unless the
/// acquirer asked for longer. The lease is released at once, so a retry may
/// re-drive immediately; one second spares the acquirer a hot loop while it
/// is failing.
pub(super) const UNKNOWN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer the found record calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// The key was first used with another request: `422`, naming the fields.
    Mismatch,
    /// The first outcome is stored: replay it, byte for byte.
    Replay,
    /// The charge awaits a person's review: `503`, and no acquirer call.
    UnderReview,
    /// Another attempt holds the lease, for `lease_remaining` more: `409`, at
    /// once.
    InFlight { lease_remaining: Duration },
    /// The holder's lease is over (it died or hung): take the record over
    /// and re-drive the acquirer with the same reference.
    TakeOver,
}

/// What a request with fingerprint `sent` does with a record made by a
/// request with fingerprint `stored`, now in `state`. A stored outcome is
/// replayed even when the charge was under review: the operator's decision
/// is that outcome.
pub(super) fn found(
    stored: &Fingerprint,
    state: &KeyState,
    under_review: bool,
    sent: &Fingerprint,
) -> Found {
    if stored != sent {
        return Found::Mismatch;
    }
    match state {
        KeyState::Completed { .. } => Found::Replay,
        KeyState::InFlight { .. } if under_review => Found::UnderReview,
        KeyState::InFlight { lease_remaining } if lease_remaining.is_zero() => Found::TakeOver,
        KeyState::InFlight { lease_remaining } => Found::InFlight {
            lease_remaining: *lease_remaining,
        },
    }
}

/// What the attempt holding a record does with the acquirer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Final: store it under the fencing token, and answer with it ever after.
    Final(Final),
    /// Money may or may not have moved: release the record with
    /// `reschedule`, and tell the client to retry after `retry_after`.
    Unknown {
        unknown: Unknown,
        reschedule: Reschedule,
        retry_after: Duration,
    },
    /// The echo is not this operation's (another amount, currency or
    /// order): to a person, at once.
    Contradicted(Contradiction),
}

/// The verdict on `result`. `backoff` is the reconciler's next wait when it is
/// the reconciler asking (`None` for a client's request): an unknown outcome
/// then counts as one of its tries, and the acquirer's `Retry-After` can only
/// lengthen the wait. A client is told to come back no sooner than
/// [`UNKNOWN_RETRY_AFTER`], or the acquirer's `Retry-After` if longer.
pub(super) fn verdict(result: Said, backoff: Option<Duration>) -> Verdict {
    let outcome = match result {
        Ok(acquirer_id) => Final::Done {
            acquirer_id: Some(acquirer_id),
        },
        Err(AcquirerError::Declined(d)) => Final::Declined { reason: d.reason },
        Err(AcquirerError::Rejected { reason, .. }) => Final::Refused { reason },
        Err(AcquirerError::Contradicted(c)) => return Verdict::Contradicted(c),
        Err(AcquirerError::Unknown(unknown)) => {
            let reschedule = match backoff {
                None => Reschedule {
                    not_before: unknown.retry_after,
                    reconciler_try: false,
                },
                Some(backoff) => Reschedule {
                    not_before: Some(backoff.max(unknown.retry_after.unwrap_or_default())),
                    reconciler_try: true,
                },
            };
            let retry_after = unknown
                .retry_after
                .map_or(UNKNOWN_RETRY_AFTER, |hint| hint.max(UNKNOWN_RETRY_AFTER));
            return Verdict::Unknown {
                unknown,
                reschedule,
                retry_after,
            };
        }
    };
    Verdict::Final(outcome)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::domain::{ChargeRequest, StoredResponse};

    fn fingerprint(amount_cents: i64) -> Fingerprint {
        let body = format!(r#"{{"order_id": 1, "amount_cents": {amount_cents}}}"#);
        Fingerprint::of_charge(&ChargeRequest::from_json(body.as_bytes()).expect("request"))
    }

    fn in_flight(lease_ms: u64) -> KeyState {
        KeyState::InFlight {
            lease_remaining: Duration::from_millis(lease_ms),
        }
    }

    fn completed() -> KeyState {
        KeyState::Completed {
            response: StoredResponse {
                status: 201,
                body: Bytes::from_static(b"{}"),
            },
            expires_in: Duration::from_secs(60),
        }
    }

    #[test]
    fn another_request_under_the_key_is_a_mismatch_whatever_the_record_holds() {
        let (stored, sent) = (fingerprint(100), fingerprint(999));
        for state in [completed(), in_flight(0), in_flight(5_000)] {
            for under_review in [false, true] {
                assert_eq!(
                    found(&stored, &state, under_review, &sent),
                    Found::Mismatch,
                    "{state:?}, under review: {under_review}"
                );
            }
        }
    }

    #[test]
    fn a_stored_outcome_is_replayed_even_for_a_charge_once_under_review() {
        let f = fingerprint(100);
        assert_eq!(found(&f, &completed(), false, &f), Found::Replay);
        assert_eq!(found(&f, &completed(), true, &f), Found::Replay);
    }

    #[test]
    fn a_charge_under_review_is_never_taken_over() {
        let f = fingerprint(100);
        assert_eq!(found(&f, &in_flight(0), true, &f), Found::UnderReview);
        assert_eq!(found(&f, &in_flight(5_000), true, &f), Found::UnderReview);
    }

    #[test]
    fn a_live_lease_is_waited_for_and_an_ended_one_taken_over() {
        let f = fingerprint(100);
        assert_eq!(
            found(&f, &in_flight(1), false, &f),
            Found::InFlight {
                lease_remaining: Duration::from_millis(1)
            }
        );
        assert_eq!(found(&f, &in_flight(0), false, &f), Found::TakeOver);
    }

    fn unknown(retry_after: Option<u64>) -> Said {
        Err(AcquirerError::Unknown(Unknown {
            why: "no answer".to_owned(),
            cause: "timeout".to_owned(),
            retry_after: retry_after.map(Duration::from_secs),
        }))
    }

    #[test]
    fn a_capture_a_decline_and_a_rejection_are_final() {
        use crate::acquirer::Declined;
        assert_eq!(
            verdict(Ok("cap_1".to_owned()), None),
            Verdict::Final(Final::Done {
                acquirer_id: Some("cap_1".to_owned())
            })
        );
        let declined = Err(AcquirerError::Declined(Declined {
            reason: "insufficient_funds".to_owned(),
        }));
        assert_eq!(
            verdict(declined, Some(Duration::from_secs(30))),
            Verdict::Final(Final::Declined {
                reason: "insufficient_funds".to_owned()
            })
        );
        let rejected = Err(AcquirerError::Rejected {
            status: 422,
            reason: Some("exceeds_capture".to_owned()),
        });
        assert_eq!(
            verdict(rejected, None),
            Verdict::Final(Final::Refused {
                reason: Some("exceeds_capture".to_owned())
            })
        );
    }

    #[test]
    fn an_unknown_outcome_for_a_client_keeps_the_reconcilers_schedule_and_says_when_to_retry() {
        let Verdict::Unknown {
            reschedule,
            retry_after,
            ..
        } = verdict(unknown(None), None)
        else {
            panic!("unknown")
        };
        assert_eq!(
            reschedule,
            Reschedule {
                not_before: None,
                reconciler_try: false
            }
        );
        assert_eq!(retry_after, UNKNOWN_RETRY_AFTER);
        // The acquirer's own Retry-After: longer is passed on, shorter is not.
        let Verdict::Unknown {
            reschedule,
            retry_after,
            ..
        } = verdict(unknown(Some(7)), None)
        else {
            panic!("unknown")
        };
        assert_eq!(reschedule.not_before, Some(Duration::from_secs(7)));
        assert_eq!(retry_after, Duration::from_secs(7));
        let Verdict::Unknown { retry_after, .. } = verdict(unknown(Some(0)), None) else {
            panic!("unknown")
        };
        assert_eq!(retry_after, UNKNOWN_RETRY_AFTER);
    }

    #[test]
    fn an_unknown_outcome_for_the_reconciler_is_one_of_its_tries_and_waits_the_longer() {
        let backoff = Some(Duration::from_secs(60));
        let Verdict::Unknown { reschedule, .. } = verdict(unknown(Some(5)), backoff) else {
            panic!("unknown")
        };
        assert_eq!(
            reschedule,
            Reschedule {
                not_before: Some(Duration::from_secs(60)),
                reconciler_try: true
            }
        );
        let Verdict::Unknown { reschedule, .. } = verdict(unknown(Some(600)), backoff) else {
            panic!("unknown")
        };
        assert_eq!(reschedule.not_before, Some(Duration::from_secs(600)));
        let Verdict::Unknown { reschedule, .. } = verdict(unknown(None), backoff) else {
            panic!("unknown")
        };
        assert_eq!(reschedule.not_before, Some(Duration::from_secs(60)));
    }

    #[test]
    fn a_contradicting_capture_goes_to_a_person() {
        let contradiction = Contradiction {
            capture_id: "cap_2".to_owned(),
            differences: vec!["amount_cents 4500 (asked 4400)".to_owned()],
        };
        assert_eq!(
            verdict(
                Err(AcquirerError::Contradicted(contradiction.clone())),
                None
            ),
            Verdict::Contradicted(contradiction)
        );
    }
}
