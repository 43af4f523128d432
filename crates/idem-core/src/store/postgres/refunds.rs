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
//! never pass the capture; a refused claim then locks the row and tries once
//! more, so that a refusal reports the state that refused it (migration
//! 0017). A refusal leaves nothing: the key stays free and nothing is stored.
//! The finalize is one function too, so that no transaction waits on the
//! service between two statements.

use const_format::concatcp;
use sqlx::postgres::PgArguments;
use sqlx::PgConnection;

use super::key_space::{refund_record, taken, REFUND_COLUMNS};
use super::keys::{KEY_COLUMNS, RELEASE_K, RESCHEDULE, TAKE_OVER_K};
use super::pool::PgPool;
use super::PgStore;
use crate::domain::{
    AcquirerReference, AmountCents, ChargeId, Currency, IdempotencyKey, Refund, RefundId,
    RefundStatus, EVENTS_EXCHANGE,
};
use crate::store::batch::{self, Batched};
use crate::store::error::StoreError;
use crate::store::model::{
    KeyState, NewRefundClaim, NewWebhook, RefundClaim, RefundDetail, RefundRecord,
    RefundSettlement, Refusal, Reschedule, StuckRefund,
};
use crate::store::ops::Refunds;
use crate::store::params::{arguments, Param, Params};
use crate::store::rows::{RefundRecordRow, RefundRow};
use crate::store::shared::millis;

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
/// order). Parameters as [`ClaimRow::params`] names them (an amount of 0:
/// what remains).
const CLAIM_SQL: &str = "select outcome, refund_id, attempt, amount_cents, currency,
            capture_reference, created_at, charge_status, under_review, remaining
       from idem_claim_refund($1, $2, $3, $4, $5, $6, $7, nullif($8, 0), $9, $10, $11, $12)";

/// The finalize, one function (migration 0014): the outcome fenced by the
/// attempt, the refund settled, a refused refund's reservation given back,
/// its event and webhook deliveries. Parameters as [`FinalizeRow::params`]
/// names them.
const FINALIZE_SQL: &str = "select idem_finalize_refund($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
            $11, $12, $13, $14, $15, $16, $17, $18)";

/// The webhook event's deliveries for each of the merchant's enabled
/// endpoints that hears it. `$1` event id, `$2` type, `$3` body, `$4`
/// merchant, `$5` the refund (the deliveries name its charge).
pub(super) const WEBHOOK_DELIVERIES_SQL: &str = "insert into webhook_deliveries
        (event_id, endpoint_id, event_type, body, charge_id)
     select $1, we.id, $2, $3, (select r.charge_id from refunds r where r.id = $5)
       from webhook_endpoints we
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
pub(super) struct ClaimAnswer {
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

#[async_trait::async_trait]
impl Refunds for PgStore {
    async fn claim_refund(&self, claim: &NewRefundClaim<'_>) -> Result<RefundClaim, StoreError> {
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        for _ in 0..CLAIM_ROUNDS {
            if let Some(answer) = self.claim_once(claim, &reference).await? {
                return Ok(answer);
            }
        }
        Err(StoreError::Corrupt(format!(
            "key {} neither claimed nor found in {CLAIM_ROUNDS} rounds",
            claim.key.as_str()
        )))
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
        let row = FinalizeRow::new(merchant_id, key, record, settlement, key_ttl);
        let Some(entry) = settlement.audit else {
            return match self.refund_finalizes.submit(row.clone()).await {
                Batched::Done(settled) => settled,
                Batched::Alone => finalize_alone(&self.pool, &row).await,
            };
        };
        let params = row.params();
        // An operator's decision: the outcome and its audit record together.
        self.in_tx(async |db| -> Result<bool, StoreError> {
            let (settled,): (bool,) =
                sqlx::query_as_with(FINALIZE_SQL, arguments::<PgArguments, 18>(&params)?)
                    .fetch_one(&mut *db)
                    .await?;
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
                deliver(&mut *tx, merchant_id, id, webhook).await?;
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

impl PgStore {
    /// One round of a refund's claim, one statement (in a batch with the
    /// claims waiting beside it, or alone): `None` when the key was taken and
    /// then gone, or free again, before it could be read (the sweeper deleted
    /// an expired record, or it expired, between the two statements): the
    /// next round claims again.
    async fn claim_once(
        &self,
        claim: &NewRefundClaim<'_>,
        reference: &AcquirerReference,
    ) -> Result<Option<RefundClaim>, StoreError> {
        let id = RefundId::generate();
        let row = ClaimRow::new(claim, &id, reference);
        let answer = match self.refund_claims.submit(row.clone()).await {
            Batched::Done(answer) => answer?,
            Batched::Alone => claim_alone(&self.pool, &row).await?,
        };
        let corrupt = |what: &str| StoreError::Corrupt(format!("refund claim: {what}"));
        Ok(Some(match answer.outcome.as_str() {
            "won" => RefundClaim::Won(Box::new(won(claim, id, reference, answer)?)),
            "expired" => RefundClaim::Expired(RefundId::from_trusted(
                answer
                    .refund_id
                    .ok_or_else(|| corrupt("a tombstone without its refund"))?,
            )),
            "refused" => {
                RefundClaim::Refused(Refusal::of_charge(answer.charge_status.map(|status| {
                    (
                        status,
                        answer.under_review.unwrap_or(false),
                        answer.remaining.unwrap_or(0),
                    )
                })))
            }
            "taken" => {
                let found = self
                    .on_conn(async |db| taken(db, claim.merchant_id, claim.key).await)
                    .await?;
                match found {
                    Some(t) if !(t.expired() && *t.fingerprint() != claim.fingerprint) => {
                        t.into_claim()
                    }
                    _ => return Ok(None),
                }
            }
            other => return Err(corrupt(&format!("outcome {other:?}"))),
        }))
    }
}

/// A refund's claim, owned: what a batch carries to its worker, in the
/// function's parameter order ([`ClaimRow::params`]).
#[derive(Debug, Clone)]
pub(super) struct ClaimRow {
    merchant_id: i64,
    key: String,
    fingerprint: Vec<u8>,
    refund_id: String,
    lease_ms: i64,
    key_ttl_ms: i64,
    charge_id: String,
    /// 0: what remains (no amount is 0: amounts are at least 1).
    amount_cents: i64,
    reason: Option<&'static str>,
    description: Option<String>,
    reference: String,
    traceparent: Option<String>,
}

impl ClaimRow {
    fn new(claim: &NewRefundClaim<'_>, id: &RefundId, reference: &AcquirerReference) -> Self {
        Self {
            merchant_id: claim.merchant_id,
            key: claim.key.as_str().to_owned(),
            fingerprint: claim.fingerprint.as_bytes().to_vec(),
            refund_id: id.as_str().to_owned(),
            lease_ms: millis(claim.lease),
            key_ttl_ms: millis(claim.key_ttl),
            charge_id: claim.charge_id.as_str().to_owned(),
            amount_cents: claim.request.amount_cents.map_or(0, |a| a.get()),
            reason: claim.request.reason.map(|r| r.as_str()),
            description: claim
                .request
                .description
                .as_ref()
                .map(|d| d.as_str().to_owned()),
            reference: reference.as_str().to_owned(),
            traceparent: claim.traceparent.map(str::to_owned),
        }
    }

    fn params(&self) -> Params<'_, 12> {
        [
            ("merchant_id", Param::Int(self.merchant_id)),
            ("idempotency_key", Param::Text(&self.key)),
            ("fingerprint", Param::Bytes(&self.fingerprint)),
            ("refund_id", Param::Text(&self.refund_id)),
            ("lease_ms", Param::Int(self.lease_ms)),
            ("key_ttl_ms", Param::Int(self.key_ttl_ms)),
            ("charge_id", Param::Text(&self.charge_id)),
            ("amount_cents", Param::Int(self.amount_cents)),
            ("reason", Param::OptText(self.reason)),
            ("description", Param::OptText(self.description.as_deref())),
            ("reference", Param::Text(&self.reference)),
            ("traceparent", Param::OptText(self.traceparent.as_deref())),
        ]
    }
}

/// A refund's finalize, owned, in the function's parameter order
/// ([`FinalizeRow::params`]).
#[derive(Debug, Clone)]
pub(super) struct FinalizeRow {
    merchant_id: i64,
    key: String,
    refund_id: String,
    attempt: i64,
    response_status: i16,
    response_body: bytes::Bytes,
    key_ttl_ms: i64,
    refund_status: &'static str,
    acquirer_refund_id: Option<String>,
    failure_reason: Option<String>,
    event: Option<(String, &'static str, String, String, bytes::Bytes)>,
    webhook: Option<(String, &'static str, bytes::Bytes)>,
}

impl FinalizeRow {
    fn new(
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &RefundRecord,
        s: &RefundSettlement<'_>,
        key_ttl: std::time::Duration,
    ) -> Self {
        Self {
            merchant_id,
            key: key.as_str().to_owned(),
            refund_id: record.subject.id.as_str().to_owned(),
            attempt: record.attempt,
            response_status: i16::try_from(s.response.status).unwrap_or(i16::MAX),
            response_body: s.response.body.clone(),
            key_ttl_ms: millis(key_ttl),
            refund_status: s.status.as_str(),
            acquirer_refund_id: s.acquirer_refund_id.map(str::to_owned),
            failure_reason: s.failure_reason.map(str::to_owned),
            event: s.event.map(|e| {
                (
                    e.message_id.as_str().to_owned(),
                    EVENTS_EXCHANGE,
                    e.event_type.to_owned(),
                    e.tenant.to_owned(),
                    e.body.clone(),
                )
            }),
            webhook: s
                .webhook
                .map(|w| (w.event_id.as_str().to_owned(), w.event_type, w.body.clone())),
        }
    }

    fn params(&self) -> Params<'_, 18> {
        let event = self.event.as_ref();
        let webhook = self.webhook.as_ref();
        [
            ("merchant_id", Param::Int(self.merchant_id)),
            ("idempotency_key", Param::Text(&self.key)),
            ("refund_id", Param::Text(&self.refund_id)),
            ("attempt", Param::Int(self.attempt)),
            ("response_status", Param::SmallInt(self.response_status)),
            ("response_body", Param::Bytes(&self.response_body)),
            ("key_ttl_ms", Param::Int(self.key_ttl_ms)),
            ("refund_status", Param::Text(self.refund_status)),
            (
                "acquirer_refund_id",
                Param::OptText(self.acquirer_refund_id.as_deref()),
            ),
            (
                "failure_reason",
                Param::OptText(self.failure_reason.as_deref()),
            ),
            ("event_id", Param::OptText(event.map(|e| e.0.as_str()))),
            ("event_exchange", Param::OptText(event.map(|e| e.1))),
            ("event_type", Param::OptText(event.map(|e| e.2.as_str()))),
            ("event_tenant", Param::OptText(event.map(|e| e.3.as_str()))),
            ("event_body", Param::OptBytes(event.map(|e| e.4.as_ref()))),
            (
                "webhook_event_id",
                Param::OptText(webhook.map(|w| w.0.as_str())),
            ),
            ("webhook_event_type", Param::OptText(webhook.map(|w| w.1))),
            (
                "webhook_body",
                Param::OptBytes(webhook.map(|w| w.2.as_ref())),
            ),
        ]
    }
}

/// Refund claims as one statement: the claim's function for each row, in
/// the order of their merchants, charges and keys, so that two batches that
/// reserve against the same charges or insert the same keys take them in
/// the same order; all in one transaction and one commit. Each row means
/// what it means alone: a later row sees what an earlier one reserved or
/// inserted (a second claim of a key in the batch finds it `taken`, and is
/// answered from the record once the batch has committed).
const CLAIM_BATCH_SQL: &str = "select i.n, f.outcome, f.refund_id, f.attempt, f.amount_cents,
            f.currency, f.capture_reference, f.created_at, f.charge_status, f.under_review,
            f.remaining
       from (select * from unnest($1::bigint[], $2::text[], $3::bytea[], $4::text[],
                                  $5::bigint[], $6::bigint[], $7::text[], $8::bigint[],
                                  $9::text[], $10::text[], $11::text[], $12::text[])
                 with ordinality as i(merchant_id, idempotency_key, fingerprint, refund_id,
                                      lease_ms, key_ttl_ms, charge_id, amount_cents, reason,
                                      description, reference, traceparent, n)
              order by i.merchant_id, i.charge_id, i.idempotency_key, i.n) i
      cross join lateral idem_claim_refund(i.merchant_id, i.idempotency_key, i.fingerprint,
            i.refund_id, i.lease_ms, i.key_ttl_ms, i.charge_id, nullif(i.amount_cents, 0),
            i.reason, i.description, i.reference, i.traceparent) f";

/// Refund finalizes as one statement, the finalize's function for each row
/// in the order of their keys; whether each settled.
const FINALIZE_BATCH_SQL: &str = "select i.n, idem_finalize_refund(i.merchant_id,
            i.idempotency_key, i.refund_id, i.attempt, i.response_status, i.response_body,
            i.key_ttl_ms, i.refund_status, i.acquirer_refund_id, i.failure_reason, i.event_id,
            i.event_exchange, i.event_type, i.event_tenant, i.event_body, i.webhook_event_id,
            i.webhook_event_type, i.webhook_body) as settled
       from (select * from unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[],
                                  $5::smallint[], $6::bytea[], $7::bigint[], $8::text[],
                                  $9::text[], $10::text[], $11::text[], $12::text[],
                                  $13::text[], $14::text[], $15::bytea[], $16::text[],
                                  $17::text[], $18::bytea[])
                 with ordinality as i(merchant_id, idempotency_key, refund_id, attempt,
                                      response_status, response_body, key_ttl_ms,
                                      refund_status, acquirer_refund_id, failure_reason,
                                      event_id, event_exchange, event_type, event_tenant,
                                      event_body, webhook_event_id, webhook_event_type,
                                      webhook_body, n)
              order by i.merchant_id, i.idempotency_key, i.n) i";

#[derive(sqlx::FromRow)]
struct ClaimBatchRow {
    n: i64,
    #[sqlx(flatten)]
    answer: ClaimAnswer,
}

async fn claim_alone(pool: &PgPool, row: &ClaimRow) -> Result<ClaimAnswer, StoreError> {
    let params = row.params();
    super::on_pool(pool, async |db| -> Result<ClaimAnswer, StoreError> {
        Ok(
            sqlx::query_as_with(CLAIM_SQL, arguments::<PgArguments, 12>(&params)?)
                .fetch_one(db)
                .await?,
        )
    })
    .await
}

async fn finalize_alone(pool: &PgPool, row: &FinalizeRow) -> Result<bool, StoreError> {
    let params = row.params();
    super::on_pool(pool, async |db| -> Result<bool, StoreError> {
        let (settled,): (bool,) =
            sqlx::query_as_with(FINALIZE_SQL, arguments::<PgArguments, 18>(&params)?)
                .fetch_one(db)
                .await?;
        Ok(settled)
    })
    .await
}

/// Runs refund claims as one statement ([`CLAIM_BATCH_SQL`]); a batch of
/// one runs the one-row statement.
pub(super) async fn claims(pool: &PgPool, rows: Vec<ClaimRow>) -> Vec<Batched<ClaimAnswer>> {
    if let [row] = rows.as_slice() {
        return vec![Batched::Done(claim_alone(pool, row).await)];
    }
    let params: Vec<_> = rows.iter().map(ClaimRow::params).collect();
    match super::batched::fetch::<ClaimBatchRow, 12>(pool, CLAIM_BATCH_SQL, &params).await {
        Ok(answers) => {
            let mut by_n: Vec<Option<ClaimAnswer>> = (0..rows.len()).map(|_| None).collect();
            for a in answers {
                let slot = usize::try_from(a.n - 1).ok().and_then(|n| by_n.get_mut(n));
                if let Some(slot) = slot {
                    *slot = Some(a.answer);
                }
            }
            by_n.into_iter()
                .map(|a| a.map_or(Batched::Alone, |a| Batched::Done(Ok(a))))
                .collect()
        }
        Err(e) => {
            tracing::debug!(error = %e, rows = rows.len(), "a batch of refund claims failed; each goes alone");
            batch::failed(rows.len(), &e)
        }
    }
}

/// Runs refund finalizes as one statement ([`FINALIZE_BATCH_SQL`]); a batch
/// of one runs the one-row statement.
pub(super) async fn finalizes(pool: &PgPool, rows: Vec<FinalizeRow>) -> Vec<Batched<bool>> {
    if let [row] = rows.as_slice() {
        return vec![Batched::Done(finalize_alone(pool, row).await)];
    }
    let params: Vec<_> = rows.iter().map(FinalizeRow::params).collect();
    match super::batched::fetch::<(i64, bool), 18>(pool, FINALIZE_BATCH_SQL, &params).await {
        Ok(settled) => {
            let mut by_n: Vec<Batched<bool>> = (0..rows.len()).map(|_| Batched::Alone).collect();
            for (n, settled) in settled {
                let slot = usize::try_from(n - 1).ok().and_then(|n| by_n.get_mut(n));
                if let Some(slot) = slot {
                    *slot = Batched::Done(Ok(settled));
                }
            }
            by_n
        }
        Err(e) => {
            tracing::debug!(error = %e, rows = rows.len(), "a batch of refund finalizes failed; each goes alone");
            batch::failed(rows.len(), &e)
        }
    }
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

/// The webhook event's deliveries, in the caller's transaction.
async fn deliver(
    tx: &mut PgConnection,
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
