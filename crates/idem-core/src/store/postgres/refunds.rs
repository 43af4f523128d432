//! Refunds on PostgreSQL: the claim that reserves a refund's amount against
//! its charge, the finalize that settles it, and reading them.
//!
//! The claim is one short transaction, committed before the acquirer is
//! called: insert the key first (the duplicate race is decided there, as a
//! charge's), then the **guarded update** that reserves the amount
//! (`refunded_cents + amount <= amount_cents`, on a captured charge not under
//! review), then the refund row. Two refunds of one charge meet at the
//! charge's row: the second's update waits for the first's commit and
//! re-checks the guard against what the first reserved, so together they can
//! never pass the capture. A refusal rolls the whole claim back: the key stays
//! free and nothing is stored.

use const_format::concatcp;
use sqlx::PgConnection;

use super::keys::{KEY_COLUMNS, RELEASE_K, RESCHEDULE, TAKE_OVER_K};
use super::PgStore;
use crate::domain::EVENTS_EXCHANGE;
use crate::domain::{AcquirerReference, ChargeId, IdempotencyKey, Refund, RefundId, RefundStatus};
use crate::store::model::{
    NewRefundClaim, NewWebhook, RefundClaim, RefundRecord, RefundSettlement, Refusal, Reschedule,
    StuckRefund, Taken,
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

/// Insert first: the refund's key, naming the refund made next in the same
/// transaction (the foreign key is deferred). `$1` merchant, `$2` key, `$3`
/// fingerprint, `$4` refund id, `$5` lease ms, `$6` key TTL ms.
const INSERT_KEY_SQL: &str = "insert into idempotency_keys
        (merchant_id, idempotency_key, fingerprint, refund_id, locked_until, expires_at)
     values ($1, $2, $3, $4, now() + $5 * interval '1 millisecond',
             now() + $6 * interval '1 millisecond')
     on conflict (merchant_id, idempotency_key) do nothing
     returning 1";

/// An expired, completed record of another request (a refund's or a
/// charge's) made this refund's claim, in the claim's transaction. `$1`
/// merchant, `$2` key, `$3` fingerprint, `$4` refund id, `$5` lease ms, `$6`
/// key TTL ms.
const RECLAIM_SQL: &str = "update idempotency_keys
        set fingerprint = $3, refund_id = $4, charge_id = null, state = 'in_flight',
            attempt = attempt + 1, response_status = null, response_body = null,
            locked_until = now() + $5 * interval '1 millisecond',
            expires_at = now() + $6 * interval '1 millisecond', created_at = now()
      where merchant_id = $1 and idempotency_key = $2
        and state = 'completed' and expires_at <= now() and fingerprint <> $3";

/// `$1` merchant, `$2` key, `$3` fingerprint: the refund of a live tombstone
/// the same request left.
const TOMBSTONE_SQL: &str = "select refund_id from key_tombstones
      where merchant_id = $1 and idempotency_key = $2 and fingerprint = $3
        and refund_id is not null and expires_at > now()";

/// What a refund of the whole remainder would take now (`$1` charge, `$2`
/// merchant): read without a lock, then reserved by the guarded update, which
/// refuses it if another refund took part of it meanwhile.
const REMAINING_SQL: &str = "select amount_cents - refunded_cents from charges
      where id = $1 and merchant_id = $2";

/// The reservation: the sum rule is this statement's `where`. `$1` charge,
/// `$2` merchant, `$3` amount.
const RESERVE_SQL: &str = "update charges
        set refunded_cents = refunded_cents + $3, updated_at = now()
      where id = $1 and merchant_id = $2
        and status = 'captured' and review_since is null
        and refunded_cents + $3 <= amount_cents
     returning currency";

/// A refund's event in the outbox, when the deployment has events on.
/// `$1` message id, `$2` exchange, `$3` type (also the routing key), `$4`
/// tenant, `$5` body, `$6` refund.
const REFUND_EVENT_SQL: &str = "insert into outbox
        (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent)
     select 'event', $1, $2, $3, $4, $3, $5, (select traceparent from refunds where id = $6)
      where (select events_enabled from settings)";

/// A delivery of a webhook event for each of the merchant's enabled
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

/// Why a reservation was refused: the charge as it is now.
const EXPLAIN_SQL: &str = "select status, review_since is not null as under_review,
            amount_cents - refunded_cents as remaining
       from charges where id = $1 and merchant_id = $2";

/// `$1` id, `$2` charge, `$3` merchant, `$4` amount, `$5` currency, `$6`
/// reason, `$7` description, `$8` reference, `$9` key, `$10` traceparent.
const INSERT_REFUND_SQL: &str = "insert into refunds
        (id, charge_id, merchant_id, amount_cents, currency, reason, description,
         acquirer_reference, idempotency_key, traceparent)
     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// The outcome, fenced by the attempt. `$1` merchant, `$2` key, `$3` refund,
/// `$4` attempt, `$5` status, `$6` body, `$7` key TTL ms.
const FINALIZE_KEY_SQL: &str = "update idempotency_keys
        set state = 'completed', locked_until = null,
            response_status = $5, response_body = $6,
            expires_at = now() + $7 * interval '1 millisecond'
      where merchant_id = $1 and idempotency_key = $2 and refund_id = $3
        and attempt = $4 and state <> 'completed'";

/// `$1` refund, `$2` status, `$3` the acquirer's refund id, `$4` failure reason.
const SETTLE_REFUND_SQL: &str = "update refunds
        set status = $2, acquirer_refund_id = $3, failure_reason = $4, updated_at = now()
      where id = $1 and status = 'pending'
     returning charge_id, amount_cents";

/// A refused refund gives its reservation back. `$1` charge, `$2` amount.
const RELEASE_RESERVATION_SQL: &str = "update charges
        set refunded_cents = refunded_cents - $2, updated_at = now()
      where id = $1";

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

/// Rounds a refund of the whole remainder may take when other refunds of
/// the charge take part of it between the read and the reservation.
const REMAINDER_ROUNDS: usize = 3;

#[derive(sqlx::FromRow)]
struct Refused {
    status: String,
    under_review: bool,
    remaining: i64,
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
        self.in_tx(async |tx| -> Result<bool, StoreError> {
            let keyed = sqlx::query(FINALIZE_KEY_SQL)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(record.subject.id.as_str())
                .bind(record.attempt)
                .bind(i16::try_from(settlement.response.status).unwrap_or(i16::MAX))
                .bind(settlement.response.body.as_ref())
                .bind(millis(key_ttl))
                .execute(&mut *tx)
                .await?;
            if keyed.rows_affected() == 0 {
                return Ok(false);
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
                deliver(&mut *tx, merchant_id, webhook).await?;
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

/// One round of a refund's claim, in one transaction: `None` when the key
/// was taken and then gone before it could be read (the sweeper deleted an
/// expired record between the two statements): the next round claims again.
async fn claim_once(
    db: &mut PgConnection,
    claim: &NewRefundClaim<'_>,
    reference: &AcquirerReference,
) -> Result<Option<RefundClaim>, StoreError> {
    let id = RefundId::generate();
    let mut tx = sqlx::Connection::begin(&mut *db).await?;
    if let Some((refund_id,)) = sqlx::query_as::<_, (String,)>(TOMBSTONE_SQL)
        .bind(claim.merchant_id)
        .bind(claim.key.as_str())
        .bind(claim.fingerprint.as_bytes())
        .fetch_optional(&mut *tx)
        .await?
    {
        tx.rollback().await?;
        return Ok(Some(RefundClaim::Expired(RefundId::from_trusted(
            refund_id,
        ))));
    }
    let inserted = sqlx::query(INSERT_KEY_SQL)
        .bind(claim.merchant_id)
        .bind(claim.key.as_str())
        .bind(claim.fingerprint.as_bytes())
        .bind(id.as_str())
        .bind(millis(claim.lease))
        .bind(millis(claim.key_ttl))
        .fetch_optional(&mut *tx)
        .await?;
    if inserted.is_none() {
        let found = taken(&mut tx, claim.merchant_id, claim.key).await?;
        let free = found
            .as_ref()
            .is_some_and(|t| t.expired() && *t.fingerprint() != claim.fingerprint);
        // An expired record of another request: this new intent's, if no
        // other claim makes it its own first.
        let reclaimed = free
            && sqlx::query(RECLAIM_SQL)
                .bind(claim.merchant_id)
                .bind(claim.key.as_str())
                .bind(claim.fingerprint.as_bytes())
                .bind(id.as_str())
                .bind(millis(claim.lease))
                .bind(millis(claim.key_ttl))
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
        if !reclaimed {
            tx.rollback().await?;
            return Ok(match found {
                // Gone (swept) or reclaimed by another: the next round sees.
                None => None,
                Some(_) if free => None,
                Some(t) => Some(t.into_claim()),
            });
        }
    }
    let Some((amount, currency)) = reserve(&mut tx, claim).await? else {
        let refusal = explain(&mut tx, claim).await?;
        tx.rollback().await?;
        return Ok(Some(RefundClaim::Refused(refusal)));
    };
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
    let record = refund_record(&mut tx, claim.merchant_id, claim.key)
        .await?
        .ok_or_else(|| StoreError::Corrupt("a refund claimed and not read back".into()))?;
    tx.commit().await?;
    Ok(Some(RefundClaim::Won(Box::new(record))))
}

/// Reserves the claim's amount (or the charge's remainder) by the guarded
/// update: the amount and the charge's currency, or `None` if refused.
async fn reserve(
    db: &mut PgConnection,
    claim: &NewRefundClaim<'_>,
) -> Result<Option<(i64, String)>, StoreError> {
    for _ in 0..REMAINDER_ROUNDS {
        let amount = match claim.request.amount_cents {
            Some(amount) => amount.get(),
            None => match sqlx::query_as::<_, (i64,)>(REMAINING_SQL)
                .bind(claim.charge_id.as_str())
                .bind(claim.merchant_id)
                .fetch_optional(&mut *db)
                .await?
            {
                Some((remaining,)) if remaining > 0 => remaining,
                _ => return Ok(None),
            },
        };
        let reserved: Option<(String,)> = sqlx::query_as(RESERVE_SQL)
            .bind(claim.charge_id.as_str())
            .bind(claim.merchant_id)
            .bind(amount)
            .fetch_optional(&mut *db)
            .await?;
        match reserved {
            Some((currency,)) => return Ok(Some((amount, currency))),
            None if claim.request.amount_cents.is_some() => return Ok(None),
            None => continue,
        }
    }
    Ok(None)
}

/// Why the charge refused the reservation.
async fn explain(db: &mut PgConnection, claim: &NewRefundClaim<'_>) -> Result<Refusal, StoreError> {
    let charge: Option<Refused> = sqlx::query_as(EXPLAIN_SQL)
        .bind(claim.charge_id.as_str())
        .bind(claim.merchant_id)
        .fetch_optional(db)
        .await?;
    Ok(Refusal::of_charge(
        charge.map(|c| (c.status, c.under_review, c.remaining)),
    ))
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
