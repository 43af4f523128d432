//! Merchants found by a secret's hash or a name, kept briefly in memory.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::StoreError;
use crate::domain::Merchant;

/// How long a found merchant is trusted without asking the database again.
/// Merchants cannot be revoked yet; when they can, this bounds how long a
/// revoked one keeps working on an instance.
const CACHE_TTL: Duration = Duration::from_secs(60);

/// Merchants found by some key (a secret's hash, a name), cached briefly so a
/// request or command does not pay a query for its merchant. Only positive
/// answers are kept, so a merchant created a moment ago is found at once. A
/// std lock, not a tokio one: it is never held across an await, and reads
/// vastly outnumber writes.
pub struct MerchantCache<K> {
    entries: Arc<RwLock<HashMap<K, (Merchant, Instant)>>>,
}

impl<K> Clone for MerchantCache<K> {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
        }
    }
}

impl<K> Default for MerchantCache<K> {
    fn default() -> Self {
        Self {
            entries: Arc::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> MerchantCache<K> {
    /// Whether `key` was ever found, fresh or not: a key worth asking the
    /// database about again when its entry is stale.
    pub fn knows(&self, key: &K) -> bool {
        self.entries.read().is_ok_and(|e| e.contains_key(key))
    }

    /// The cached merchant under `key`, or what `load` finds (cached if found).
    pub async fn get_or_load<F, Fut>(
        &self,
        key: &K,
        load: F,
    ) -> Result<Option<Merchant>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<Merchant>, StoreError>>,
    {
        let cached = self.entries.read().ok().and_then(|e| e.get(key).cloned());
        if let Some((merchant, at)) = cached {
            if at.elapsed() < CACHE_TTL {
                return Ok(Some(merchant));
            }
        }
        let merchant = load().await?;
        if let (Some(m), Ok(mut entries)) = (&merchant, self.entries.write()) {
            entries.insert(key.clone(), (m.clone(), Instant::now()));
        }
        Ok(merchant)
    }
}
