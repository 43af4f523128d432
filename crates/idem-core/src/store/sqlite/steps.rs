//! Captures and voids on SQLite: the same operations as PostgreSQL's
//! (`idem_claim_step`, `idem_finalize_step` in migrations/postgres/0016),
//! each a few statements in one write transaction, as refunds are
//! ([`super::refunds`]). Under `begin immediate` (the file's one write lock)
//! two steps of one charge take turns, so each guarded update of the charge's
//! row sees what the other reserved or closed: of a void and a capture racing
//! on one authorization, the second is refused, whichever it is. The claim
//! writes the key only once the reservation holds, then the step; a refusal
//! writes nothing.

use const_format::concatcp;
use sqlx::sqlite::SqliteConnection;

use super::key_space::{step_record, taken, STEP_COLUMNS};
use super::keys::{release_in, take_over_key, tombstone, KeyOf, Subject};
use super::webhooks::ENDPOINT_HEARS;
use super::{SqliteStore, NOW};
use crate::domain::{AcquirerReference, EVENTS_EXCHANGE};
use crate::domain::{ChargeId, IdempotencyKey, Step, StepId, StepKind, StepStatus};
use crate::store::error::StoreError;
use crate::store::model::{
    NewStepClaim, NewWebhook, Refusal, Reschedule, StepClaim, StepDetail, StepRecord,
    StepSettlement, Taken,
};
use crate::store::ops::Steps;
use crate::store::rows::StepRow;

/// What a capture without an amount takes: what the authorization has not
/// reserved (null for a charge captured in one step). `$1` charge, `$2`
/// merchant.
const REMAINING_SQL: &str = "select amount_cents - capture_reserved_cents
       from charges where id = $1 and merchant_id = $2";

/// A capture's reservation: the sum rule is this statement's `where`; a final
/// capture also closes the authorization. `$1` charge, `$2` merchant, `$3`
/// amount, `$4` final, `$5` the step.
const RESERVE_CAPTURE_SQL: &str = concatcp!(
    "update charges
        set capture_reserved_cents = capture_reserved_cents + $3,
            capture_closed_by = case when $4 then $5 end, updated_at = ",
    NOW,
    "
      where id = $1 and merchant_id = $2
        and status = 'authorized' and review_since is null
        and capture_closed_by is null
        and capture_reserved_cents + $3 <= amount_cents
     returning currency, $3"
);

/// A void closes the authorization, releasing what was not captured, only
/// while no capture is pending: what it releases is its amount. `$1` charge,
/// `$2` merchant, `$5` the step (bound as the capture's; `$3`, `$4` unused).
const RESERVE_VOID_SQL: &str = concatcp!(
    "update charges
        set capture_closed_by = $5, updated_at = ",
    NOW,
    "
      where id = $1 and merchant_id = $2
        and status = 'authorized' and review_since is null
        and capture_closed_by is null and capture_reserved_cents = captured_cents
     returning currency, amount_cents - captured_cents"
);

/// What a refused reservation found of the charge. `$1` charge, `$2` merchant.
const EXPLAIN_SQL: &str = "select status, review_since is not null as under_review,
            amount_cents - coalesce(capture_reserved_cents, amount_cents) as remaining,
            capture_closed_by is not null as closed,
            coalesce(capture_reserved_cents <> captured_cents, 0) as capturing
       from charges where id = $1 and merchant_id = $2";

const INSERT_STEP_SQL: &str = concatcp!(
    "insert into authorization_steps
        (id, kind, charge_id, merchant_id, amount_cents, currency, final, acquirer_reference,
         idempotency_key, traceparent, created_at, updated_at)
     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, ",
    NOW,
    ", ",
    NOW,
    ")"
);

/// `$1` merchant, `$2` key, `$3` step, `$4` attempt, `$5` status, `$6` body,
/// `$7` key TTL ms.
const FINALIZE_KEY_SQL: &str = concatcp!(
    "update idempotency_keys
        set state = 'completed', locked_until = null,
            response_status = $5, response_body = $6, expires_at = ",
    NOW,
    " + $7
      where merchant_id = $1 and idempotency_key = $2 and step_id = $3
        and attempt = $4 and state <> 'completed'"
);

/// `$1` step, `$2` status, `$3` acquirer's id, `$4` failure reason.
const SETTLE_STEP_SQL: &str = concatcp!(
    "update authorization_steps
        set status = $2, acquirer_id = $3, failure_reason = $4, updated_at = ",
    NOW,
    "
      where id = $1 and status = 'pending'
     returning kind, charge_id, amount_cents, final"
);

/// A capture made: `$1` charge, `$2` its amount, `$3` final. The charge is
/// `captured` once the capture was final or nothing is left to capture.
const CAPTURED_SQL: &str = concatcp!(
    "update charges
        set captured_cents = captured_cents + $2,
            status = case when $3 or captured_cents + $2 = amount_cents
                          then 'captured' else status end,
            updated_at = ",
    NOW,
    " where id = $1"
);

/// A void made: `$1` charge; `captured` if part of it was.
const VOIDED_SQL: &str = concatcp!(
    "update charges
        set status = case when captured_cents > 0 then 'captured' else 'voided' end,
            updated_at = ",
    NOW,
    " where id = $1"
);

/// A step refused gives its reservation back: `$1` charge, `$2` what it
/// reserved (a void: 0), `$3` the step (the closing, if it was this step's).
const RELEASE_RESERVATION_SQL: &str = concatcp!(
    "update charges
        set capture_reserved_cents = capture_reserved_cents - $2,
            capture_closed_by = case when capture_closed_by = $3 then null
                                     else capture_closed_by end,
            updated_at = ",
    NOW,
    " where id = $1"
);

/// As PostgreSQL's: `$1` message id, `$2` exchange, `$3` type, `$4` tenant,
/// `$5` body, `$6` step.
const STEP_EVENT_SQL: &str = concatcp!(
    "insert into outbox
        (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent, created_at)
     select 'event', $1, $2, $3, $4, $3, $5,
            (select traceparent from authorization_steps where id = $6), ",
    NOW,
    " where (select events_enabled from settings)"
);

/// `$1` event id, `$2` type, `$3` body, `$4` merchant, `$5` the step (the
/// deliveries name its charge).
const WEBHOOK_DELIVERIES_SQL: &str = concatcp!(
    "with i as (select $1 as webhook_event_id, $2 as webhook_event_type, $3 as webhook_body)
     insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select i.webhook_event_id, we.id, i.webhook_event_type, i.webhook_body,
            (select s.charge_id from authorization_steps s where s.id = $5), ",
    NOW,
    ", ",
    NOW,
    " from i join webhook_endpoints we on we.merchant_id = $4
      where ",
    ENDPOINT_HEARS
);

/// The reconciler scheduled on a released step (parameters as
/// `keys::release_in` binds them).
const RESCHEDULE_STEP_SQL: &str = concatcp!(
    "update authorization_steps
        set reconcile_attempts = reconcile_attempts + $4,
            next_reconcile_at = case when $5 is null then next_reconcile_at
                else max(coalesce(next_reconcile_at, ",
    NOW,
    "), ",
    NOW,
    " + $5) end
      where id = (select step_id from idempotency_keys
                   where merchant_id = $1 and idempotency_key = $2 and attempt = $3)"
);

/// `$1` step, `$2` reason.
const MARK_FOR_REVIEW_SQL: &str = concatcp!(
    "update authorization_steps set review_since = ",
    NOW,
    ", review_reason = $2, updated_at = ",
    NOW,
    " where id = $1 and status = 'pending' and review_since is null"
);

/// `$1` step.
const DETAIL_SQL: &str = "select s.id, s.kind, s.charge_id, s.merchant_id, m.name as merchant,
            s.amount_cents, s.currency, s.status, s.acquirer_reference,
            strftime('%Y-%m-%dT%H:%M:%fZ', s.created_at / 1000.0, 'unixepoch') as created_at,
            strftime('%Y-%m-%dT%H:%M:%fZ', s.review_since / 1000.0, 'unixepoch') as review_since,
            s.review_reason, s.idempotency_key
       from authorization_steps s join merchants m on m.id = s.merchant_id
      where s.id = $1";

/// `$1` merchant, `$2` key, `$3` step.
const KEY_DETAIL_SQL: &str = "select idempotency_key, state, attempt,
            strftime('%Y-%m-%dT%H:%M:%fZ', locked_until / 1000.0, 'unixepoch') as locked_until,
            response_status,
            strftime('%Y-%m-%dT%H:%M:%fZ', expires_at / 1000.0, 'unixepoch') as expires_at
       from idempotency_keys
      where merchant_id = $1 and idempotency_key = $2 and step_id = $3";

const STEP_SQL: &str = concatcp!(
    "select ",
    STEP_COLUMNS,
    " from authorization_steps s join charges c on c.id = s.charge_id
      where s.id = $1 and s.merchant_id = $2"
);

const STEPS_OF_SQL: &str = concatcp!(
    "select ",
    STEP_COLUMNS,
    " from authorization_steps s join charges c on c.id = s.charge_id
      where s.charge_id = $1 and s.merchant_id = $2
      order by s.created_at, s.id"
);

/// What a refused reservation found ([`Refusal::of_authorization`]).
#[derive(sqlx::FromRow)]
struct Refused {
    status: String,
    under_review: bool,
    remaining: i64,
    closed: bool,
    capturing: bool,
}

#[async_trait::async_trait]
impl Steps for SqliteStore {
    async fn claim_step(&self, claim: &NewStepClaim<'_>) -> Result<StepClaim, StoreError> {
        let id = StepId::generate(claim.kind);
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        self.write(async |tx| -> Result<StepClaim, StoreError> {
            // As a refund's claim: under the file's one write lock nothing
            // changes between these statements, so the key is decided by
            // reading it, and written only once the reservation holds.
            let (merchant_id, key, fingerprint) =
                (claim.merchant_id, claim.key, &claim.fingerprint);
            if let Some(step_id) =
                tombstone(tx, Subject::Step, merchant_id, key, fingerprint).await?
            {
                return Ok(StepClaim::Expired(StepId::from_trusted(step_id)));
            }
            let found = taken(tx, merchant_id, key).await?;
            let free = match &found {
                None => true,
                Some(t) => t.expired() && t.fingerprint() != fingerprint,
            };
            if !free {
                return found
                    .map(Taken::into_step_claim)
                    .ok_or_else(|| StoreError::Corrupt("a taken key not found".into()));
            }
            let Some((currency, amount)) = reserve(tx, claim, &id).await? else {
                let charge: Option<Refused> = sqlx::query_as(EXPLAIN_SQL)
                    .bind(claim.charge_id.as_str())
                    .bind(merchant_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                return Ok(StepClaim::Refused(Refusal::of_authorization(
                    claim.kind,
                    charge.map(|c| (c.status, c.under_review, c.remaining, c.closed, c.capturing)),
                )));
            };
            KeyOf {
                subject: Subject::Step,
                id: id.as_str(),
                merchant_id,
                key,
                fingerprint,
                lease: claim.lease,
                key_ttl: claim.key_ttl,
            }
            .claim(tx, found.is_none())
            .await?;
            sqlx::query(INSERT_STEP_SQL)
                .bind(id.as_str())
                .bind(claim.kind.as_str())
                .bind(claim.charge_id.as_str())
                .bind(merchant_id)
                .bind(amount)
                .bind(&currency)
                .bind(claim.kind == StepKind::Void || claim.final_capture)
                .bind(reference.as_str())
                .bind(key.as_str())
                .bind(claim.traceparent)
                .execute(&mut *tx)
                .await?;
            let record = step_record(tx, merchant_id, key)
                .await?
                .ok_or_else(|| StoreError::Corrupt("a step claimed and not read back".into()))?;
            Ok(StepClaim::Won(Box::new(record)))
        })
        .await
    }

    async fn step_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<StepRecord>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        step_record(&mut conn, merchant_id, key).await
    }

    async fn finalize_step(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &StepRecord,
        s: &StepSettlement<'_>,
        key_ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let step = &record.subject.id;
        self.write(async |tx| -> Result<bool, StoreError> {
            let keyed = sqlx::query(FINALIZE_KEY_SQL)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(step.as_str())
                .bind(record.attempt)
                .bind(i64::from(s.response.status))
                .bind(s.response.body.as_ref())
                .bind(crate::store::shared::millis(key_ttl))
                .execute(&mut *tx)
                .await?;
            if keyed.rows_affected() == 0 {
                return Ok(false);
            }
            if let Some(entry) = s.audit {
                super::audit::record(tx, entry).await?;
            }
            let settled: Option<(String, String, i64, bool)> = sqlx::query_as(SETTLE_STEP_SQL)
                .bind(step.as_str())
                .bind(s.status.as_str())
                .bind(s.acquirer_id)
                .bind(s.failure_reason)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((kind, charge_id, amount, final_capture)) = settled else {
                // Settled already: it keeps its status.
                return Ok(true);
            };
            let capture = kind == StepKind::Capture.as_str();
            let settle = match (s.status, capture) {
                (StepStatus::Succeeded, true) => sqlx::query(CAPTURED_SQL)
                    .bind(&charge_id)
                    .bind(amount)
                    .bind(final_capture),
                (StepStatus::Succeeded, false) => sqlx::query(VOIDED_SQL).bind(&charge_id),
                _ => sqlx::query(RELEASE_RESERVATION_SQL)
                    .bind(&charge_id)
                    .bind(if capture { amount } else { 0 })
                    .bind(step.as_str()),
            };
            settle.execute(&mut *tx).await?;
            if let Some(event) = s.event {
                sqlx::query(STEP_EVENT_SQL)
                    .bind(event.message_id.as_str())
                    .bind(EVENTS_EXCHANGE)
                    .bind(event.event_type)
                    .bind(event.tenant)
                    .bind(event.body.as_ref())
                    .bind(step.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(webhook) = s.webhook {
                deliver(tx, merchant_id, step, webhook).await?;
            }
            Ok(true)
        })
        .await
    }

    async fn take_over_step(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> Result<Option<StepRecord>, StoreError> {
        self.write(async |tx| {
            if !take_over_key(tx, merchant_id, key, attempt, lease).await? {
                return Ok(None);
            }
            step_record(tx, merchant_id, key).await
        })
        .await
    }

    async fn release_step(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            release_in(
                tx,
                RESCHEDULE_STEP_SQL,
                merchant_id,
                key,
                attempt,
                reschedule,
            )
            .await
        })
        .await
    }

    async fn mark_step_for_review(
        &self,
        merchant_id: i64,
        id: &StepId,
        reason: &str,
        webhook: &NewWebhook,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            let marked = sqlx::query(MARK_FOR_REVIEW_SQL)
                .bind(id.as_str())
                .bind(reason)
                .execute(&mut *tx)
                .await?;
            if marked.rows_affected() == 1 {
                deliver(tx, merchant_id, id, webhook).await?;
            }
            Ok(())
        })
        .await
    }

    async fn step_detail(&self, id: &str) -> Result<Option<StepDetail>, StoreError> {
        let step: Option<StepDetail> = sqlx::query_as(DETAIL_SQL)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(mut step) = step else {
            return Ok(None);
        };
        step.key = sqlx::query_as(KEY_DETAIL_SQL)
            .bind(step.merchant_id)
            .bind(&step.idempotency_key)
            .bind(&step.id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(Some(step))
    }

    async fn step(&self, merchant_id: i64, id: &StepId) -> Result<Option<Step>, StoreError> {
        let row: Option<StepRow> = sqlx::query_as(STEP_SQL)
            .bind(id.as_str())
            .bind(merchant_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(Step::try_from).transpose()
    }

    async fn steps_of(
        &self,
        merchant_id: i64,
        charge_id: &ChargeId,
    ) -> Result<Vec<Step>, StoreError> {
        let rows: Vec<StepRow> = sqlx::query_as(STEPS_OF_SQL)
            .bind(charge_id.as_str())
            .bind(merchant_id)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(Step::try_from).collect()
    }
}

/// The claim's reservation against the authorization, in its write
/// transaction: the charge's currency and the amount reserved (a void's: what
/// it releases); `None` when the charge refused it.
async fn reserve(
    tx: &mut SqliteConnection,
    claim: &NewStepClaim<'_>,
    id: &StepId,
) -> Result<Option<(String, i64)>, StoreError> {
    let amount = match (claim.kind, claim.amount) {
        (StepKind::Void, _) => None,
        (StepKind::Capture, Some(amount)) => Some(amount.get()),
        // All the authorization has left, if anything.
        (StepKind::Capture, None) => {
            let remaining: Option<(Option<i64>,)> = sqlx::query_as(REMAINING_SQL)
                .bind(claim.charge_id.as_str())
                .bind(claim.merchant_id)
                .fetch_optional(&mut *tx)
                .await?;
            match remaining.and_then(|(r,)| r).filter(|r| *r > 0) {
                Some(remaining) => Some(remaining),
                None => return Ok(None),
            }
        }
    };
    let sql = match claim.kind {
        StepKind::Capture => RESERVE_CAPTURE_SQL,
        StepKind::Void => RESERVE_VOID_SQL,
    };
    Ok(sqlx::query_as(sql)
        .bind(claim.charge_id.as_str())
        .bind(claim.merchant_id)
        .bind(amount)
        .bind(claim.final_capture)
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await?)
}

/// The webhook event's deliveries, in the caller's write transaction.
async fn deliver(
    tx: &mut SqliteConnection,
    merchant_id: i64,
    step: &StepId,
    webhook: &NewWebhook,
) -> Result<(), StoreError> {
    sqlx::query(WEBHOOK_DELIVERIES_SQL)
        .bind(webhook.event_id.as_str())
        .bind(webhook.event_type)
        .bind(webhook.body.as_ref())
        .bind(merchant_id)
        .bind(step.as_str())
        .execute(tx)
        .await?;
    Ok(())
}

/// Throwaway checks of migration 0012 and the steps on SQLite (helper's).
#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::str::FromStr;
    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

    use crate::domain::{
        AmountCents, CaptureRequest, ChargeId, ChargeRequest, ChargeStatus, Currency, Fingerprint,
        IdempotencyKey, OrderId, RefundRequest, RefundStatus, StepKind, StepStatus, StoredResponse,
        SubjectId,
    };
    use crate::store::model::{
        Claim, KeyStatus, NewClaim, NewRefundClaim, NewStepClaim, RefundClaim, RefundSettlement,
        Refusal, Settlement, StepClaim, StepRecord, StepSettlement, Taken,
    };
    use crate::store::Store;

    const M: i64 = 1;

    fn key(s: &str) -> IdempotencyKey {
        IdempotencyKey::from_unquoted(s).unwrap()
    }

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            body: b"{}".to_vec().into(),
        }
    }

    /// A database at migration 0011, with rows in it, as the previous release left it.
    async fn old_database(url: &str) -> SqlitePool {
        let options = SqliteConnectOptions::from_str(url)
            .unwrap()
            .create_if_missing(true)
            .foreign_keys(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        let all = sqlx::migrate!("./migrations/sqlite");
        let old = sqlx::migrate::Migrator {
            migrations: Cow::Owned(
                all.migrations
                    .iter()
                    .filter(|m| m.version < 12)
                    .cloned()
                    .collect(),
            ),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        old.run(&pool).await.unwrap();
        for sql in [
            "insert into merchants (id, name, secret_hash, created_at) values (1, 'loja', x'01', 1)",
            "insert into merchants (id, name, secret_hash, created_at) values (2, 'outra', x'02', 1)",
            // A captured charge partly refunded, one in flight, one declined.
            "insert into charges (id, merchant_id, order_id, amount_cents, currency, status,
                acquirer_reference, acquirer_capture_id, created_at, updated_at, idempotency_key,
                traceparent, refunded_cents)
             values ('ch_old1', 1, 1, 1000, 'EUR', 'captured', 'ref_old1', 'cap_1', 10, 11, 'k1',
                     '00-tp', 300)",
            "insert into charges (id, merchant_id, order_id, amount_cents, currency, status,
                acquirer_reference, created_at, updated_at, idempotency_key, review_since,
                review_reason, reconcile_attempts, next_reconcile_at)
             values ('ch_old2', 1, 2, 500, 'EUR', 'processing', 'ref_old2', 20, 21, 'k2', 22,
                     'stuck', 3, 23)",
            "insert into charges (id, merchant_id, order_id, amount_cents, currency, status,
                acquirer_reference, decline_reason, created_at, updated_at, description)
             values ('ch_old3', 2, 3, 700, 'USD', 'declined', 'ref_old3', 'no', 30, 31, 'd')",
            "insert into refunds (id, charge_id, merchant_id, amount_cents, currency, status,
                acquirer_reference, idempotency_key, created_at, updated_at)
             values ('re_old1', 'ch_old1', 1, 300, 'EUR', 'succeeded', 'ref_re1', 'k3', 12, 13)",
            "insert into idempotency_keys (merchant_id, idempotency_key, fingerprint, charge_id,
                state, attempt, response_status, response_body, created_at, expires_at)
             values (1, 'k1', randomblob(32), 'ch_old1', 'completed', 1, 201, x'7b7d', 10, 9999999999999)",
            "insert into idempotency_keys (merchant_id, idempotency_key, fingerprint, charge_id,
                state, attempt, locked_until, created_at, expires_at)
             values (1, 'k2', randomblob(32), 'ch_old2', 'in_flight', 2, 25, 20, 9999999999999)",
            "insert into idempotency_keys (merchant_id, idempotency_key, fingerprint, refund_id,
                state, attempt, response_status, response_body, created_at, expires_at)
             values (1, 'k3', randomblob(32), 're_old1', 'completed', 1, 201, x'7b7d', 12, 9999999999999)",
            "insert into key_tombstones (merchant_id, idempotency_key, fingerprint, charge_id,
                expires_at)
             values (2, 'k9', randomblob(32), 'ch_old3', 9999999999999)",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool
    }

    async fn dump(pool: &SqlitePool, table: &str, columns: &str) -> Vec<String> {
        let sql = format!("select json_array(rowid, {columns}) from {table} order by rowid");
        sqlx::query_scalar(&sql).fetch_all(pool).await.unwrap()
    }

    const CHARGE_COLUMNS: &str = "id, merchant_id, order_id, amount_cents, currency, description,
        status, acquirer_reference, acquirer_capture_id, decline_reason, created_at, updated_at,
        reconcile_attempts, next_reconcile_at, review_since, review_reason, idempotency_key,
        traceparent, refunded_cents";
    const REFUND_COLUMNS: &str = "id, charge_id, merchant_id, amount_cents, currency, reason,
        description, status, acquirer_reference, acquirer_refund_id, failure_reason,
        idempotency_key, reconcile_attempts, next_reconcile_at, review_since, review_reason,
        traceparent, created_at, updated_at";
    const KEY_COLUMNS: &str = "merchant_id, idempotency_key, hex(fingerprint), charge_id, state,
        locked_until, attempt, response_status, hex(response_body), created_at, expires_at,
        refund_id";

    async fn authorize(store: &Store, k: &IdempotencyKey, amount: i64) -> ChargeId {
        let request = ChargeRequest {
            order_id: OrderId::parse(7).unwrap(),
            amount_cents: AmountCents::parse(amount).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            description: None,
            capture: false,
        };
        let claim = NewClaim {
            merchant_id: M,
            key: k,
            fingerprint: Fingerprint::of_charge(&request),
            request: &request,
            lease: Duration::from_secs(30),
            key_ttl: Duration::from_secs(3600),
            traceparent: None,
        };
        let Claim::Won(record) = store.claim(&claim).await.unwrap() else {
            panic!("authorization not won");
        };
        let settled = store
            .finalize(
                M,
                k,
                &record,
                &Settlement {
                    status: ChargeStatus::Authorized,
                    capture_id: None,
                    decline_reason: None,
                    response: &response(),
                    event: None,
                    webhook: None,
                    audit: None,
                },
                Duration::from_secs(3600),
            )
            .await
            .unwrap();
        assert!(settled);
        record.subject.id
    }

    async fn step(
        store: &Store,
        k: &str,
        charge: &ChargeId,
        kind: StepKind,
        amount: Option<i64>,
        final_capture: bool,
    ) -> StepClaim {
        let k = key(k);
        let fingerprint = match kind {
            StepKind::Capture => Fingerprint::of_capture(
                charge,
                &CaptureRequest {
                    amount_cents: amount.map(|a| AmountCents::parse(a).unwrap()),
                    final_capture,
                },
            ),
            StepKind::Void => Fingerprint::of_void(charge),
        };
        store
            .claim_step(&NewStepClaim {
                merchant_id: M,
                key: &k,
                fingerprint,
                charge_id: charge,
                kind,
                amount: amount.map(|a| AmountCents::parse(a).unwrap()),
                final_capture,
                lease: Duration::from_secs(30),
                key_ttl: Duration::from_secs(3600),
                traceparent: Some("00-step"),
            })
            .await
            .unwrap()
    }

    fn won(claim: StepClaim) -> StepRecord {
        match claim {
            StepClaim::Won(record) => *record,
            other => panic!("not won: {other:?}"),
        }
    }

    fn refused(claim: StepClaim) -> Refusal {
        match claim {
            StepClaim::Refused(refusal) => refusal,
            other => panic!("not refused: {other:?}"),
        }
    }

    async fn finalize(store: &Store, k: &str, record: &StepRecord, status: StepStatus) -> bool {
        store
            .finalize_step(
                M,
                &key(k),
                record,
                &StepSettlement {
                    status,
                    acquirer_id: Some("acq"),
                    failure_reason: (status == StepStatus::Failed).then_some("refused"),
                    response: &response(),
                    event: None,
                    webhook: None,
                    audit: None,
                },
                Duration::from_secs(3600),
            )
            .await
            .unwrap()
    }

    /// (status, captured, reserved, closed_by)
    async fn charge(
        pool: &SqlitePool,
        id: &ChargeId,
    ) -> (String, Option<i64>, Option<i64>, Option<String>) {
        sqlx::query_as(
            "select status, captured_cents, capture_reserved_cents, capture_closed_by
               from charges where id = $1",
        )
        .bind(id.as_str())
        .fetch_one(pool)
        .await
        .unwrap()
    }

    async fn fk_check(pool: &SqlitePool) {
        let violations: Vec<(String,)> =
            sqlx::query_as("select \"table\" from pragma_foreign_key_check")
                .fetch_all(pool)
                .await
                .unwrap();
        assert!(violations.is_empty(), "{violations:?}");
        let (ok,): (String,) = sqlx::query_as("pragma integrity_check")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(ok, "ok");
    }

    #[tokio::test]
    async fn migration_0012_and_two_step_on_sqlite() {
        let dir = std::env::temp_dir().join(format!(
            "idem_two_step_{}",
            crate::domain::ChargeId::generate().as_str()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/idem.db", dir.display());
        let pool = old_database(&url).await;
        let charges_before = dump(&pool, "charges", CHARGE_COLUMNS).await;
        let keys_before = dump(&pool, "idempotency_keys", KEY_COLUMNS).await;
        let refunds_before = dump(&pool, "refunds", REFUND_COLUMNS).await;

        let store = Store::connect(&url, 4).await.unwrap();
        store.migrate().await.unwrap();
        // Again: nothing to do.
        store.migrate().await.unwrap();

        assert_eq!(dump(&pool, "charges", CHARGE_COLUMNS).await, charges_before);
        assert_eq!(
            dump(&pool, "idempotency_keys", KEY_COLUMNS).await,
            keys_before
        );
        assert_eq!(dump(&pool, "refunds", REFUND_COLUMNS).await, refunds_before);
        type NewColumns = (Option<String>, Option<i64>, Option<i64>, Option<String>);
        let new_columns: Vec<NewColumns> = sqlx::query_as(
            "select capture_method, captured_cents, capture_reserved_cents, capture_closed_by
                   from charges",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(new_columns.iter().all(|c| *c == (None, None, None, None)));
        fk_check(&pool).await;
        let (fk_on,): (i64,) = sqlx::query_as("pragma foreign_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(fk_on, 1);
        let indexes: Vec<(String,)> = sqlx::query_as(
            "select name from sqlite_master where type = 'index' and sql is not null order by name",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let indexes: Vec<String> = indexes.into_iter().map(|(n,)| n).collect();
        for expected in [
            "charges_processing",
            "charges_authorized",
            "authorization_steps_charge",
            "authorization_steps_pending",
            "idempotency_keys_in_flight",
            "idempotency_keys_expiry",
            "idempotency_keys_charge",
            "idempotency_keys_refund",
            "idempotency_keys_step",
            "key_tombstones_expires_at",
        ] {
            assert!(
                indexes.iter().any(|i| i == expected),
                "{expected}: {indexes:?}"
            );
        }
        assert!(
            !indexes
                .iter()
                .any(|i| i.contains("0012") || i.contains("_new")),
            "{indexes:?}"
        );
        let leftovers: Vec<(String,)> = sqlx::query_as(
            "select name from sqlite_master where name like '%before_0012%' or name like '%_new'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // The foreign keys still hold: a refund of no charge is refused.
        assert!(sqlx::query(
            "insert into refunds (id, charge_id, merchant_id, amount_cents, currency,
                acquirer_reference, idempotency_key, created_at, updated_at)
             values ('re_x', 'ch_none', 1, 1, 'EUR', 'ref_x', 'kx', 1, 1)"
        )
        .execute(&pool)
        .await
        .is_err());
        // The checks hold: a status unknown, captures beyond the authorization.
        assert!(
            sqlx::query("update charges set status = 'nope' where id = 'ch_old1'")
                .execute(&pool)
                .await
                .is_err()
        );
        assert!(sqlx::query(
            "update charges set capture_method = 'manual', captured_cents = 0,
                capture_reserved_cents = 1001 where id = 'ch_old1'"
        )
        .execute(&pool)
        .await
        .is_err());
        // The old refund's record still reads as the refund's.
        assert!(store.refund_record(M, &key("k3")).await.unwrap().is_some());

        // Authorize 1000, then two partial captures.
        let ch = authorize(&store, &key("auth1"), 1000).await;
        assert_eq!(
            charge(&pool, &ch).await,
            ("authorized".into(), Some(0), Some(0), None)
        );
        let c1 = won(step(&store, "c1", &ch, StepKind::Capture, Some(400), false).await);
        assert_eq!(c1.subject.amount_cents.get(), 400);
        assert_eq!(c1.subject.status, StepStatus::Pending);
        assert_eq!(c1.subject.final_capture, Some(false));
        assert_eq!(c1.attempt, 1);
        let c2 = won(step(&store, "c2", &ch, StepKind::Capture, Some(300), false).await);
        assert_eq!(
            charge(&pool, &ch).await,
            ("authorized".into(), Some(0), Some(700), None)
        );
        // Over what remains: refused, nothing written.
        let keys = dump(&pool, "idempotency_keys", KEY_COLUMNS).await.len();
        assert_eq!(
            refused(step(&store, "c3", &ch, StepKind::Capture, Some(400), false).await),
            Refusal::ExceedsAuthorization { remaining: 300 }
        );
        // A void while captures are pending: refused.
        assert_eq!(
            refused(step(&store, "v1", &ch, StepKind::Void, None, true).await),
            Refusal::CapturePending
        );
        assert_eq!(
            dump(&pool, "idempotency_keys", KEY_COLUMNS).await.len(),
            keys
        );
        assert_eq!(
            charge(&pool, &ch).await,
            ("authorized".into(), Some(0), Some(700), None)
        );
        // The same capture again: its record.
        match step(&store, "c1", &ch, StepKind::Capture, Some(400), false).await {
            StepClaim::Lost(taken) => match *taken {
                Taken::Step(r) => assert_eq!(r.subject.id, c1.subject.id),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        // A refund under a step's key: answered with the step's record.
        let refund = |k: &'static str, amount: i64| {
            let store = store.clone();
            let ch = ch.clone();
            async move {
                let request = RefundRequest {
                    amount_cents: Some(AmountCents::parse(amount).unwrap()),
                    reason: None,
                    description: None,
                };
                let k = key(k);
                store
                    .claim_refund(&NewRefundClaim {
                        merchant_id: M,
                        key: &k,
                        fingerprint: Fingerprint::of_refund(&ch, &request),
                        charge_id: &ch,
                        request: &request,
                        lease: Duration::from_secs(30),
                        key_ttl: Duration::from_secs(3600),
                        traceparent: None,
                    })
                    .await
                    .unwrap()
            }
        };
        match refund("c1", 100).await {
            RefundClaim::Lost(taken) => assert!(matches!(*taken, Taken::Step(_)), "{taken:?}"),
            other => panic!("{other:?}"),
        }
        // A charge under a step's key: another operation's.
        let request = ChargeRequest {
            order_id: OrderId::parse(8).unwrap(),
            amount_cents: AmountCents::parse(5).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            description: None,
            capture: true,
        };
        let c1_key = key("c1");
        let claimed = store
            .claim(&NewClaim {
                merchant_id: M,
                key: &c1_key,
                fingerprint: Fingerprint::of_charge(&request),
                request: &request,
                lease: Duration::from_secs(30),
                key_ttl: Duration::from_secs(3600),
                traceparent: None,
            })
            .await
            .unwrap();
        assert!(
            matches!(&claimed, Claim::Other(SubjectId::Step(id)) if *id == c1.subject.id),
            "{claimed:?}"
        );
        // Nothing captured yet: nothing to refund.
        assert!(matches!(
            refund("r0", 1).await,
            RefundClaim::Refused(Refusal::Exceeds { remaining: 0 })
        ));

        // c1 made, c2 refused by the acquirer: its amount goes back.
        assert!(finalize(&store, "c1", &c1, StepStatus::Succeeded).await);
        assert!(
            !finalize(&store, "c1", &c1, StepStatus::Succeeded).await,
            "fenced"
        );
        assert_eq!(
            charge(&pool, &ch).await,
            ("authorized".into(), Some(400), Some(700), None)
        );
        assert!(finalize(&store, "c2", &c2, StepStatus::Failed).await);
        assert_eq!(
            charge(&pool, &ch).await,
            ("authorized".into(), Some(400), Some(400), None)
        );
        let c2_now = store.step(M, &c2.subject.id).await.unwrap().unwrap();
        assert_eq!(c2_now.status, StepStatus::Failed);
        assert_eq!(c2_now.failure_reason.as_deref(), Some("refused"));
        // Refunds of an authorization partly captured: up to what was captured.
        assert!(matches!(
            refund("r1", 401).await,
            RefundClaim::Refused(Refusal::Exceeds { remaining: 400 })
        ));
        let RefundClaim::Won(r2) = refund("r2", 150).await else {
            panic!("refund of what was captured");
        };
        assert!(store
            .finalize_refund(
                M,
                &key("r2"),
                &r2,
                &RefundSettlement {
                    status: RefundStatus::Succeeded,
                    acquirer_refund_id: None,
                    failure_reason: None,
                    response: &response(),
                    event: None,
                    webhook: None,
                    audit: None,
                },
                Duration::from_secs(3600),
            )
            .await
            .unwrap());

        // The rest, final, without an amount: 600.
        let c4 = won(step(&store, "c4", &ch, StepKind::Capture, None, true).await);
        assert_eq!(c4.subject.amount_cents.get(), 600);
        assert_eq!(c4.subject.final_capture, Some(true));
        let closed = Some(c4.subject.id.as_str().to_owned());
        assert_eq!(
            charge(&pool, &ch).await,
            ("authorized".into(), Some(400), Some(1000), closed.clone())
        );
        assert_eq!(
            refused(step(&store, "c5", &ch, StepKind::Capture, Some(1), false).await),
            Refusal::AuthorizationClosed
        );
        assert_eq!(
            refused(step(&store, "v2", &ch, StepKind::Void, None, true).await),
            Refusal::AuthorizationClosed
        );
        assert!(finalize(&store, "c4", &c4, StepStatus::Succeeded).await);
        assert_eq!(
            charge(&pool, &ch).await,
            ("captured".into(), Some(1000), Some(1000), closed)
        );
        assert_eq!(
            refused(step(&store, "c6", &ch, StepKind::Capture, Some(1), false).await),
            Refusal::NotAuthorized {
                status: ChargeStatus::Captured,
                under_review: false
            }
        );
        let steps = store.steps_of(M, &ch).await.unwrap();
        assert_eq!(steps.len(), 3);
        let c = store.charge(M, &ch).await.unwrap().unwrap();
        let auth = c.authorization.expect("a two-step charge");
        assert_eq!(
            (auth.amount_captured_cents, auth.amount_capturable_cents),
            (1000, 0)
        );

        // A final capture refused gives its closing back.
        let ch2 = authorize(&store, &key("auth2"), 500).await;
        let f = won(step(&store, "f1", &ch2, StepKind::Capture, Some(200), true).await);
        assert_eq!(
            refused(step(&store, "f2", &ch2, StepKind::Capture, Some(1), false).await),
            Refusal::AuthorizationClosed
        );
        assert!(finalize(&store, "f1", &f, StepStatus::Failed).await);
        assert_eq!(
            charge(&pool, &ch2).await,
            ("authorized".into(), Some(0), Some(0), None)
        );
        // A partial capture, then a void: captured, what was left released.
        let p = won(step(&store, "p1", &ch2, StepKind::Capture, Some(200), false).await);
        assert!(finalize(&store, "p1", &p, StepStatus::Succeeded).await);
        let v = won(step(&store, "v3", &ch2, StepKind::Void, None, true).await);
        assert_eq!(v.subject.amount_cents.get(), 300);
        assert_eq!(v.subject.final_capture, None);
        assert_eq!(
            refused(step(&store, "p2", &ch2, StepKind::Capture, Some(1), false).await),
            Refusal::AuthorizationClosed
        );
        assert!(finalize(&store, "v3", &v, StepStatus::Succeeded).await);
        assert_eq!(
            charge(&pool, &ch2).await,
            (
                "captured".into(),
                Some(200),
                Some(200),
                Some(v.subject.id.as_str().to_owned())
            )
        );
        // A void of nothing captured: voided.
        let ch3 = authorize(&store, &key("auth3"), 900).await;
        let v = won(step(&store, "v4", &ch3, StepKind::Void, None, true).await);
        assert_eq!(v.subject.amount_cents.get(), 900);
        // With events on and an endpoint: the step's event (with its
        // traceparent) and deliveries naming its charge.
        sqlx::query("update settings set events_enabled = 1")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "insert into webhook_endpoints (id, merchant_id, url, secret, created_at)
             values ('we_1', 1, 'http://x', 's', 1)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let event = crate::store::model::NewEvent {
            message_id: crate::domain::MessageId::event(),
            event_type: "charge.voided",
            tenant: "loja",
            body: b"{}".to_vec().into(),
        };
        let webhook = crate::store::model::NewWebhook {
            event_id: crate::domain::MessageId::event(),
            event_type: "charge.voided",
            body: b"{}".to_vec().into(),
        };
        assert!(store
            .finalize_step(
                M,
                &key("v4"),
                &v,
                &StepSettlement {
                    status: StepStatus::Succeeded,
                    acquirer_id: None,
                    failure_reason: None,
                    response: &response(),
                    event: Some(&event),
                    webhook: Some(&webhook),
                    audit: None,
                },
                Duration::from_secs(3600),
            )
            .await
            .unwrap());
        let (traceparent,): (Option<String>,) =
            sqlx::query_as("select traceparent from outbox where message_id = $1")
                .bind(event.message_id.as_str())
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(traceparent.as_deref(), Some("00-step"));
        let (delivered,): (String,) =
            sqlx::query_as("select charge_id from webhook_deliveries where event_id = $1")
                .bind(webhook.event_id.as_str())
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(delivered, ch3.as_str());
        // A pending step set aside for a person: once.
        let ch5 = authorize(&store, &key("auth5"), 100).await;
        let r = won(step(&store, "rv1", &ch5, StepKind::Capture, Some(10), false).await);
        for _ in 0..2 {
            let webhook = crate::store::model::NewWebhook {
                event_id: crate::domain::MessageId::event(),
                event_type: "capture.review",
                body: b"{}".to_vec().into(),
            };
            store
                .mark_step_for_review(M, &r.subject.id, "slow", &webhook)
                .await
                .unwrap();
        }
        let detail = store
            .step_detail(r.subject.id.as_str())
            .await
            .unwrap()
            .unwrap();
        assert!(detail.awaiting_review());
        let (n,): (i64,) = sqlx::query_as(
            "select count(*) from webhook_deliveries where event_type = 'capture.review'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(n, 1);
        assert_eq!(charge(&pool, &ch3).await.0, "voided");
        // One-step charges and no charge.
        let old = ChargeId::from_trusted("ch_old1".into());
        assert_eq!(
            refused(step(&store, "s1", &old, StepKind::Capture, None, true).await),
            Refusal::NotAuthorized {
                status: ChargeStatus::Captured,
                under_review: false
            }
        );
        let none = ChargeId::from_trusted("ch_none".into());
        assert_eq!(
            refused(step(&store, "s2", &none, StepKind::Void, None, true).await),
            Refusal::NoSuchCharge
        );

        // A step's key: its status, an orphan once its lease is over, taken
        // over, released, swept to a tombstone that answers a late retry.
        let ch4 = authorize(&store, &key("auth4"), 100).await;
        let k = key("o1");
        let fingerprint = Fingerprint::of_void(&ch4);
        let StepClaim::Won(o) = store
            .claim_step(&NewStepClaim {
                merchant_id: M,
                key: &k,
                fingerprint,
                charge_id: &ch4,
                kind: StepKind::Void,
                amount: None,
                final_capture: true,
                lease: Duration::ZERO,
                key_ttl: Duration::ZERO,
                traceparent: None,
            })
            .await
            .unwrap()
        else {
            panic!("void not won");
        };
        assert!(matches!(
            store.key_status(M, &k).await.unwrap(),
            Some(KeyStatus::InFlight {
                subject: SubjectId::Step(_),
                ..
            })
        ));
        let orphans = store.orphans(10, Duration::from_secs(3600)).await.unwrap();
        assert!(
            orphans
                .iter()
                .any(|orphan| orphan.subject == SubjectId::Step(o.subject.id.clone())),
            "{orphans:?}"
        );
        let taken = store
            .take_over_step(M, &k, o.attempt, Duration::ZERO)
            .await
            .unwrap()
            .expect("taken over");
        assert_eq!(taken.attempt, 2);
        store
            .release_step(M, &k, 2, &crate::store::model::Reschedule::default())
            .await
            .unwrap();
        assert!(store
            .finalize_step(
                M,
                &k,
                &taken,
                &StepSettlement {
                    status: StepStatus::Succeeded,
                    acquirer_id: None,
                    failure_reason: None,
                    response: &response(),
                    event: None,
                    webhook: None,
                    audit: None,
                },
                Duration::ZERO,
            )
            .await
            .unwrap());
        assert_eq!(charge(&pool, &ch4).await.0, "voided");
        let detail = store
            .step_detail(o.subject.id.as_str())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (detail.kind.as_str(), detail.status.as_str()),
            ("void", "succeeded")
        );
        assert!(detail.key.is_some());
        assert!(
            store
                .sweep_expired_keys(100, Duration::from_secs(3600))
                .await
                .unwrap()
                >= 1
        );
        assert!(matches!(
            store.key_status(M, &k).await.unwrap(),
            Some(KeyStatus::Expired {
                subject: SubjectId::Step(_),
                ..
            })
        ));
        match step(&store, "o1", &ch4, StepKind::Void, None, true).await {
            StepClaim::Expired(id) => assert_eq!(id, o.subject.id),
            other => panic!("{other:?}"),
        }

        fk_check(&pool).await;
        store.close().await;
        pool.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
