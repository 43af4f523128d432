//! Refunds on MariaDB: the same operations as SQLite's, each a few
//! statements in one transaction. Two refunds of one charge take turns at
//! the charge's row: the reservation is a guarded update, so the second
//! waits for the first to commit and its guard then sees what the first
//! reserved. The claim inserts the key only once the reservation holds, then
//! makes the refund; a refusal writes nothing. Two claims of one new key
//! both reserve in turn, and the second's key insert then fails as a
//! duplicate: its transaction rolls back, reservation and all, and the claim
//! runs again, to find the key taken ([`KEY_RACE_TRIES`]).

use const_format::concatcp;
use sqlx::mysql::MySqlConnection;

use super::key_space::{refund_record, taken, REFUND_COLUMNS};
use super::keys::{lost_a_race, release_in, take_over_key, tombstone, KeyOf, Subject};
use super::sql::{params, query, query_as};
use super::webhooks::ENDPOINT_HEARS;
use super::{MariaDbStore, NOW};
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
    " from dual where (select events_enabled from settings)"
);

/// `$1` event id, `$2` type, `$3` body, `$4` merchant, `$5` the refund (the
/// deliveries name its charge).
const WEBHOOK_DELIVERIES_SQL: &str = concatcp!(
    "insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select i.webhook_event_id, we.id, i.webhook_event_type, i.webhook_body,
            (select r.charge_id from refunds r where r.id = $5), ",
    NOW,
    ", ",
    NOW,
    " from (select $1 as webhook_event_id, $2 as webhook_event_type, $3 as webhook_body) i
       join webhook_endpoints we on we.merchant_id = $4
      where ",
    ENDPOINT_HEARS
);

/// Refunds awaiting review, oldest first.
const STUCK_SQL: &str = "select r.id, r.charge_id, m.name as merchant, r.amount_cents, r.currency,
            r.acquirer_reference,
            timestampadd(microsecond, r.created_at * 1000, timestamp'1970-01-01 00:00:00') as created_at,
            timestampadd(microsecond, r.review_since * 1000, timestamp'1970-01-01 00:00:00') as review_since,
            r.review_reason
       from refunds r join merchants m on m.id = r.merchant_id
      where r.status = 'pending' and r.review_since is not null
      order by r.created_at";

/// `$1` refund.
const DETAIL_SQL: &str = "select r.id, r.charge_id, r.merchant_id, m.name as merchant,
            r.amount_cents, r.currency, r.status, r.acquirer_reference,
            timestampadd(microsecond, r.created_at * 1000, timestamp'1970-01-01 00:00:00') as created_at,
            timestampadd(microsecond, r.review_since * 1000, timestamp'1970-01-01 00:00:00') as review_since,
            r.review_reason, r.idempotency_key
       from refunds r join merchants m on m.id = r.merchant_id
      where r.id = $1";

/// `$1` merchant, `$2` key, `$3` refund.
const KEY_DETAIL_SQL: &str = "select idempotency_key, state, attempt,
            timestampadd(microsecond, locked_until * 1000, timestamp'1970-01-01 00:00:00') as locked_until,
            response_status,
            timestampadd(microsecond, expires_at * 1000, timestamp'1970-01-01 00:00:00') as expires_at
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
/// its amount), less what refunds took or hold, the charge's row locked so
/// that it stays so until the reservation. `$1` charge, `$2` merchant.
const REMAINING_SQL: &str = "select coalesce(captured_cents, amount_cents) - refunded_cents
       from charges where id = $1 and merchant_id = $2 for update";

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
        and refunded_cents + $3 <= coalesce(captured_cents, amount_cents)"
);

/// The currency of a charge just reserved against (`$1`).
const CURRENCY_SQL: &str = "select currency from charges where id = $1";

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
      where id = $1 and status = 'pending'"
);

/// A pending refund's charge and amount, locked for its settlement. `$1` refund.
const PENDING_REFUND_SQL: &str =
    "select charge_id, amount_cents from refunds where id = $1 and status = 'pending' for update";

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
                else greatest(coalesce(next_reconcile_at, ",
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

/// How many times a claim runs when another claim of the same key commits
/// first: the second run finds the key taken and answers with it.
pub(super) const KEY_RACE_TRIES: u32 = 3;

#[derive(sqlx::FromRow)]
struct Refused {
    status: String,
    under_review: bool,
    remaining: i64,
}

#[async_trait::async_trait]
impl Refunds for MariaDbStore {
    async fn claim_refund(&self, claim: &NewRefundClaim<'_>) -> Result<RefundClaim, StoreError> {
        let id = RefundId::generate();
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        // One deadline for every run: a store operation stays within it.
        super::within_deadline(async {
            let mut tries = 0;
            loop {
                tries += 1;
                let claimed = self
                    .write(async |tx| -> Result<RefundClaim, StoreError> {
                        // The key is decided first by reading it, and written only once
                        // the reservation holds: a refusal writes nothing. A claim of the
                        // same key that commits in between makes this one's key insert
                        // fail as a duplicate, and this claim runs again.
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
                            return found.map(Taken::into_claim).ok_or_else(|| {
                                StoreError::Corrupt("a taken key not found".into())
                            });
                        }
                        let amount = match claim.request.amount_cents {
                            Some(amount) => Some(amount.get()),
                            None => query_as::<(i64,)>(
                                REMAINING_SQL,
                                params![claim.charge_id.as_str(), claim.merchant_id],
                            )?
                            .fetch_optional(&mut *tx)
                            .await?
                            .map(|(remaining,)| remaining)
                            .filter(|remaining| *remaining > 0),
                        };
                        let reserved: Option<(String,)> = match amount {
                            Some(amount) => {
                                let done = query(
                                    RESERVE_SQL,
                                    params![claim.charge_id.as_str(), claim.merchant_id, amount],
                                )?
                                .execute(&mut *tx)
                                .await?;
                                if done.rows_affected() == 1 {
                                    query_as(CURRENCY_SQL, params![claim.charge_id.as_str()])?
                                        .fetch_optional(&mut *tx)
                                        .await?
                                } else {
                                    None
                                }
                            }
                            None => None,
                        };
                        let (Some(amount), Some((currency,))) = (amount, reserved) else {
                            // The reservation waited on the charge's row for the
                            // claims ahead of it; if one of them was of this very
                            // key, its record is there now, and is the answer.
                            if let Some(now) = taken(tx, merchant_id, key).await? {
                                if found.is_none() || !now.expired() {
                                    return Ok(now.into_claim());
                                }
                            }
                            let charge: Option<Refused> = query_as(
                                EXPLAIN_SQL,
                                params![claim.charge_id.as_str(), claim.merchant_id],
                            )?
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
                        // The refund first: the key record's foreign key names it.
                        query(
                            INSERT_REFUND_SQL,
                            params![
                                id.as_str(),
                                claim.charge_id.as_str(),
                                claim.merchant_id,
                                amount,
                                &currency,
                                claim.request.reason.map(|r| r.as_str()),
                                claim.request.description.as_ref().map(|d| d.as_str()),
                                reference.as_str(),
                                claim.key.as_str(),
                                claim.traceparent
                            ],
                        )?
                        .execute(&mut *tx)
                        .await?;
                        keyed.claim(tx, found.is_none()).await?;
                        let record = refund_record(tx, claim.merchant_id, claim.key)
                            .await?
                            .ok_or_else(|| {
                                StoreError::Corrupt("a refund claimed and not read back".into())
                            })?;
                        Ok(RefundClaim::Won(Box::new(record)))
                    })
                    .await;
                match claimed {
                    Err(e) if lost_a_race(&e) && tries < KEY_RACE_TRIES => continue,
                    claimed => return claimed,
                }
            }
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
        super::again_on_deadlock!(
            self.write(async |tx| -> Result<bool, StoreError> {
                let keyed = query(
                    FINALIZE_KEY_SQL,
                    params![
                        merchant_id,
                        key.as_str(),
                        record.subject.id.as_str(),
                        record.attempt,
                        i64::from(settlement.response.status),
                        settlement.response.body.as_ref(),
                        millis(key_ttl)
                    ],
                )?
                .execute(&mut *tx)
                .await?;
                if keyed.rows_affected() == 0 {
                    return Ok(false);
                }
                if let Some(entry) = settlement.audit {
                    super::audit::record(tx, entry).await?;
                }
                let settled: Option<(String, i64)> =
                    query_as(PENDING_REFUND_SQL, params![record.subject.id.as_str()])?
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some((charge_id, amount)) = settled else {
                    return Ok(true);
                };
                query(
                    SETTLE_REFUND_SQL,
                    params![
                        record.subject.id.as_str(),
                        settlement.status.as_str(),
                        settlement.acquirer_refund_id,
                        settlement.failure_reason
                    ],
                )?
                .execute(&mut *tx)
                .await?;
                if settlement.status == RefundStatus::Failed {
                    query(RELEASE_RESERVATION_SQL, params![charge_id.as_str(), amount])?
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some(event) = settlement.event {
                    query(
                        REFUND_EVENT_SQL,
                        params![
                            event.message_id.as_str(),
                            EVENTS_EXCHANGE,
                            event.event_type,
                            event.tenant,
                            event.body.as_ref(),
                            record.subject.id.as_str()
                        ],
                    )?
                    .execute(&mut *tx)
                    .await?;
                }
                if let Some(webhook) = settlement.webhook {
                    deliver(tx, merchant_id, &record.subject.id, webhook).await?;
                }
                Ok(true)
            })
            .await
        )
    }

    async fn take_over_refund(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> Result<Option<RefundRecord>, StoreError> {
        super::again_on_deadlock!(
            self.write(async |tx| {
                if !take_over_key(tx, merchant_id, key, attempt, lease).await? {
                    return Ok(None);
                }
                refund_record(tx, merchant_id, key).await
            })
            .await
        )
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
            let marked = query(MARK_FOR_REVIEW_SQL, params![id.as_str(), reason])?
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
        Ok(query_as(STUCK_SQL, params![])?
            .fetch_all(&self.pool)
            .await?)
    }

    async fn refund_detail(&self, id: &str) -> Result<Option<RefundDetail>, StoreError> {
        let refund: Option<RefundDetail> = query_as(DETAIL_SQL, params![id])?
            .fetch_optional(&self.pool)
            .await?;
        let Some(mut refund) = refund else {
            return Ok(None);
        };
        refund.key = query_as(
            KEY_DETAIL_SQL,
            params![refund.merchant_id, &refund.idempotency_key, &refund.id],
        )?
        .fetch_optional(&self.pool)
        .await?;
        Ok(Some(refund))
    }

    async fn refund(&self, merchant_id: i64, id: &RefundId) -> Result<Option<Refund>, StoreError> {
        let row: Option<RefundRow> = query_as(REFUND_SQL, params![id.as_str(), merchant_id])?
            .fetch_optional(&self.pool)
            .await?;
        row.map(Refund::try_from).transpose()
    }

    async fn refunds_of(
        &self,
        merchant_id: i64,
        charge_id: &ChargeId,
    ) -> Result<Vec<Refund>, StoreError> {
        let rows: Vec<RefundRow> =
            query_as(REFUNDS_OF_SQL, params![charge_id.as_str(), merchant_id])?
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter().map(Refund::try_from).collect()
    }
}

/// The webhook event's deliveries, in the caller's write transaction.
async fn deliver(
    tx: &mut MySqlConnection,
    merchant_id: i64,
    refund: &RefundId,
    webhook: &NewWebhook,
) -> Result<(), StoreError> {
    query(
        WEBHOOK_DELIVERIES_SQL,
        params![
            webhook.event_id.as_str(),
            webhook.event_type,
            webhook.body.as_ref(),
            merchant_id,
            refund.as_str()
        ],
    )?
    .execute(tx)
    .await?;
    Ok(())
}
