//! The idempotency statements for SQLite. SQLite cannot write from a CTE, so
//! an operation that PostgreSQL does in one statement is here a few statements
//! in one `begin immediate` transaction: it takes the database's write lock at
//! its start, so nothing interleaves, and it never spans a call to the
//! acquirer, so the lock is held for microseconds. The unique primary key on
//! `(merchant_id, idempotency_key)` still decides every race, between
//! connections and between processes sharing the file.

use std::time::Duration;

use sqlx::SqlitePool;

use super::{bind_claim, bind_finalize, ClaimValues, FinalizeValues, RecordRow};
use super::{Claim, KeyRecord, NewClaim, Reschedule};
use crate::domain::IdempotencyKey;
use crate::store::charges::sqlite_charge_columns;
use crate::store::{millis, StoreError, WriteTurns};

/// Starts a write transaction at once, so a claim never meets another
/// writer's commit halfway (the busy timeout makes it wait its turn instead).
const BEGIN_IMMEDIATE: &str = "begin immediate";

/// Columns of a key record joined with its charge (aliases `k` and `c`), with
/// the lease and expiry judged by the host's clock.
macro_rules! record_columns {
    () => {
        concat!(
            sqlite_charge_columns!(),
            ", k.fingerprint, k.state, k.attempt, k.response_status, k.response_body, \
             max(0, coalesce(k.locked_until, 0) - ",
            sqlite_now!(),
            ") as lease_remaining_ms, \
             (k.state = 'completed' and k.expires_at <= ",
            sqlite_now!(),
            ") as expired"
        )
    };
}

/// Insert first: `on conflict do nothing returning` tells at once whether this
/// attempt won. Parameters as bound by [`bind_claim`].
const INSERT_KEY_SQL: &str = concat!(
    "insert into idempotency_keys
        (merchant_id, idempotency_key, fingerprint, charge_id, locked_until, expires_at, created_at)
     values ($1, $2, $3, $4, ",
    sqlite_now!(),
    " + $5, ",
    sqlite_now!(),
    " + $6, ",
    sqlite_now!(),
    ")
     on conflict (merchant_id, idempotency_key) do nothing
     returning charge_id"
);

/// The charge of a claim just won. Parameters as bound by [`bind_claim`].
const INSERT_CHARGE_SQL: &str = concat!(
    "insert into charges
        (id, merchant_id, order_id, amount_cents, currency, description, acquirer_reference,
         created_at, updated_at)
     values ($4, $1, $7, $8, $9, $10, $11, ",
    sqlite_now!(),
    ", ",
    sqlite_now!(),
    ")"
);

/// An expired, completed record made a fresh claim for a new intent.
const RECLAIM_SQL: &str = concat!(
    "update idempotency_keys
        set fingerprint = $3, charge_id = $4, state = 'in_flight',
            attempt = attempt + 1, response_status = null, response_body = null,
            locked_until = ",
    sqlite_now!(),
    " + $5, expires_at = ",
    sqlite_now!(),
    " + $6, created_at = ",
    sqlite_now!(),
    "
      where merchant_id = $1 and idempotency_key = $2
        and state = 'completed' and expires_at <= ",
    sqlite_now!()
);

/// `$1` merchant, `$2` key.
const KEY_RECORD_SQL: &str = concat!(
    "select ",
    record_columns!(),
    " from idempotency_keys k join charges c on c.id = k.charge_id
     where k.merchant_id = $1 and k.idempotency_key = $2"
);

/// `$1` merchant, `$2` key, `$3` attempt seen, `$4` lease in ms.
const TAKE_OVER_SQL: &str = concat!(
    "update idempotency_keys
        set attempt = attempt + 1, locked_until = ",
    sqlite_now!(),
    " + $4
      where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight' and locked_until <= ",
    sqlite_now!()
);

/// `$1` merchant, `$2` key, `$3` attempt.
const RELEASE_KEY_SQL: &str = concat!(
    "update idempotency_keys set locked_until = ",
    sqlite_now!(),
    " where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight'"
);

/// In the same transaction as [`RELEASE_KEY_SQL`], as
/// [`super::postgres::RELEASE_SQL`] documents it: `$1` merchant, `$2` key,
/// `$3` attempt, `$4` tries to add, `$5` wait in ms or null.
const RELEASE_CHARGE_SQL: &str = concat!(
    "update charges
        set reconcile_attempts = reconcile_attempts + $4,
            next_reconcile_at = case when $5 is null then next_reconcile_at
                else max(coalesce(next_reconcile_at, ",
    sqlite_now!(),
    "), ",
    sqlite_now!(),
    " + $5) end
      where id = (select charge_id from idempotency_keys
                   where merchant_id = $1 and idempotency_key = $2 and attempt = $3)"
);

/// `$1` merchant, `$2` key, `$3` attempt, `$4` lease in ms.
pub(super) const RENEW_SQL: &str = concat!(
    "update idempotency_keys set locked_until = ",
    sqlite_now!(),
    " + $4 where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight'"
);

/// Parameters as [`super::postgres::FINALIZE_SQL`] documents them.
const FINALIZE_KEY_SQL: &str = concat!(
    "update idempotency_keys
        set state = 'completed', locked_until = null,
            response_status = $5, response_body = $6,
            expires_at = ",
    sqlite_now!(),
    " + $7
      where merchant_id = $1 and idempotency_key = $2 and charge_id = $3
        and attempt = $4 and state = 'in_flight'"
);

const FINALIZE_EVENT_SQL: &str = concat!(
    "insert into outbox (kind, message_id, exchange, routing_key, tenant, event_type, body, created_at)
     select 'event', $11, $12, $13, $14, $13, $15, ",
    sqlite_now!(),
    " where $11 is not null"
);

const FINALIZE_CHARGE_SQL: &str = concat!(
    "update charges
        set status = $8, acquirer_capture_id = $9, decline_reason = $10, updated_at = ",
    sqlite_now!(),
    " where id = $3"
);

/// `$1` limit, `$2` settle deadline in ms.
pub(super) const ORPHANS_SQL: &str = concat!(
    "select k.merchant_id, m.name as merchant_name, k.idempotency_key, k.charge_id,
            k.attempt, c.reconcile_attempts,
            c.created_at + $2 <= ",
    sqlite_now!(),
    " as past_deadline
       from idempotency_keys k
       join charges c on c.id = k.charge_id
       join merchants m on m.id = k.merchant_id
      where k.state = 'in_flight' and k.locked_until <= ",
    sqlite_now!(),
    "
        and c.review_since is null
        and (c.next_reconcile_at is null or c.next_reconcile_at <= ",
    sqlite_now!(),
    ")
      order by k.locked_until
      limit $1"
);

/// `$1` limit. SQLite has no row locks to skip: each batch is one short write
/// transaction, and a claim reclaiming an expired key runs before or after it,
/// never during.
pub(super) const SWEEP_SQL: &str = concat!(
    "delete from idempotency_keys
      where rowid in (
            select rowid from idempotency_keys
             where state = 'completed' and expires_at <= ",
    sqlite_now!(),
    "
             limit $1)"
);

pub(super) async fn claim(
    pool: &SqlitePool,
    writer: &WriteTurns,
    new: &NewClaim<'_>,
) -> Result<Claim, StoreError> {
    // A live record answers a retry without the write lock, which SQLite has
    // one of for the whole file: a 409 or a replay never queues behind other
    // keys' writes. This read decides nothing: a record, once there, stays
    // until it expires; when none is seen (or it expired), the insert below
    // decides, against the unique key, as everywhere else.
    if let Some(record) = key_record(pool, new.merchant_id, new.key).await? {
        if !record.expired {
            return Ok(Claim::Lost(record));
        }
    }
    let values = ClaimValues::new(new);
    let _turn = writer.take().await?;
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    let inserted: Option<(String,)> = bind_claim!(sqlx::query_as(INSERT_KEY_SQL), values)
        .fetch_optional(&mut *tx)
        .await?;
    let won = match inserted {
        Some(_) => true,
        None => {
            // The key exists. An expired record becomes this new intent's claim;
            // any other is what the winner left.
            let reclaimed = bind_claim!(sqlx::query(RECLAIM_SQL), values)
                .execute(&mut *tx)
                .await?;
            reclaimed.rows_affected() == 1
        }
    };
    if won {
        bind_claim!(sqlx::query(INSERT_CHARGE_SQL), values)
            .execute(&mut *tx)
            .await?;
    }
    let record = key_record(&mut *tx, new.merchant_id, new.key)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("key {} vanished inside a claim", new.key)))?;
    tx.commit().await?;
    Ok(if won {
        Claim::Won(record)
    } else {
        Claim::Lost(record)
    })
}

/// The record under a key, read on a pool or inside a transaction.
pub(super) async fn key_record<'c, E>(
    executor: E,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<KeyRecord>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    let row: Option<RecordRow> = sqlx::query_as(KEY_RECORD_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .fetch_optional(executor)
        .await?;
    row.map(KeyRecord::try_from).transpose()
}

pub(super) async fn take_over(
    pool: &SqlitePool,
    merchant_id: i64,
    key: &IdempotencyKey,
    attempt: i64,
    lease: Duration,
) -> Result<Option<KeyRecord>, StoreError> {
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    let taken = sqlx::query(TAKE_OVER_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .bind(attempt)
        .bind(millis(lease))
        .execute(&mut *tx)
        .await?;
    if taken.rows_affected() == 0 {
        return Ok(None);
    }
    let record = key_record(&mut *tx, merchant_id, key).await?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn finalize(
    pool: &SqlitePool,
    v: &FinalizeValues<'_>,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    let fenced = bind_finalize!(sqlx::query(FINALIZE_KEY_SQL), v)
        .execute(&mut *tx)
        .await?;
    if fenced.rows_affected() == 0 {
        return Ok(false);
    }
    bind_finalize!(sqlx::query(FINALIZE_EVENT_SQL), v)
        .execute(&mut *tx)
        .await?;
    bind_finalize!(sqlx::query(FINALIZE_CHARGE_SQL), v)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn release(
    pool: &SqlitePool,
    merchant_id: i64,
    key: &IdempotencyKey,
    attempt: i64,
    reschedule: &Reschedule,
) -> Result<(), StoreError> {
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    let released = sqlx::query(RELEASE_KEY_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .bind(attempt)
        .execute(&mut *tx)
        .await?;
    if released.rows_affected() == 0 {
        return Ok(());
    }
    sqlx::query(RELEASE_CHARGE_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .bind(attempt)
        .bind(i32::from(reschedule.reconciler_try))
        .bind(reschedule.not_before.map(millis))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
