//! What an operator may do to one charge (`idem charges retry | resolve`, and
//! the console's buttons): the same fenced take-over every attempt uses, so an
//! operator never works a charge at the same time as a client retry, a server
//! or the reconciler, and the same finalize, so a late retry replays what the
//! operator decided exactly as if the engine had decided it.

use std::time::Duration;

use super::engine::{Approach, Decided};
use super::operation::Final;
use super::{Engine, EngineError, Outcome};
use crate::domain::{ChargeRequest, ChargeStatus, IdempotencyKey, Merchant};
use crate::store::{Audit, AuditEntry, ChargeRecord, KeyRecord};

/// How a person settles a charge awaiting review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The acquirer's records show the money moved.
    Captured,
    /// They show it did not: the stored answer is the acquirer-rejected problem.
    Failed,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Captured => "captured",
            Self::Failed => "failed",
        }
    }
}

/// Why an operator's action was not taken. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("no charge has the id {0:?}")]
    NotFound(String),
    #[error("charge {id} is already final ({status}); its stored answer stands")]
    AlreadyFinal { id: String, status: String },
    #[error(
        "charge {0} is not awaiting review (the reconciler has not given up on it): \
         `idem charges retry` it instead"
    )]
    NotAwaitingReview(String),
    #[error("charge {id} has no key record left to work on")]
    NoKeyRecord { id: String },
    #[error(
        "charge {id} is being worked on by another attempt (a client retry, a server or the \
         reconciler) until {until}; try again after it"
    )]
    Busy { id: String, until: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<crate::store::StoreError> for OperatorError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Engine(e.into())
    }
}

/// A charge an operator may act on, taken over: its merchant, key and record.
struct Taken {
    merchant: Merchant,
    key: IdempotencyKey,
    record: KeyRecord,
}

impl Engine {
    /// Re-drives a processing charge now: looks its reference up at the
    /// acquirer and captures with the same reference only where the acquirer
    /// has no outcome (as the reconciler does), then records the retry, with
    /// what came of it, in the audit trail.
    pub async fn retry_charge(&self, id: &str, audit: Audit<'_>) -> Result<Outcome, OperatorError> {
        let found = self.operable(id).await?;
        let taken = self.take(&found).await?;
        let outcome = self
            .drive::<ChargeRequest>(
                &taken.merchant,
                &taken.key,
                taken.record,
                Approach::LookupFirst {
                    backoff: Duration::ZERO,
                },
            )
            .await?;
        let detail = match &outcome {
            Outcome::Completed { response, .. } => {
                format!("the acquirer's outcome stored (answer {})", response.status)
            }
            Outcome::Unknown { retry_after, .. } => format!(
                "the acquirer's outcome is still unknown (it asks to wait {} s)",
                retry_after.as_secs()
            ),
            other => format!("another attempt's outcome: {}", other.label()),
        };
        self.store
            .record_audit(&AuditEntry {
                audit,
                action: "charge.retry",
                subject: id,
                detail: &detail,
            })
            .await?;
        Ok(outcome)
    }

    /// Settles a charge awaiting review as a person decided, with the
    /// acquirer's records in hand: stores the answer the engine would have
    /// stored for that outcome, with its event, and the decision in the audit
    /// trail, all in one transaction. No call to the acquirer is made.
    pub async fn resolve_charge(
        &self,
        id: &str,
        resolution: Resolution,
        audit: Audit<'_>,
    ) -> Result<Outcome, OperatorError> {
        let found = self.operable(id).await?;
        if !found.charge.awaiting_review() {
            return Err(OperatorError::NotAwaitingReview(id.to_owned()));
        }
        let taken = self.take(&found).await?;
        let detail = format!("resolved as {}", resolution.as_str());
        let entry = AuditEntry {
            audit,
            action: "charge.resolve",
            subject: id,
            detail: &detail,
        };
        let outcome = match resolution {
            Resolution::Captured => Final::Done { acquirer_id: None },
            Resolution::Failed => Final::Refused { reason: None },
        };
        let outcome = self
            .store_outcome::<ChargeRequest>(
                &taken.merchant,
                &taken.key,
                taken.record,
                Decided {
                    outcome,
                    audit: Some(&entry),
                },
            )
            .await?;
        Ok(outcome)
    }

    /// The charge `id` while it is still processing, with its key record.
    async fn operable(&self, id: &str) -> Result<ChargeRecord, OperatorError> {
        let found = self
            .store
            .charge_record(id)
            .await?
            .ok_or_else(|| OperatorError::NotFound(id.to_owned()))?;
        if found.charge.status != ChargeStatus::Processing.as_str() {
            return Err(OperatorError::AlreadyFinal {
                id: id.to_owned(),
                status: found.charge.status.clone(),
            });
        }
        Ok(found)
    }

    /// Takes the charge's record over with the fenced take-over every attempt uses.
    async fn take(&self, found: &ChargeRecord) -> Result<Taken, OperatorError> {
        let id = &found.charge.id;
        let no_record = || OperatorError::NoKeyRecord { id: id.clone() };
        let key_detail = found.key.as_ref().ok_or_else(no_record)?;
        let key = IdempotencyKey::parse(key_detail.idempotency_key.as_bytes())
            .map_err(|_| no_record())?;
        let merchant = Merchant {
            id: found.charge.merchant_id,
            name: found.charge.merchant.clone(),
        };
        let record = self
            .store
            .take_over(merchant.id, &key, key_detail.attempt, self.config.lease)
            .await?
            .ok_or_else(|| OperatorError::Busy {
                id: id.clone(),
                until: key_detail
                    .locked_until
                    .map_or_else(|| "its lease ends".to_owned(), |t| t.to_rfc3339()),
            })?;
        Ok(Taken {
            merchant,
            key,
            record,
        })
    }
}
