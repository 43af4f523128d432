//! What an operator may do to one charge or one refund (`idem charges retry
//! | resolve`, `idem refunds retry | resolve`, and the console's buttons): the
//! same fenced take-over every attempt uses, so an operator never works a
//! subject at the same time as a client retry, a server or the reconciler,
//! and the same finalize, so a late retry replays what the operator decided
//! exactly as if the engine had decided it. Written once, for any
//! [`Operation`].

use std::time::Duration;

use super::engine::{Approach, Decided};
use super::operation::{Final, Operable, Operation};
use super::{Engine, EngineError, Outcome};
use crate::domain::{IdempotencyKey, Merchant};
use crate::store::{Audit, AuditEntry, Record};

/// How a person settles a subject awaiting review, from the acquirer's
/// records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The money moved as asked: the charge was captured, the refund paid.
    Succeeded,
    /// It did not: the stored answer is the one the acquirer's refusal gets.
    Failed,
}

/// Why an operator's action was not taken. Nothing was written. `kind` is
/// `charge` or `refund`.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("no {kind} has the id {id:?}")]
    NotFound { kind: &'static str, id: String },
    #[error("{kind} {id} is already final ({status}); its stored answer stands")]
    AlreadyFinal {
        kind: &'static str,
        id: String,
        status: String,
    },
    #[error(
        "{kind} {id} is not awaiting review (the reconciler has not given up on it): \
         `idem {kind}s retry` it instead"
    )]
    NotAwaitingReview { kind: &'static str, id: String },
    #[error("{kind} {id} has no key record left to work on")]
    NoKeyRecord { kind: &'static str, id: String },
    #[error(
        "{kind} {id} is being worked on by another attempt (a client retry, a server or the \
         reconciler) until {until}; try again after it"
    )]
    Busy {
        kind: &'static str,
        id: String,
        until: String,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<crate::store::StoreError> for OperatorError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Engine(e.into())
    }
}

/// What the acquirer says now of a subject's reference, asked by its lookup
/// (a read: nothing moves), for an operator's page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquirerWord {
    /// It did it: its id for it (a capture's, a refund's).
    Done(String),
    /// It declined or refused it: its reason.
    Refused(String),
    /// It did something else than asked under the reference.
    Contradicted(String),
    /// It has no record of the reference.
    Nothing,
    /// It did not say (timed out, an error): why.
    Unknown(String),
}

impl AcquirerWord {
    fn of(answer: Result<Option<super::operation::Said>, crate::acquirer::AcquirerError>) -> Self {
        use crate::acquirer::AcquirerError as E;
        match answer {
            Ok(None) => Self::Nothing,
            Ok(Some(Ok(id))) => Self::Done(id),
            Ok(Some(Err(E::Declined(d)))) => Self::Refused(d.reason),
            Ok(Some(Err(E::Rejected { status, reason }))) => {
                Self::Refused(reason.unwrap_or_else(|| format!("status {status}")))
            }
            Ok(Some(Err(E::Contradicted(c)))) => {
                Self::Contradicted(format!("{}: {}", c.capture_id, c.differences.join(", ")))
            }
            Ok(Some(Err(e))) | Err(e) => Self::Unknown(e.to_string()),
        }
    }
}

/// A subject an operator may act on, taken over: its merchant, key and record.
struct Taken<S> {
    merchant: Merchant,
    key: IdempotencyKey,
    record: Record<S>,
}

impl Engine {
    /// Re-drives a pending charge or refund now: looks its reference up at
    /// the acquirer and calls with the same reference only where the
    /// acquirer has no outcome (as the reconciler does), then records the
    /// retry, with what came of it, in the audit trail.
    pub async fn retry<O: Operation>(
        &self,
        id: &str,
        audit: Audit<'_>,
    ) -> Result<Outcome, OperatorError> {
        let found = self.operable::<O>(id).await?;
        let taken = self.take::<O>(id, &found).await?;
        let outcome = self
            .drive::<O>(
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
        let action = format!("{}.retry", O::KIND);
        self.store
            .record_audit(&AuditEntry {
                audit,
                action: &action,
                subject: id,
                detail: &detail,
            })
            .await?;
        Ok(outcome)
    }

    /// Settles a charge or refund awaiting review as a person decided, with
    /// the acquirer's records in hand: stores the answer the engine would
    /// have stored for that outcome, with its event and webhooks, and the
    /// decision in the audit trail, all in one transaction. No call to the
    /// acquirer is made.
    pub async fn resolve<O: Operation>(
        &self,
        id: &str,
        resolution: Resolution,
        audit: Audit<'_>,
    ) -> Result<Outcome, OperatorError> {
        let found = self.operable::<O>(id).await?;
        if !found.awaiting_review {
            return Err(OperatorError::NotAwaitingReview {
                kind: O::KIND,
                id: id.to_owned(),
            });
        }
        let taken = self.take::<O>(id, &found).await?;
        let outcome = match resolution {
            Resolution::Succeeded => Final::Done { acquirer_id: None },
            Resolution::Failed => Final::Refused { reason: None },
        };
        let detail = format!(
            "resolved as {}",
            O::status(&O::settled(&taken.record.subject, &outcome))
        );
        let action = format!("{}.resolve", O::KIND);
        let entry = AuditEntry {
            audit,
            action: &action,
            subject: id,
            detail: &detail,
        };
        let outcome = self
            .store_outcome::<O>(
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

    /// Asks the acquirer what it did under `subject`'s reference, by its
    /// lookup, as the reconciler does; no record is taken and nothing is
    /// stored: what an operator's page shows beside idem's own record.
    pub async fn ask_acquirer<O: Operation>(
        &self,
        merchant: &Merchant,
        subject: &O::Subject,
    ) -> AcquirerWord {
        AcquirerWord::of(O::look_up(self.acquirer.as_ref(), merchant, subject).await)
    }

    /// The subject `id` while it is still pending.
    async fn operable<O: Operation>(&self, id: &str) -> Result<Operable, OperatorError> {
        let found = O::operable(&self.store, id)
            .await?
            .ok_or_else(|| OperatorError::NotFound {
                kind: O::KIND,
                id: id.to_owned(),
            })?;
        if !found.pending {
            return Err(OperatorError::AlreadyFinal {
                kind: O::KIND,
                id: id.to_owned(),
                status: found.status,
            });
        }
        Ok(found)
    }

    /// Takes the subject's record over with the fenced take-over every
    /// attempt uses.
    async fn take<O: Operation>(
        &self,
        id: &str,
        found: &Operable,
    ) -> Result<Taken<O::Subject>, OperatorError> {
        let no_record = || OperatorError::NoKeyRecord {
            kind: O::KIND,
            id: id.to_owned(),
        };
        let key_detail = found.key.as_ref().ok_or_else(no_record)?;
        let key = IdempotencyKey::parse(key_detail.idempotency_key.as_bytes())
            .map_err(|_| no_record())?;
        let record = O::take_over(
            &self.store,
            found.merchant.id,
            &key,
            key_detail.attempt,
            self.config.lease,
        )
        .await?
        .ok_or_else(|| OperatorError::Busy {
            kind: O::KIND,
            id: id.to_owned(),
            until: key_detail
                .locked_until
                .map_or_else(|| "its lease ends".to_owned(), |t| t.to_rfc3339()),
        })?;
        Ok(Taken {
            merchant: found.merchant.clone(),
            key,
            record,
        })
    }
}
