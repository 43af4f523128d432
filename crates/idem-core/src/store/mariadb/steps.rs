//! Captures and voids on MariaDB: the same operations as SQLite's, each a
//! few statements in one transaction, as refunds are ([`super::refunds`]).
//! Two steps of one charge take turns at the charge's row (each reservation
//! is a guarded update of it), so each sees what the other reserved or
//! closed: of a void and a capture racing on one authorization, the second
//! is refused, whichever it is. The claim writes the key only once the
//! reservation holds, then the step; a refusal writes nothing; a claim of
//! the same key committed in between makes this one run again.

use const_format::concatcp;
use sqlx::mysql::MySqlConnection;

use super::key_space::{step_record, taken, STEP_COLUMNS};
use super::keys::{lost_a_race, release_in, take_over_key, tombstone, KeyOf, Subject};
use super::refunds::KEY_RACE_TRIES;
use super::sql::{params, query, query_as};
use super::webhooks::ENDPOINT_HEARS;
use super::{MariaDbStore, NOW};
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
       from charges where id = $1 and merchant_id = $2 for update";

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
        and capture_reserved_cents + $3 <= amount_cents"
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
        and capture_closed_by is null and capture_reserved_cents = captured_cents"
);

/// What a reservation just made took (its row locked by it): the currency,
/// and the amount (`$3` for a capture; a void releases what was not captured).
/// `$1` charge, `$2` merchant, `$3` a capture's amount, `$6` whether a void.
const RESERVED_SQL: &str = "select currency,
            case when $6 then amount_cents - captured_cents else $3 end
       from charges where id = $1";

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
      where id = $1 and status = 'pending'"
);

/// A pending step, locked for its settlement. `$1` step.
const PENDING_STEP_SQL: &str = "select kind, charge_id, amount_cents, final
       from authorization_steps where id = $1 and status = 'pending' for update";

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
    " from dual where (select events_enabled from settings)"
);

/// `$1` event id, `$2` type, `$3` body, `$4` merchant, `$5` the step (the
/// deliveries name its charge).
const WEBHOOK_DELIVERIES_SQL: &str = concatcp!(
    "insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select i.webhook_event_id, we.id, i.webhook_event_type, i.webhook_body,
            (select s.charge_id from authorization_steps s where s.id = $5), ",
    NOW,
    ", ",
    NOW,
    " from (select $1 as webhook_event_id, $2 as webhook_event_type, $3 as webhook_body) i
       join webhook_endpoints we on we.merchant_id = $4
      where ",
    ENDPOINT_HEARS
);

/// The reconciler scheduled on a released step (parameters as
/// `keys::release_in` binds them).
const RESCHEDULE_STEP_SQL: &str = concatcp!(
    "update authorization_steps
        set reconcile_attempts = reconcile_attempts + $4,
            next_reconcile_at = case when $5 is null then next_reconcile_at
                else greatest(coalesce(next_reconcile_at, ",
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
            timestampadd(microsecond, s.created_at * 1000, timestamp'1970-01-01 00:00:00') as created_at,
            timestampadd(microsecond, s.review_since * 1000, timestamp'1970-01-01 00:00:00') as review_since,
            s.review_reason, s.idempotency_key
       from authorization_steps s join merchants m on m.id = s.merchant_id
      where s.id = $1";

/// `$1` merchant, `$2` key, `$3` step.
const KEY_DETAIL_SQL: &str = "select idempotency_key, state, attempt,
            timestampadd(microsecond, locked_until * 1000, timestamp'1970-01-01 00:00:00') as locked_until,
            response_status,
            timestampadd(microsecond, expires_at * 1000, timestamp'1970-01-01 00:00:00') as expires_at
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
impl Steps for MariaDbStore {
    async fn claim_step(&self, claim: &NewStepClaim<'_>) -> Result<StepClaim, StoreError> {
        let id = StepId::generate(claim.kind);
        let reference =
            AcquirerReference::for_intent(claim.merchant_id, claim.key, &claim.fingerprint);
        // One deadline for every run: a store operation stays within it.
        super::within_deadline(async {
            let mut tries = 0;
            loop {
                tries += 1;
                let claimed = self
                    .write(async |tx| -> Result<StepClaim, StoreError> {
                        // As a refund's claim: the key is decided by reading it, and
                        // written only once the reservation holds; a claim of the same
                        // key committed in between makes this one run again.
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
                            return found.map(Taken::into_step_claim).ok_or_else(|| {
                                StoreError::Corrupt("a taken key not found".into())
                            });
                        }
                        let Some((currency, amount)) = reserve(tx, claim, &id).await? else {
                            // The reservation waited on the charge's row for the
                            // claims ahead of it; if one of them was of this very
                            // key, its record is there now, and is the answer.
                            if let Some(now) = taken(tx, merchant_id, key).await? {
                                if found.is_none() || !now.expired() {
                                    return Ok(now.into_step_claim());
                                }
                            }
                            let charge: Option<Refused> = query_as(
                                EXPLAIN_SQL,
                                params![claim.charge_id.as_str(), merchant_id],
                            )?
                            .fetch_optional(&mut *tx)
                            .await?;
                            return Ok(StepClaim::Refused(Refusal::of_authorization(
                                claim.kind,
                                charge.map(|c| {
                                    (c.status, c.under_review, c.remaining, c.closed, c.capturing)
                                }),
                            )));
                        };
                        // The step first: the key record's foreign key names it.
                        query(
                            INSERT_STEP_SQL,
                            params![
                                id.as_str(),
                                claim.kind.as_str(),
                                claim.charge_id.as_str(),
                                merchant_id,
                                amount,
                                &currency,
                                claim.kind == StepKind::Void || claim.final_capture,
                                reference.as_str(),
                                key.as_str(),
                                claim.traceparent
                            ],
                        )?
                        .execute(&mut *tx)
                        .await?;
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
                        let record = step_record(tx, merchant_id, key).await?.ok_or_else(|| {
                            StoreError::Corrupt("a step claimed and not read back".into())
                        })?;
                        Ok(StepClaim::Won(Box::new(record)))
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
        super::again_on_deadlock!(
            self.write(async |tx| -> Result<bool, StoreError> {
                let keyed = query(
                    FINALIZE_KEY_SQL,
                    params![
                        merchant_id,
                        key.as_str(),
                        step.as_str(),
                        record.attempt,
                        i64::from(s.response.status),
                        s.response.body.as_ref(),
                        crate::store::shared::millis(key_ttl)
                    ],
                )?
                .execute(&mut *tx)
                .await?;
                if keyed.rows_affected() == 0 {
                    return Ok(false);
                }
                if let Some(entry) = s.audit {
                    super::audit::record(tx, entry).await?;
                }
                let settled: Option<(String, String, i64, bool)> =
                    query_as(PENDING_STEP_SQL, params![step.as_str()])?
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some((kind, charge_id, amount, final_capture)) = settled else {
                    // Settled already: it keeps its status.
                    return Ok(true);
                };
                query(
                    SETTLE_STEP_SQL,
                    params![
                        step.as_str(),
                        s.status.as_str(),
                        s.acquirer_id,
                        s.failure_reason
                    ],
                )?
                .execute(&mut *tx)
                .await?;
                let capture = kind == StepKind::Capture.as_str();
                let settle = match (s.status, capture) {
                    (StepStatus::Succeeded, true) => {
                        query(CAPTURED_SQL, params![&charge_id, amount, final_capture])?
                    }
                    (StepStatus::Succeeded, false) => query(VOIDED_SQL, params![&charge_id])?,
                    _ => query(
                        RELEASE_RESERVATION_SQL,
                        params![&charge_id, if capture { amount } else { 0 }, step.as_str()],
                    )?,
                };
                settle.execute(&mut *tx).await?;
                if let Some(event) = s.event {
                    query(
                        STEP_EVENT_SQL,
                        params![
                            event.message_id.as_str(),
                            EVENTS_EXCHANGE,
                            event.event_type,
                            event.tenant,
                            event.body.as_ref(),
                            step.as_str()
                        ],
                    )?
                    .execute(&mut *tx)
                    .await?;
                }
                if let Some(webhook) = s.webhook {
                    deliver(tx, merchant_id, step, webhook).await?;
                }
                Ok(true)
            })
            .await
        )
    }

    async fn take_over_step(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> Result<Option<StepRecord>, StoreError> {
        super::again_on_deadlock!(
            self.write(async |tx| {
                if !take_over_key(tx, merchant_id, key, attempt, lease).await? {
                    return Ok(None);
                }
                step_record(tx, merchant_id, key).await
            })
            .await
        )
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

    async fn step_detail(&self, id: &str) -> Result<Option<StepDetail>, StoreError> {
        let step: Option<StepDetail> = query_as(DETAIL_SQL, params![id])?
            .fetch_optional(&self.pool)
            .await?;
        let Some(mut step) = step else {
            return Ok(None);
        };
        step.key = query_as(
            KEY_DETAIL_SQL,
            params![step.merchant_id, &step.idempotency_key, &step.id],
        )?
        .fetch_optional(&self.pool)
        .await?;
        Ok(Some(step))
    }

    async fn step(&self, merchant_id: i64, id: &StepId) -> Result<Option<Step>, StoreError> {
        let row: Option<StepRow> = query_as(STEP_SQL, params![id.as_str(), merchant_id])?
            .fetch_optional(&self.pool)
            .await?;
        row.map(Step::try_from).transpose()
    }

    async fn steps_of(
        &self,
        merchant_id: i64,
        charge_id: &ChargeId,
    ) -> Result<Vec<Step>, StoreError> {
        let rows: Vec<StepRow> = query_as(STEPS_OF_SQL, params![charge_id.as_str(), merchant_id])?
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(Step::try_from).collect()
    }
}

/// The claim's reservation against the authorization, in its write
/// transaction: the charge's currency and the amount reserved (a void's: what
/// it releases); `None` when the charge refused it.
async fn reserve(
    tx: &mut MySqlConnection,
    claim: &NewStepClaim<'_>,
    id: &StepId,
) -> Result<Option<(String, i64)>, StoreError> {
    let amount = match (claim.kind, claim.amount) {
        (StepKind::Void, _) => None,
        (StepKind::Capture, Some(amount)) => Some(amount.get()),
        // All the authorization has left, if anything.
        (StepKind::Capture, None) => {
            let remaining: Option<(Option<i64>,)> = query_as(
                REMAINING_SQL,
                params![claim.charge_id.as_str(), claim.merchant_id],
            )?
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
    let void = claim.kind == StepKind::Void;
    let params = params![
        claim.charge_id.as_str(),
        claim.merchant_id,
        amount,
        claim.final_capture,
        id.as_str(),
        void
    ];
    if query(sql, params)?.execute(&mut *tx).await?.rows_affected() != 1 {
        return Ok(None);
    }
    Ok(query_as(RESERVED_SQL, params)?
        .fetch_optional(&mut *tx)
        .await?)
}

/// The webhook event's deliveries, in the caller's write transaction.
async fn deliver(
    tx: &mut MySqlConnection,
    merchant_id: i64,
    step: &StepId,
    webhook: &NewWebhook,
) -> Result<(), StoreError> {
    query(
        WEBHOOK_DELIVERIES_SQL,
        params![
            webhook.event_id.as_str(),
            webhook.event_type,
            webhook.body.as_ref(),
            merchant_id,
            step.as_str()
        ],
    )?
    .execute(tx)
    .await?;
    Ok(())
}
