//! Captures and voids on PostgreSQL: the claim that reserves a step against
//! its charge's authorization, the finalize that settles both, and reading
//! them.
//!
//! As a refund's, the claim is one short transaction committed before the
//! acquirer is called, and one statement: the function `idem_claim_step`
//! (migrations 0016 and 0017) inserts the key first, then makes the **guarded
//! update** of the charge's row (a capture: `capture_reserved_cents + amount
//! <= amount_cents`, the authorization open; a void: the authorization open
//! and no capture pending), then the step. Two steps of one charge meet at
//! the charge's row: the second's update waits for the first's commit and
//! re-checks its guard against what the first reserved or closed; a refused
//! claim then locks the row and tries once more, so that a refusal reports
//! the state that refused it. The finalize is one function too
//! (`idem_finalize_step`). Steps are rarer than charges and refunds, so they
//! go alone, not in batches.

use const_format::concatcp;

use super::key_space::{step_record, taken, STEP_COLUMNS};
use super::keys::{KEY_COLUMNS, RELEASE_K, RESCHEDULE, TAKE_OVER_K};
use super::PgStore;
use crate::domain::{
    AcquirerReference, AmountCents, ChargeId, Currency, IdempotencyKey, Step, StepId, StepKind,
    StepStatus, EVENTS_EXCHANGE,
};
use crate::store::error::StoreError;
use crate::store::model::{
    KeyState, NewStepClaim, NewWebhook, Refusal, Reschedule, StepClaim, StepDetail, StepRecord,
    StepSettlement,
};
use crate::store::ops::Steps;
use crate::store::rows::{StepRecordRow, StepRow};
use crate::store::shared::millis;

const TAKE_OVER_SQL: &str = concatcp!(
    TAKE_OVER_K,
    " select ",
    STEP_COLUMNS,
    ", ",
    KEY_COLUMNS,
    ", s.review_since is not null as under_review
       from k join authorization_steps s on s.id = k.step_id
       join charges c on c.id = s.charge_id"
);

const RELEASE_SQL: &str = concatcp!(
    RELEASE_K,
    " update authorization_steps s",
    RESCHEDULE,
    " from k where s.id = k.step_id"
);

const CLAIM_SQL: &str = "select outcome, step_id, attempt, amount_cents, currency,
            authorization_reference, created_at, charge_status, under_review, remaining,
            closed, capturing
       from idem_claim_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

const FINALIZE_SQL: &str = "select idem_finalize_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
            $11, $12, $13, $14, $15, $16, $17, $18)";

/// `$1` event id, `$2` type, `$3` body, `$4` merchant, `$5` the step (the
/// deliveries name its charge).
const WEBHOOK_DELIVERIES_SQL: &str = "insert into webhook_deliveries
        (event_id, endpoint_id, event_type, body, charge_id)
     select $1, we.id, $2, $3, (select s.charge_id from authorization_steps s where s.id = $5)
       from webhook_endpoints we
      where we.merchant_id = $4 and we.disabled_at is null
        and (we.events is null or $2 = any(we.events))";

const MARK_FOR_REVIEW_SQL: &str = "update authorization_steps
        set review_since = now(), review_reason = $2, updated_at = now()
      where id = $1 and status = 'pending' and review_since is null";

const DETAIL_SQL: &str = "select s.id, s.kind, s.charge_id, s.merchant_id, m.name as merchant,
            s.amount_cents, s.currency, s.status, s.acquirer_reference, s.created_at,
            s.review_since, s.review_reason, s.idempotency_key
       from authorization_steps s join merchants m on m.id = s.merchant_id
      where s.id = $1";

const KEY_DETAIL_SQL: &str = "select idempotency_key, state, attempt, locked_until,
            response_status, expires_at
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

/// Rounds of insert-or-read a claim may need (as a charge's claim).
const CLAIM_ROUNDS: usize = 3;

/// What the claim's function answers (migration 0016 names the columns).
#[derive(sqlx::FromRow)]
struct ClaimAnswer {
    outcome: String,
    step_id: Option<String>,
    attempt: Option<i64>,
    amount_cents: Option<i64>,
    currency: Option<String>,
    authorization_reference: Option<String>,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
    charge_status: Option<String>,
    under_review: Option<bool>,
    remaining: Option<i64>,
    closed: Option<bool>,
    capturing: Option<bool>,
}

#[async_trait::async_trait]
impl Steps for PgStore {
    async fn claim_step(&self, claim: &NewStepClaim<'_>) -> Result<StepClaim, StoreError> {
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        for _ in 0..CLAIM_ROUNDS {
            let id = StepId::generate(claim.kind);
            let answer: ClaimAnswer = self
                .on_conn(async |db| {
                    sqlx::query_as(CLAIM_SQL)
                        .bind(claim.merchant_id)
                        .bind(claim.key.as_str())
                        .bind(claim.fingerprint.as_bytes())
                        .bind(id.as_str())
                        .bind(claim.kind.as_str())
                        .bind(millis(claim.lease))
                        .bind(millis(claim.key_ttl))
                        .bind(claim.charge_id.as_str())
                        .bind(claim.amount.map(AmountCents::get))
                        .bind(claim.final_capture)
                        .bind(reference.as_str())
                        .bind(claim.traceparent)
                        .fetch_one(db)
                        .await
                })
                .await?;
            let corrupt = |what: &str| StoreError::Corrupt(format!("step claim: {what}"));
            return Ok(match answer.outcome.as_str() {
                "won" => StepClaim::Won(Box::new(won(claim, id, &reference, answer)?)),
                "expired" => StepClaim::Expired(StepId::from_trusted(
                    answer
                        .step_id
                        .ok_or_else(|| corrupt("a tombstone without its step"))?,
                )),
                "refused" => StepClaim::Refused(Refusal::of_authorization(
                    claim.kind,
                    answer.charge_status.map(|status| {
                        (
                            status,
                            answer.under_review.unwrap_or(false),
                            answer.remaining.unwrap_or(0),
                            answer.closed.unwrap_or(false),
                            answer.capturing.unwrap_or(false),
                        )
                    }),
                )),
                "taken" => {
                    let found = self
                        .on_conn(async |db| taken(db, claim.merchant_id, claim.key).await)
                        .await?;
                    match found {
                        Some(t) if !(t.expired() && *t.fingerprint() != claim.fingerprint) => {
                            t.into_step_claim()
                        }
                        // Gone, or free again, before it could be read: again.
                        _ => continue,
                    }
                }
                other => return Err(corrupt(&format!("outcome {other:?}"))),
            });
        }
        Err(StoreError::Corrupt(format!(
            "key {} neither claimed nor found in {CLAIM_ROUNDS} rounds",
            claim.key.as_str()
        )))
    }

    async fn step_record(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<StepRecord>, StoreError> {
        self.on_conn(async |db| step_record(db, merchant_id, key).await)
            .await
    }

    async fn finalize_step(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: &StepRecord,
        s: &StepSettlement<'_>,
        key_ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.in_tx(async |db| -> Result<bool, StoreError> {
            let event = s.event;
            let webhook = s.webhook;
            let (settled,): (bool,) = sqlx::query_as(FINALIZE_SQL)
                .bind(merchant_id)
                .bind(key.as_str())
                .bind(record.subject.id.as_str())
                .bind(record.attempt)
                .bind(i16::try_from(s.response.status).unwrap_or(i16::MAX))
                .bind(s.response.body.as_ref())
                .bind(millis(key_ttl))
                .bind(s.status.as_str())
                .bind(s.acquirer_id)
                .bind(s.failure_reason)
                .bind(event.map(|e| e.message_id.as_str()))
                .bind(event.map(|_| EVENTS_EXCHANGE))
                .bind(event.map(|e| e.event_type))
                .bind(event.map(|e| e.tenant))
                .bind(event.map(|e| e.body.as_ref()))
                .bind(webhook.map(|w| w.event_id.as_str()))
                .bind(webhook.map(|w| w.event_type))
                .bind(webhook.map(|w| w.body.as_ref()))
                .fetch_one(&mut *db)
                .await?;
            if let (true, Some(entry)) = (settled, s.audit) {
                super::audit::record(db, entry).await?;
            }
            Ok(settled)
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
        let row: Option<StepRecordRow> = self
            .take_over_with(TAKE_OVER_SQL, merchant_id, key, attempt, lease)
            .await?;
        row.map(StepRecord::try_from).transpose()
    }

    async fn release_step(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        self.release_with(RELEASE_SQL, merchant_id, key, attempt, reschedule)
            .await
    }

    async fn mark_step_for_review(
        &self,
        merchant_id: i64,
        id: &StepId,
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
                sqlx::query(WEBHOOK_DELIVERIES_SQL)
                    .bind(webhook.event_id.as_str())
                    .bind(webhook.event_type)
                    .bind(webhook.body.as_ref())
                    .bind(merchant_id)
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            Ok(())
        })
        .await
    }

    async fn step_detail(&self, id: &str) -> Result<Option<StepDetail>, StoreError> {
        self.on_conn(async |db| -> Result<_, sqlx::Error> {
            let step: Option<StepDetail> = sqlx::query_as(DETAIL_SQL)
                .bind(id)
                .fetch_optional(&mut *db)
                .await?;
            let Some(mut step) = step else {
                return Ok(None);
            };
            step.key = sqlx::query_as(KEY_DETAIL_SQL)
                .bind(step.merchant_id)
                .bind(&step.idempotency_key)
                .bind(&step.id)
                .fetch_optional(db)
                .await?;
            Ok(Some(step))
        })
        .await
    }

    async fn step(&self, merchant_id: i64, id: &StepId) -> Result<Option<Step>, StoreError> {
        self.on_conn(async |db| -> Result<_, StoreError> {
            let row: Option<StepRow> = sqlx::query_as(STEP_SQL)
                .bind(id.as_str())
                .bind(merchant_id)
                .fetch_optional(db)
                .await?;
            row.map(Step::try_from).transpose()
        })
        .await
    }

    async fn steps_of(
        &self,
        merchant_id: i64,
        charge_id: &ChargeId,
    ) -> Result<Vec<Step>, StoreError> {
        self.on_conn(async |db| -> Result<_, StoreError> {
            let rows: Vec<StepRow> = sqlx::query_as(STEPS_OF_SQL)
                .bind(charge_id.as_str())
                .bind(merchant_id)
                .fetch_all(db)
                .await?;
            rows.into_iter().map(Step::try_from).collect()
        })
        .await
    }
}

/// The record a won claim made, from what the claim knew and its function
/// answered: the step pending, the key in flight under this attempt's lease.
fn won(
    claim: &NewStepClaim<'_>,
    id: StepId,
    reference: &AcquirerReference,
    answer: ClaimAnswer,
) -> Result<StepRecord, StoreError> {
    let name = id.to_string();
    let corrupt = |what: &str| StoreError::Corrupt(format!("step {name}'s claim: {what}"));
    let amount = answer.amount_cents.ok_or_else(|| corrupt("no amount"))?;
    let currency = answer.currency.ok_or_else(|| corrupt("no currency"))?;
    let step = Step {
        charge_id: claim.charge_id.clone(),
        amount_cents: AmountCents::parse(amount).map_err(|e| corrupt(&e.to_string()))?,
        currency: Currency::parse(&currency).map_err(|e| corrupt(&e.to_string()))?,
        final_capture: (claim.kind == StepKind::Capture).then_some(claim.final_capture),
        status: StepStatus::Pending,
        acquirer_reference: reference.clone(),
        failure_reason: None,
        created_at: answer.created_at.ok_or_else(|| corrupt("no time"))?,
        authorization_reference: AcquirerReference::from_trusted(
            answer
                .authorization_reference
                .ok_or_else(|| corrupt("no authorization reference"))?,
        ),
        id,
    };
    Ok(StepRecord {
        subject: step,
        fingerprint: claim.fingerprint,
        state: KeyState::InFlight {
            lease_remaining: claim.lease,
        },
        attempt: answer.attempt.ok_or_else(|| corrupt("no attempt"))?,
        expired: false,
        under_review: false,
    })
}
