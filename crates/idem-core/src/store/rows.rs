//! Rows as both backends select them, and how each becomes a domain record:
//! a row the schema should have made impossible is [`StoreError::Corrupt`].
//! Each backend names its columns to match (its own time format aside:
//! PostgreSQL's `timestamptz`, SQLite's RFC 3339 text made from milliseconds).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::model::{
    KeyRecord, KeyState, KeyStatus, MerchantListing, Orphan, Record, RefundRecord, SecretInfo,
    StepRecord,
};
use crate::domain::{
    AcquirerReference, AmountCents, Authorization, Charge, ChargeId, ChargeStatus, Currency,
    Description, Merchant, OrderId, Refund, RefundId, RefundReason, RefundStatus, Step, StepId,
    StepKind, StepStatus,
};
use crate::domain::{Fingerprint, IdempotencyKey, StoredResponse, SubjectId};

#[derive(sqlx::FromRow)]
pub(super) struct ChargeRow {
    id: String,
    order_id: i64,
    amount_cents: i64,
    currency: String,
    description: Option<String>,
    status: String,
    acquirer_reference: String,
    decline_reason: Option<String>,
    created_at: DateTime<Utc>,
    /// A two-step charge's captures made, and made or pending (null: one step).
    captured_cents: Option<i64>,
    capture_reserved_cents: Option<i64>,
    capture_closed: bool,
}

impl TryFrom<ChargeRow> for Charge {
    type Error = StoreError;

    fn try_from(r: ChargeRow) -> Result<Self, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("charge {}: {what}", r.id));
        let status = ChargeStatus::parse(&r.status)
            .ok_or_else(|| corrupt(format!("status {:?}", r.status)))?;
        Ok(Charge {
            order_id: OrderId::parse(r.order_id).map_err(|e| corrupt(e.to_string()))?,
            amount_cents: AmountCents::parse(r.amount_cents).map_err(|e| corrupt(e.to_string()))?,
            currency: Currency::parse(&r.currency).map_err(|e| corrupt(e.to_string()))?,
            description: r
                .description
                .map(Description::parse)
                .transpose()
                .map_err(|e| corrupt(e.to_string()))?,
            status,
            authorization: r.captured_cents.map(|captured| Authorization {
                amount_captured_cents: captured,
                amount_capturable_cents: match (status, r.capture_closed) {
                    (ChargeStatus::Authorized, false) => {
                        r.amount_cents - r.capture_reserved_cents.unwrap_or(r.amount_cents)
                    }
                    _ => 0,
                },
            }),
            acquirer_reference: AcquirerReference::from_trusted(r.acquirer_reference),
            decline_reason: r.decline_reason,
            created_at: r.created_at,
            id: ChargeId::from_trusted(r.id),
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct RecordRow {
    #[sqlx(flatten)]
    charge: ChargeRow,
    #[sqlx(flatten)]
    key: KeyColumns,
}

/// A key record's own columns, whatever its subject.
#[derive(sqlx::FromRow)]
pub(super) struct KeyColumns {
    fingerprint: Vec<u8>,
    state: String,
    attempt: i64,
    response_status: Option<i16>,
    response_body: Option<Vec<u8>>,
    lease_remaining_ms: i64,
    expired: bool,
    expires_in_ms: i64,
    under_review: bool,
}

impl KeyColumns {
    /// The record of `subject` these columns describe; `what` names it in
    /// the error when a column is corrupt.
    fn record<S>(self, subject: S, what: &str) -> Result<Record<S>, StoreError> {
        let (attempt, expired, under_review) = (self.attempt, self.expired, self.under_review);
        let (fingerprint, state) =
            self.read(|column| StoreError::Corrupt(format!("{what}: {column}")))?;
        Ok(Record {
            subject,
            fingerprint,
            state,
            attempt,
            expired,
            under_review,
        })
    }

    /// The fingerprint and the state, or what is corrupt about them.
    fn read(
        self,
        corrupt: impl Fn(&str) -> StoreError,
    ) -> Result<(Fingerprint, KeyState), StoreError> {
        let fingerprint =
            Fingerprint::from_bytes(&self.fingerprint).ok_or_else(|| corrupt("fingerprint"))?;
        let state = match (
            self.state.as_str(),
            self.response_status,
            self.response_body,
        ) {
            ("in_flight", _, _) => KeyState::InFlight {
                lease_remaining: Duration::from_millis(
                    self.lease_remaining_ms.max(0).unsigned_abs(),
                ),
            },
            ("completed", Some(status), Some(body)) => KeyState::Completed {
                response: StoredResponse {
                    status: u16::try_from(status).map_err(|_| corrupt("response status"))?,
                    body: body.into(),
                },
                expires_in: Duration::from_millis(self.expires_in_ms.max(0).unsigned_abs()),
            },
            _ => return Err(corrupt("state")),
        };
        Ok((fingerprint, state))
    }
}

impl TryFrom<RecordRow> for KeyRecord {
    type Error = StoreError;

    fn try_from(r: RecordRow) -> Result<Self, StoreError> {
        let charge = Charge::try_from(r.charge)?;
        let what = format!("key of charge {}", charge.id);
        r.key.record(charge, &what)
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct RefundRow {
    id: String,
    charge_id: String,
    amount_cents: i64,
    currency: String,
    status: String,
    reason: Option<String>,
    description: Option<String>,
    acquirer_reference: String,
    failure_reason: Option<String>,
    created_at: DateTime<Utc>,
    capture_reference: String,
}

impl TryFrom<RefundRow> for Refund {
    type Error = StoreError;

    fn try_from(r: RefundRow) -> Result<Self, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("refund {}: {what}", r.id));
        Ok(Refund {
            charge_id: ChargeId::from_trusted(r.charge_id),
            amount_cents: AmountCents::parse(r.amount_cents).map_err(|e| corrupt(e.to_string()))?,
            currency: Currency::parse(&r.currency).map_err(|e| corrupt(e.to_string()))?,
            status: RefundStatus::parse(&r.status)
                .ok_or_else(|| corrupt(format!("status {:?}", r.status)))?,
            reason: match r.reason {
                Some(reason) => Some(
                    RefundReason::parse(&reason)
                        .ok_or_else(|| corrupt(format!("reason {reason:?}")))?,
                ),
                None => None,
            },
            description: r
                .description
                .map(Description::parse)
                .transpose()
                .map_err(|e| corrupt(e.to_string()))?,
            acquirer_reference: AcquirerReference::from_trusted(r.acquirer_reference),
            failure_reason: r.failure_reason,
            created_at: r.created_at,
            capture_reference: AcquirerReference::from_trusted(r.capture_reference),
            id: RefundId::from_trusted(r.id),
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct StepRow {
    id: String,
    charge_id: String,
    amount_cents: i64,
    currency: String,
    #[sqlx(rename = "final")]
    final_capture: bool,
    status: String,
    acquirer_reference: String,
    failure_reason: Option<String>,
    created_at: DateTime<Utc>,
    authorization_reference: String,
}

impl TryFrom<StepRow> for Step {
    type Error = StoreError;

    fn try_from(r: StepRow) -> Result<Self, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("step {}: {what}", r.id));
        let id = StepId::from_trusted(r.id.clone());
        Ok(Step {
            charge_id: ChargeId::from_trusted(r.charge_id),
            amount_cents: AmountCents::parse(r.amount_cents).map_err(|e| corrupt(e.to_string()))?,
            currency: Currency::parse(&r.currency).map_err(|e| corrupt(e.to_string()))?,
            final_capture: (id.kind() == StepKind::Capture).then_some(r.final_capture),
            status: StepStatus::parse(&r.status)
                .ok_or_else(|| corrupt(format!("status {:?}", r.status)))?,
            acquirer_reference: AcquirerReference::from_trusted(r.acquirer_reference),
            failure_reason: r.failure_reason,
            created_at: r.created_at,
            authorization_reference: AcquirerReference::from_trusted(r.authorization_reference),
            id,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct StepRecordRow {
    #[sqlx(flatten)]
    step: StepRow,
    #[sqlx(flatten)]
    key: KeyColumns,
}

impl TryFrom<StepRecordRow> for StepRecord {
    type Error = StoreError;

    fn try_from(r: StepRecordRow) -> Result<Self, StoreError> {
        let step = Step::try_from(r.step)?;
        let what = format!("key of step {}", step.id);
        r.key.record(step, &what)
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct RefundRecordRow {
    #[sqlx(flatten)]
    refund: RefundRow,
    #[sqlx(flatten)]
    key: KeyColumns,
}

impl TryFrom<RefundRecordRow> for RefundRecord {
    type Error = StoreError;

    fn try_from(r: RefundRecordRow) -> Result<Self, StoreError> {
        let refund = Refund::try_from(r.refund)?;
        let what = format!("key of refund {}", refund.id);
        r.key.record(refund, &what)
    }
}

/// One row of a batch of claims' statement: the place of the claim it answers
/// (from 1), whether that claim won, and the record it found or made.
#[derive(sqlx::FromRow)]
pub(super) struct ClaimBatchRow {
    pub(super) n: i64,
    pub(super) won: bool,
    #[sqlx(flatten)]
    pub(super) record: RecordRow,
}

/// A key's record as `key_status` reads it, or its tombstone (`state` =
/// `tombstone`, no response and no lease).
#[derive(sqlx::FromRow)]
pub(super) struct KeyStatusRow {
    state: String,
    charge_id: Option<String>,
    refund_id: Option<String>,
    step_id: Option<String>,
    response_status: Option<i16>,
    expires_at: DateTime<Utc>,
    lease_remaining_ms: i64,
    expired: bool,
}

impl TryFrom<KeyStatusRow> for KeyStatus {
    type Error = StoreError;

    fn try_from(r: KeyStatusRow) -> Result<Self, StoreError> {
        let subject = SubjectId::from_columns(r.charge_id, r.refund_id, r.step_id)
            .ok_or_else(|| StoreError::Corrupt("a key with no subject".to_owned()))?;
        Ok(match (r.state.as_str(), r.expired, r.response_status) {
            ("tombstone", _, _) => KeyStatus::Expired {
                subject,
                until: Some(r.expires_at),
            },
            ("completed", true, _) => KeyStatus::Expired {
                subject,
                until: None,
            },
            ("completed", false, Some(status)) => KeyStatus::Completed {
                subject,
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt("key status".to_owned()))?,
                expires_at: r.expires_at,
            },
            ("in_flight", _, _) => KeyStatus::InFlight {
                subject,
                lease_remaining: Duration::from_millis(r.lease_remaining_ms.max(0).unsigned_abs()),
            },
            (state, _, _) => {
                return Err(StoreError::Corrupt(format!(
                    "key of {subject}: state {state}"
                )))
            }
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct OrphanRow {
    merchant_id: i64,
    merchant_name: String,
    idempotency_key: String,
    charge_id: Option<String>,
    refund_id: Option<String>,
    step_id: Option<String>,
    attempt: i64,
    reconcile_attempts: i32,
    traceparent: Option<String>,
    past_deadline: bool,
}

impl TryFrom<OrphanRow> for Orphan {
    type Error = StoreError;

    fn try_from(r: OrphanRow) -> Result<Self, StoreError> {
        Ok(Orphan {
            key: IdempotencyKey::from_unquoted(&r.idempotency_key)
                .map_err(|e| StoreError::Corrupt(format!("stored key: {e}")))?,
            merchant: Merchant {
                id: r.merchant_id,
                name: r.merchant_name,
            },
            subject: SubjectId::from_columns(r.charge_id, r.refund_id, r.step_id)
                .ok_or_else(|| StoreError::Corrupt("an orphan with no subject".to_owned()))?,
            attempt: r.attempt,
            reconcile_attempts: r.reconcile_attempts,
            traceparent: r.traceparent,
            past_deadline: r.past_deadline,
        })
    }
}

/// A merchant joined with one of its secrets (or none), as both backends
/// select it: id, name, created, disabled, then the secret's id, created and
/// expiry. Ordered by merchant, then secret.
pub(super) type MerchantListingRow = (
    i64,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<i64>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// The merchants, each with its secrets, from rows ordered by merchant.
pub(super) fn merchant_listing(rows: Vec<MerchantListingRow>) -> Vec<MerchantListing> {
    let mut listing: Vec<MerchantListing> = Vec::new();
    for (id, name, created_at, disabled_at, secret_id, secret_created, expires_at) in rows {
        if listing.last().is_none_or(|t| t.merchant.id != id) {
            listing.push(MerchantListing {
                merchant: crate::domain::Merchant { id, name },
                created_at,
                disabled_at,
                secrets: Vec::new(),
            });
        }
        if let (Some(id), Some(created_at), Some(merchant)) =
            (secret_id, secret_created, listing.last_mut())
        {
            merchant.secrets.push(SecretInfo {
                id,
                created_at,
                expires_at,
            });
        }
    }
    listing
}
