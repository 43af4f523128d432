//! Refunds on PostgreSQL: the claim that reserves a refund's amount against
//! its charge, the finalize that settles it, and reading them.
//!
//! The claim is one short transaction, committed before the acquirer is
//! called, and one statement: the function `idem_claim_refund` (migration
//! 0014) inserts the key first (the duplicate race is decided there, as a
//! charge's), then makes the **guarded update** that reserves the amount
//! (`refunded_cents + amount <= amount_cents`, on a captured charge not under
//! review), then the refund row. Two refunds of one charge meet at the
//! charge's row: the second's update waits for the first's commit and
//! re-checks the guard against what the first reserved, so together they can
//! never pass the capture. A refusal leaves nothing: the key stays free and
//! nothing is stored. The finalize is one function too, so that no
//! transaction waits on the service between two statements.

use const_format::concatcp;
use sqlx::PgConnection;

use super::keys::{KEY_COLUMNS, RELEASE_K, RESCHEDULE, TAKE_OVER_K};
use super::PgStore;
use crate::domain::{
    AcquirerReference, AmountCents, ChargeId, Currency, IdempotencyKey, Refund, RefundId,
    RefundStatus, EVENTS_EXCHANGE,
};
use crate::store::model::{
    KeyState, NewRefundClaim, NewWebhook, RefundClaim, RefundDetail, RefundRecord,
    RefundSettlement, Refusal, Reschedule, StuckRefund, Taken,
};
use crate::store::ops::Refunds;
use crate::store::rows::{RefundRecordRow, RefundRow};
use crate::store::{millis, StoreError};

/// A refund's columns (alias `r`), with its charge's reference (alias `c`).
const REFUND_COLUMNS: &str = "r.id, r.charge_id, r.amount_cents, r.currency, r.status, r.reason, \
     r.description, r.acquirer_reference, r.failure_reason, r.created_at, \
     c.acquirer_reference as capture_reference";

const REFUND_RECORD_SQL: &str = concatcp!(
    "select ",
    REFUND_COLUMNS,
    ", ",
    KEY_COLUMNS,
    ", r.review_since is not null as under_review
       from idempotency_keys k
       join refunds r on r.id = k.refund_id
       join charges c on c.id = r.charge_id
      where k.merchant_id = $1 and k.idempotency_key = $2"
);

/// A refund's record taken over (as a charge's, by [`TAKE_OVER_K`]).
const TAKE_OVER_SQL: &str = concatcp!(
    TAKE_OVER_K,
    " select ",
    REFUND_COLUMNS,
    ", ",
    KEY_COLUMNS,
    ", r.review_since is not null as under_review
       from k join refunds r on r.id = k.refund_id join charges c on c.id = r.charge_id"
);

/// A refund's record released, its reconciler scheduled on the refund.
const RELEASE_SQL: &str = concatcp!(
    RELEASE_K,
    " update refunds r",
    RESCHEDULE,
    " from k where r.id = k.refund_id"
);

/// The claim, one function (migration 0014 says what it decides, in which
/// order). Parameters in its order: merchant, key, fingerprint, refund id,
/// lease ms, key TTL ms, charge, amount (null: what remains), reason,
/// description, the refund's reference, traceparent.
const CLAIM_SQL: &str = "select outcome, refund_id, attempt, amount_cents, currency,
            capture_reference, created_at, charge_status, under_review, remaining
       from idem_claim_refund($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// The finalize, one function (migration 0014): the outcome fenced by the
/// attempt, the refund settled, a refused refund's reservation given back,
/// its event and webhook deliveries. Parameters in its order: merchant, key,
/// refund, attempt, response status, body, key TTL ms, refund status, the
/// acquirer's refund id, failure reason, event id, exchange, type, tenant,
/// body, webhook event id, type, body.
const FINALIZE_SQL: &str = "select idem_finalize_refund($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
            $11, $12, $13, $14, $15, $16, $17, $18)";

/// The webhook event's deliveries for each of the merchant's enabled
/// endpoints that hears it. `$1` event id, `$2` type, `$3` body, `$4` merchant.
pub(super) const WEBHOOK_DELIVERIES_SQL: &str = "insert into webhook_deliveries
        (event_id, endpoint_id, event_type, body)
     select $1, we.id, $2, $3 from webhook_endpoints we
      where we.merchant_id = $4 and we.disabled_at is null
        and (we.events is null or $2 = any(we.events))";

/// A refund's review: the reconciler and every retry leave it alone until
/// an operator settles it. `$1` refund, `$2` reason.
const MARK_FOR_REVIEW_SQL: &str = "update refunds
        set review_since = now(), review_reason = $2, updated_at = now()
      where id = $1 and status = 'pending' and review_since is null";

/// Refunds awaiting review, oldest first.
const STUCK_SQL: &str = "select r.id, r.charge_id, m.name as merchant, r.amount_cents, r.currency,
            r.acquirer_reference, r.created_at, r.review_since, r.review_reason
       from refunds r join merchants m on m.id = r.merchant_id
      where r.status = 'pending' and r.review_since is not null
      order by r.created_at";

/// `$1` refund.
const DETAIL_SQL: &str = "select r.id, r.charge_id, r.merchant_id, m.name as merchant,
            r.amount_cents, r.currency, r.status, r.acquirer_reference, r.created_at,
            r.review_since, r.review_reason, r.idempotency_key
       from refunds r join merchants m on m.id = r.merchant_id
      where r.id = $1";

/// `$1` merchant, `$2` key, `$3` refund.
const KEY_DETAIL_SQL: &str = "select idempotency_key, state, attempt, locked_until,
            response_status, expires_at
       from idempotency_keys
      where merchant_id = $1 and idempotency_key = $2 and refund_id = $3";

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

/// Rounds of insert-or-read a claim may need (as a charge's claim).
const CLAIM_ROUNDS: usize = 3;

/// What the claim's function answers (migration 0014 names the columns).
#[derive(sqlx::FromRow)]
struct ClaimAnswer {
    outcome: String,
    refund_id: Option<String>,
    attempt: Option<i64>,
    amount_cents: Option<i64>,
    currency: Option<String>,
    capture_reference: Option<String>,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
    charge_status: Option<String>,
    under_review: Option<bool>,
    remaining: Option<i64>,
}

impl Refunds for PgStore {
    async fn claim_refund(&self, claim: &NewRefundClaim<'_>) -> Result<RefundClaim, StoreError> {
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        self.on_conn(async |db| -> Result<RefundClaim, StoreError> {
            for _ in 0..CLAIM_ROUNDS {
                if let Some(answer) = claim_once(db, claim, &reference).await? {
                    return Ok(answer);
                }
            }
            Err(StoreError::Corrupt(format!(
                "key {} neither claimed nor found in {CLAIM_ROUNDS} rounds",
                claim.key.as_str()
            )))
        })
        .await
    }

    async fn refund_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<RefundRecord>, StoreError> {
        self.on_conn(async |db| refund_record(db, merchant_id, key).await)
            .await
    }

    async fn finalize_refund(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &RefundRecord,
        settlement: &RefundSettlement<'_>,
        key_ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let event = settlement.event;
        let webhook = settlement.webhook;
        let finalize = sqlx::query_as(FINALIZE_SQL)
            .bind(merchant_id)
            .bind(key.as_str())
            .bind(record.subject.id.as_str())
            .bind(record.attempt)
            .bind(i16::try_from(settlement.response.status).unwrap_or(i16::MAX))
            .bind(settlement.response.body.as_ref())
            .bind(millis(key_ttl))
            .bind(settlement.status.as_str())
            .bind(settlement.acquirer_refund_id)
            .bind(settlement.failure_reason)
            .bind(event.map(|e| e.message_id.as_str()))
            .bind(event.map(|_| EVENTS_EXCHANGE))
            .bind(event.map(|e| e.event_type))
            .bind(event.map(|e| e.tenant))
            .bind(event.map(|e| e.body.as_ref()))
            .bind(webhook.map(|w| w.event_id.as_str()))
            .bind(webhook.map(|w| w.event_type))
            .bind(webhook.map(|w| w.body.as_ref()));
        let Some(entry) = settlement.audit else {
            return self
                .on_conn(async |db| -> Result<bool, StoreError> {
                    let (settled,): (bool,) = finalize.fetch_one(db).await?;
                    Ok(settled)
                })
                .await;
        };
        // An operator's decision: the outcome and its audit record together.
        self.in_tx(async |db| -> Result<bool, StoreError> {
            let (settled,): (bool,) = finalize.fetch_one(&mut *db).await?;
            if settled {
                super::audit::record(db, entry).await?;
            }
            Ok(settled)
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
        let row: Option<RefundRecordRow> = self
            .take_over_with(TAKE_OVER_SQL, merchant_id, key, attempt, lease)
            .await?;
        row.map(RefundRecord::try_from).transpose()
    }

    async fn release_refund(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.release_with(RELEASE_SQL, merchant_id, key, attempt, reschedule)
            .await
    }

    async fn mark_refund_for_review(
        &self,
        merchant_id: i64,
        id: &RefundId,
        reason: &str,
        webhook: &NewWebhook,
    ) -> Result<(), StoreError> {
        self.in_tx(async |tx| -> Result<(), StoreError> {
            let marked = sqlx::query(MARK_FOR_REVIEW_SQL)
                .bind(id.as_str())
                .bind(reason)
                .execute(&mut *tx)
                .await?;
            if marked.rows_affected() == 1 {
                deliver(&mut *tx, merchant_id, webhook).await?;
            }
            Ok(())
        })
        .await
    }

    async fn stuck_refunds(&self) -> Result<Vec<StuckRefund>, StoreError> {
        self.on_conn(async |db| sqlx::query_as(STUCK_SQL).fetch_all(db).await)
            .await
    }

    async fn refund_detail(&self, id: &str) -> Result<Option<RefundDetail>, StoreError> {
        self.on_conn(async |db| -> Result<_, sqlx::Error> {
            let refund: Option<RefundDetail> = sqlx::query_as(DETAIL_SQL)
                .bind(id)
                .fetch_optional(&mut *db)
                .await?;
            let Some(mut refund) = refund else {
                return Ok(None);
            };
            refund.key = sqlx::query_as(KEY_DETAIL_SQL)
                .bind(refund.merchant_id)
                .bind(&refund.idempotency_key)
                .bind(&refund.id)
                .fetch_optional(db)
                .await?;
            Ok(Some(refund))
        })
        .await
    }

    async fn refund(&self, merchant_id: i64, id: &RefundId) -> Result<Option<Refund>, StoreError> {
        self.on_conn(async |db| -> Result<_, StoreError> {
            let row: Option<RefundRow> = sqlx::query_as(REFUND_SQL)
                .bind(id.as_str())
                .bind(merchant_id)
                .fetch_optional(db)
                .await?;
            row.map(Refund::try_from).transpose()
        })
        .await
    }

    async fn refunds_of(
        &self,
        merchant_id: i64,
        charge_id: &ChargeId,
    ) -> Result<Vec<Refund>, StoreError> {
        self.on_conn(async |db| -> Result<_, StoreError> {
            let rows: Vec<RefundRow> = sqlx::query_as(REFUNDS_OF_SQL)
                .bind(charge_id.as_str())
                .bind(merchant_id)
                .fetch_all(db)
                .await?;
            rows.into_iter().map(Refund::try_from).collect()
        })
        .await
    }
}

/// One round of a refund's claim, one statement: `None` when the key was
/// taken and then gone, or free again, before it could be read (the sweeper
/// deleted an expired record, or it expired, between the two statements):
/// the next round claims again.
async fn claim_once(
    db: &mut PgConnection,
    claim: &NewRefundClaim<'_>,
    reference: &AcquirerReference,
) -> Result<Option<RefundClaim>, StoreError> {
    let id = RefundId::generate();
    let answer: ClaimAnswer = sqlx::query_as(CLAIM_SQL)
        .bind(claim.merchant_id)
        .bind(claim.key.as_str())
        .bind(claim.fingerprint.as_bytes())
        .bind(id.as_str())
        .bind(millis(claim.lease))
        .bind(millis(claim.key_ttl))
        .bind(claim.charge_id.as_str())
        .bind(claim.request.amount_cents.map(|a| a.get()))
        .bind(claim.request.reason.map(|r| r.as_str()))
        .bind(claim.request.description.as_ref().map(|d| d.as_str()))
        .bind(reference.as_str())
        .bind(claim.traceparent)
        .fetch_one(&mut *db)
        .await?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("refund claim: {what}"));
    Ok(Some(match answer.outcome.as_str() {
        "won" => RefundClaim::Won(Box::new(won(claim, id, reference, answer)?)),
        "expired" => RefundClaim::Expired(RefundId::from_trusted(
            answer
                .refund_id
                .ok_or_else(|| corrupt("a tombstone without its refund"))?,
        )),
        "refused" => RefundClaim::Refused(Refusal::of_charge(answer.charge_status.map(|status| {
            (
                status,
                answer.under_review.unwrap_or(false),
                answer.remaining.unwrap_or(0),
            )
        }))),
        "taken" => match taken(db, claim.merchant_id, claim.key).await? {
            Some(t) if !(t.expired() && *t.fingerprint() != claim.fingerprint) => t.into_claim(),
            _ => return Ok(None),
        },
        other => return Err(corrupt(&format!("outcome {other:?}"))),
    }))
}

/// The record a won claim made, from what the claim knew and its function
/// answered: the refund pending, the key in flight under this attempt's
/// whole lease.
fn won(
    claim: &NewRefundClaim<'_>,
    id: RefundId,
    reference: &AcquirerReference,
    answer: ClaimAnswer,
) -> Result<RefundRecord, StoreError> {
    let name = id.to_string();
    let corrupt = |what: &str| StoreError::Corrupt(format!("refund {name}'s claim: {what}"));
    let amount = answer.amount_cents.ok_or_else(|| corrupt("no amount"))?;
    let currency = answer.currency.ok_or_else(|| corrupt("no currency"))?;
    let refund = Refund {
        charge_id: claim.charge_id.clone(),
        amount_cents: AmountCents::parse(amount).map_err(|e| corrupt(&e.to_string()))?,
        currency: Currency::parse(&currency).map_err(|e| corrupt(&e.to_string()))?,
        status: RefundStatus::Pending,
        reason: claim.request.reason,
        description: claim.request.description.clone(),
        acquirer_reference: reference.clone(),
        failure_reason: None,
        created_at: answer.created_at.ok_or_else(|| corrupt("no time"))?,
        capture_reference: AcquirerReference::from_trusted(
            answer
                .capture_reference
                .ok_or_else(|| corrupt("no capture reference"))?,
        ),
        id,
    };
    Ok(RefundRecord {
        subject: refund,
        fingerprint: claim.fingerprint,
        state: KeyState::InFlight {
            lease_remaining: claim.lease,
        },
        attempt: answer.attempt.ok_or_else(|| corrupt("no attempt"))?,
        expired: false,
        under_review: false,
    })
}

async fn refund_record(
    db: &mut PgConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<RefundRecord>, StoreError> {
    let row: Option<RefundRecordRow> = sqlx::query_as(REFUND_RECORD_SQL)
        .bind(merchant_id)
        .bind(key.as_str())
        .fetch_optional(db)
        .await?;
    row.map(RefundRecord::try_from).transpose()
}

/// The webhook event's deliveries, in the caller's transaction.
async fn deliver(
    tx: &mut PgConnection,
    merchant_id: i64,
    webhook: &NewWebhook,
) -> Result<(), StoreError> {
    sqlx::query(WEBHOOK_DELIVERIES_SQL)
        .bind(webhook.event_id.as_str())
        .bind(webhook.event_type)
        .bind(webhook.body.as_ref())
        .bind(merchant_id)
        .execute(tx)
        .await?;
    Ok(())
}

/// Whose the key is: a refund's, or a charge's; `None` if it is gone.
async fn taken(
    db: &mut PgConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<Taken>, StoreError> {
    if let Some(record) = refund_record(db, merchant_id, key).await? {
        return Ok(Some(Taken::Refund(record)));
    }
    let charge = super::keys::key_record(db, merchant_id, key).await?;
    Ok(charge.map(Taken::Charge))
}
