//! The `idempotency_keys` table: claim, read, take over, release, finalize.
//!
//! The article's order, in statements: [`Store::claim`] inserts first
//! (`on conflict do nothing`) and commits at once, creating the charge in the
//! same statement; the acquirer is called with no transaction open; then
//! [`Store::finalize`] stores the outcome and settles the charge in one statement
//! that only succeeds for the current holder of the fencing token.

use std::time::Duration;

use super::charges::{charge_columns, ChargeRow};
use super::{millis, NewEvent, Store, StoreError};
use crate::domain::{AcquirerReference, Charge, ChargeId, ChargeRequest, ChargeStatus, Merchant};
use crate::idempotency::{Fingerprint, IdempotencyKey, StoredResponse};

/// Columns of a key record joined with its charge (aliases `k` and `c`).
/// The lease and expiry are judged by the database's clock, the one clock all
/// instances share.
macro_rules! record_columns {
    () => {
        concat!(
            charge_columns!(),
            ", k.fingerprint, k.state, k.attempt, k.response_status, k.response_body, \
             greatest(0, ceil(extract(epoch from (k.locked_until - now())) * 1000))::bigint \
               as lease_remaining_ms, \
             (k.state = 'completed' and k.expires_at <= now()) as expired"
        )
    };
}

/// Rounds of insert-or-read a claim may need: each extra one means the sweeper
/// deleted the record between two statements, which takes the key's expiry and
/// a sweep landing in the same milliseconds; three is already generous.
const CLAIM_ROUNDS: usize = 3;

/// A CTE `c`: the new charge of a claim `k` that was just made, if any.
/// Parameters as bound by [`bind_new_claim`].
macro_rules! create_charge_of_k {
    () => {
        "c as (
            insert into charges
                (id, merchant_id, order_id, amount_cents, currency, description, acquirer_reference)
            select k.charge_id, $1, $7, $8, $9, $10, $11 from k
            returning *
        )"
    };
}

type PgQueryAs<'q, O> = sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>;

/// Binds `$1..$11` of the statements that make a claim: the key record's
/// columns, then the new charge's, with a fresh charge id and reference.
fn bind_new_claim<'q, O>(query: PgQueryAs<'q, O>, new: &NewClaim<'_>) -> PgQueryAs<'q, O> {
    query
        .bind(new.merchant_id)
        .bind(new.key.as_str().to_owned())
        .bind(new.fingerprint.as_bytes().to_vec())
        .bind(ChargeId::generate().as_str().to_owned())
        .bind(millis(new.lease))
        .bind(millis(new.key_ttl))
        .bind(new.request.order_id.get())
        .bind(new.request.amount_cents.get())
        .bind(new.request.currency.as_str().to_owned())
        .bind(
            new.request
                .description
                .as_ref()
                .map(|d| d.as_str().to_owned()),
        )
        .bind(AcquirerReference::generate().as_str().to_owned())
}

/// Insert first, in one statement: claim the key and create its charge, or
/// read the record that won. Parameters as bound by [`bind_new_claim`]; public
/// so that `idem bench --vs-pgbench` runs the very same statement.
pub const CLAIM_SQL: &str = concat!(
    "with k as (
                insert into idempotency_keys
                    (merchant_id, idempotency_key, fingerprint, charge_id, locked_until, expires_at)
                values ($1, $2, $3, $4, now() + $5 * interval '1 millisecond',
                        now() + $6 * interval '1 millisecond')
                on conflict (merchant_id, idempotency_key) do nothing
                returning *
            ), ",
    create_charge_of_k!(),
    "
            select true as won, ",
    record_columns!(),
    " from c cross join k
            union all
            select false as won, ",
    record_columns!(),
    " from idempotency_keys k join charges c on c.id = k.charge_id
            where k.merchant_id = $1 and k.idempotency_key = $2
              and not exists (select 1 from k)"
);

/// Store the outcome, settle the charge and write its event to the outbox, in
/// one statement (one transaction), fenced by `attempt`:
/// `$1` merchant, `$2` key, `$3` charge id, `$4` attempt, `$5` response status,
/// `$6` response body, `$7` key TTL in ms, `$8` charge status, `$9` capture id,
/// `$10` decline reason; the event: `$11` message id (null: no event), `$12`
/// exchange, `$13` type (also its routing key), `$14` tenant, `$15` body.
/// Public for `idem bench --vs-pgbench`.
pub const FINALIZE_SQL: &str = "with k as (
                update idempotency_keys
                   set state = 'completed', locked_until = null,
                       response_status = $5, response_body = $6,
                       expires_at = now() + $7 * interval '1 millisecond'
                 where merchant_id = $1 and idempotency_key = $2 and charge_id = $3
                   and attempt = $4 and state = 'in_flight'
                returning charge_id
            ), e as (
                insert into outbox (kind, message_id, exchange, routing_key, tenant, event_type, body)
                select 'event', $11, $12, $13, $14, $13, $15 from k where $11::text is not null
            )
            update charges c
               set status = $8, acquirer_capture_id = $9, decline_reason = $10, updated_at = now()
              from k
             where c.id = k.charge_id
            returning c.id";

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
    pub charge: Charge,
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

#[derive(sqlx::FromRow)]
struct ClaimRow {
    won: bool,
    #[sqlx(flatten)]
    record: RecordRow,
}

impl TryFrom<RecordRow> for KeyRecord {
    type Error = StoreError;

    fn try_from(r: RecordRow) -> Result<Self, StoreError> {
        let charge = Charge::try_from(r.charge)?;
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

impl Store {
    /// Insert first: claims the key and creates its charge as `processing` in
    /// one statement, committed on return, or reports the record that won.
    ///
    /// A record that expired is reclaimed for the new intent the same way, by a
    /// conditional update that only one attempt can win.
    pub async fn claim(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        for _ in 0..CLAIM_ROUNDS {
            if let Some(claim) = self.try_claim(new).await? {
                return Ok(claim);
            }
        }
        Err(StoreError::Corrupt(format!(
            "key {} kept vanishing between statements",
            new.key
        )))
    }

    /// One round of [`Store::claim`]; `None` when the record this round saw was
    /// deleted (swept) before the round could use it.
    async fn try_claim(&self, new: &NewClaim<'_>) -> Result<Option<Claim>, StoreError> {
        let query = sqlx::query_as(CLAIM_SQL);
        let row: Option<ClaimRow> = bind_new_claim(query, new)
            .fetch_optional(&self.pool)
            .await?;
        let record = match row {
            Some(ClaimRow { won: true, record }) => {
                return Ok(Some(Claim::Won(record.try_into()?)))
            }
            Some(ClaimRow { won: false, record }) => KeyRecord::try_from(record)?,
            // The winner committed after this statement's snapshot was taken:
            // the insert saw its row, the select could not. A fresh read will
            // (unless the row was swept meanwhile: then the next round inserts).
            None => match self.key_record(new.merchant_id, new.key).await? {
                Some(record) => record,
                None => return Ok(None),
            },
        };
        if record.expired {
            return self.reclaim_expired(new).await;
        }
        Ok(Some(Claim::Lost(record)))
    }

    /// Turns an expired, completed record into a fresh claim for a new intent
    /// with a new charge; the old charge stays as it was.
    async fn reclaim_expired(&self, new: &NewClaim<'_>) -> Result<Option<Claim>, StoreError> {
        let query = sqlx::query_as(concat!(
            "with k as (
                update idempotency_keys
                   set fingerprint = $3, charge_id = $4, state = 'in_flight',
                       attempt = attempt + 1, response_status = null, response_body = null,
                       locked_until = now() + $5 * interval '1 millisecond',
                       expires_at = now() + $6 * interval '1 millisecond', created_at = now()
                 where merchant_id = $1 and idempotency_key = $2
                   and state = 'completed' and expires_at <= now()
                returning *
            ), ",
            create_charge_of_k!(),
            "
            select ",
            record_columns!(),
            " from c cross join k"
        ));
        let row: Option<RecordRow> = bind_new_claim(query, new)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(record) => Ok(Some(Claim::Won(record.try_into()?))),
            // Another attempt reclaimed it first (that one is now the intent),
            // or the sweeper deleted it (the next round inserts afresh).
            None => Ok(self
                .key_record(new.merchant_id, new.key)
                .await?
                .map(Claim::Lost)),
        }
    }

    /// The record under a key, with its charge.
    pub async fn key_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<RecordRow> = sqlx::query_as(concat!(
            "select ",
            record_columns!(),
            " from idempotency_keys k join charges c on c.id = k.charge_id
             where k.merchant_id = $1 and k.idempotency_key = $2"
        ))
        .bind(merchant_id)
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(KeyRecord::try_from).transpose()
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
        let row: Option<RecordRow> = sqlx::query_as(concat!(
            "with k as (
                update idempotency_keys
                   set attempt = attempt + 1, locked_until = now() + $4 * interval '1 millisecond'
                 where merchant_id = $1 and idempotency_key = $2 and attempt = $3
                   and state = 'in_flight' and locked_until <= now()
                returning *
            )
            select ",
            record_columns!(),
            " from k join charges c on c.id = k.charge_id"
        ))
        .bind(merchant_id)
        .bind(key.as_str())
        .bind(attempt)
        .bind(millis(lease))
        .fetch_optional(&self.pool)
        .await?;
        row.map(KeyRecord::try_from).transpose()
    }

    /// Ends the lease early after an unknown outcome, so the next retry re-drives
    /// at once instead of waiting it out. A no-op for a fenced-out holder.
    pub async fn release(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "update idempotency_keys set locked_until = now()
              where merchant_id = $1 and idempotency_key = $2 and attempt = $3
                and state = 'in_flight'",
        )
        .bind(merchant_id)
        .bind(key.as_str())
        .bind(attempt)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Stores the outcome and settles the charge, in one statement, if `attempt`
    /// still holds the record. `false`: another attempt took over (this one is
    /// stale) or already finished; nothing was written.
    pub async fn finalize(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &KeyRecord,
        settlement: &Settlement<'_>,
        key_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let settled: Option<(String,)> = sqlx::query_as(FINALIZE_SQL)
            .bind(merchant_id)
            .bind(key.as_str())
            .bind(record.charge.id.as_str())
            .bind(record.attempt)
            .bind(i16::try_from(settlement.response.status).unwrap_or(i16::MAX))
            .bind(settlement.response.body.as_ref())
            .bind(millis(key_ttl))
            .bind(settlement.status.as_str())
            .bind(settlement.capture_id)
            .bind(settlement.decline_reason)
            .bind(settlement.event.map(|e| e.message_id.as_str()))
            .bind(settlement.event.map(|e| e.exchange))
            .bind(settlement.event.map(|e| e.event_type))
            .bind(settlement.event.map(|e| e.tenant))
            .bind(settlement.event.map(|e| e.body.as_ref()))
            .fetch_optional(&self.pool)
            .await?;
        Ok(settled.is_some())
    }
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

impl Store {
    /// Up to `limit` orphans due for the reconciler, oldest lease first. Reading
    /// them takes nothing: each is then taken with the fenced [`Store::take_over`],
    /// so several reconcilers and servers never work one charge at once.
    pub async fn orphans(
        &self,
        limit: i64,
        settle_deadline: Duration,
    ) -> Result<Vec<Orphan>, StoreError> {
        let rows: Vec<OrphanRow> = sqlx::query_as(
            "select k.merchant_id, m.name as merchant_name, k.idempotency_key, k.charge_id,
                    k.attempt, c.reconcile_attempts,
                    c.created_at + $2 * interval '1 millisecond' <= now() as past_deadline
               from idempotency_keys k
               join charges c on c.id = k.charge_id
               join merchants m on m.id = k.merchant_id
              where k.state = 'in_flight' and k.locked_until <= now()
                and c.review_since is null
                and (c.next_reconcile_at is null or c.next_reconcile_at <= now())
              order by k.locked_until
              limit $1",
        )
        .bind(limit)
        .bind(millis(settle_deadline))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
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
            })
            .collect()
    }

    /// Deletes up to `limit` expired, completed key records; returns how many.
    /// Small bounded batches with `skip locked`: no long lock, no wait on a row
    /// a request is reclaiming. Charges are never deleted, and an in-flight
    /// record never expires.
    pub async fn sweep_expired_keys(&self, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "delete from idempotency_keys
              where ctid = any(array(
                    select ctid from idempotency_keys
                     where state = 'completed' and expires_at <= now()
                     limit $1
                     for update skip locked))",
        )
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
