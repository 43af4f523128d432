//! The charge as an [`Operation`]: one capture per key, or, for a charge
//! made with `"capture": false`, one authorization (its captures and void
//! are operations of their own: [`super::step`]).

use super::memo::InFlightMemo;
use super::operation::Operable;
use super::operation::{ClaimArgs, Claimed, Final, Finalize, Operation, Said};
use super::Engine;
use crate::acquirer::protocol::{AuthorizationRequest, CaptureRequest};
use crate::acquirer::{Acquirer, AcquirerError};
use crate::crash;
use crate::domain::{
    AcquirerReference, Authorization, Charge, ChargeEvent, ChargeRequest, ChargeStatus, EventType,
    Fingerprint, IdempotencyKey, Merchant, MessageId, StoredResponse, SubjectId, WebhookBody,
    WebhookEvent,
};
use crate::problem::{Problem, ProblemKind};
use crate::store::{
    Claim, KeyRecord, NewClaim, NewEvent, NewWebhook, Reschedule, Settlement, Store, StoreError,
};

impl Operation for ChargeRequest {
    type Subject = Charge;

    const ACQUIRER_PATH: &'static str = "/v1/captures";
    const KIND: &'static str = "charge";

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_charge(self)
    }

    fn request_of(charge: &Charge) -> Self {
        charge.request()
    }

    fn differing_fields(&self, held: &Self) -> Vec<&'static str> {
        held.differing_fields(self)
    }

    fn id(charge: &Charge) -> SubjectId {
        SubjectId::Charge(charge.id.clone())
    }

    fn reference(charge: &Charge) -> &AcquirerReference {
        &charge.acquirer_reference
    }

    fn memo(engine: &Engine) -> &InFlightMemo<Self> {
        &engine.charges_in_flight
    }

    async fn claim(&self, store: &Store, a: ClaimArgs<'_>) -> Result<Claimed<Charge>, StoreError> {
        let claim = store
            .claim(&NewClaim {
                merchant_id: a.merchant_id,
                key: a.key,
                fingerprint: a.fingerprint,
                request: self,
                lease: a.lease,
                key_ttl: a.key_ttl,
                traceparent: a.traceparent,
            })
            .await?;
        Ok(match claim {
            Claim::Won(record) => Claimed::Won(record),
            Claim::Lost(record) => Claimed::Lost(record),
            Claim::Expired(id) => Claimed::Expired(id.into()),
            Claim::Other(subject) => Claimed::Other(subject),
        })
    }

    async fn record(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        store.key_record(merchant_id, key).await
    }

    async fn take_over(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> Result<Option<KeyRecord>, StoreError> {
        store.take_over(merchant_id, key, attempt, lease).await
    }

    async fn release(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        store.release(merchant_id, key, attempt, reschedule).await
    }

    async fn mark_for_review(
        store: &Store,
        merchant: &Merchant,
        charge: &Charge,
        reason: &str,
    ) -> Result<(), StoreError> {
        let webhook = new_webhook(WebhookEvent::ReviewRequired, merchant, charge);
        store.mark_for_review(&charge.id, reason, &webhook).await
    }

    async fn finalize(store: &Store, f: Finalize<'_, Charge>) -> Result<bool, StoreError> {
        let settled = f.settled;
        let event = EventType::of(settled.status).map(|event_type| {
            let message_id = MessageId::event();
            let body =
                ChargeEvent::new(&message_id, event_type, &f.merchant.name, settled).to_bytes();
            NewEvent {
                message_id,
                event_type: event_type.as_str(),
                tenant: &f.merchant.name,
                body: body.into(),
            }
        });
        // A person's decision is `charge.resolved`; the acquirer's, its outcome.
        let webhook_event = if f.audit.is_some() {
            Some(WebhookEvent::Resolved)
        } else {
            WebhookEvent::of_final(settled.status)
        };
        let webhook = webhook_event.map(|event| new_webhook(event, f.merchant, settled));
        let (capture_id, decline_reason) = match f.outcome {
            Final::Done { acquirer_id } => (acquirer_id.as_deref(), None),
            Final::Declined { reason } => (None, Some(reason.as_str())),
            Final::Refused { .. } => (None, None),
        };
        crash::around_finalize(store.finalize(
            f.merchant.id,
            f.key,
            f.record,
            &Settlement {
                status: settled.status,
                capture_id,
                decline_reason,
                response: f.response,
                event: event.as_ref(),
                webhook: webhook.as_ref(),
                audit: f.audit,
            },
            f.key_ttl,
        ))
        .await
    }

    async fn call(acquirer: &dyn Acquirer, merchant: &Merchant, charge: &Charge) -> Said {
        if charge.authorization.is_some() {
            return acquirer
                .authorize(&authorization_request(merchant, charge))
                .await
                .map(|authorized| authorized.authorization_id);
        }
        acquirer
            .capture(&capture_request(merchant, charge))
            .await
            .map(|captured| captured.capture_id)
    }

    async fn look_up(
        acquirer: &dyn Acquirer,
        merchant: &Merchant,
        charge: &Charge,
    ) -> Result<Option<Said>, AcquirerError> {
        if charge.authorization.is_some() {
            let found = acquirer
                .lookup_authorization(&authorization_request(merchant, charge))
                .await?;
            return Ok(found.map(|settled| settled.map(|a| a.authorization_id)));
        }
        let found = acquirer.lookup(&capture_request(merchant, charge)).await?;
        Ok(found.map(|settled| settled.map(|captured| captured.capture_id)))
    }

    async fn operable(store: &Store, id: &str) -> Result<Option<Operable>, StoreError> {
        Ok(store.charge_record(id).await?.map(|r| Operable {
            merchant: Merchant {
                id: r.charge.merchant_id,
                name: r.charge.merchant.clone(),
            },
            pending: r.charge.status == ChargeStatus::Processing.as_str(),
            awaiting_review: r.charge.awaiting_review(),
            status: r.charge.status,
            key: r.key,
        }))
    }

    fn status(charge: &Charge) -> &'static str {
        charge.status.as_str()
    }

    fn settled(charge: &Charge, outcome: &Final) -> Charge {
        let two_step = charge.authorization.is_some();
        let (status, decline_reason) = match outcome {
            Final::Done { .. } if two_step => (ChargeStatus::Authorized, None),
            Final::Done { .. } => (ChargeStatus::Captured, None),
            Final::Declined { reason } => (ChargeStatus::Declined, Some(reason.clone())),
            Final::Refused { .. } => (ChargeStatus::Failed, None),
        };
        Charge {
            status,
            decline_reason,
            // A new authorization holds all of its amount, capturable.
            authorization: match status {
                ChargeStatus::Authorized => Some(Authorization::new(charge.amount_cents)),
                _ => charge.authorization,
            },
            ..charge.clone()
        }
    }

    fn response(charge: &Charge) -> StoredResponse {
        final_response(charge)
    }
}

/// The webhook event `event` of `charge` (as it is after the decision), with
/// an id of its own: every endpoint's every attempt carries it.
pub(super) fn new_webhook(event: WebhookEvent, merchant: &Merchant, charge: &Charge) -> NewWebhook {
    let event_id = MessageId::event();
    let body = WebhookBody::new(&event_id, event, &merchant.name, charge).to_bytes();
    NewWebhook {
        event_id,
        event_type: event.as_str(),
        body: body.into(),
    }
}

/// What the acquirer is asked for a charge: its reference, and the order,
/// amount and currency a capture's echo is checked against.
fn capture_request(merchant: &Merchant, charge: &Charge) -> CaptureRequest {
    CaptureRequest {
        reference: charge.acquirer_reference.as_str().to_owned(),
        merchant: merchant.name.clone(),
        order_id: charge.order_id.get(),
        amount_cents: charge.amount_cents.get(),
        currency: charge.currency.as_str().to_owned(),
    }
}

/// What the acquirer is asked for a charge only authorized: its reference,
/// and what the echo is checked against, as a capture's.
fn authorization_request(merchant: &Merchant, charge: &Charge) -> AuthorizationRequest {
    AuthorizationRequest {
        reference: charge.acquirer_reference.as_str().to_owned(),
        merchant: merchant.name.clone(),
        order_id: charge.order_id.get(),
        amount_cents: charge.amount_cents.get(),
        currency: charge.currency.as_str().to_owned(),
    }
}

/// The answer stored for a charge's final outcome: what the API says, and
/// what every replay repeats byte for byte.
fn final_response(charge: &Charge) -> StoredResponse {
    let (status, body) = match charge.status {
        ChargeStatus::Captured | ChargeStatus::Authorized | ChargeStatus::Voided => {
            (201, crate::domain::to_json(charge))
        }
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
