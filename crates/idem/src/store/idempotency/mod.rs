//! The `idempotency_keys` table: claim, read, take over, release, finalize.
//!
//! The article's order: [`Store::claim`] inserts first (`on conflict do
//! nothing`) and commits at once, creating the charge in the same transaction;
//! the acquirer is called with no transaction open; then [`Store::finalize`]
//! stores the outcome and settles the charge in one transaction that only
//! succeeds for the current holder of the fencing token.
//!
//! The statements of each backend live beside each other: [`postgres`] does
//! each operation in one statement (data-modifying CTEs), [`sqlite`] in a short
//! `begin immediate` transaction of a few.

mod postgres;
mod sqlite;

use std::time::Duration;

use super::charges::ChargeRow;
use super::{Db, NewEvent, Store, StoreError};
use crate::domain::{AcquirerReference, ChargeId, ChargeRequest, ChargeStatus, Merchant};
use crate::domain::{Fingerprint, IdempotencyKey, StoredResponse};

pub use postgres::{CLAIM_SQL, FINALIZE_SQL};

/// What a new attempt asks to claim.
pub struct NewClaim<'a> {
    pub merchant_id: i64,
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub request: &'a ChargeRequest,
    /// How long the winner may work before another attempt may take over.
    pub lease: Duration,
    /// How long a completed outcome is honoured.
    pub key_ttl: Duration,
}

/// The state of a key record.
#[derive(Debug, Clone)]
pub enum KeyState {
    /// An attempt holds (or held) the lease; no outcome yet.
    InFlight { lease_remaining: Duration },
    /// The first outcome, to replay.
    Completed(StoredResponse),
}

/// A key record with its charge, as some attempt found or made it.
#[derive(Debug, Clone)]
pub struct KeyRecord {
    pub charge: crate::domain::Charge,
    pub fingerprint: Fingerprint,
    pub state: KeyState,
    /// The fencing token the holder of the lease must present to finalize.
    pub attempt: i64,
    /// Completed and past its time to live: the key may start a new intent.
    pub expired: bool,
}

/// The answer to an insert-first claim.
#[derive(Debug)]
pub enum Claim {
    /// This attempt inserted the record: it owns the lease and must call the acquirer.
    Won(KeyRecord),
    /// Another attempt got there first; here is what it left.
    Lost(KeyRecord),
}

/// The final outcome to store for a charge.
pub struct Settlement<'a> {
    pub status: ChargeStatus,
    pub capture_id: Option<&'a str>,
    pub decline_reason: Option<&'a str>,
    pub response: &'a StoredResponse,
    /// The charge event the outcome produces, if any.
    pub event: Option<&'a NewEvent<'a>>,
}

/// What releasing a record after an unknown outcome tells the reconciler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reschedule {
    /// The reconciler leaves the charge alone at least this long from now (its
    /// backoff, or the acquirer's own `Retry-After`); `None` leaves the
    /// charge's schedule as it was. A later schedule already set is kept.
    pub not_before: Option<Duration>,
    /// Counts as one of the reconciler's tries, whose backoff doubles with each.
    pub reconciler_try: bool,
}

/// An in-flight record whose lease is over and that no attempt is working:
/// the reconciler's unit of work.
#[derive(Debug, Clone)]
pub struct Orphan {
    pub merchant: Merchant,
    pub key: IdempotencyKey,
    pub charge_id: ChargeId,
    /// The fencing token seen; taking over succeeds only if it is still current.
    pub attempt: i64,
    /// Unknown outcomes the reconciler met so far, for its backoff.
    pub reconcile_attempts: i32,
    /// Older than the settle deadline: stop trying, mark for review.
    pub past_deadline: bool,
}

/// The values a claim binds, made once so that every statement of one claim
/// (SQLite runs several) names the same new charge.
struct ClaimValues {
    merchant_id: i64,
    key: String,
    fingerprint: Vec<u8>,
    charge_id: String,
    lease_ms: i64,
    key_ttl_ms: i64,
    order_id: i64,
    amount_cents: i64,
    currency: String,
    description: Option<String>,
    reference: String,
}

impl ClaimValues {
    /// A claim's values, with a fresh charge id and reference.
    fn new(new: &NewClaim<'_>) -> Self {
        Self {
            merchant_id: new.merchant_id,
            key: new.key.as_str().to_owned(),
            fingerprint: new.fingerprint.as_bytes().to_vec(),
            charge_id: ChargeId::generate().as_str().to_owned(),
            lease_ms: super::millis(new.lease),
            key_ttl_ms: super::millis(new.key_ttl),
            order_id: new.request.order_id.get(),
            amount_cents: new.request.amount_cents.get(),
            currency: new.request.currency.as_str().to_owned(),
            description: new
                .request
                .description
                .as_ref()
                .map(|d| d.as_str().to_owned()),
            reference: AcquirerReference::generate().as_str().to_owned(),
        }
    }
}

/// Binds `$1..$11` of the statements that make a claim: the key record's
/// columns (`$1` merchant, `$2` key, `$3` fingerprint, `$4` charge id, `$5`
/// lease and `$6` key TTL in ms), then the new charge's (`$7` order, `$8`
/// amount, `$9` currency, `$10` description, `$11` reference). A statement
/// that uses fewer of them ignores the rest.
macro_rules! bind_claim {
    ($query:expr, $v:expr) => {
        $query
            .bind($v.merchant_id)
            .bind(&$v.key)
            .bind(&$v.fingerprint)
            .bind(&$v.charge_id)
            .bind($v.lease_ms)
            .bind($v.key_ttl_ms)
            .bind($v.order_id)
            .bind($v.amount_cents)
            .bind(&$v.currency)
            .bind(&$v.description)
            .bind(&$v.reference)
    };
}
use bind_claim;

#[derive(sqlx::FromRow)]
struct RecordRow {
    #[sqlx(flatten)]
    charge: ChargeRow,
    fingerprint: Vec<u8>,
    state: String,
    attempt: i64,
    response_status: Option<i16>,
    response_body: Option<Vec<u8>>,
    lease_remaining_ms: i64,
    expired: bool,
}

impl TryFrom<RecordRow> for KeyRecord {
    type Error = StoreError;

    fn try_from(r: RecordRow) -> Result<Self, StoreError> {
        let charge = crate::domain::Charge::try_from(r.charge)?;
        let corrupt =
            |what: &str| StoreError::Corrupt(format!("key of charge {}: {what}", charge.id));
        let fingerprint =
            Fingerprint::from_bytes(&r.fingerprint).ok_or_else(|| corrupt("fingerprint"))?;
        let state = match (r.state.as_str(), r.response_status, r.response_body) {
            ("in_flight", _, _) => KeyState::InFlight {
                lease_remaining: Duration::from_millis(r.lease_remaining_ms.max(0).unsigned_abs()),
            },
            ("completed", Some(status), Some(body)) => KeyState::Completed(StoredResponse {
                status: u16::try_from(status).map_err(|_| corrupt("response status"))?,
                body: body.into(),
            }),
            _ => return Err(corrupt("state")),
        };
        Ok(KeyRecord {
            charge,
            fingerprint,
            state,
            attempt: r.attempt,
            expired: r.expired,
        })
    }
}

#[derive(sqlx::FromRow)]
struct OrphanRow {
    merchant_id: i64,
    merchant_name: String,
    idempotency_key: String,
    charge_id: String,
    attempt: i64,
    reconcile_attempts: i32,
    past_deadline: bool,
}

impl TryFrom<OrphanRow> for Orphan {
    type Error = StoreError;

    fn try_from(r: OrphanRow) -> Result<Self, StoreError> {
        Ok(Orphan {
            key: IdempotencyKey::from_unquoted(&r.idempotency_key)
                .map_err(|e| StoreError::Corrupt(format!("stored key: {e}")))?,
            merchant: Merchant {
                id: r.merchant_id,
                name: r.merchant_name,
            },
            charge_id: ChargeId::from_trusted(r.charge_id),
            attempt: r.attempt,
            reconcile_attempts: r.reconcile_attempts,
            past_deadline: r.past_deadline,
        })
    }
}

impl Store {
    /// Insert first: claims the key and creates its charge as `processing` in
    /// one transaction, committed on return, or reports the record that won.
    ///
    /// A record that expired is reclaimed for the new intent the same way, by a
    /// conditional update that only one attempt can win.
    pub async fn claim(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        match &self.db {
            Db::Postgres(pool) => on_pg!(pool, |db| postgres::claim(db, new).await),
            Db::Sqlite(pool) => sqlite::claim(pool, &self.writer, new).await,
        }
    }

    /// The record under a key, with its charge.
    pub async fn key_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        match &self.db {
            Db::Postgres(pool) => {
                on_pg!(pool, |db| postgres::key_record(db, merchant_id, key).await)
            }
            Db::Sqlite(pool) => sqlite::key_record(pool, merchant_id, key).await,
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
        match &self.db {
            Db::Postgres(pool) => {
                on_pg!(pool, |db| postgres::take_over(
                    db,
                    merchant_id,
                    key,
                    attempt,
                    lease
                )
                .await)
            }
            Db::Sqlite(pool) => {
                let _turn = self.writer.take().await?;
                sqlite::take_over(pool, merchant_id, key, attempt, lease).await
            }
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
        match &self.db {
            Db::Postgres(pool) => on_pg!(pool, |db| sqlx::query(postgres::RELEASE_SQL)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(attempt)
                .bind(i32::from(reschedule.reconciler_try))
                .bind(reschedule.not_before.map(super::millis))
                .execute(db)
                .await
                .map(drop)
                .map_err(StoreError::from)),
            Db::Sqlite(pool) => {
                let _turn = self.writer.take().await?;
                sqlite::release(pool, merchant_id, key, attempt, reschedule).await
            }
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
        let renewed = on_backend!(
            write self,
            postgres::RENEW_SQL,
            sqlite::RENEW_SQL,
            |sql, db| sqlx::query(sql)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(attempt)
                .bind(super::millis(lease))
                .execute(db)
                .await
                .map(|done| done.rows_affected())
        )?;
        Ok(renewed == 1)
    }

    /// Stores the outcome and settles the charge, in one transaction, if
    /// `attempt` still holds the record. `false`: another attempt took over
    /// (this one is stale) or already finished; nothing was written.
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
            key_ttl_ms: super::millis(key_ttl),
            charge_status: settlement.status.as_str(),
            capture_id: settlement.capture_id,
            decline_reason: settlement.decline_reason,
            event: settlement.event,
        };
        match &self.db {
            Db::Postgres(pool) => on_pg!(pool, |db| postgres::finalize(db, &values).await),
            Db::Sqlite(pool) => {
                let _turn = self.writer.take().await?;
                sqlite::finalize(pool, &values).await
            }
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
        let rows: Vec<OrphanRow> = on_backend!(
            self,
            postgres::ORPHANS_SQL,
            sqlite::ORPHANS_SQL,
            |sql, db| sqlx::query_as(sql)
                .bind(limit)
                .bind(super::millis(settle_deadline))
                .fetch_all(db)
                .await
        )?;
        rows.into_iter().map(Orphan::try_from).collect()
    }

    /// Deletes up to `limit` expired, completed key records; returns how many.
    /// Small bounded batches, so no long lock (PostgreSQL also skips rows a
    /// request is reclaiming). Charges are never deleted, and an in-flight
    /// record never expires.
    pub async fn sweep_expired_keys(&self, limit: i64) -> Result<u64, StoreError> {
        Ok(on_backend!(
            write self,
            postgres::SWEEP_SQL,
            sqlite::SWEEP_SQL,
            |sql, db| sqlx::query(sql)
                .bind(limit)
                .execute(db)
                .await
                .map(|done| done.rows_affected())
        )?)
    }
}

/// What a finalize writes, as both backends bind it.
struct FinalizeValues<'a> {
    merchant_id: i64,
    key: &'a str,
    charge_id: &'a str,
    attempt: i64,
    status: i16,
    body: &'a [u8],
    key_ttl_ms: i64,
    charge_status: &'a str,
    capture_id: Option<&'a str>,
    decline_reason: Option<&'a str>,
    event: Option<&'a NewEvent<'a>>,
}

/// Binds `$1..$15` of a finalize, as [`FINALIZE_SQL`] documents them.
macro_rules! bind_finalize {
    ($query:expr, $v:expr) => {
        $query
            .bind($v.merchant_id)
            .bind($v.key)
            .bind($v.charge_id)
            .bind($v.attempt)
            .bind($v.status)
            .bind($v.body)
            .bind($v.key_ttl_ms)
            .bind($v.charge_status)
            .bind($v.capture_id)
            .bind($v.decline_reason)
            .bind($v.event.map(|e| e.message_id.as_str()))
            .bind($v.event.map(|_| crate::domain::EVENTS_EXCHANGE))
            .bind($v.event.map(|e| e.event_type))
            .bind($v.event.map(|e| e.tenant))
            .bind($v.event.map(|e| e.body.as_ref()))
    };
}
use bind_finalize;
