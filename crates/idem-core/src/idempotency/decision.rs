//! What a request does with the key record it found when its claim lost: a
//! pure function of the record and of the request's fingerprint, so every
//! branch is tested here, without a database. The engine carries it out.
//! The lease's remaining time is read on the database's clock (the one clock
//! every instance shares), so no clock of this process takes part.

use std::time::Duration;

use crate::domain::Fingerprint;
use crate::store::KeyState;

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
}
