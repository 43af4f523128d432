//! A bounded memory of completed outcomes, so a replay is answered without a
//! database round trip.
//!
//! A completed key's stored answer cannot change until the key expires: no
//! statement rewrites a completed record (a finalize is fenced to in-flight
//! ones, an operator's resolve and retry too), and only an expired record may
//! be swept or claimed again. So an instance may repeat the answer from
//! memory until the expiry, as the database's clock sets it. The database
//! says how long the key has left (`expires_at - now()`, on its clock, in the
//! same statement that read the answer); the entry lives that long from
//! *before* the statement was sent, less a margin for the two clocks running
//! at different rates, so it always ends before the key does.
//!
//! Only a request with the stored fingerprint is answered from here; any other
//! (a `422`) goes to the database, which names the differing fields. In-flight
//! keys are never remembered (that is [`super::InFlightMemo`]'s short job).
//! The memory is bounded in bytes (`--replay-cache-bytes`, `0` turns it off)
//! and evicts the least useful entries first.

use std::time::{Duration, Instant};

use moka::sync::Cache;
use moka::Expiry;

use crate::domain::{Fingerprint, IdempotencyKey, StoredResponse, SubjectId};

/// The margin taken off every entry's life: a second, or a hundredth of the
/// time left if that is more (clock rates differ by far less than 1 %).
fn margin(expires_in: Duration) -> Duration {
    (expires_in / 100).max(Duration::from_secs(1))
}

/// Bytes an entry costs beyond its key and body: the fingerprint, the charge
/// id, the cache's own bookkeeping (`moka` keeps an `Arc`'d entry, a hash, a
/// queue node and a frequency sketch per key) and the allocator's slack. At
/// 160 here, 8 MiB of weight grew `serve`'s peak RSS by 15-19 MiB under new
/// charges (about 1.4 KiB an entry, for some 650 B weighed): the bound should
/// be about what the cache really holds.
const ENTRY_OVERHEAD: usize = 900;

/// One remembered outcome.
#[derive(Debug, Clone)]
struct Done {
    fingerprint: Fingerprint,
    subject: SubjectId,
    response: StoredResponse,
    /// When this instance stops answering from memory.
    until: Instant,
    /// Until when, at least, the key lives: what a replay says of it
    /// (`Idempotency-TTL`), the same as a replay read from the database would.
    key_lives_until: Instant,
}

/// Entries live until their own deadline.
struct UntilDeadline;

impl Expiry<(i64, String), Done> for UntilDeadline {
    fn expire_after_create(
        &self,
        _key: &(i64, String),
        value: &Done,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(value.until.saturating_duration_since(created_at))
    }
}

/// Completed outcomes by `(merchant, key)`. Cheap to clone; `off` remembers nothing.
#[derive(Clone)]
pub struct ReplayCache {
    entries: Option<Cache<(i64, String), Done>>,
}

impl ReplayCache {
    /// A cache of at most `max_bytes` (keys, bodies and overhead); 0: off.
    pub fn new(max_bytes: u64) -> Self {
        let entries = (max_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|(_, key): &(i64, String), done: &Done| {
                    u32::try_from(key.len() + done.response.body.len() + ENTRY_OVERHEAD)
                        .unwrap_or(u32::MAX)
                })
                .expire_after(UntilDeadline)
                .build()
        });
        Self { entries }
    }

    /// The stored answer for this very request, while the key surely lives,
    /// and until when, at least, the key lives.
    pub fn replay(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Option<(SubjectId, StoredResponse, Instant)> {
        let entries = self.entries.as_ref()?;
        let done = entries
            .get(&(merchant_id, key.as_str().to_owned()))
            .filter(|d| d.until > Instant::now() && d.fingerprint == *fingerprint);
        let result = if done.is_some() { "hit" } else { "miss" };
        metrics::counter!(crate::metrics::REPLAY_CACHE, "result" => result).increment(1);
        done.map(|d| (d.subject, d.response, d.key_lives_until))
    }

    /// Remembers a completed outcome whose key lives at least until
    /// `key_lives_until` on this host's clock: the statement's send time plus
    /// the time the database said the key had left (its `now()` came later).
    pub fn remember(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        subject: &SubjectId,
        response: &StoredResponse,
        key_lives_until: Instant,
    ) {
        let Some(entries) = &self.entries else {
            return;
        };
        let now = Instant::now();
        let left = key_lives_until.saturating_duration_since(now);
        let Some(until) = left.checked_sub(margin(left)).map(|life| now + life) else {
            return;
        };
        entries.insert(
            (merchant_id, key.as_str().to_owned()),
            Done {
                fingerprint,
                subject: subject.clone(),
                response: response.clone(),
                until,
                key_lives_until,
            },
        );
    }

    /// Entries held now (after pending evictions): for tests.
    #[cfg(test)]
    fn weighted_size(&self) -> u64 {
        self.entries.as_ref().map_or(0, |c| {
            c.run_pending_tasks();
            c.weighted_size()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ChargeRequest;

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey::parse(k.as_bytes()).unwrap()
    }

    fn fingerprint(order: u32) -> Fingerprint {
        let r = ChargeRequest::from_json(
            format!(r#"{{"order_id": {order}, "amount_cents": 100}}"#).as_bytes(),
        )
        .unwrap();
        Fingerprint::of_charge(&r)
    }

    fn response(len: usize) -> StoredResponse {
        StoredResponse {
            status: 201,
            body: vec![b'x'; len].into(),
        }
    }

    fn remember(cache: &ReplayCache, k: &str, expires_in: Duration, body: usize) {
        cache.remember(
            7,
            &key(k),
            fingerprint(1),
            &crate::domain::ChargeId::generate().into(),
            &response(body),
            Instant::now() + expires_in,
        );
    }

    #[test]
    fn only_the_same_request_of_the_same_merchant_is_answered() {
        let cache = ReplayCache::new(1 << 20);
        remember(&cache, "k", Duration::from_secs(60), 10);
        assert!(cache.replay(7, &key("k"), &fingerprint(1)).is_some());
        assert!(cache.replay(7, &key("k"), &fingerprint(2)).is_none());
        assert!(cache.replay(8, &key("k"), &fingerprint(1)).is_none());
    }

    #[test]
    fn an_entry_ends_before_the_key_by_the_margin() {
        let cache = ReplayCache::new(1 << 20);
        // Under the one-second margin: never remembered.
        remember(&cache, "short", Duration::from_millis(900), 10);
        assert!(cache.replay(7, &key("short"), &fingerprint(1)).is_none());
        // 1.2 s left: answered for about 0.2 s, then no more.
        remember(&cache, "brief", Duration::from_millis(1_200), 10);
        assert!(cache.replay(7, &key("brief"), &fingerprint(1)).is_some());
        std::thread::sleep(Duration::from_millis(250));
        assert!(cache.replay(7, &key("brief"), &fingerprint(1)).is_none());
        // A day left: the margin is a hundredth of it.
        assert_eq!(
            margin(Duration::from_secs(86_400)),
            Duration::from_secs(864)
        );
    }

    #[test]
    fn the_bytes_stay_bounded_and_off_remembers_nothing() {
        let cache = ReplayCache::new(64 * 1024);
        for i in 0..1_000 {
            remember(&cache, &format!("k{i}"), Duration::from_secs(60), 500);
        }
        assert!(
            cache.weighted_size() <= 64 * 1024,
            "{}",
            cache.weighted_size()
        );
        let off = ReplayCache::new(0);
        remember(&off, "k", Duration::from_secs(60), 10);
        assert!(off.replay(7, &key("k"), &fingerprint(1)).is_none());
    }
}
