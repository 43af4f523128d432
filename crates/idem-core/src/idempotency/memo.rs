//! A short memory of keys seen in flight, so a burst of duplicates is answered
//! `409` (or `422`) without a database round trip each.
//!
//! Only what cannot change is remembered: the fingerprint and request of a
//! record that another attempt holds. An entry lives
//! at most [`MEMO_FOR`] and never past the lease, so a take-over after a crash
//! is never delayed by it. The one thing it can get wrong is freshness: a
//! duplicate that arrives after the holder (on another instance) finished, but
//! while the entry lives, is told `409` instead of being replayed. The `409`
//! already tells the client to wait at least one second (`Retry-After`), the
//! same bound, so a client that follows it sees no difference. The holder's
//! own instance forgets the key as soon as it stores the outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::domain::{Fingerprint, IdempotencyKey, SubjectId};

/// The longest an in-flight key is remembered: the shortest `Retry-After`.
pub const MEMO_FOR: Duration = Duration::from_secs(1);

/// Above this many entries, expired ones are dropped on insert; a memo still
/// this full after that is cleared (a flood of distinct keys gains nothing).
const PRUNE_AT: usize = 4_096;

/// What is remembered of a key another attempt holds.
#[derive(Debug, Clone)]
pub struct Held<R> {
    pub fingerprint: Fingerprint,
    /// The request that holds the key, to name the fields another differs in.
    pub request: R,
    pub subject: SubjectId,
    until: Instant,
}

/// What is held, by merchant and key.
type Entries<R> = HashMap<(i64, String), Held<R>>;

/// Keys held in flight by requests of one kind `R` (a charge's, a refund's).
#[derive(Clone)]
pub struct InFlightMemo<R> {
    entries: Arc<Mutex<Entries<R>>>,
}

impl<R> Default for InFlightMemo<R> {
    fn default() -> Self {
        Self {
            entries: Arc::default(),
        }
    }
}

impl<R: Clone> InFlightMemo<R> {
    /// The live entry for a key, if any.
    pub fn get(&self, merchant_id: i64, key: &IdempotencyKey) -> Option<Held<R>> {
        let now = Instant::now();
        let entries = self.entries.lock().ok()?;
        entries
            .get(&(merchant_id, key.as_str().to_owned()))
            .filter(|h| h.until > now)
            .cloned()
    }

    /// Remembers a key seen in flight with `lease_remaining` left.
    pub fn hold(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        request: R,
        subject: SubjectId,
        lease_remaining: Duration,
    ) {
        if lease_remaining.is_zero() {
            return;
        }
        let now = Instant::now();
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.len() >= PRUNE_AT {
            entries.retain(|_, h| h.until > now);
            if entries.len() >= PRUNE_AT {
                entries.clear();
            }
        }
        entries.insert(
            (merchant_id, key.as_str().to_owned()),
            Held {
                fingerprint,
                request,
                subject,
                until: now + lease_remaining.min(MEMO_FOR),
            },
        );
    }

    /// Forgets a key: its outcome is stored.
    pub fn forget(&self, merchant_id: i64, key: &IdempotencyKey) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(&(merchant_id, key.as_str().to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ChargeId, ChargeRequest};

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey::parse(k.as_bytes()).unwrap()
    }

    fn request() -> ChargeRequest {
        ChargeRequest::from_json(br#"{"order_id": 1, "amount_cents": 100}"#).unwrap()
    }

    fn hold(memo: &InFlightMemo<ChargeRequest>, k: &str, lease: Duration) {
        let r = request();
        memo.hold(
            7,
            &key(k),
            Fingerprint::of_charge(&r),
            r,
            ChargeId::generate().into(),
            lease,
        );
    }

    #[test]
    fn an_entry_lives_no_longer_than_the_lease_nor_the_memo_bound() {
        let memo = InFlightMemo::<ChargeRequest>::default();
        hold(&memo, "short", Duration::from_millis(30));
        hold(&memo, "long", Duration::from_secs(30));
        let long = memo.get(7, &key("long")).expect("remembered");
        assert!(long.until <= Instant::now() + MEMO_FOR);
        assert!(memo.get(7, &key("short")).is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(memo.get(7, &key("short")).is_none(), "gone with its lease");
        assert!(
            memo.get(8, &key("long")).is_none(),
            "scoped to the merchant"
        );
    }

    #[test]
    fn a_spent_lease_is_not_remembered_and_forget_forgets() {
        let memo = InFlightMemo::<ChargeRequest>::default();
        hold(&memo, "spent", Duration::ZERO);
        assert!(memo.get(7, &key("spent")).is_none());
        hold(&memo, "k", Duration::from_secs(5));
        memo.forget(7, &key("k"));
        assert!(memo.get(7, &key("k")).is_none());
    }

    #[test]
    fn a_flood_of_keys_stays_bounded() {
        let memo = InFlightMemo::<ChargeRequest>::default();
        for i in 0..3 * PRUNE_AT {
            hold(&memo, &format!("k{i}"), Duration::from_secs(5));
        }
        assert!(memo.entries.lock().unwrap().len() <= PRUNE_AT);
    }
}
