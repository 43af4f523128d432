//! The `idempotency_keys` table on MariaDB: the same operations as SQLite's,
//! each a few statements in one transaction. The primary key on
//! `(merchant_id, idempotency_key)` decides every race: of two claims of one
//! key, the second's insert waits on the first's row lock and, once it
//! commits, fails as a duplicate; the loser then reads what the winner left.
//! Every other rule is a guarded update (the fencing token, the lease), which
//! InnoDB runs on the row's latest version under its lock.

use std::time::Duration;

use const_format::concatcp;
use sqlx::mysql::MySqlConnection;

use super::charges::CHARGE_COLUMNS;
use super::sql::{params, query, query_as};
use super::webhooks::ENDPOINT_HEARS;
use super::{again_on_deadlock, at, MariaDbStore, NOW};
use crate::domain::{ChargeId, Fingerprint, IdempotencyKey, SubjectId};
use crate::store::error::StoreError;
use crate::store::model::{Claim, KeyRecord, KeyStatus, NewClaim, Orphan, Reschedule};
use crate::store::ops::Keys;
use crate::store::params::{ClaimValues, FinalizeValues};
use crate::store::rows::{KeyStatusRow, OrphanRow, RecordRow};
use crate::store::shared::millis;

/// A key record's own columns (alias `k`), whatever its subject.
pub(super) const KEY_COLUMNS: &str = concatcp!(
    "k.fingerprint, k.state, k.attempt, k.response_status, k.response_body, \
     greatest(0, coalesce(k.locked_until, 0) - ",
    NOW,
    ") as lease_remaining_ms, \
     (k.state = 'completed' and k.expires_at <= ",
    NOW,
    ") as expired, greatest(0, k.expires_at - ",
    NOW,
    ") as expires_in_ms"
);

/// Columns of a key record joined with its charge (aliases `k` and `c`).
const RECORD_COLUMNS: &str = concatcp!(
    CHARGE_COLUMNS,
    ", ",
    KEY_COLUMNS,
    ", c.review_since is not null as under_review"
);

/// Insert first: a duplicate of the primary key is the answer that another
/// attempt holds the key. Parameters as [`ClaimValues::params`] names them.
const INSERT_KEY_SQL: &str = concatcp!(
    "insert into idempotency_keys
        (merchant_id, idempotency_key, fingerprint, charge_id, locked_until, expires_at, created_at)
     values ($1, $2, $3, $4, ",
    NOW,
    " + $5, ",
    NOW,
    " + $6, ",
    NOW,
    ")"
);

/// The charge of a claim just won. Parameters as [`ClaimValues::params`] names them.
const INSERT_CHARGE_SQL: &str = concatcp!(
    "insert into charges
        (id, merchant_id, order_id, amount_cents, currency, description, acquirer_reference,
         idempotency_key, traceparent, capture_method, captured_cents, capture_reserved_cents,
         created_at, updated_at)
     values ($4, $1, $7, $8, $9, $10, $11, $2, $12, $13,
             case when $13 is not null then 0 end, case when $13 is not null then 0 end, ",
    NOW,
    ", ",
    NOW,
    ")"
);

/// An expired, completed record made a fresh claim for a new intent.
const RECLAIM_SQL: &str = concatcp!(
    "update idempotency_keys
        set fingerprint = $3, charge_id = $4, refund_id = null, step_id = null,
            state = 'in_flight', attempt = attempt + 1, response_status = null,
            response_body = null, locked_until = ",
    NOW,
    " + $5, expires_at = ",
    NOW,
    " + $6, created_at = ",
    NOW,
    "
      where merchant_id = $1 and idempotency_key = $2
        and state = 'completed' and fingerprint <> $3 and expires_at <= ",
    NOW
);

/// `$1` merchant, `$2` key.
const KEY_RECORD_SQL: &str = concatcp!(
    "select ",
    RECORD_COLUMNS,
    " from idempotency_keys k join charges c on c.id = k.charge_id
     where k.merchant_id = $1 and k.idempotency_key = $2"
);

/// `$1` merchant, `$2` key, `$3` attempt seen, `$4` lease in ms.
const TAKE_OVER_SQL: &str = concatcp!(
    "update idempotency_keys
        set attempt = attempt + 1, locked_until = ",
    NOW,
    " + $4
      where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight' and locked_until <= ",
    NOW
);

/// `$1` merchant, `$2` key, `$3` attempt.
const RELEASE_KEY_SQL: &str = concatcp!(
    "update idempotency_keys set locked_until = ",
    NOW,
    " where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight'"
);

/// In the same transaction as [`RELEASE_KEY_SQL`]: `$1` merchant, `$2` key,
/// `$3` attempt, `$4` reconciler tries to add (0 or 1), `$5` the reconciler's
/// wait in ms (null: leave the schedule as it is; a later schedule is kept).
const RELEASE_CHARGE_SQL: &str = concatcp!(
    "update charges
        set reconcile_attempts = reconcile_attempts + $4,
            next_reconcile_at = case when $5 is null then next_reconcile_at
                else greatest(coalesce(next_reconcile_at, ",
    NOW,
    "), ",
    NOW,
    " + $5) end
      where id = (select charge_id from idempotency_keys
                   where merchant_id = $1 and idempotency_key = $2 and attempt = $3)"
);

/// `$1` merchant, `$2` key, `$3` attempt, `$4` lease in ms.
const RENEW_SQL: &str = concatcp!(
    "update idempotency_keys set locked_until = ",
    NOW,
    " + $4 where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight'"
);

/// Parameters as [`FinalizeValues::params`] names them.
const FINALIZE_KEY_SQL: &str = concatcp!(
    "update idempotency_keys
        set state = 'completed', locked_until = null,
            response_status = $5, response_body = $6,
            expires_at = ",
    NOW,
    " + $7
      where merchant_id = $1 and idempotency_key = $2 and charge_id = $3
        and attempt = $4 and state = 'in_flight'"
);

const FINALIZE_EVENT_SQL: &str = concatcp!(
    "insert into outbox
        (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent, created_at)
     select 'event', $11, $12, $13, $14, $13, $15,
            (select traceparent from charges where id = $3), ",
    NOW,
    " from dual where $11 is not null and (select events_enabled from settings)"
);

/// A delivery of the webhook event (`$16..$18`) for each of the merchant's
/// enabled endpoints that hears it.
const FINALIZE_WEBHOOK_SQL: &str = concatcp!(
    "insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select i.webhook_event_id, we.id, i.webhook_event_type, i.webhook_body, $3, ",
    NOW,
    ", ",
    NOW,
    " from (select $16 as webhook_event_id, $17 as webhook_event_type, $18 as webhook_body) i
       join webhook_endpoints we on we.merchant_id = $1
      where i.webhook_event_id is not null and ",
    ENDPOINT_HEARS
);

const FINALIZE_CHARGE_SQL: &str = concatcp!(
    "update charges
        set status = $8, acquirer_capture_id = $9, decline_reason = $10, updated_at = ",
    NOW,
    " where id = $3"
);

/// One kind of subject's orphans: `$1` limit, `$2` settle deadline in ms.
macro_rules! orphans_of {
    ($table:literal, $alias:literal, $column:literal) => {
        concatcp!(
            "select k.merchant_id, m.name as merchant_name, k.idempotency_key, k.charge_id,
                    k.refund_id, k.step_id, k.attempt, ",
            $alias,
            ".reconcile_attempts, ",
            $alias,
            ".traceparent, ",
            $alias,
            ".created_at + $2 <= ",
            NOW,
            " as past_deadline, k.locked_until
               from idempotency_keys k
               join ",
            $table,
            " ",
            $alias,
            " on ",
            $alias,
            ".id = k.",
            $column,
            "
               join merchants m on m.id = k.merchant_id
              where k.state = 'in_flight' and k.locked_until <= ",
            NOW,
            " and ",
            $alias,
            ".review_since is null
                and (",
            $alias,
            ".next_reconcile_at is null or ",
            $alias,
            ".next_reconcile_at <= ",
            NOW,
            ")"
        )
    };
}

/// `$1` limit, `$2` settle deadline in ms: the charges' orphans, the
/// refunds' and the steps', oldest lease first.
const ORPHANS_SQL: &str = concatcp!(
    "select * from (",
    orphans_of!("charges", "c", "charge_id"),
    " union all ",
    orphans_of!("refunds", "r", "refund_id"),
    " union all ",
    orphans_of!("authorization_steps", "s", "step_id"),
    ") o order by locked_until limit $1"
);

/// `$1` limit: a batch of expired records, read without a lock.
const EXPIRED_SQL: &str = concatcp!(
    "select merchant_id, idempotency_key from idempotency_keys
      where state = 'completed' and expires_at <= ",
    NOW,
    " order by expires_at limit $1"
);

/// One record, `$1` merchant and `$2` key, deleted if it is still expired,
/// its values returned for its tombstone. By primary key, one at a time: a
/// finalize locks the key's row and then its index entries, and a delete that
/// went through the expiry index would lock the other way round and deadlock
/// with it (nor can MariaDB join a list of keys here: it would scan, and wait
/// on every in-flight row). A claim reclaiming the record waits on the
/// delete's row lock, then finds it gone and inserts afresh.
const SWEEP_SQL: &str = concatcp!(
    "delete from idempotency_keys
      where merchant_id = $1 and idempotency_key = $2
        and state = 'completed' and expires_at <= ",
    NOW,
    "
     returning merchant_id, idempotency_key, fingerprint, charge_id, refund_id, step_id,
               expires_at"
);

/// One swept record's tombstone: `$1` merchant, `$2` key, `$3` fingerprint,
/// `$4` charge id, `$5` when it ends (ms), `$6` refund id, `$7` step id.
const INSERT_TOMBSTONE_SQL: &str = "insert into key_tombstones
        (merchant_id, idempotency_key, fingerprint, charge_id, expires_at, refund_id, step_id)
     values ($1, $2, $3, $4, $5, $6, $7)
     on duplicate key update
        fingerprint = values(fingerprint), charge_id = values(charge_id),
        refund_id = values(refund_id), step_id = values(step_id),
        expires_at = values(expires_at)";

/// `$1` limit: tombstones past their time.
const SWEEP_TOMBSTONES_SQL: &str = concatcp!(
    "delete from key_tombstones where expires_at <= ",
    NOW,
    " order by expires_at limit $1"
);

/// `$1` merchant, `$2` key: the record's state, else a live tombstone's.
const KEY_STATUS_SQL: &str = concatcp!(
    "select state, charge_id, refund_id, step_id, response_status, ",
    at!("expires_at"),
    " as expires_at, greatest(0, coalesce(locked_until, 0) - ",
    NOW,
    ") as lease_remaining_ms,
            (state = 'completed' and expires_at <= ",
    NOW,
    ") as expired
       from idempotency_keys where merchant_id = $1 and idempotency_key = $2
     union all
     select 'tombstone', charge_id, refund_id, step_id, null, ",
    at!("expires_at"),
    ", 0, 1
       from key_tombstones
      where merchant_id = $1 and idempotency_key = $2 and expires_at > ",
    NOW,
    "
        and not exists (select 1 from idempotency_keys
                         where merchant_id = $1 and idempotency_key = $2)"
);

/// `$1` merchant, `$2` key: whose the record is.
const KEY_OWNER_SQL: &str = "select charge_id, refund_id, step_id from idempotency_keys
      where merchant_id = $1 and idempotency_key = $2";

/// `$1` merchant, `$2` key, `$3` fingerprint: the charge of a live tombstone
/// left by the same request.
const TOMBSTONE_SQL: &str = concatcp!(
    "select charge_id from key_tombstones
      where merchant_id = $1 and idempotency_key = $2 and fingerprint = $3
        and charge_id is not null and expires_at > ",
    NOW
);

/// Whether `e` is the duplicate of a key record's primary key: another
/// attempt's claim of the same key committed first.
pub(super) fn is_key_taken(e: &StoreError) -> bool {
    match e {
        StoreError::Database(sqlx::Error::Database(db)) => {
            db.is_unique_violation() && db.message().contains("for key 'PRIMARY'")
        }
        _ => false,
    }
}

/// The subjects whose key record a claim writes only once the subject's
/// reservation against its charge holds (a refund, a step), each named by a
/// column of its own.
#[derive(Debug, Clone, Copy)]
pub(super) enum Subject {
    Refund,
    Step,
}

/// A key record made the subject's: `$1` merchant, `$2` key, `$3` fingerprint,
/// `$4` the subject's id, `$5` lease ms, `$6` key TTL ms.
const INSERT_SUBJECT_KEY_HEAD: &str =
    "insert into idempotency_keys (merchant_id, idempotency_key, fingerprint, ";
const INSERT_SUBJECT_KEY_TAIL: &str = concatcp!(
    ", locked_until, expires_at, created_at)
     values ($1, $2, $3, $4, ",
    NOW,
    " + $5, ",
    NOW,
    " + $6, ",
    NOW,
    ")"
);

/// An expired, completed record of another request made the subject's claim
/// (parameters as the insert's).
const RECLAIM_SUBJECT_KEY_TAIL: &str = concatcp!(
    ", state = 'in_flight', attempt = attempt + 1, response_status = null,
            response_body = null, locked_until = ",
    NOW,
    " + $5, expires_at = ",
    NOW,
    " + $6, created_at = ",
    NOW,
    "
      where merchant_id = $1 and idempotency_key = $2
        and state = 'completed' and fingerprint <> $3 and expires_at <= ",
    NOW
);

/// `$1` merchant, `$2` key, `$3` fingerprint: the subject of a live tombstone
/// the same request left.
const TOMBSTONE_OF_TAIL: &str = concatcp!(
    " from key_tombstones
      where merchant_id = $1 and idempotency_key = $2 and fingerprint = $3
        and expires_at > ",
    NOW
);

impl Subject {
    fn insert_key_sql(self) -> &'static str {
        match self {
            Self::Refund => concatcp!(
                INSERT_SUBJECT_KEY_HEAD,
                "refund_id",
                INSERT_SUBJECT_KEY_TAIL
            ),
            Self::Step => concatcp!(INSERT_SUBJECT_KEY_HEAD, "step_id", INSERT_SUBJECT_KEY_TAIL),
        }
    }

    fn reclaim_key_sql(self) -> &'static str {
        match self {
            Self::Refund => concatcp!(
                "update idempotency_keys
        set fingerprint = $3, refund_id = $4, charge_id = null, step_id = null",
                RECLAIM_SUBJECT_KEY_TAIL
            ),
            Self::Step => concatcp!(
                "update idempotency_keys
        set fingerprint = $3, step_id = $4, charge_id = null, refund_id = null",
                RECLAIM_SUBJECT_KEY_TAIL
            ),
        }
    }

    fn tombstone_sql(self) -> &'static str {
        match self {
            Self::Refund => concatcp!(
                "select refund_id",
                TOMBSTONE_OF_TAIL,
                " and refund_id is not null"
            ),
            Self::Step => concatcp!(
                "select step_id",
                TOMBSTONE_OF_TAIL,
                " and step_id is not null"
            ),
        }
    }
}

/// The subject of a live tombstone that the same request (`fingerprint`)
/// left under the key, in the caller's transaction: a late retry.
pub(super) async fn tombstone(
    tx: &mut MySqlConnection,
    subject: Subject,
    merchant_id: i64,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Option<String>, StoreError> {
    let found: Option<(String,)> = query_as(
        subject.tombstone_sql(),
        params![merchant_id, key.as_str(), fingerprint.as_bytes()],
    )?
    .fetch_optional(&mut *tx)
    .await?;
    Ok(found.map(|(id,)| id))
}

/// A key record to make a subject's, once its reservation holds.
pub(super) struct KeyOf<'a> {
    pub subject: Subject,
    pub id: &'a str,
    pub merchant_id: i64,
    pub key: &'a IdempotencyKey,
    pub fingerprint: &'a Fingerprint,
    pub lease: Duration,
    pub key_ttl: Duration,
}

impl KeyOf<'_> {
    /// Makes the key the subject's, in flight under attempt 1's lease (or the
    /// next attempt's), in the caller's transaction: a new record (`fresh`:
    /// none was found), or the expired record of another request found under
    /// the key. Another claim of the same key may have committed since the
    /// caller read it: the insert then fails as a duplicate
    /// ([`is_key_taken`]), and the caller runs its claim again, which now
    /// finds the key taken (the reservation rolled back with the error).
    pub(super) async fn claim(
        &self,
        tx: &mut MySqlConnection,
        fresh: bool,
    ) -> Result<(), StoreError> {
        let sql = if fresh {
            self.subject.insert_key_sql()
        } else {
            self.subject.reclaim_key_sql()
        };
        let keyed = query(
            sql,
            params![
                self.merchant_id,
                self.key.as_str(),
                self.fingerprint.as_bytes(),
                self.id,
                millis(self.lease),
                millis(self.key_ttl)
            ],
        )?
        .execute(&mut *tx)
        .await?;
        if keyed.rows_affected() != 1 {
            // The expired record it read was reclaimed or swept since.
            return Err(StoreError::Unavailable(sqlx::Error::Protocol(format!(
                "{CLAIMED_MEANWHILE}: {}",
                self.key.as_str()
            ))));
        }
        Ok(())
    }
}

/// What [`KeyOf::claim`] says when the expired record it was to reclaim
/// changed after the claim read it: weather, since the claim, run again,
/// finds what changed it.
const CLAIMED_MEANWHILE: &str = "the key was claimed or swept meanwhile";

/// Whether a refund's or a step's claim lost a race that it runs again to
/// answer: another claim of the same key committed first (a duplicate of the
/// key's primary key; of the subject's reference, when the same request's
/// subject row went in first), the expired record it read changed, or InnoDB
/// chose it as a deadlock's victim. Its transaction rolled back whole, its
/// reservation with it; run again, it finds the key taken.
pub(super) fn lost_a_race(e: &StoreError) -> bool {
    let duplicate_reference = match e {
        StoreError::Database(sqlx::Error::Database(db)) => {
            db.is_unique_violation() && db.message().contains("for key 'acquirer_reference'")
        }
        _ => false,
    };
    let changed = matches!(
        e,
        StoreError::Unavailable(sqlx::Error::Protocol(m)) if m.starts_with(CLAIMED_MEANWHILE)
    );
    is_key_taken(e) || duplicate_reference || changed || super::is_deadlock(e)
}

#[async_trait::async_trait]
impl Keys for MariaDbStore {
    async fn key_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        self.read(async |db| key_record(db, merchant_id, key.as_str()).await)
            .await
    }

    async fn key_status(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyStatus>, StoreError> {
        let row: Option<KeyStatusRow> = self
            .read(async |db| {
                Ok(
                    query_as(KEY_STATUS_SQL, params![merchant_id, key.as_str()])?
                        .fetch_optional(db)
                        .await?,
                )
            })
            .await?;
        row.map(KeyStatus::try_from).transpose()
    }

    async fn take_over(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: Duration,
    ) -> Result<Option<KeyRecord>, StoreError> {
        again_on_deadlock!(
            self.write(async |tx| {
                if !take_over_key(tx, merchant_id, key, attempt, lease).await? {
                    return Ok(None);
                }
                key_record(&mut *tx, merchant_id, key.as_str()).await
            })
            .await
        )
    }

    async fn renew(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.write(async |tx| {
            let done = query(
                RENEW_SQL,
                params![merchant_id, key.as_str(), attempt, millis(lease)],
            )?
            .execute(&mut *tx)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn orphans(
        &self,
        limit: i64,
        settle_deadline: Duration,
    ) -> Result<Vec<Orphan>, StoreError> {
        let rows: Vec<OrphanRow> = self
            .read(async |db| {
                Ok(
                    query_as(ORPHANS_SQL, params![limit, millis(settle_deadline)])?
                        .fetch_all(db)
                        .await?,
                )
            })
            .await?;
        rows.into_iter().map(Orphan::try_from).collect()
    }

    /// Deletes a batch of expired records and leaves each one's tombstone, in
    /// one transaction.
    async fn sweep_expired_keys(
        &self,
        limit: i64,
        tombstone_ttl: Duration,
    ) -> Result<u64, StoreError> {
        again_on_deadlock!(
            self.write(async |tx| {
                type Swept = (
                    i64,
                    String,
                    Vec<u8>,
                    Option<String>,
                    Option<String>,
                    Option<String>,
                    i64,
                );
                let expired: Vec<(i64, String)> = query_as(EXPIRED_SQL, params![limit])?
                    .fetch_all(&mut *tx)
                    .await?;
                let mut swept: Vec<Swept> = Vec::with_capacity(expired.len());
                for (merchant_id, key) in &expired {
                    let gone: Option<Swept> =
                        query_as(SWEEP_SQL, params![*merchant_id, key.as_str()])?
                            .fetch_optional(&mut *tx)
                            .await?;
                    swept.extend(gone);
                }
                for (merchant_id, key, fingerprint, charge_id, refund_id, step_id, expired_at) in
                    &swept
                {
                    query(
                        INSERT_TOMBSTONE_SQL,
                        params![
                            *merchant_id,
                            key.as_str(),
                            fingerprint.as_slice(),
                            charge_id.as_deref(),
                            expired_at.saturating_add(millis(tombstone_ttl)),
                            refund_id.as_deref(),
                            step_id.as_deref()
                        ],
                    )?
                    .execute(&mut *tx)
                    .await?;
                }
                Ok(swept.len() as u64)
            })
            .await
        )
    }

    async fn sweep_tombstones(&self, limit: i64) -> Result<u64, StoreError> {
        self.write(async |tx| {
            let done = query(SWEEP_TOMBSTONES_SQL, params![limit])?
                .execute(&mut *tx)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn release(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            release_in(
                tx,
                RELEASE_CHARGE_SQL,
                merchant_id,
                key,
                attempt,
                reschedule,
            )
            .await
        })
        .await
    }
}

/// Takes over the record of any subject, in the caller's transaction:
/// `false` if `attempt` no longer holds it or its lease is not over.
pub(super) async fn take_over_key(
    tx: &mut MySqlConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
    attempt: i64,
    lease: Duration,
) -> Result<bool, StoreError> {
    let taken = query(
        TAKE_OVER_SQL,
        params![merchant_id, key.as_str(), attempt, millis(lease)],
    )?
    .execute(&mut *tx)
    .await?;
    Ok(taken.rows_affected() > 0)
}

/// Releases the record of any subject and, if `attempt` held it, schedules
/// the reconciler on its subject with `reschedule_sql` (same parameters as
/// [`RELEASE_CHARGE_SQL`]), in the caller's transaction.
pub(super) async fn release_in(
    tx: &mut MySqlConnection,
    reschedule_sql: &'static str,
    merchant_id: i64,
    key: &IdempotencyKey,
    attempt: i64,
    reschedule: &Reschedule,
) -> Result<(), StoreError> {
    let released = query(RELEASE_KEY_SQL, params![merchant_id, key.as_str(), attempt])?
        .execute(&mut *tx)
        .await?;
    if released.rows_affected() == 0 {
        return Ok(());
    }
    query(
        reschedule_sql,
        params![
            merchant_id,
            key.as_str(),
            attempt,
            i64::from(reschedule.reconciler_try),
            reschedule.not_before.map(millis)
        ],
    )?
    .execute(&mut *tx)
    .await?;
    Ok(())
}

impl MariaDbStore {
    /// A claim in a transaction of its own. A live record answers a retry
    /// with a read first, as on SQLite: a 409 or a replay takes no lock.
    pub(in crate::store) async fn claim_one(
        &self,
        new: &NewClaim<'_>,
    ) -> Result<Claim, StoreError> {
        if let Some(record) = self.key_record(new.merchant_id, new.key).await? {
            if !record.expired {
                return Ok(Claim::Lost(record));
            }
        }
        let values = ClaimValues::new(new);
        again_on_deadlock!(self.write(async |tx| claim_in(tx, &values).await).await)
    }
}

/// The record under a key, read on a connection or inside a transaction.
pub(super) async fn key_record(
    db: &mut MySqlConnection,
    merchant_id: i64,
    key: &str,
) -> Result<Option<KeyRecord>, StoreError> {
    let row: Option<RecordRow> = query_as(KEY_RECORD_SQL, params![merchant_id, key])?
        .fetch_optional(db)
        .await?;
    row.map(KeyRecord::try_from).transpose()
}

/// A claim inside a transaction: the statements that PostgreSQL's one claim
/// statement does.
async fn claim_in(tx: &mut MySqlConnection, values: &ClaimValues) -> Result<Claim, StoreError> {
    let params = values.params().map(|(_, p)| p);
    // The same request's tombstone: a late retry, nothing to claim.
    let tombstone: Option<(String,)> = query_as(
        TOMBSTONE_SQL,
        params![values.merchant_id(), values.key(), values.fingerprint()],
    )?
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((charge_id,)) = tombstone {
        return Ok(Claim::Expired(ChargeId::from_trusted(charge_id)));
    }
    // Insert first. A duplicate fails this statement alone (MariaDB keeps
    // the transaction): the key exists, and an expired record of another
    // request becomes this new intent's claim; any other is what the winner
    // left.
    let inserted = match query(INSERT_KEY_SQL, &params)?.execute(&mut *tx).await {
        Ok(_) => true,
        Err(e) => {
            let e = StoreError::from(e);
            if !is_key_taken(&e) {
                return Err(e);
            }
            false
        }
    };
    // The loser of an insert holds a shared lock on the winner's row: it
    // tries the reclaim (which would need it exclusive, and deadlock with
    // every other loser) only when the row it reads is one to reclaim.
    let won = inserted
        || (reclaimable(tx, values).await?
            && query(RECLAIM_SQL, &params)?
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1);
    if won {
        query(INSERT_CHARGE_SQL, &params)?.execute(&mut *tx).await?;
    }
    let Some(record) = key_record(&mut *tx, values.merchant_id(), values.key()).await? else {
        // Not a charge's: another operation's live key (an expired one was
        // reclaimed above).
        type Owner = (Option<String>, Option<String>, Option<String>);
        let owner: Option<Owner> =
            query_as(KEY_OWNER_SQL, params![values.merchant_id(), values.key()])?
                .fetch_optional(&mut *tx)
                .await?;
        return match owner.and_then(|(c, r, s)| SubjectId::from_columns(c, r, s)) {
            Some(subject) if !won => Ok(Claim::Other(subject)),
            _ => Err(StoreError::Corrupt(format!(
                "key {} vanished inside a claim",
                values.key()
            ))),
        };
    };
    Ok(if won {
        Claim::Won(record)
    } else {
        Claim::Lost(record)
    })
}

/// `$1` merchant, `$2` key, `$3` fingerprint: whether the record under the
/// key is another request's, completed and expired.
const RECLAIMABLE_SQL: &str = concatcp!(
    "select count(*) from idempotency_keys
      where merchant_id = $1 and idempotency_key = $2
        and state = 'completed' and fingerprint <> $3 and expires_at <= ",
    NOW
);

/// Whether a claim that lost the insert may reclaim the record it found.
async fn reclaimable(tx: &mut MySqlConnection, values: &ClaimValues) -> Result<bool, StoreError> {
    let (n,): (i64,) = query_as(
        RECLAIMABLE_SQL,
        params![values.merchant_id(), values.key(), values.fingerprint()],
    )?
    .fetch_one(&mut *tx)
    .await?;
    Ok(n > 0)
}

/// A finalize inside a transaction; `false`: fenced off.
pub(super) async fn finalize_in(
    tx: &mut MySqlConnection,
    values: &FinalizeValues<'_>,
) -> Result<bool, StoreError> {
    let params = values.params().map(|(_, p)| p);
    let fenced = query(FINALIZE_KEY_SQL, &params)?.execute(&mut *tx).await?;
    if fenced.rows_affected() == 0 {
        return Ok(false);
    }
    for sql in [
        FINALIZE_EVENT_SQL,
        FINALIZE_WEBHOOK_SQL,
        FINALIZE_CHARGE_SQL,
    ] {
        query(sql, &params)?.execute(&mut *tx).await?;
    }
    if let Some(entry) = values.audit {
        super::audit::record(tx, entry).await?;
    }
    Ok(true)
}
