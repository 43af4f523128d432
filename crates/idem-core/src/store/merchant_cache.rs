//! Merchants found by a secret's hash or a name, kept briefly in memory, and
//! forgotten on every instance within a second or two of a change to who may
//! authenticate.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::error::StoreError;
use super::Store;
use crate::domain::Merchant;

/// Longest a found merchant is trusted without asking the database again.
const CACHE_TTL: Duration = Duration::from_secs(60);

/// How often [`MerchantCache::keep_fresh`] reads the merchants version.
pub const VERSION_POLL: Duration = Duration::from_secs(1);

/// How long a read of the merchants version vouches for the cache: past it
/// (the database has not answered for that long, or nothing keeps the cache
/// fresh), every look-up asks the database. Above [`VERSION_POLL`] so that
/// one slow read does not empty the cache.
const VERSION_TRUSTED_FOR: Duration = Duration::from_secs(3);

/// Merchants found by some key (a secret's hash, a name), cached so a request
/// or command does not pay a query for its merchant. Only positive answers
/// are kept, so a merchant created a moment ago is found at once.
///
/// Revocation: every rotation, disable and enable moves the database's
/// merchants version in its own transaction. [`MerchantCache::keep_fresh`]
/// reads it every [`VERSION_POLL`]; an entry is trusted only while it was
/// loaded under the version last read, and that read is recent. So a revoked
/// secret stops working on every instance within about a second, and a cache
/// nobody keeps fresh (or one cut off from its database) trusts nothing. An
/// entry also ends when its secret does (a rotation's grace), whatever the
/// version. Std locks, not tokio ones: never held across an await.
pub struct MerchantCache<K> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    entries: RwLock<HashMap<K, Entry>>,
    seen: Mutex<Seen>,
}

struct Entry {
    merchant: Merchant,
    /// Untrusted from then on: [`CACHE_TTL`], or sooner if the secret ends sooner.
    until: Instant,
    /// The merchants version read before this entry was loaded.
    version: Option<i64>,
}

/// The merchants version last read, and when.
#[derive(Default, Clone, Copy)]
struct Seen {
    version: Option<i64>,
    at: Option<Instant>,
}

impl<K> Clone for MerchantCache<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Default for MerchantCache<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                entries: RwLock::default(),
                seen: Mutex::default(),
            }),
        }
    }
}

impl<K: Hash + Eq + Clone> MerchantCache<K> {
    /// Whether `key` was ever found, trusted or not: a key worth asking the
    /// database about again.
    pub fn knows(&self, key: &K) -> bool {
        self.inner.entries.read().is_ok_and(|e| e.contains_key(key))
    }

    /// The cached merchant under `key` while its entry is trusted; else what
    /// `load` finds (the merchant, and how long its finding holds: `None` for
    /// as long as the cache may trust anything), cached if found.
    pub async fn get_or_load<F, Fut>(
        &self,
        key: &K,
        load: F,
    ) -> Result<Option<Merchant>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<(Merchant, Option<Duration>)>, StoreError>>,
    {
        let seen = self.seen();
        let trusted = seen.at.is_some_and(|at| at.elapsed() < VERSION_TRUSTED_FOR);
        if trusted {
            let entries = self.inner.entries.read().ok();
            let hit = entries.as_ref().and_then(|e| e.get(key)).and_then(|e| {
                (e.version == seen.version && Instant::now() < e.until).then(|| e.merchant.clone())
            });
            if hit.is_some() {
                return Ok(hit);
            }
        }
        let found = load().await?;
        let Some((merchant, expires_in)) = found else {
            if let Ok(mut entries) = self.inner.entries.write() {
                entries.remove(key);
            }
            return Ok(None);
        };
        if let Ok(mut entries) = self.inner.entries.write() {
            let ttl = expires_in.map_or(CACHE_TTL, |left| left.min(CACHE_TTL));
            entries.insert(
                key.clone(),
                Entry {
                    merchant: merchant.clone(),
                    until: Instant::now() + ttl,
                    version: seen.version,
                },
            );
        }
        Ok(Some(merchant))
    }

    /// Reads the merchants version every [`VERSION_POLL`] until `shutdown`,
    /// forgetting every entry when it has moved. The cache trusts its entries
    /// only while this runs and the database answers.
    pub async fn keep_fresh(self, store: Store, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            match store.merchants_version().await {
                Ok(version) => {
                    self.saw(version);
                    failing = false;
                }
                Err(e) if !failing => {
                    tracing::warn!(error = %e, "cannot read the merchants version; \
                        merchants are looked up on every request until it answers");
                    failing = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(VERSION_POLL) => {}
            }
        }
    }

    fn seen(&self) -> Seen {
        self.inner.seen.lock().map(|s| *s).unwrap_or_default()
    }

    fn saw(&self, version: i64) {
        let Ok(mut seen) = self.inner.seen.lock() else {
            return;
        };
        if seen.version != Some(version) {
            if let Ok(mut entries) = self.inner.entries.write() {
                entries.clear();
            }
            seen.version = Some(version);
        }
        seen.at = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn merchant() -> Merchant {
        Merchant {
            id: 7,
            name: "loja".to_owned(),
        }
    }

    async fn get(
        cache: &MerchantCache<&'static str>,
        calls: &AtomicUsize,
        expires_in: Option<Duration>,
    ) -> Option<Merchant> {
        cache
            .get_or_load(&"k", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(Some((merchant(), expires_in)))
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn entries_are_trusted_only_under_the_version_last_read() {
        let cache = MerchantCache::default();
        let calls = AtomicUsize::new(0);
        get(&cache, &calls, None).await;
        get(&cache, &calls, None).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "no version read: no trust");

        cache.saw(1);
        get(&cache, &calls, None).await;
        get(&cache, &calls, None).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "cached under version 1");

        cache.saw(1);
        get(&cache, &calls, None).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "the same version keeps it");

        cache.saw(2);
        assert!(!cache.knows(&"k"), "a new version forgets everything");
        get(&cache, &calls, None).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_entry_loaded_before_a_change_is_not_trusted_after_it() {
        let cache = MerchantCache::default();
        cache.saw(1);
        let calls = AtomicUsize::new(0);
        // The load starts under version 1; the change lands while it runs.
        let loaded = cache
            .get_or_load(&"k", || async {
                cache.saw(2);
                Ok(Some((merchant(), None)))
            })
            .await
            .unwrap();
        assert!(loaded.is_some());
        get(&cache, &calls, None).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the stale entry was not trusted"
        );
    }

    #[tokio::test]
    async fn an_entry_ends_when_its_secret_does() {
        let cache = MerchantCache::default();
        cache.saw(1);
        let calls = AtomicUsize::new(0);
        get(&cache, &calls, Some(Duration::from_millis(50))).await;
        get(&cache, &calls, None).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(80)).await;
        cache.saw(1);
        get(&cache, &calls, None).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "past the secret's end");
    }
}
