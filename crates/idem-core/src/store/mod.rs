//! The store: every SQL statement idem runs, one method per domain
//! operation, for two backends chosen by the URL:
//! PostgreSQL (`postgres://...`, the deployment for many hosts) and SQLite
//! (`sqlite://path`, the embedded default: nothing to install, several
//! processes on one host sharing one file).
//!
//! Invariants the schema and these statements keep together, on both backends:
//! - one idempotency record per `(merchant, key)` (the primary key decides races);
//! - a record and its charge are created in one transaction, so neither exists alone;
//! - a record's outcome is written once, by the holder of its current `attempt`
//!   (the fencing token), in the same transaction that settles the charge;
//! - no transaction here is ever left open across a call to the acquirer: each
//!   function is one short transaction (one statement on PostgreSQL; on SQLite,
//!   which cannot write from a CTE, a few statements under `begin immediate`).
//!
//! [`Store`] holds one backend behind the store's contract ([`ops`]), chosen
//! by the URL when it is opened ([`Store::connect_lazy`], which
//! [`Store::connect`] calls: the one place that makes a [`postgres`] or a
//! [`sqlite`] store). Each backend implements the operations one
//! concern at a time (the traits of [`ops`]: keys, charges, merchants,
//! webhooks, the outbox, the audit trail, the console, refunds, steps),
//! beside its own statements, and [`ops`] gives `Store` a method per
//! operation that runs it on that backend. What is left here is what the
//! facade decides itself, above every backend: a late retry's answer
//! ([`Store::claim`]), packing a finalize's values, opening and closing. A
//! relay's batch is each backend's to hold ([`relay_batch`]: the relay sees
//! one `OutboxBatch` whatever holds it). What both backends share: the records they take and
//! give ([`model`]), the rows they read ([`rows`]), the parameters of the
//! claim and the finalize in their order ([`params`]), what an operator's
//! change says in the audit trail ([`said`]), and the bounds every part keeps
//! ([`shared`]), with the error class ([`error`]) beside them: none of these
//! imports this facade, so the backends stand below it.

mod batch;
mod error;
mod health;
mod mariadb;
mod merchant_cache;
mod model;
mod ops;
mod outbox;
mod params;
mod postgres;
mod relay_batch;
mod rows;
mod said;
mod shared;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use crate::domain::{AcquirerReference, IdempotencyKey};
use mariadb::MariaDbStore;
use params::FinalizeValues;
use postgres::PgStore;
use sqlite::SqliteStore;

pub use error::StoreError;
pub use merchant_cache::MerchantCache;
pub use model::{
    AttemptOutcome, Audit, AuditEntry, AuditRecord, ChargeDetail, ChargeFilter, ChargeRecord,
    ChargeSummary, Claim, DeliveryInfo, DueDelivery, EndpointChange, EndpointInfo, KeyDetail,
    KeyRecord, KeyState, KeyStatus, MerchantError, MerchantListing, NewClaim, NewEndpoint,
    NewEvent, NewRefundClaim, NewResult, NewStepClaim, NewWebhook, Orphan, OutboxMessage,
    PoolStats, ProcessingStats, Record, RefundClaim, RefundRecord, RefundSettlement, Refusal,
    Reschedule, ResultAnswer, Rotation, SecretInfo, SecretMatch, Settlement, StepClaim, StepDetail,
    StepRecord, StepSettlement, StuckCharge, StuckRefund, Taken,
};
pub use params::{claim_param_names, finalize_param_names};
pub use postgres::{CLAIM_SQL, FINALIZE_SQL};
pub use relay_batch::OutboxBatch;
use shared::millis;
pub use shared::{STORE_BOUND, STORE_DEADLINE};

/// The URL used when none is given: an embedded SQLite file in the working
/// directory, so that idem runs with nothing installed.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db";

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
    MariaDb,
}

impl Backend {
    /// The backend a URL names, by its scheme.
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            Ok(Self::MariaDb)
        } else {
            Err(StoreError::UnsupportedUrl(url.to_owned()))
        }
    }
}

/// A handle on the database: one backend behind the store's contract
/// ([`ops`]), chosen by the URL when the store is opened, the only place
/// that names the backends; cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn ops::StoreBackend>,
}

impl Store {
    /// The database's name in OpenTelemetry's conventions (`db.system.name`).
    pub fn system_name(&self) -> &'static str {
        self.backend.system_name()
    }

    /// Connects a pool, and proves the database answers. No connection ping
    /// before each use: a dead connection shows up as an I/O error on the
    /// statement itself, which is a 503 anyway, and a ping would add a round
    /// trip to every request.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let store = Self::connect_lazy(url, max_connections)?;
        store.ping().await?;
        Ok(store)
    }

    /// Like [`Store::connect`], but connects on first use: a server started
    /// while the database is down comes up, answers 503 (readiness red), and
    /// starts working when the database does, with no restart. The one place
    /// that knows which backends there are.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let backend: Arc<dyn ops::StoreBackend> = match Backend::of_url(url)? {
            Backend::Postgres => Arc::new(PgStore::lazy(url, max_connections)?),
            Backend::Sqlite => Arc::new(SqliteStore::lazy(url, max_connections)?),
            Backend::MariaDb => Arc::new(MariaDbStore::lazy(url, max_connections)?),
        };
        Ok(Self { backend })
    }

    /// The backend, for the operations [`ops`] declares.
    fn backend(&self) -> &dyn ops::StoreBackend {
        &*self.backend
    }

    /// Creates or upgrades the schema. Safe to run from several processes at
    /// once: sqlx serializes migrations (an advisory lock on PostgreSQL, the
    /// write lock on SQLite).
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        self.backend.migrate().await
    }

    /// One trivial round trip: is the database answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.backend.ping().await
    }

    /// Whether the store can take a charge now: the database answers, and
    /// can write as far as the last writes found (see [`health`]: no write
    /// per check while it can, one small write now and then while it could not).
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.ping().await?;
        self.backend.writable().await
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.backend.pool_stats()
    }

    /// Closes the pool; for SQLite this also checkpoints the write-ahead log.
    pub async fn close(&self) {
        self.backend.close().await
    }

    // The idempotency keys: the article's order. `claim` inserts first (`on
    // conflict do nothing`) and commits at once, creating the charge in the
    // same transaction; the acquirer is called with no transaction open; then
    // `finalize` stores the outcome and settles the charge in one transaction
    // that only succeeds for the current holder of the fencing token.

    /// Insert first: claims the key and creates its charge as `processing` in
    /// one transaction, committed on return, or reports the record that won.
    ///
    /// A record that expired is reclaimed for the new intent the same way, by a
    /// conditional update that only one attempt can win.
    ///
    /// The same request under a key that expired (its record past its time to
    /// live, or swept and left a tombstone, or gone with its tombstone too: the
    /// charge still holds the intent's reference) claims nothing:
    /// [`Claim::Expired`].
    pub async fn claim(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        let claimed = self.backend.claim(new).await;
        self.late_retry(new, claimed).await
    }

    /// `claims` as one batch, however many other requests are waiting: each
    /// answered as [`Store::claim`] answers it (the property tests compare the
    /// two). Claims of the same key within it are racing requests: one wins.
    pub async fn claim_batch(&self, claims: &[NewClaim<'_>]) -> Vec<Result<Claim, StoreError>> {
        let answers = self.backend.batch_claims(claims).await;
        let mut out = Vec::with_capacity(claims.len());
        for (new, answer) in claims.iter().zip(answers) {
            out.push(match answer {
                batch::Batched::Done(claimed) => self.late_retry(new, claimed).await,
                batch::Batched::Alone => self.claim_alone(new).await,
            });
        }
        out
    }

    /// [`Store::claim`] on the one-row path, never batched: what a batch must
    /// agree with (the property tests compare the two).
    pub async fn claim_alone(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        let claimed = self.backend.claim_alone(new).await;
        self.late_retry(new, claimed).await
    }

    /// A claim's answer, where the same request came back after its key
    /// expired: [`Claim::Expired`].
    async fn late_retry(
        &self,
        new: &NewClaim<'_>,
        claimed: Result<Claim, StoreError>,
    ) -> Result<Claim, StoreError> {
        let claim = match claimed {
            // Past its tombstone too: the charge itself remembers the intent.
            Err(e) if error::is_reference_taken(&e) => {
                let reference =
                    AcquirerReference::for_intent(new.merchant_id, new.key, &new.fingerprint);
                let charge_id = self
                    .backend
                    .charge_by_reference(new.merchant_id, &reference)
                    .await?;
                return match charge_id {
                    Some(id) => Ok(Claim::Expired(id)),
                    None => Err(e),
                };
            }
            claimed => claimed?,
        };
        Ok(match claim {
            Claim::Lost(record) if record.expired && record.fingerprint == new.fingerprint => {
                Claim::Expired(record.subject.id)
            }
            claim => claim,
        })
    }

    /// Stores the outcome and settles the charge, with its event in the outbox,
    /// in one transaction, if `record.attempt` still holds the record.
    /// `false`: another attempt took over (this one is stale) or already
    /// finished; nothing was written.
    pub async fn finalize(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &KeyRecord,
        settlement: &Settlement<'_>,
        key_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let values = FinalizeValues {
            merchant_id,
            key: key.as_str(),
            charge_id: record.subject.id.as_str(),
            attempt: record.attempt,
            status: i16::try_from(settlement.response.status).unwrap_or(i16::MAX),
            body: settlement.response.body.as_ref(),
            key_ttl_ms: millis(key_ttl),
            charge_status: settlement.status.as_str(),
            capture_id: settlement.capture_id,
            decline_reason: settlement.decline_reason,
            event: settlement.event.map(Into::into),
            webhook: settlement.webhook.map(Into::into),
            audit: settlement.audit,
        };
        self.backend.finalize(&values).await
    }
}
