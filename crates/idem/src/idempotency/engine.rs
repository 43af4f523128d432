//! The engine: one intent in, at most one capture out, whatever arrives when.
//!
//! ```text
//! claim (insert first, committed) ──won──► acquirer ──► finalize (fenced) ──► answer
//!   │ lost
//!   ├─ other fingerprint ──────────────► Mismatch (422)
//!   ├─ outcome stored ─────────────────► replay, byte for byte
//!   ├─ in flight, lease alive ─────────► InFlight (409), at once
//!   └─ in flight, lease over ─► take over (attempt + 1) ──► acquirer, same reference ...
//! ```
//! No transaction is open while the acquirer is called. The acquirer deduplicates
//! by reference, so a re-drive after a crash, timeout or take-over moves no money
//! twice; the fencing token means only the current holder stores an outcome.

use std::time::Duration;

use bytes::Bytes;

use super::{Fingerprint, IdempotencyKey, InFlightMemo};
use crate::acquirer::protocol::CaptureRequest;
use crate::acquirer::{AcquirerClient, AcquirerError};
use crate::crash::{self, CrashPoint};
use crate::domain::{
    Charge, ChargeEvent, ChargeId, ChargeRequest, ChargeStatus, EventType, Merchant, MessageId,
};
use crate::problem::{Problem, ProblemKind};
use crate::queue;
use crate::store::{
    Claim, KeyRecord, KeyState, NewClaim, NewEvent, Orphan, Settlement, Store, StoreError,
};

/// What a client is told to wait after an unknown outcome. The lease is released
/// at once, so a retry may re-drive immediately; one second spares the acquirer
/// a hot loop while it is failing.
const UNKNOWN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The shortest `Retry-After` for an in-flight key: HTTP counts it in whole seconds.
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How an attempt that holds a record learns the acquirer's outcome.
#[derive(Debug, Clone, Copy)]
enum Approach {
    /// POST the capture: a live attempt, the client wants the charge.
    Capture,
    /// Look the reference up, and POST only where the acquirer has no outcome.
    LookupFirst,
}

/// The first outcome of a key: status and the exact body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Bytes,
}

/// What the engine decided for one attempt.
#[derive(Debug)]
pub enum Outcome {
    /// A final outcome: fresh from this attempt, or the stored one replayed.
    Completed {
        charge_id: ChargeId,
        response: StoredResponse,
        replayed: bool,
    },
    /// Another attempt holds the key; ask again after `retry_after`.
    InFlight {
        charge_id: ChargeId,
        retry_after: Duration,
    },
    /// The key was first used for a different request.
    Mismatch { fields: Vec<&'static str> },
    /// The acquirer gave no definite answer; the charge stays `processing` and
    /// the next attempt (or the reconciler) re-drives it with the same reference.
    Unknown {
        charge_id: ChargeId,
        retry_after: Duration,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How long claims live.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// How long a claim's holder may work before another attempt may take over.
    /// Must exceed the acquirer timeout, or live attempts get taken over.
    pub lease: Duration,
    /// How long a completed outcome is honoured after it is stored.
    pub key_ttl: Duration,
}

/// The idempotency engine for charges. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    store: Store,
    acquirer: AcquirerClient,
    config: EngineConfig,
    /// Keys this instance saw held by another attempt, answered from memory.
    in_flight: InFlightMemo,
}

impl Engine {
    pub fn new(store: Store, acquirer: AcquirerClient, config: EngineConfig) -> Self {
        Self {
            store,
            acquirer,
            config,
            in_flight: InFlightMemo::default(),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs one attempt of one intent to completion.
    ///
    /// Callers should not cancel this future between claim and finalize (the HTTP
    /// layer runs it on its own task): a cancelled attempt is safe, but its key
    /// answers `409` until the lease runs out.
    pub async fn submit(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<Outcome, EngineError> {
        let fingerprint = Fingerprint::of_charge(request);
        if let Some(held) = self.in_flight.get(merchant.id, key) {
            return Ok(waiting_or_mismatch(
                &held.fingerprint,
                &held.request,
                held.charge_id,
                held.lease_ends
                    .saturating_duration_since(std::time::Instant::now()),
                fingerprint,
                request,
            ));
        }
        let claim = self
            .store
            .claim(&NewClaim {
                merchant_id: merchant.id,
                key,
                fingerprint,
                request,
                lease: self.config.lease,
                key_ttl: self.config.key_ttl,
            })
            .await?;
        let record = match claim {
            Claim::Won(record) => {
                crash::point(CrashPoint::AfterClaim);
                return self.drive(merchant, key, record, Approach::Capture).await;
            }
            Claim::Lost(record) => record,
        };
        if record.fingerprint != fingerprint {
            return Ok(Outcome::Mismatch {
                fields: record.charge.request().differing_fields(request),
            });
        }
        if let KeyState::InFlight { lease_remaining } = &record.state {
            self.in_flight.hold(
                merchant.id,
                key,
                record.fingerprint,
                record.charge.request(),
                record.charge.id.clone(),
                *lease_remaining,
            );
        }
        match &record.state {
            KeyState::InFlight { lease_remaining } if lease_remaining.is_zero() => {
                match self
                    .store
                    .take_over(merchant.id, key, record.attempt, self.config.lease)
                    .await?
                {
                    Some(taken) => {
                        tracing::info!(charge_id = %taken.charge.id, attempt = taken.attempt,
                            "took over an expired lease; re-driving with the same reference");
                        self.drive(merchant, key, taken, Approach::Capture).await
                    }
                    None => self.current(merchant, key).await,
                }
            }
            _ => Ok(settled_or_waiting(record)),
        }
    }

    /// Settles a charge whose attempt died or gave up (the reconciler's job):
    /// takes its record over if `orphan.attempt` still holds it, asks the
    /// acquirer for the reference's outcome, and captures with the same
    /// reference only where the acquirer has none. `None`: another attempt
    /// took it first.
    pub async fn settle_orphan(&self, orphan: &Orphan) -> Result<Option<Outcome>, EngineError> {
        let Some(record) = self
            .store
            .take_over(
                orphan.merchant.id,
                &orphan.key,
                orphan.attempt,
                self.config.lease,
            )
            .await?
        else {
            return Ok(None);
        };
        let outcome = self
            .drive(&orphan.merchant, &orphan.key, record, Approach::LookupFirst)
            .await?;
        Ok(Some(outcome))
    }

    /// Learns the acquirer's outcome for a record this attempt holds, then stores it.
    async fn drive(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: KeyRecord,
        approach: Approach,
    ) -> Result<Outcome, EngineError> {
        let charge = &record.charge;
        let request = CaptureRequest {
            reference: charge.acquirer_reference.as_str().to_owned(),
            merchant: merchant.name.clone(),
            order_id: charge.order_id.get(),
            amount_cents: charge.amount_cents.get(),
            currency: charge.currency.as_str().to_owned(),
        };
        let called = std::time::Instant::now();
        let known = match approach {
            Approach::Capture => None,
            Approach::LookupFirst => match self.acquirer.lookup(&request.reference).await {
                Ok(found) => found,
                Err(e) => Some(Err(e)),
            },
        };
        let result = match known {
            Some(settled) => settled,
            None => self.acquirer.capture(&request).await,
        };
        crash::point(CrashPoint::AfterAcquirer);
        metrics::histogram!(crate::metrics::ACQUIRER_SECONDS)
            .record(called.elapsed().as_secs_f64());
        let label = match &result {
            Ok(_) => "captured",
            Err(AcquirerError::Declined(_)) => "declined",
            Err(AcquirerError::Rejected { .. }) => "rejected",
            Err(AcquirerError::Unknown(_)) => "unknown",
        };
        metrics::counter!(crate::metrics::ACQUIRER_CALLS, "outcome" => label).increment(1);
        let (status, capture_id, decline_reason) = match result {
            Ok(captured) => (ChargeStatus::Captured, Some(captured.capture_id), None),
            Err(AcquirerError::Declined(d)) => (ChargeStatus::Declined, None, Some(d.reason)),
            Err(AcquirerError::Rejected { status }) => {
                tracing::error!(charge_id = %charge.id, status, "acquirer rejected the capture");
                (ChargeStatus::Failed, None, None)
            }
            Err(AcquirerError::Unknown(why)) => {
                tracing::warn!(charge_id = %charge.id, %why, "acquirer outcome unknown");
                self.store.release(merchant.id, key, record.attempt).await?;
                // The next duplicate here must re-drive at once, not hear 409.
                self.in_flight.forget(merchant.id, key);
                return Ok(Outcome::Unknown {
                    charge_id: charge.id.clone(),
                    retry_after: UNKNOWN_RETRY_AFTER,
                });
            }
        };
        let settled = Charge {
            status,
            decline_reason: decline_reason.clone(),
            ..charge.clone()
        };
        let response = final_response(&settled);
        let event = EventType::of(status).map(|event_type| {
            let message_id = MessageId::event();
            let body =
                ChargeEvent::new(&message_id, event_type, &merchant.name, &settled).to_bytes();
            NewEvent {
                message_id,
                exchange: queue::EVENTS_EXCHANGE,
                event_type: event_type.as_str(),
                tenant: &merchant.name,
                body: body.into(),
            }
        });
        let stored = crash::around_finalize(self.store.finalize(
            merchant.id,
            key,
            &record,
            &Settlement {
                status,
                capture_id: capture_id.as_deref(),
                decline_reason: decline_reason.as_deref(),
                response: &response,
                event: event.as_ref(),
            },
            self.config.key_ttl,
        ))
        .await?;
        if stored {
            self.in_flight.forget(merchant.id, key);
            return Ok(Outcome::Completed {
                charge_id: settled.id,
                response,
                replayed: false,
            });
        }
        // Fenced out: our lease ran out and another attempt took over. Its answer
        // (from the same acquirer outcome, by reference) is the one that counts.
        tracing::warn!(charge_id = %settled.id, attempt = record.attempt,
            "lost the lease before finalizing; answering with the current holder's outcome");
        self.current(merchant, key).await
    }

    /// The key's record as it is now, without taking anything over.
    async fn current(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
    ) -> Result<Outcome, EngineError> {
        match self.store.key_record(merchant.id, key).await? {
            Some(record) => Ok(settled_or_waiting(record)),
            None => Err(StoreError::Corrupt(format!("key {key} vanished while in use")).into()),
        }
    }
}

impl Outcome {
    /// The outcome's name in metrics: `captured`, `declined`, `failed`,
    /// `replayed`, `in_flight`, `key_reused`, `unknown`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Completed { replayed: true, .. } => "replayed",
            Self::Completed { response, .. } => match response.status {
                201 => "captured",
                402 => "declined",
                _ => "failed",
            },
            Self::InFlight { .. } => "in_flight",
            Self::Mismatch { .. } => "key_reused",
            Self::Unknown { .. } => "unknown",
        }
    }
}

/// The answer for a key known to be in flight: `409`, or `422` if this
/// request is not the one that holds it.
fn waiting_or_mismatch(
    held_fingerprint: &Fingerprint,
    held_request: &ChargeRequest,
    charge_id: ChargeId,
    lease_remaining: Duration,
    fingerprint: Fingerprint,
    request: &ChargeRequest,
) -> Outcome {
    if *held_fingerprint != fingerprint {
        return Outcome::Mismatch {
            fields: held_request.differing_fields(request),
        };
    }
    Outcome::InFlight {
        charge_id,
        retry_after: lease_remaining.max(MIN_RETRY_AFTER),
    }
}

fn settled_or_waiting(record: KeyRecord) -> Outcome {
    match record.state {
        KeyState::Completed(response) => Outcome::Completed {
            charge_id: record.charge.id,
            response,
            replayed: true,
        },
        KeyState::InFlight { lease_remaining } => Outcome::InFlight {
            charge_id: record.charge.id,
            retry_after: lease_remaining.max(MIN_RETRY_AFTER),
        },
    }
}

/// The answer stored for a final outcome: what the API says, and what every
/// replay repeats byte for byte.
pub fn final_response(charge: &Charge) -> StoredResponse {
    let (status, body) = match charge.status {
        ChargeStatus::Captured => (201, serde_json::to_vec(charge).unwrap_or_default()),
        ChargeStatus::Declined => {
            let reason = charge.decline_reason.as_deref().unwrap_or("unspecified");
            let mut p = Problem::new(
                ProblemKind::Declined,
                format!("The acquirer declined the charge: {reason}. Use a new Idempotency-Key for a new attempt."),
            );
            p.charge = Some(charge);
            (p.status, p.to_bytes())
        }
        ChargeStatus::Failed | ChargeStatus::Processing => {
            let mut p = Problem::new(
                ProblemKind::AcquirerRejected,
                "The acquirer rejected the capture request; no money moved.",
            );
            p.charge = Some(charge);
            (p.status, p.to_bytes())
        }
    };
    StoredResponse {
        status,
        body: body.into(),
    }
}
