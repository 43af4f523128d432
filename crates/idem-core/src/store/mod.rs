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
//! [`Store`] is an enum of the two backends, [`postgres`] and [`sqlite`], each
//! a concrete type with one method per operation and its own statements; the
//! methods here only pick the backend. What both share: the records they take
//! and give ([`model`]), the rows they read ([`rows`]), the parameters of the
//! claim and the finalize in their order ([`params`]).

mod batch;
mod error;
mod health;
mod merchant_cache;
mod model;
mod outbox;
mod params;
mod postgres;
mod relay_batch;
mod rows;
mod said;
mod sqlite;

use std::time::Duration;

use crate::domain::{AcquirerReference, Charge, ChargeId, IdempotencyKey, Merchant, SecretHash};
use params::FinalizeValues;
use postgres::PgStore;
use relay_batch::BatchHold;
use sqlite::SqliteStore;

pub use error::StoreError;
pub use merchant_cache::MerchantCache;
pub use model::{
    AttemptOutcome, Audit, AuditEntry, AuditRecord, ChargeDetail, ChargeFilter, ChargeRecord,
    ChargeSummary, Claim, DeliveryInfo, DueDelivery, EndpointChange, EndpointInfo, KeyDetail,
    KeyRecord, KeyState, KeyStatus, MerchantError, MerchantListing, NewClaim, NewEndpoint,
    NewEvent, NewResult, NewWebhook, Orphan, OutboxMessage, PoolStats, ProcessingStats, Reschedule,
    ResultAnswer, Rotation, SecretInfo, SecretMatch, Settlement, StuckCharge,
};
pub use params::{claim_param_names, finalize_param_names};
pub use postgres::{CLAIM_SQL, FINALIZE_SQL};
pub use relay_batch::OutboxBatch;

/// The longest one PostgreSQL operation takes, from taking a connection to
/// the answer, whatever the database and the network between do. A database
/// that answers nothing at all (a partition that drops packets and sends no
/// reset, a host frozen mid-way) makes the operation
/// [`StoreError::Unavailable`] at this deadline, and the request answers `503`
/// with `Retry-After`. As after any lost connection, a write it sent may or
/// may not have committed: a claim that did is in flight (a retry gets `409`
/// until its lease ends, then takes it over), a finalize that did is
/// replayed. PostgreSQL's own `statement_timeout` (2 s) ends a slow statement
/// before this; this is for the answer that never comes.
pub const STORE_DEADLINE: Duration = Duration::from_secs(5);

/// The longest a request waits on one store operation: a batched one waits
/// for the batch ahead of it (refused as late past [`ACQUIRE_TIMEOUT`]), then
/// its own batch runs within [`STORE_DEADLINE`].
pub const STORE_BOUND: Duration = Duration::from_secs(8);
const _: () =
    assert!(ACQUIRE_TIMEOUT.as_secs() + STORE_DEADLINE.as_secs() <= STORE_BOUND.as_secs());

/// How long a request waits for a pooled connection before answering 503:
/// long enough to ride out a burst, short enough that a client retries on a
/// healthy instance instead of hanging on a sick one.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Batches of claims (and of finalizes) at the database at once, per store:
/// while one is there, the next requests queue up to go together. One of
/// each: at 32 clients on PostgreSQL, 1 gave 3,094–3,170 new charges/s (8.7
/// claims per batch), 2 gave 2,718–2,814 (5.1), 4 gave 2,007–2,113 (3.1):
/// fewer, larger batches cost the database less per request (docs/benchmarks.md).
const BATCHES_AT_ONCE: usize = 1;

/// Requests per batch at most: a batch's statement (and, on SQLite, its write
/// transaction) stays short, so the requests behind it do not wait long.
const BATCH_CAP: usize = 64;

/// The URL used when none is given: an embedded SQLite file in the working
/// directory, so that idem runs with nothing installed.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db";

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    /// The backend a URL names, by its scheme.
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else {
            Err(StoreError::UnsupportedUrl(url.to_owned()))
        }
    }
}

/// A handle on the database, one of the two backends; cheap to clone.
#[derive(Clone)]
pub enum Store {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

impl Store {
    /// Connects a pool, and proves the database answers. No connection ping
    /// before each use: a dead connection shows up as an I/O error on the
    /// statement itself, which is a 503 anyway, and a ping would add a round
    /// trip to every request.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Ok(match Backend::of_url(url)? {
            Backend::Postgres => Self::Postgres(PgStore::connect(url, max_connections).await?),
            Backend::Sqlite => Self::Sqlite(SqliteStore::connect(url, max_connections).await?),
        })
    }

    /// Like [`Store::connect`], but connects on first use: a server started
    /// while the database is down comes up, answers 503 (readiness red), and
    /// starts working when the database does, with no restart.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Ok(match Backend::of_url(url)? {
            Backend::Postgres => Self::Postgres(PgStore::lazy(url, max_connections)?),
            Backend::Sqlite => Self::Sqlite(SqliteStore::lazy(url, max_connections)?),
        })
    }

    /// Creates or upgrades the schema. Safe to run from several processes at
    /// once: sqlx serializes migrations (an advisory lock on PostgreSQL, the
    /// write lock on SQLite).
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        match self {
            Self::Postgres(s) => s.migrate().await,
            Self::Sqlite(s) => s.migrate().await,
        }
    }

    /// One trivial round trip: is the database answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.ping().await,
            Self::Sqlite(s) => s.ping().await,
        }
    }

    /// Whether the store can take a charge now: the database answers, and
    /// can write as far as the last writes found (see [`health`]: no write
    /// per check while it can, one small write now and then while it could not).
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.ping().await?;
        match self {
            Self::Postgres(s) => s.writable().await,
            Self::Sqlite(s) => s.writable().await,
        }
    }

    pub fn pool_stats(&self) -> PoolStats {
        match self {
            Self::Postgres(s) => s.pool_stats(),
            Self::Sqlite(s) => s.pool_stats(),
        }
    }

    /// Closes the pool; for SQLite this also checkpoints the write-ahead log.
    pub async fn close(&self) {
        match self {
            Self::Postgres(s) => s.close().await,
            Self::Sqlite(s) => s.close().await,
        }
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
        let claimed = match self {
            Self::Postgres(s) => s.claim(new).await,
            Self::Sqlite(s) => s.claim(new).await,
        };
        self.late_retry(new, claimed).await
    }

    /// `claims` as one batch, however many other requests are waiting: each
    /// answered as [`Store::claim`] answers it (the property tests compare the
    /// two). Claims of the same key within it are racing requests: one wins.
    pub async fn claim_batch(&self, claims: &[NewClaim<'_>]) -> Vec<Result<Claim, StoreError>> {
        let answers = match self {
            Self::Postgres(s) => s.batch_claims(claims).await,
            Self::Sqlite(s) => s.batch_claims(claims).await,
        };
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
        let claimed = match self {
            Self::Postgres(s) => s.claim_alone(new).await,
            Self::Sqlite(s) => s.claim_alone(new).await,
        };
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
                let charge_id = match self {
                    Self::Postgres(s) => s.charge_by_reference(new.merchant_id, &reference).await?,
                    Self::Sqlite(s) => s.charge_by_reference(new.merchant_id, &reference).await?,
                };
                return match charge_id {
                    Some(id) => Ok(Claim::Expired(id)),
                    None => Err(e),
                };
            }
            claimed => claimed?,
        };
        Ok(match claim {
            Claim::Lost(record) if record.expired && record.fingerprint == new.fingerprint => {
                Claim::Expired(record.charge.id)
            }
            claim => claim,
        })
    }

    /// The record under a key, with its charge.
    pub async fn key_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        match self {
            Self::Postgres(s) => s.key_record(merchant_id, key).await,
            Self::Sqlite(s) => s.key_record(merchant_id, key).await,
        }
    }

    /// What a key stands for now: its record, or its tombstone; `None` when
    /// the merchant has neither.
    pub async fn key_status(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyStatus>, StoreError> {
        match self {
            Self::Postgres(s) => s.key_status(merchant_id, key).await,
            Self::Sqlite(s) => s.key_status(merchant_id, key).await,
        }
    }

    /// Takes over an in-flight record whose lease has run out (its holder crashed
    /// or hung), bumping the fencing token. Only the attempt that saw `attempt`
    /// can win; `None` means someone else moved first.
    pub async fn take_over(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: Duration,
    ) -> Result<Option<KeyRecord>, StoreError> {
        match self {
            Self::Postgres(s) => s.take_over(merchant_id, key, attempt, lease).await,
            Self::Sqlite(s) => s.take_over(merchant_id, key, attempt, lease).await,
        }
    }

    /// Ends the lease early after an unknown outcome, so the next retry
    /// re-drives at once instead of waiting it out, and tells the reconciler
    /// when to look again, in one transaction: no reconciler can find the
    /// record free before its wait is written. A no-op for a fenced-out holder.
    pub async fn release(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.release(merchant_id, key, attempt, reschedule).await,
            Self::Sqlite(s) => s.release(merchant_id, key, attempt, reschedule).await,
        }
    }

    /// Extends the lease of the attempt that holds it, before a second call to
    /// the acquirer in one attempt (the reconciler's lookup, then capture), so
    /// that no take-over can start a POST of the same reference meanwhile.
    /// `false`: the attempt no longer holds the record.
    pub async fn renew(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Postgres(s) => s.renew(merchant_id, key, attempt, lease).await,
            Self::Sqlite(s) => s.renew(merchant_id, key, attempt, lease).await,
        }
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
            charge_id: record.charge.id.as_str(),
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
        match self {
            Self::Postgres(s) => s.finalize(&values).await,
            Self::Sqlite(s) => s.finalize(&values).await,
        }
    }

    /// Up to `limit` orphans due for the reconciler, oldest lease first. Reading
    /// them takes nothing: each is then taken with the fenced [`Store::take_over`],
    /// so several reconcilers and servers never work one charge at once.
    pub async fn orphans(
        &self,
        limit: i64,
        settle_deadline: Duration,
    ) -> Result<Vec<Orphan>, StoreError> {
        match self {
            Self::Postgres(s) => s.orphans(limit, settle_deadline).await,
            Self::Sqlite(s) => s.orphans(limit, settle_deadline).await,
        }
    }

    /// Deletes up to `limit` expired, completed key records, each leaving a
    /// tombstone (merchant, key, fingerprint, charge) that lives `tombstone_ttl`
    /// past the key's expiry; returns how many. Small bounded batches, so no
    /// long lock (PostgreSQL also skips rows a request is reclaiming). Charges
    /// are never deleted, and an in-flight record never expires.
    pub async fn sweep_expired_keys(
        &self,
        limit: i64,
        tombstone_ttl: Duration,
    ) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.sweep_expired_keys(limit, tombstone_ttl).await,
            Self::Sqlite(s) => s.sweep_expired_keys(limit, tombstone_ttl).await,
        }
    }

    /// Deletes up to `limit` tombstones past their time; returns how many.
    pub async fn sweep_tombstones(&self, limit: i64) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.sweep_tombstones(limit).await,
            Self::Sqlite(s) => s.sweep_tombstones(limit).await,
        }
    }

    // Charges.

    /// A merchant's charge as it is now; `None` when absent or another merchant's.
    pub async fn charge(
        &self,
        merchant_id: i64,
        id: &ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        match self {
            Self::Postgres(s) => s.charge(merchant_id, id).await,
            Self::Sqlite(s) => s.charge(merchant_id, id).await,
        }
    }

    /// Stops the reconciler trying this charge; it stays `processing`, because
    /// only the acquirer's word may make it captured or failed. With the
    /// mark, in its transaction, `webhook`'s deliveries (once: a charge
    /// already marked is left as it is).
    pub async fn mark_for_review(
        &self,
        id: &ChargeId,
        reason: &str,
        webhook: &NewWebhook,
    ) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.mark_for_review(id, reason, webhook).await,
            Self::Sqlite(s) => s.mark_for_review(id, reason, webhook).await,
        }
    }

    /// Charges as `filter` picks them, newest first.
    pub async fn charges(&self, filter: &ChargeFilter) -> Result<Vec<ChargeSummary>, StoreError> {
        match self {
            Self::Postgres(s) => s.charges(filter).await,
            Self::Sqlite(s) => s.charges(filter).await,
        }
    }

    /// One charge, any merchant's, with its key record: for operators.
    pub async fn charge_record(&self, id: &str) -> Result<Option<ChargeRecord>, StoreError> {
        match self {
            Self::Postgres(s) => s.charge_record(id).await,
            Self::Sqlite(s) => s.charge_record(id).await,
        }
    }

    /// Charges awaiting review, oldest first.
    pub async fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError> {
        match self {
            Self::Postgres(s) => s.stuck_charges().await,
            Self::Sqlite(s) => s.stuck_charges().await,
        }
    }

    /// What the `/metrics` gauges show about unsettled charges.
    pub async fn processing_stats(&self) -> Result<ProcessingStats, StoreError> {
        match self {
            Self::Postgres(s) => s.processing_stats().await,
            Self::Sqlite(s) => s.processing_stats().await,
        }
    }

    // Webhook endpoints.

    /// Adds a webhook endpoint for the merchant `new.merchant` (an unknown
    /// name is [`MerchantError::Unknown`]), audited.
    pub async fn add_webhook_endpoint(
        &self,
        new: &NewEndpoint<'_>,
        audit: &Audit<'_>,
    ) -> Result<(), MerchantError> {
        match self {
            Self::Postgres(s) => s.add_webhook_endpoint(new, audit).await,
            Self::Sqlite(s) => s.add_webhook_endpoint(new, audit).await,
        }
    }

    /// Every webhook endpoint, by merchant: never a secret.
    pub async fn webhook_endpoints(&self) -> Result<Vec<EndpointInfo>, StoreError> {
        match self {
            Self::Postgres(s) => s.webhook_endpoints().await,
            Self::Sqlite(s) => s.webhook_endpoints().await,
        }
    }

    /// Changes the endpoint `id`, audited; `false` when there is no such
    /// endpoint (or nothing to change: enabling an enabled one).
    pub async fn change_webhook_endpoint(
        &self,
        id: &str,
        change: EndpointChange<'_>,
        audit: &Audit<'_>,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Postgres(s) => s.change_webhook_endpoint(id, change, audit).await,
            Self::Sqlite(s) => s.change_webhook_endpoint(id, change, audit).await,
        }
    }

    /// Leases up to `limit` due webhook deliveries for `lease`, at most
    /// `per_endpoint` in flight per endpoint across every deliverer; each
    /// counts as an attempt.
    pub async fn take_webhook_deliveries(
        &self,
        limit: i64,
        lease: Duration,
        per_endpoint: i64,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        match self {
            Self::Postgres(s) => s.take_webhook_deliveries(limit, lease, per_endpoint).await,
            Self::Sqlite(s) => s.take_webhook_deliveries(limit, lease, per_endpoint).await,
        }
    }

    /// Settles one attempt; `false` when it was not the delivery's current
    /// attempt any more (its lease ran out and another deliverer took it).
    pub async fn finish_webhook_delivery(
        &self,
        id: i64,
        attempt: i32,
        outcome: &AttemptOutcome,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Postgres(s) => s.finish_webhook_delivery(id, attempt, outcome).await,
            Self::Sqlite(s) => s.finish_webhook_delivery(id, attempt, outcome).await,
        }
    }

    /// Sends the event's delivered or failed deliveries again, from the
    /// schedule's start; how many. Audited.
    pub async fn redeliver_webhook(
        &self,
        event_id: &str,
        audit: &Audit<'_>,
    ) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.redeliver_webhook(event_id, audit).await,
            Self::Sqlite(s) => s.redeliver_webhook(event_id, audit).await,
        }
    }

    /// The latest `limit` deliveries, newest first.
    pub async fn webhook_deliveries(&self, limit: i64) -> Result<Vec<DeliveryInfo>, StoreError> {
        match self {
            Self::Postgres(s) => s.webhook_deliveries(limit).await,
            Self::Sqlite(s) => s.webhook_deliveries(limit).await,
        }
    }

    /// Deliveries not yet delivered nor given up, and the oldest's age in seconds.
    pub async fn webhook_backlog(&self) -> Result<(i64, f64), StoreError> {
        match self {
            Self::Postgres(s) => s.webhook_backlog().await,
            Self::Sqlite(s) => s.webhook_backlog().await,
        }
    }

    // Merchants.

    /// Adds a merchant with its first secret.
    pub async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
        audit: &Audit<'_>,
    ) -> Result<Merchant, MerchantError> {
        match self {
            Self::Postgres(s) => s.create_merchant(name, secret_hash, audit).await,
            Self::Sqlite(s) => s.create_merchant(name, secret_hash, audit).await,
        }
    }

    /// The enabled merchant a live secret authenticates, and how long the
    /// secret has left.
    pub async fn merchant_by_secret(
        &self,
        secret_hash: &SecretHash,
    ) -> Result<Option<SecretMatch>, StoreError> {
        match self {
            Self::Postgres(s) => s.merchant_by_secret(secret_hash).await,
            Self::Sqlite(s) => s.merchant_by_secret(secret_hash).await,
        }
    }

    /// Moves whenever a secret is rotated or a merchant disabled or enabled:
    /// an instance that sees it move forgets the merchants it cached.
    pub async fn merchants_version(&self) -> Result<i64, StoreError> {
        match self {
            Self::Postgres(s) => s.merchants_version().await,
            Self::Sqlite(s) => s.merchants_version().await,
        }
    }

    /// Every merchant, by name, with its secrets' dates (never the secrets).
    pub async fn merchant_listing(&self) -> Result<Vec<MerchantListing>, StoreError> {
        match self {
            Self::Postgres(s) => s.merchant_listing().await,
            Self::Sqlite(s) => s.merchant_listing().await,
        }
    }

    /// Gives the merchant `name` a new secret; its live ones work `grace`
    /// more (none: refused at once).
    pub async fn rotate_secret(
        &self,
        name: &str,
        secret_hash: &SecretHash,
        grace: Duration,
        audit: &Audit<'_>,
    ) -> Result<Rotation, MerchantError> {
        match self {
            Self::Postgres(s) => s.rotate_secret(name, secret_hash, grace, audit).await,
            Self::Sqlite(s) => s.rotate_secret(name, secret_hash, grace, audit).await,
        }
    }

    /// Disables (every secret refused) or enables the merchant `name`;
    /// `false` when it already was so (nothing changed, nothing recorded).
    pub async fn set_merchant_disabled(
        &self,
        name: &str,
        disabled: bool,
        audit: &Audit<'_>,
    ) -> Result<bool, MerchantError> {
        match self {
            Self::Postgres(s) => s.set_merchant_disabled(name, disabled, audit).await,
            Self::Sqlite(s) => s.set_merchant_disabled(name, disabled, audit).await,
        }
    }

    /// Appends `entry` to the audit trail on its own (an action whose own
    /// writes are the engine's, such as `idem charges retry`, or the
    /// reconciler's looks).
    pub async fn record_audit(&self, entry: &AuditEntry<'_>) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.record_audit(entry).await,
            Self::Sqlite(s) => s.record_audit(entry).await,
        }
    }

    /// Adds a console token named `name` (the actor its actions are audited as).
    pub async fn create_admin_token(
        &self,
        name: &str,
        token_hash: &SecretHash,
        by: &Audit<'_>,
    ) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.create_admin_token(name, token_hash, by).await,
            Self::Sqlite(s) => s.create_admin_token(name, token_hash, by).await,
        }
    }

    /// The name of the console token that hashes to `token_hash`, if any.
    pub async fn admin_token_name(
        &self,
        token_hash: &SecretHash,
    ) -> Result<Option<String>, StoreError> {
        match self {
            Self::Postgres(s) => s.admin_token_name(token_hash).await,
            Self::Sqlite(s) => s.admin_token_name(token_hash).await,
        }
    }

    /// Charges made within `window`, counted by status.
    pub async fn outcome_counts(&self, window: Duration) -> Result<Vec<(String, i64)>, StoreError> {
        match self {
            Self::Postgres(s) => s.outcome_counts(window).await,
            Self::Sqlite(s) => s.outcome_counts(window).await,
        }
    }

    /// The audit trail, newest first: of `subject` (a merchant's name or a
    /// charge's id), or of everything.
    pub async fn audit_trail(
        &self,
        subject: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        match self {
            Self::Postgres(s) => s.audit_trail(subject, limit).await,
            Self::Sqlite(s) => s.audit_trail(subject, limit).await,
        }
    }

    /// The merchant a queue command names in its `tenant` header.
    pub async fn merchant_by_name(&self, name: &str) -> Result<Option<Merchant>, StoreError> {
        match self {
            Self::Postgres(s) => s.merchant_by_name(name).await,
            Self::Sqlite(s) => s.merchant_by_name(name).await,
        }
    }

    // The outbox (see [`outbox`]).

    /// Writes the result of one delivery of a queue command.
    pub async fn enqueue_result(&self, new: &NewResult<'_>) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.enqueue_result(new).await,
            Self::Sqlite(s) => s.enqueue_result(new).await,
        }
    }

    /// Takes up to `limit` messages ready to publish, oldest first, skipping
    /// rows another relay holds. A waiting result is ready once its key's
    /// outcome is stored, and takes that outcome's status and body.
    pub async fn outbox_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError> {
        Ok(match self {
            Self::Postgres(s) => {
                let (batch, messages) = s.outbox_batch(limit).await?;
                OutboxBatch {
                    hold: BatchHold::Postgres(batch),
                    messages,
                }
            }
            Self::Sqlite(s) => OutboxBatch {
                messages: s.outbox_batch(limit).await?,
                hold: BatchHold::Sqlite(s.clone()),
            },
        })
    }

    /// Deletes up to `limit` messages published longer than `retention` ago.
    pub async fn prune_outbox(&self, retention: Duration, limit: i64) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.prune_outbox(retention, limit).await,
            Self::Sqlite(s) => s.prune_outbox(retention, limit).await,
        }
    }

    /// Whether finalizes write charge events to the outbox: one setting for the
    /// whole deployment, kept in the database so that every instance agrees.
    pub async fn events_enabled(&self) -> Result<bool, StoreError> {
        match self {
            Self::Postgres(s) => s.events_enabled().await,
            Self::Sqlite(s) => s.events_enabled().await,
        }
    }

    /// Turns charge events on or off for the whole deployment; `true` if that
    /// changed the setting. A relay turns them on when it starts.
    pub async fn set_events_enabled(&self, enabled: bool) -> Result<bool, StoreError> {
        match self {
            Self::Postgres(s) => s.set_events_enabled(enabled).await,
            Self::Sqlite(s) => s.set_events_enabled(enabled).await,
        }
    }

    /// Messages not yet published, and the age of the oldest, in seconds; rows
    /// set aside are not waiting to be published, and are not counted.
    pub async fn outbox_backlog(&self) -> Result<(i64, f64), StoreError> {
        match self {
            Self::Postgres(s) => s.outbox_backlog().await,
            Self::Sqlite(s) => s.outbox_backlog().await,
        }
    }
}

/// Milliseconds as `i64` for interval arithmetic in SQL.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The error of an operation that had no answer within [`STORE_DEADLINE`].
fn past_deadline() -> StoreError {
    StoreError::Unavailable(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the database gave no answer within {} s",
            STORE_DEADLINE.as_secs()
        ),
    )))
}
