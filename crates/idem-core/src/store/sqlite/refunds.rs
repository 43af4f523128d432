//! Refunds on SQLite: the same operations as PostgreSQL's, each a few
//! statements in one write transaction (`begin immediate`, which holds the
//! file's one write lock, so two refunds of one charge take turns and the
//! second's guarded update sees what the first reserved). The claim inserts
//! the key only once the guarded update has reserved the amount (under the
//! write lock the key cannot be taken meanwhile), then makes the refund; a
//! refusal writes nothing.

use const_format::concatcp;
use sqlx::sqlite::SqliteConnection;

use super::key_space::{refund_record, taken, REFUND_COLUMNS};
use super::keys::{release_in, take_over_key, tombstone, KeyOf, Subject};
use super::webhooks::ENDPOINT_HEARS;
use super::{SqliteStore, NOW};
use crate::domain::EVENTS_EXCHANGE;
use crate::domain::{AcquirerReference, ChargeId, IdempotencyKey, Refund, RefundId, RefundStatus};
use crate::store::error::StoreError;
use crate::store::model::{
    NewRefundClaim, NewWebhook, RefundClaim, RefundDetail, RefundRecord, RefundSettlement, Refusal,
    Reschedule, StuckRefund, Taken,
};
use crate::store::ops::Refunds;
use crate::store::rows::RefundRow;
use crate::store::shared::millis;

/// As PostgreSQL's: `$1` message id, `$2` exchange, `$3` type, `$4` tenant,
/// `$5` body, `$6` refund.
const REFUND_EVENT_SQL: &str = concatcp!(
    "insert into outbox
        (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent, created_at)
     select 'event', $1, $2, $3, $4, $3, $5, (select traceparent from refunds where id = $6), ",
    NOW,
    " where (select events_enabled from settings)"
);

/// `$1` event id, `$2` type, `$3` body, `$4` merchant, `$5` the refund (the
/// deliveries name its charge).
const WEBHOOK_DELIVERIES_SQL: &str = concatcp!(
    "with i as (select $1 as webhook_event_id, $2 as webhook_event_type, $3 as webhook_body)
     insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select i.webhook_event_id, we.id, i.webhook_event_type, i.webhook_body,
            (select r.charge_id from refunds r where r.id = $5), ",
    NOW,
    ", ",
    NOW,
    " from i join webhook_endpoints we on we.merchant_id = $4
      where ",
    ENDPOINT_HEARS
);

/// Refunds awaiting review, oldest first.
const STUCK_SQL: &str = "select r.id, r.charge_id, m.name as merchant, r.amount_cents, r.currency,
            r.acquirer_reference,
            strftime('%Y-%m-%dT%H:%M:%fZ', r.created_at / 1000.0, 'unixepoch') as created_at,
            strftime('%Y-%m-%dT%H:%M:%fZ', r.review_since / 1000.0, 'unixepoch') as review_since,
            r.review_reason
       from refunds r join merchants m on m.id = r.merchant_id
      where r.status = 'pending' and r.review_since is not null
      order by r.created_at";

/// `$1` refund.
const DETAIL_SQL: &str = "select r.id, r.charge_id, r.merchant_id, m.name as merchant,
            r.amount_cents, r.currency, r.status, r.acquirer_reference,
            strftime('%Y-%m-%dT%H:%M:%fZ', r.created_at / 1000.0, 'unixepoch') as created_at,
            strftime('%Y-%m-%dT%H:%M:%fZ', r.review_since / 1000.0, 'unixepoch') as review_since,
            r.review_reason, r.idempotency_key
       from refunds r join merchants m on m.id = r.merchant_id
      where r.id = $1";

/// `$1` merchant, `$2` key, `$3` refund.
const KEY_DETAIL_SQL: &str = "select idempotency_key, state, attempt,
            strftime('%Y-%m-%dT%H:%M:%fZ', locked_until / 1000.0, 'unixepoch') as locked_until,
            response_status,
            strftime('%Y-%m-%dT%H:%M:%fZ', expires_at / 1000.0, 'unixepoch') as expires_at
       from idempotency_keys
      where merchant_id = $1 and idempotency_key = $2 and refund_id = $3";

/// `$1` refund, `$2` reason.
const MARK_FOR_REVIEW_SQL: &str = concatcp!(
    "update refunds set review_since = ",
    NOW,
    ", review_reason = $2, updated_at = ",
    NOW,
    " where id = $1 and status = 'pending' and review_since is null"
);

/// What a charge has left to give back: what it captured (a one-step charge:
/// its amount), less what refunds took or hold. `$1` charge, `$2` merchant.
const REMAINING_SQL: &str = "select coalesce(captured_cents, amount_cents) - refunded_cents
       from charges where id = $1 and merchant_id = $2";

/// The reservation: the sum rule is this statement's `where` (a two-step
/// charge, still authorized or captured, gives back what it captured). `$1`
/// charge, `$2` merchant, `$3` amount.
const RESERVE_SQL: &str = concatcp!(
    "update charges
        set refunded_cents = refunded_cents + $3, updated_at = ",
    NOW,
    "
      where id = $1 and merchant_id = $2
        and status in ('captured', 'authorized') and review_since is null
        and refunded_cents + $3 <= coalesce(captured_cents, amount_cents)
     returning currency"
);

const EXPLAIN_SQL: &str = "select status, review_since is not null as under_review,
            coalesce(captured_cents, amount_cents) - refunded_cents as remaining
       from charges where id = $1 and merchant_id = $2";

const INSERT_REFUND_SQL: &str = concatcp!(
    "insert into refunds
        (id, charge_id, merchant_id, amount_cents, currency, reason, description,
         acquirer_reference, idempotency_key, traceparent, created_at, updated_at)
     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, ",
    NOW,
    ", ",
    NOW,
    ")"
);

const FINALIZE_KEY_SQL: &str = concatcp!(
    "update idempotency_keys
        set state = 'completed', locked_until = null,
            response_status = $5, response_body = $6, expires_at = ",
    NOW,
    " + $7
      where merchant_id = $1 and idempotency_key = $2 and refund_id = $3
        and attempt = $4 and state <> 'completed'"
);

const SETTLE_REFUND_SQL: &str = concatcp!(
    "update refunds
        set status = $2, acquirer_refund_id = $3, failure_reason = $4, updated_at = ",
    NOW,
    "
      where id = $1 and status = 'pending'
     returning charge_id, amount_cents"
);

const RELEASE_RESERVATION_SQL: &str = concatcp!(
    "update charges set refunded_cents = refunded_cents - $2, updated_at = ",
    NOW,
    " where id = $1"
);

/// The reconciler scheduled on a released refund (parameters as
/// `keys::release_in` binds them), as `keys.rs` schedules it on a charge.
const RESCHEDULE_REFUND_SQL: &str = concatcp!(
    "update refunds
        set reconcile_attempts = reconcile_attempts + $4,
            next_reconcile_at = case when $5 is null then next_reconcile_at
                else max(coalesce(next_reconcile_at, ",
    NOW,
    "), ",
    NOW,
    " + $5) end
      where id = (select refund_id from idempotency_keys
                   where merchant_id = $1 and idempotency_key = $2 and attempt = $3)"
);

const REFUND_SQL: &str = concatcp!(
    "select ",
    REFUND_COLUMNS,
    " from refunds r join charges c on c.id = r.charge_id
      where r.id = $1 and r.merchant_id = $2"
);

const REFUNDS_OF_SQL: &str = concatcp!(
    "select ",
    REFUND_COLUMNS,
    " from refunds r join charges c on c.id = r.charge_id
      where r.charge_id = $1 and r.merchant_id = $2
      order by r.created_at, r.id"
);

#[derive(sqlx::FromRow)]
struct Refused {
    status: String,
    under_review: bool,
    remaining: i64,
}

#[async_trait::async_trait]
impl Refunds for SqliteStore {
    async fn claim_refund(&self, claim: &NewRefundClaim<'_>) -> Result<RefundClaim, StoreError> {
        let id = RefundId::generate();
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        self.write(async |tx| -> Result<RefundClaim, StoreError> {
            // Under the file's one write lock nothing changes between these
            // statements, so the key is decided first by reading it, and
            // written only once the reservation holds: a refusal writes nothing.
            let (merchant_id, key, fingerprint) =
                (claim.merchant_id, claim.key, &claim.fingerprint);
            if let Some(refund_id) =
                tombstone(tx, Subject::Refund, merchant_id, key, fingerprint).await?
            {
                return Ok(RefundClaim::Expired(RefundId::from_trusted(refund_id)));
            }
            let found = taken(tx, merchant_id, key).await?;
            let free = match &found {
                None => true,
                Some(t) => t.expired() && *t.fingerprint() != claim.fingerprint,
            };
            if !free {
                return found
                    .map(Taken::into_claim)
                    .ok_or_else(|| StoreError::Corrupt("a taken key not found".into()));
            }
            let amount = match claim.request.amount_cents {
                Some(amount) => Some(amount.get()),
                None => sqlx::query_as::<_, (i64,)>(REMAINING_SQL)
                    .bind(claim.charge_id.as_str())
                    .bind(claim.merchant_id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .map(|(remaining,)| remaining)
                    .filter(|remaining| *remaining > 0),
            };
            let reserved: Option<(String,)> = match amount {
                Some(amount) => {
                    sqlx::query_as(RESERVE_SQL)
                        .bind(claim.charge_id.as_str())
                        .bind(claim.merchant_id)
                        .bind(amount)
                        .fetch_optional(&mut *tx)
                        .await?
                }
                None => None,
            };
            let (Some(amount), Some((currency,))) = (amount, reserved) else {
                let charge: Option<Refused> = sqlx::query_as(EXPLAIN_SQL)
                    .bind(claim.charge_id.as_str())
                    .bind(claim.merchant_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                return Ok(RefundClaim::Refused(Refusal::of_charge(
                    charge.map(|c| (c.status, c.under_review, c.remaining)),
                )));
            };
            let keyed = KeyOf {
                subject: Subject::Refund,
                id: id.as_str(),
                merchant_id,
                key,
                fingerprint,
                lease: claim.lease,
                key_ttl: claim.key_ttl,
            };
            keyed.claim(tx, found.is_none()).await?;
            sqlx::query(INSERT_REFUND_SQL)
                .bind(id.as_str())
                .bind(claim.charge_id.as_str())
                .bind(claim.merchant_id)
                .bind(amount)
                .bind(&currency)
                .bind(claim.request.reason.map(|r| r.as_str()))
                .bind(claim.request.description.as_ref().map(|d| d.as_str()))
                .bind(reference.as_str())
                .bind(claim.key.as_str())
                .bind(claim.traceparent)
                .execute(&mut *tx)
                .await?;
            let record = refund_record(tx, claim.merchant_id, claim.key)
                .await?
                .ok_or_else(|| StoreError::Corrupt("a refund claimed and not read back".into()))?;
            Ok(RefundClaim::Won(Box::new(record)))
        })
        .await
    }

    async fn refund_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<RefundRecord>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        refund_record(&mut conn, merchant_id, key).await
    }

    async fn finalize_refund(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &RefundRecord,
        settlement: &RefundSettlement<'_>,
        key_ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.write(async |tx| -> Result<bool, StoreError> {
            let keyed = sqlx::query(FINALIZE_KEY_SQL)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(record.subject.id.as_str())
                .bind(record.attempt)
                .bind(i64::from(settlement.response.status))
                .bind(settlement.response.body.as_ref())
                .bind(millis(key_ttl))
                .execute(&mut *tx)
                .await?;
            if keyed.rows_affected() == 0 {
                return Ok(false);
            }
            if let Some(entry) = settlement.audit {
                super::audit::record(tx, entry).await?;
            }
            let settled: Option<(String, i64)> = sqlx::query_as(SETTLE_REFUND_SQL)
                .bind(record.subject.id.as_str())
                .bind(settlement.status.as_str())
                .bind(settlement.acquirer_refund_id)
                .bind(settlement.failure_reason)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((charge_id, amount)) = settled else {
                return Ok(true);
            };
            if settlement.status == RefundStatus::Failed {
                sqlx::query(RELEASE_RESERVATION_SQL)
                    .bind(charge_id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(event) = settlement.event {
                sqlx::query(REFUND_EVENT_SQL)
                    .bind(event.message_id.as_str())
                    .bind(EVENTS_EXCHANGE)
                    .bind(event.event_type)
                    .bind(event.tenant)
                    .bind(event.body.as_ref())
                    .bind(record.subject.id.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(webhook) = settlement.webhook {
                deliver(tx, merchant_id, &record.subject.id, webhook).await?;
            }
            Ok(true)
        })
        .await
    }

    async fn take_over_refund(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> Result<Option<RefundRecord>, StoreError> {
        self.write(async |tx| {
            if !take_over_key(tx, merchant_id, key, attempt, lease).await? {
                return Ok(None);
            }
            refund_record(tx, merchant_id, key).await
        })
        .await
    }

    async fn release_refund(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            release_in(
                tx,
                RESCHEDULE_REFUND_SQL,
                merchant_id,
                key,
                attempt,
                reschedule,
            )
            .await
        })
        .await
    }

    async fn mark_refund_for_review(
        &self,
        merchant_id: i64,
        id: &RefundId,
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

    async fn stuck_refunds(&self) -> Result<Vec<StuckRefund>, StoreError> {
        Ok(sqlx::query_as(STUCK_SQL).fetch_all(&self.pool).await?)
    }

    async fn refund_detail(&self, id: &str) -> Result<Option<RefundDetail>, StoreError> {
        let refund: Option<RefundDetail> = sqlx::query_as(DETAIL_SQL)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(mut refund) = refund else {
            return Ok(None);
        };
        refund.key = sqlx::query_as(KEY_DETAIL_SQL)
            .bind(refund.merchant_id)
            .bind(&refund.idempotency_key)
            .bind(&refund.id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(Some(refund))
    }

    async fn refund(&self, merchant_id: i64, id: &RefundId) -> Result<Option<Refund>, StoreError> {
        let row: Option<RefundRow> = sqlx::query_as(REFUND_SQL)
            .bind(id.as_str())
            .bind(merchant_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(Refund::try_from).transpose()
    }

    async fn refunds_of(
        &self,
        merchant_id: i64,
        charge_id: &ChargeId,
    ) -> Result<Vec<Refund>, StoreError> {
        let rows: Vec<RefundRow> = sqlx::query_as(REFUNDS_OF_SQL)
            .bind(charge_id.as_str())
            .bind(merchant_id)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(Refund::try_from).collect()
    }
}

/// The webhook event's deliveries, in the caller's write transaction.
async fn deliver(
    tx: &mut SqliteConnection,
    merchant_id: i64,
    refund: &RefundId,
    webhook: &NewWebhook,
) -> Result<(), StoreError> {
    sqlx::query(WEBHOOK_DELIVERIES_SQL)
        .bind(webhook.event_id.as_str())
        .bind(webhook.event_type)
        .bind(webhook.body.as_ref())
        .bind(merchant_id)
        .bind(refund.as_str())
        .execute(tx)
        .await?;
    Ok(())
}
