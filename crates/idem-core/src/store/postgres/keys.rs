//! The `idempotency_keys` table on PostgreSQL: claim, read, take over,
//! release, renew, finalize, find orphans, sweep. Each operation is one
//! statement, so the claim that decides a race is the same statement that
//! reads the winner. The lease and expiry are judged by the database's clock,
//! the one clock all instances share.

use std::time::Duration;

use const_format::concatcp;
use sqlx::postgres::PgArguments;
use sqlx::PgConnection;

use super::charges::CHARGE_COLUMNS;
use super::pool::PgPool;
use super::PgStore;
use crate::domain::{ChargeId, IdempotencyKey};
use crate::store::batch::Batched;
use crate::store::error::StoreError;
use crate::store::model::{Claim, KeyOwner, KeyRecord, KeyStatus, NewClaim, Orphan, Reschedule};
use crate::store::ops::Keys;
use crate::store::params::{arguments, ClaimRow, ClaimValues, FinalizeRow, FinalizeValues};
use crate::store::rows::{KeyStatusRow, OrphanRow, RecordRow};
use crate::store::shared::millis;

/// A key record's own columns (alias `k`), whatever its subject.
pub(super) const KEY_COLUMNS: &str =
    "k.fingerprint, k.state, k.attempt, k.response_status, k.response_body, \
     greatest(0, ceil(extract(epoch from (k.locked_until - now())) * 1000))::bigint \
       as lease_remaining_ms, \
     (k.state = 'completed' and k.expires_at <= now()) as expired, \
     greatest(0, floor(extract(epoch from (k.expires_at - now())) * 1000))::bigint \
       as expires_in_ms";

/// Columns of a key record joined with its charge (aliases `k` and `c`).
pub(super) const RECORD_COLUMNS: &str = concatcp!(
    CHARGE_COLUMNS,
    ", ",
    KEY_COLUMNS,
    ", c.review_since is not null as under_review"
);

/// Rounds of insert-or-read a claim may need: each extra one means the sweeper
/// deleted the record between two statements, which takes the key's expiry and
/// a sweep landing in the same milliseconds; three is already generous.
const CLAIM_ROUNDS: usize = 3;

/// A CTE `c`: the new charge of a claim `k` that was just made, if any.
/// Parameters as [`ClaimValues::params`] names them.
const CREATE_CHARGE_OF_K: &str = "c as (
            insert into charges
                (id, merchant_id, order_id, amount_cents, currency, description, acquirer_reference,
                 idempotency_key, traceparent, capture_method, captured_cents,
                 capture_reserved_cents)
            select k.charge_id, $1, $7, $8, $9, $10, $11, $2, $12, $13,
                   case when $13::text is not null then 0 end,
                   case when $13::text is not null then 0 end
              from k
            returning *
        )";

/// Insert first, in one statement: claim the key and create its charge, or
/// read the record that won. No claim is made where the same request left a
/// live tombstone (the statement then returns no row). Parameters as
/// [`ClaimValues::params`] names them; public so that `idem-lab bench
/// --vs-pgbench` runs the very same statement.
pub const CLAIM_SQL: &str = concatcp!(
    "with k as (
                insert into idempotency_keys
                    (merchant_id, idempotency_key, fingerprint, charge_id, locked_until, expires_at)
                select $1, $2, $3, $4, now() + $5 * interval '1 millisecond',
                       now() + $6 * interval '1 millisecond'
                 where not exists (
                       select 1 from key_tombstones t
                        where t.merchant_id = $1 and t.idempotency_key = $2
                          and t.fingerprint = $3 and t.expires_at > now())
                on conflict (merchant_id, idempotency_key) do nothing
                returning *
            ), ",
    CREATE_CHARGE_OF_K,
    "
            select true as won, ",
    RECORD_COLUMNS,
    " from c cross join k
            union all
            select false as won, ",
    RECORD_COLUMNS,
    " from idempotency_keys k join charges c on c.id = k.charge_id
            where k.merchant_id = $1 and k.idempotency_key = $2
              and not exists (select 1 from k)"
);

/// Turns an expired, completed record into a fresh claim for a new intent
/// with a new charge; the old charge stays as it was.
const RECLAIM_SQL: &str = concatcp!(
    "with k as (
        update idempotency_keys
           set fingerprint = $3, charge_id = $4, refund_id = null, step_id = null, state = 'in_flight',
               attempt = attempt + 1, response_status = null, response_body = null,
               locked_until = now() + $5 * interval '1 millisecond',
               expires_at = now() + $6 * interval '1 millisecond', created_at = now()
         where merchant_id = $1 and idempotency_key = $2
           and state = 'completed' and expires_at <= now() and fingerprint <> $3
        returning *
    ), ",
    CREATE_CHARGE_OF_K,
    "
    select ",
    RECORD_COLUMNS,
    " from c cross join k"
);

/// The finalize's last step, after its rows `s` (columns as
/// [`FinalizeValues::params`] names them, `n`, the row's place from 1, and
/// `settled`: whether this attempt still held the record, and its outcome is
/// now stored and the charge settled): for the rows that settled, once for
/// all of them, the charge event in the outbox (when the deployment has
/// events on: the `settings` table) and a webhook delivery for each of the
/// merchant's enabled endpoints that hears the webhook event. The event
/// carries its charge's `traceparent`, if it kept one. Answers each
/// row's place and whether it settled. (Deciding the event and the deliveries
/// once per statement rather than per row gave 2-4 % more new charges/s:
/// docs/benchmarks.md.)
pub(super) const FINALIZE_SETTLED_WRITES: &str = "), e as (
        insert into outbox
            (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent)
        select 'event', s.event_id, s.event_exchange, s.event_type, s.event_tenant,
               s.event_type, s.event_body,
               (select ch.traceparent from charges ch where ch.id = s.charge_id)
          from s
         where s.settled and s.event_id is not null and (select events_enabled from settings)
    ), w as (
        insert into webhook_deliveries (event_id, endpoint_id, event_type, body, charge_id)
        select s.webhook_event_id, we.id, s.webhook_event_type, s.webhook_body, s.charge_id
          from s join webhook_endpoints we on we.merchant_id = s.merchant_id
         where s.settled and s.webhook_event_id is not null and we.disabled_at is null
           and (we.events is null or s.webhook_event_type = any(we.events))
    )
    select n, settled from s order by n";

/// The finalize of one row: the function `idem_finalize` (migration 0011)
/// stores the outcome and settles the charge, fenced by `attempt`, reaching
/// both by primary key whatever plan the connection keeps; then
/// [`FINALIZE_SETTLED_WRITES`]. One statement, one transaction. Parameters
/// as [`FinalizeValues::params`] names them (the event's type is also its
/// routing key). Public for `idem-lab bench --vs-pgbench`.
///
/// The migration says why a function, and that a batch calls it per row: no
/// longer ([`super::batched`] runs one update over a batch's rows, on
/// connections whose planner cannot choose a scan), but a migration's text
/// is checksummed and stays as it shipped.
pub const FINALIZE_SQL: &str = concatcp!(
    "with i as (
        select $1::bigint as merchant_id, $2::text as idempotency_key, $3::text as charge_id,
               $4::bigint as attempt, $5::smallint as response_status,
               $6::bytea as response_body, $7::bigint as key_ttl_ms, $8::text as charge_status,
               $9::text as capture_id, $10::text as decline_reason, $11::text as event_id,
               $12::text as event_exchange, $13::text as event_type, $14::text as event_tenant,
               $15::bytea as event_body, $16::text as webhook_event_id,
               $17::text as webhook_event_type, $18::bytea as webhook_body, 1::bigint as n
    ), s as (
        select i.*, idem_finalize(i.merchant_id, i.idempotency_key, i.charge_id, i.attempt,
                                  i.response_status, i.response_body, i.key_ttl_ms,
                                  i.charge_status, i.capture_id, i.decline_reason) as settled
          from i
    ",
    FINALIZE_SETTLED_WRITES
);

/// `$1` merchant, `$2` key.
const KEY_RECORD_SQL: &str = concatcp!(
    "select ",
    RECORD_COLUMNS,
    " from idempotency_keys k join charges c on c.id = k.charge_id
     where k.merchant_id = $1 and k.idempotency_key = $2"
);

/// A CTE `k`: the record taken over, if the attempt seen still held it and
/// its lease is over, whatever its subject. `$1` merchant, `$2` key, `$3`
/// attempt seen, `$4` lease in ms.
pub(super) const TAKE_OVER_K: &str = "with k as (
        update idempotency_keys
           set attempt = attempt + 1, locked_until = now() + $4 * interval '1 millisecond'
         where merchant_id = $1 and idempotency_key = $2 and attempt = $3
           and state = 'in_flight' and locked_until <= now()
        returning *
    )";

const TAKE_OVER_SQL: &str = concatcp!(
    TAKE_OVER_K,
    " select ",
    RECORD_COLUMNS,
    " from k join charges c on c.id = k.charge_id"
);

/// A CTE `k`: the record released (its lease ended now), if `$3` still
/// holds it; `$1` merchant, `$2` key. The statement it opens schedules the
/// reconciler on the subject in the same statement, so no reconciler can see
/// the record free and its subject not yet rescheduled: `$4` reconciler tries
/// to add (0 or 1), `$5` the reconciler's wait in ms (null: leave the schedule
/// as it is; an existing later schedule is kept), by [`RESCHEDULE`].
pub(super) const RELEASE_K: &str = "with k as (
        update idempotency_keys set locked_until = now()
         where merchant_id = $1 and idempotency_key = $2 and attempt = $3
           and state = 'in_flight'
        returning charge_id, refund_id, step_id
    )";

/// The `set` of a release's update of its subject (a charge or a refund).
pub(super) const RESCHEDULE: &str = " set reconcile_attempts = reconcile_attempts + $4,
           next_reconcile_at = case when $5::bigint is null then next_reconcile_at
               else greatest(coalesce(next_reconcile_at, now()),
                             now() + $5 * interval '1 millisecond') end";

const RELEASE_SQL: &str = concatcp!(
    RELEASE_K,
    " update charges c",
    RESCHEDULE,
    " from k where c.id = k.charge_id"
);

/// Extends the lease of the attempt that holds it (fenced by `attempt`).
/// `$1` merchant, `$2` key, `$3` attempt, `$4` lease in ms.
const RENEW_SQL: &str = "update idempotency_keys
        set locked_until = now() + $4 * interval '1 millisecond'
      where merchant_id = $1 and idempotency_key = $2 and attempt = $3
        and state = 'in_flight'";

/// `$1` limit, `$2` settle deadline in ms: the charges' orphans and the
/// refunds' and the steps', oldest lease first.
const ORPHANS_SQL: &str = "select * from (
     (select k.merchant_id, m.name as merchant_name, k.idempotency_key, k.charge_id,
             k.refund_id, k.step_id, k.attempt, c.reconcile_attempts, c.traceparent,
             c.created_at + $2 * interval '1 millisecond' <= now() as past_deadline,
             k.locked_until
        from idempotency_keys k
        join charges c on c.id = k.charge_id
        join merchants m on m.id = k.merchant_id
       where k.state = 'in_flight' and k.locked_until <= now()
         and c.review_since is null
         and (c.next_reconcile_at is null or c.next_reconcile_at <= now())
       order by k.locked_until
       limit $1)
     union all
     (select k.merchant_id, m.name, k.idempotency_key, k.charge_id, k.refund_id, k.step_id,
             k.attempt, r.reconcile_attempts, r.traceparent,
             r.created_at + $2 * interval '1 millisecond' <= now(), k.locked_until
        from idempotency_keys k
        join refunds r on r.id = k.refund_id
        join merchants m on m.id = k.merchant_id
       where k.state = 'in_flight' and k.locked_until <= now()
         and r.review_since is null
         and (r.next_reconcile_at is null or r.next_reconcile_at <= now())
       order by k.locked_until
       limit $1)
     union all
     (select k.merchant_id, m.name, k.idempotency_key, k.charge_id, k.refund_id, k.step_id,
             k.attempt, s.reconcile_attempts, s.traceparent,
             s.created_at + $2 * interval '1 millisecond' <= now(), k.locked_until
        from idempotency_keys k
        join authorization_steps s on s.id = k.step_id
        join merchants m on m.id = k.merchant_id
       where k.state = 'in_flight' and k.locked_until <= now()
         and s.review_since is null
         and (s.next_reconcile_at is null or s.next_reconcile_at <= now())
       order by k.locked_until
       limit $1)
    ) o
    order by locked_until
    limit $1";

/// `$1` limit, `$2` the tombstone's time to live in ms (from the key's
/// expiry). Each swept record leaves its tombstone, in the same statement.
/// `skip locked`: never waits on a row a request is reclaiming.
const SWEEP_SQL: &str = "with swept as (
        delete from idempotency_keys
         where ctid = any(array(
               select ctid from idempotency_keys
                where state = 'completed' and expires_at <= now()
                limit $1
                for update skip locked))
        returning merchant_id, idempotency_key, fingerprint, charge_id, refund_id, step_id,
                  expires_at
    )
    insert into key_tombstones
        (merchant_id, idempotency_key, fingerprint, charge_id, refund_id, step_id, expires_at)
    select merchant_id, idempotency_key, fingerprint, charge_id, refund_id, step_id,
           expires_at + $2 * interval '1 millisecond'
      from swept
    on conflict (merchant_id, idempotency_key) do update
       set fingerprint = excluded.fingerprint, charge_id = excluded.charge_id,
           refund_id = excluded.refund_id, step_id = excluded.step_id,
           expires_at = excluded.expires_at";

/// `$1` limit: tombstones past their time.
const SWEEP_TOMBSTONES_SQL: &str = "delete from key_tombstones
      where ctid = any(array(
            select ctid from key_tombstones where expires_at <= now()
             limit $1
             for update skip locked))";

/// `$1` merchant, `$2` key: the record's state, else a live tombstone's.
const KEY_STATUS_SQL: &str = "select state, charge_id, refund_id, step_id, response_status,
            expires_at,
            greatest(0, ceil(extract(epoch from (locked_until - now())) * 1000))::bigint
              as lease_remaining_ms,
            (state = 'completed' and expires_at <= now()) as expired
       from idempotency_keys where merchant_id = $1 and idempotency_key = $2
     union all
     select 'tombstone', charge_id, refund_id, step_id, null, expires_at, 0, true
       from key_tombstones
      where merchant_id = $1 and idempotency_key = $2 and expires_at > now()
        and not exists (select 1 from idempotency_keys
                         where merchant_id = $1 and idempotency_key = $2)";

/// `$1` merchant, `$2` key: whose the record is, and whether it expired.
pub(super) const KEY_OWNER_SQL: &str = "select charge_id, refund_id, step_id,
            (state = 'completed' and expires_at <= now()) as expired
       from idempotency_keys where merchant_id = $1 and idempotency_key = $2";

/// `$1` merchant, `$2` key, `$3` fingerprint: the charge of a live tombstone
/// left by the same request.
const TOMBSTONE_SQL: &str = "select charge_id from key_tombstones
      where merchant_id = $1 and idempotency_key = $2 and fingerprint = $3
        and expires_at > now()";

#[derive(sqlx::FromRow)]
struct ClaimAnswer {
    won: bool,
    #[sqlx(flatten)]
    record: RecordRow,
}

#[async_trait::async_trait]
impl Keys for PgStore {
    async fn key_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        self.on_conn(async |db| key_record(db, merchant_id, key).await)
            .await
    }

    async fn key_status(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyStatus>, StoreError> {
        let row: Option<KeyStatusRow> = self
            .on_conn(async |db| {
                sqlx::query_as(KEY_STATUS_SQL)
                    .bind(merchant_id)
                    .bind(key.as_str())
                    .fetch_optional(db)
                    .await
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
        let row: Option<RecordRow> = self
            .take_over_with(TAKE_OVER_SQL, merchant_id, key, attempt, lease)
            .await?;
        row.map(KeyRecord::try_from).transpose()
    }

    async fn renew(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let done = self
            .on_conn(async |db| {
                sqlx::query(RENEW_SQL)
                    .bind(merchant_id)
                    .bind(key.as_str())
                    .bind(attempt)
                    .bind(millis(lease))
                    .execute(db)
                    .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn orphans(
        &self,
        limit: i64,
        settle_deadline: Duration,
    ) -> Result<Vec<Orphan>, StoreError> {
        let rows: Vec<OrphanRow> = self
            .on_conn(async |db| {
                sqlx::query_as(ORPHANS_SQL)
                    .bind(limit)
                    .bind(millis(settle_deadline))
                    .fetch_all(db)
                    .await
            })
            .await?;
        rows.into_iter().map(Orphan::try_from).collect()
    }

    async fn sweep_expired_keys(
        &self,
        limit: i64,
        tombstone_ttl: Duration,
    ) -> Result<u64, StoreError> {
        let done = self
            .on_conn(async |db| {
                sqlx::query(SWEEP_SQL)
                    .bind(limit)
                    .bind(millis(tombstone_ttl))
                    .execute(db)
                    .await
            })
            .await?;
        Ok(done.rows_affected())
    }

    async fn sweep_tombstones(&self, limit: i64) -> Result<u64, StoreError> {
        let done = self
            .on_conn(async |db| {
                sqlx::query(SWEEP_TOMBSTONES_SQL)
                    .bind(limit)
                    .execute(db)
                    .await
            })
            .await?;
        Ok(done.rows_affected())
    }

    async fn release(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.release_with(RELEASE_SQL, merchant_id, key, attempt, reschedule)
            .await
    }
}

impl PgStore {
    /// A claim, in the next batch of claims; alone where the batch cannot
    /// settle it.
    pub(in crate::store) async fn claim_batched(
        &self,
        new: &NewClaim<'_>,
    ) -> Result<Claim, StoreError> {
        match self.claims.submit(ClaimRow::new(new)).await {
            Batched::Done(claim) => claim,
            Batched::Alone => self.claim_one(new).await,
        }
    }

    /// A claim on its own: one statement, and where a record was swept between
    /// statements, another round.
    pub(in crate::store) async fn claim_one(
        &self,
        new: &NewClaim<'_>,
    ) -> Result<Claim, StoreError> {
        claim_on(&self.pool, new).await
    }

    pub(in crate::store) async fn finalize_batched(
        &self,
        values: &FinalizeValues<'_>,
    ) -> Result<bool, StoreError> {
        let Some(entry) = values.audit else {
            return match self.finalizes.submit(FinalizeRow::new(values)).await {
                Batched::Done(settled) => settled,
                Batched::Alone => finalize_on(&self.pool, values).await,
            };
        };
        let args: PgArguments = arguments(&values.params())?;
        // An operator's decision: the outcome and its audit record together.
        self.in_tx(async |db| {
            let (_, settled): (i64, bool) = sqlx::query_as_with(FINALIZE_SQL, args)
                .fetch_one(&mut *db)
                .await?;
            if settled {
                super::audit::record(db, entry).await?;
            }
            Ok(settled)
        })
        .await
    }
}

/// One round of a claim; `None` when the record this round saw was deleted
/// (swept) before the round could use it.
async fn try_claim(db: &mut PgConnection, new: &NewClaim<'_>) -> Result<Option<Claim>, StoreError> {
    let values = ClaimValues::new(new);
    let row: Option<ClaimAnswer> =
        sqlx::query_as_with(CLAIM_SQL, arguments::<PgArguments, 13>(&values.params())?)
            .fetch_optional(&mut *db)
            .await?;
    let record = match row {
        Some(ClaimAnswer { won: true, record }) => return Ok(Some(Claim::Won(record.try_into()?))),
        Some(ClaimAnswer { won: false, record }) => KeyRecord::try_from(record)?,
        // The winner committed after this statement's snapshot was taken:
        // the insert saw its row, the select could not. A fresh read will
        // (unless the row was swept meanwhile: then the next round inserts).
        // Or the same request left a tombstone: nothing was claimed.
        None => match key_record(db, new.merchant_id, new.key).await? {
            Some(record) => record,
            None => match key_owner(db, new.merchant_id, new.key).await? {
                // Another operation's live key; an expired one is free to
                // become this new intent's.
                Some(owner) if !owner.expired => return Ok(Some(Claim::Other(owner.subject))),
                Some(_) => return reclaim_expired(db, new).await,
                None => return Ok(tombstone(db, new).await?.map(Claim::Expired)),
            },
        },
    };
    // An expired record is a new intent only for another request; the same
    // request is a late retry ([`Store::claim`] answers it as expired).
    if record.expired && record.fingerprint != new.fingerprint {
        return reclaim_expired(db, new).await;
    }
    Ok(Some(Claim::Lost(record)))
}

async fn reclaim_expired(
    db: &mut PgConnection,
    new: &NewClaim<'_>,
) -> Result<Option<Claim>, StoreError> {
    let values = ClaimValues::new(new);
    let row: Option<RecordRow> =
        sqlx::query_as_with(RECLAIM_SQL, arguments::<PgArguments, 13>(&values.params())?)
            .fetch_optional(&mut *db)
            .await?;
    match row {
        Some(record) => Ok(Some(Claim::Won(record.try_into()?))),
        // Another attempt reclaimed it first (that one is now the intent),
        // or the sweeper deleted it (the next round inserts afresh).
        None => Ok(key_record(db, new.merchant_id, new.key)
            .await?
            .map(Claim::Lost)),
    }
}

/// The charge of a live tombstone the same request left under the key.
async fn tombstone(
    db: &mut PgConnection,
    new: &NewClaim<'_>,
) -> Result<Option<ChargeId>, StoreError> {
    let row: Option<(String,)> = sqlx::query_as(TOMBSTONE_SQL)
        .bind(new.merchant_id)
        .bind(new.key.as_str())
        .bind(new.fingerprint.as_bytes())
        .fetch_optional(&mut *db)
        .await?;
    Ok(row.map(|(id,)| ChargeId::from_trusted(id)))
}

impl PgStore {
    /// Runs a take-over statement (one that opens with [`TAKE_OVER_K`]) for
    /// the record of any subject, and reads its row.
    pub(super) async fn take_over_with<R>(
        &self,
        sql: &'static str,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: Duration,
    ) -> Result<Option<R>, StoreError>
    where
        R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        self.on_conn(async |db| {
            sqlx::query_as(sql)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(attempt)
                .bind(millis(lease))
                .fetch_optional(db)
                .await
        })
        .await
    }

    /// Runs a release statement (one that opens with [`RELEASE_K`]) for the
    /// record of any subject.
    pub(super) async fn release_with(
        &self,
        sql: &'static str,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.on_conn(async |db| {
            sqlx::query(sql)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(attempt)
                .bind(i32::from(reschedule.reconciler_try))
                .bind(reschedule.not_before.map(millis))
                .execute(db)
                .await
        })
        .await?;
        Ok(())
    }
}

/// A key's subject columns (charge, refund, step) and whether it expired.
type OwnerRow = (Option<String>, Option<String>, Option<String>, bool);

/// Whose the record under a key is, whatever its subject; `None`: no record.
pub(super) async fn key_owner(
    db: &mut PgConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<KeyOwner>, StoreError> {
    let row: Option<OwnerRow> = sqlx::query_as(KEY_OWNER_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .fetch_optional(&mut *db)
        .await?;
    row.map(|(charge_id, refund_id, step_id, expired)| {
        KeyOwner::new(charge_id, refund_id, step_id, expired)
    })
    .transpose()
}

pub(super) async fn key_record(
    db: &mut PgConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<KeyRecord>, StoreError> {
    let row: Option<RecordRow> = sqlx::query_as(KEY_RECORD_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .fetch_optional(&mut *db)
        .await?;
    row.map(KeyRecord::try_from).transpose()
}

/// The one-row claim on a connection of `pool`: one statement, and where a
/// record was swept between statements, another round.
pub(super) async fn claim_on(pool: &PgPool, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
    super::on_pool(pool, async |db| {
        for _ in 0..CLAIM_ROUNDS {
            if let Some(claim) = try_claim(db, new).await? {
                return Ok(claim);
            }
        }
        Err(StoreError::Corrupt(format!(
            "key {} kept vanishing between statements",
            new.key
        )))
    })
    .await
}

/// The one-row finalize (no audit entry) on a connection of `pool`.
pub(super) async fn finalize_on(
    pool: &PgPool,
    values: &FinalizeValues<'_>,
) -> Result<bool, StoreError> {
    let args: PgArguments = arguments(&values.params())?;
    let (_, settled): (i64, bool) = super::on_pool(pool, async |db| {
        sqlx::query_as_with(FINALIZE_SQL, args).fetch_one(db).await
    })
    .await?;
    Ok(settled)
}
