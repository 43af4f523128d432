//! One key space across charges, refunds and steps: each kind's record read
//! by its key, and whose a key is. Both refunds' and steps' claims ask it when
//! their key is taken, so it stands below both.

use const_format::concatcp;
use sqlx::mysql::MySqlConnection;

use super::at;
use super::sql::{params, query_as};

use super::keys::KEY_COLUMNS;
use crate::domain::IdempotencyKey;
use crate::store::error::StoreError;
use crate::store::model::{RefundRecord, StepRecord, Taken};
use crate::store::rows::{RefundRecordRow, StepRecordRow};

/// A step's columns (alias `s`), with its charge's reference (alias `c`).
pub(super) const STEP_COLUMNS: &str = concatcp!(
    "s.id, s.charge_id, s.amount_cents, s.currency, s.final, s.status, \
     s.acquirer_reference, s.failure_reason, ",
    at!("s.created_at"),
    " as created_at, c.acquirer_reference as authorization_reference"
);

/// `$1` merchant, `$2` key.
pub(super) const STEP_RECORD_SQL: &str = concatcp!(
    "select ",
    STEP_COLUMNS,
    ", ",
    KEY_COLUMNS,
    ", s.review_since is not null as under_review
       from idempotency_keys k
       join authorization_steps s on s.id = k.step_id
       join charges c on c.id = s.charge_id
      where k.merchant_id = $1 and k.idempotency_key = $2"
);

pub(super) async fn step_record(
    db: &mut MySqlConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<StepRecord>, StoreError> {
    let row: Option<StepRecordRow> = query_as(STEP_RECORD_SQL, params![merchant_id, key.as_str()])?
        .fetch_optional(db)
        .await?;
    row.map(StepRecord::try_from).transpose()
}

/// A refund's columns (alias `r`), with its charge's reference (alias `c`).
pub(super) const REFUND_COLUMNS: &str = concatcp!(
    "r.id, r.charge_id, r.amount_cents, r.currency, r.status, r.reason, \
     r.description, r.acquirer_reference, r.failure_reason, ",
    at!("r.created_at"),
    " as created_at, c.acquirer_reference as capture_reference"
);

pub(super) const REFUND_RECORD_SQL: &str = concatcp!(
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

pub(super) async fn refund_record(
    db: &mut MySqlConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<RefundRecord>, StoreError> {
    let row: Option<RefundRecordRow> =
        query_as(REFUND_RECORD_SQL, params![merchant_id, key.as_str()])?
            .fetch_optional(db)
            .await?;
    row.map(RefundRecord::try_from).transpose()
}

/// Whose the key is: a step's, a refund's or a charge's; `None` if it is
/// gone. Read in the caller's transaction, as the latest commit has it: a claim of
/// the same key may commit after it (the claims that write the key then
/// fail as a duplicate and run again: `keys::lost_a_race`).
pub(super) async fn taken(
    db: &mut MySqlConnection,
    merchant_id: i64,
    key: &IdempotencyKey,
) -> Result<Option<Taken>, StoreError> {
    if let Some(record) = step_record(db, merchant_id, key).await? {
        return Ok(Some(Taken::Step(record)));
    }
    if let Some(record) = refund_record(db, merchant_id, key).await? {
        return Ok(Some(Taken::Refund(record)));
    }
    let charge = super::keys::key_record(&mut *db, merchant_id, key.as_str()).await?;
    Ok(charge.map(Taken::Charge))
}
