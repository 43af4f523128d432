//! The refund as an [`Operation`]: money back from a captured charge, once
//! per key, the sum of a charge's refunds never above its capture (the
//! store's claim reserves the amount before the acquirer is called).

use super::memo::InFlightMemo;
use super::operation::Operable;
use super::operation::{ClaimArgs, Claimed, Final, Finalize, Operation, Said};
use super::Engine;
use crate::acquirer::protocol::RefundRequest as AcquirerRefund;
use crate::acquirer::{Acquirer, AcquirerError};
use crate::crash;
use crate::domain::{
    AcquirerReference, ChargeEvent, EventType, Fingerprint, IdempotencyKey, Merchant, MessageId,
    Refund, RefundIntent, RefundStatus, StoredResponse, SubjectId, WebhookBody, WebhookEvent,
};
use crate::problem::{Problem, ProblemKind};
use crate::store::{
    NewEvent, NewRefundClaim, NewWebhook, RefundClaim, RefundRecord, RefundSettlement, Refusal,
    Reschedule, Store, StoreError, Taken,
};

impl Operation for RefundIntent {
    type Subject = Refund;

    const ACQUIRER_PATH: &'static str = "/v1/refunds";
    const KIND: &'static str = "refund";

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_refund(&self.charge_id, &self.request)
    }

    fn request_of(refund: &Refund) -> Self {
        RefundIntent::of(refund)
    }

    fn differing_fields(&self, held: &Self) -> Vec<&'static str> {
        let fields = held.differing_fields(self);
        if fields.is_empty() {
            // The held intent named no amount (what remained), which the
            // refund's reserved amount cannot tell apart from this one's.
            return vec!["amount_cents"];
        }
        fields
    }

    fn id(refund: &Refund) -> SubjectId {
        SubjectId::Refund(refund.id.clone())
    }

    fn reference(refund: &Refund) -> &AcquirerReference {
        &refund.acquirer_reference
    }

    fn memo(engine: &Engine) -> &InFlightMemo<Self> {
        &engine.refunds_in_flight
    }

    async fn claim(&self, store: &Store, a: ClaimArgs<'_>) -> Result<Claimed<Refund>, StoreError> {
        let claim = store
            .claim_refund(&NewRefundClaim {
                merchant_id: a.merchant_id,
                key: a.key,
                fingerprint: a.fingerprint,
                charge_id: &self.charge_id,
                request: &self.request,
                lease: a.lease,
                key_ttl: a.key_ttl,
                traceparent: a.traceparent,
            })
            .await?;
        Ok(match claim {
            RefundClaim::Won(record) => Claimed::Won(*record),
            RefundClaim::Lost(taken) => match *taken {
                Taken::Refund(record) => Claimed::Lost(record),
                Taken::Charge(record) => Claimed::Other(SubjectId::Charge(record.subject.id)),
                Taken::Step(record) => Claimed::Other(SubjectId::Step(record.subject.id)),
            },
            RefundClaim::Refused(refusal) => Claimed::Refused(refusal),
            RefundClaim::Expired(id) => Claimed::Expired(id.into()),
        })
    }

    async fn record(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> Result<Option<RefundRecord>, StoreError> {
        store.refund_record(merchant_id, key).await
    }

    async fn take_over(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> Result<Option<RefundRecord>, StoreError> {
        store
            .take_over_refund(merchant_id, key, attempt, lease)
            .await
    }

    async fn release(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> Result<(), StoreError> {
        store
            .release_refund(merchant_id, key, attempt, reschedule)
            .await
    }

    async fn mark_for_review(
        store: &Store,
        merchant: &Merchant,
        refund: &Refund,
        reason: &str,
    ) -> Result<(), StoreError> {
        let webhook = new_webhook(WebhookEvent::RefundReviewRequired, merchant, refund);
        store
            .mark_refund_for_review(merchant.id, &refund.id, reason, &webhook)
            .await
    }

    async fn finalize(store: &Store, f: Finalize<'_, Refund>) -> Result<bool, StoreError> {
        let (acquirer_refund_id, failure_reason) = match f.outcome {
            Final::Done { acquirer_id } => (acquirer_id.as_deref(), None),
            Final::Declined { .. } | Final::Refused { .. } => {
                (None, f.settled.failure_reason.as_deref())
            }
        };
        let succeeded = f.settled.status == RefundStatus::Succeeded;
        let event = succeeded.then(|| {
            let message_id = MessageId::event();
            let body = ChargeEvent::of_refund(&message_id, &f.merchant.name, f.settled).to_bytes();
            NewEvent {
                message_id,
                event_type: EventType::Refunded.as_str(),
                tenant: &f.merchant.name,
                body: body.into(),
            }
        });
        // A person's decision is `refund.resolved`; the acquirer's, its outcome.
        let webhook_event = if f.audit.is_some() {
            WebhookEvent::RefundResolved
        } else if succeeded {
            WebhookEvent::RefundSucceeded
        } else {
            WebhookEvent::RefundFailed
        };
        let webhook = new_webhook(webhook_event, f.merchant, f.settled);
        crash::around_finalize(store.finalize_refund(
            f.merchant.id,
            f.key,
            f.record,
            &RefundSettlement {
                status: f.settled.status,
                acquirer_refund_id,
                failure_reason,
                response: f.response,
                event: event.as_ref(),
                webhook: Some(&webhook),
                audit: f.audit,
            },
            f.key_ttl,
        ))
        .await
    }

    async fn call(acquirer: &dyn Acquirer, merchant: &Merchant, refund: &Refund) -> Said {
        acquirer
            .refund(&acquirer_refund(merchant, refund))
            .await
            .map(|refunded| refunded.refund_id)
    }

    async fn look_up(
        acquirer: &dyn Acquirer,
        merchant: &Merchant,
        refund: &Refund,
    ) -> Result<Option<Said>, AcquirerError> {
        let found = acquirer
            .lookup_refund(&acquirer_refund(merchant, refund))
            .await?;
        Ok(found.map(|settled| settled.map(|refunded| refunded.refund_id)))
    }

    async fn operable(store: &Store, id: &str) -> Result<Option<Operable>, StoreError> {
        Ok(store.refund_detail(id).await?.map(|r| Operable {
            merchant: Merchant {
                id: r.merchant_id,
                name: r.merchant.clone(),
            },
            pending: r.status == RefundStatus::Pending.as_str(),
            awaiting_review: r.awaiting_review(),
            status: r.status,
            key: r.key,
        }))
    }

    fn status(refund: &Refund) -> &'static str {
        refund.status.as_str()
    }

    fn settled(refund: &Refund, outcome: &Final) -> Refund {
        let (status, failure_reason) = match outcome {
            Final::Done { .. } => (RefundStatus::Succeeded, None),
            Final::Declined { reason } => (RefundStatus::Failed, Some(reason.clone())),
            Final::Refused { reason } => (
                RefundStatus::Failed,
                Some(reason.clone().unwrap_or_else(|| "refused".to_owned())),
            ),
        };
        Refund {
            status,
            failure_reason,
            ..refund.clone()
        }
    }

    fn response(refund: &Refund) -> StoredResponse {
        let (status, body) = match refund.status {
            RefundStatus::Succeeded => (201, crate::domain::to_json(refund)),
            RefundStatus::Failed | RefundStatus::Pending => {
                let reason = refund.failure_reason.as_deref().unwrap_or("unspecified");
                let mut p = Problem::new(
                    ProblemKind::RefundFailed,
                    format!(
                        "The acquirer refused the refund: {reason}. No money moved, and its \
                         amount is the charge's to refund again, with a new Idempotency-Key."
                    ),
                );
                p.refund = Some(refund);
                (p.status, p.to_bytes())
            }
        };
        StoredResponse {
            status,
            body: body.into(),
        }
    }
}

/// The kind of problem an operation the charge cannot take (a refund, a
/// capture, a void) is.
pub fn refusal_kind(refusal: &Refusal) -> ProblemKind {
    match refusal {
        Refusal::NoSuchCharge => ProblemKind::NotFound,
        Refusal::NotRefundable { .. } => ProblemKind::ChargeNotRefundable,
        Refusal::Exceeds { .. } => ProblemKind::RefundExceedsCaptured,
        Refusal::NotAuthorized { .. } => ProblemKind::ChargeNotAuthorized,
        Refusal::AuthorizationClosed => ProblemKind::AuthorizationClosed,
        Refusal::CapturePending => ProblemKind::CapturePending,
        Refusal::ExceedsAuthorization { .. } => ProblemKind::CaptureExceedsAuthorization,
    }
}

/// The answer to an operation the charge cannot take (nothing stored, the
/// key free), over HTTP and in a queue command's result alike.
pub fn refusal_response(refusal: &Refusal) -> StoredResponse {
    let detail = match refusal {
        Refusal::NoSuchCharge => "no such charge".to_owned(),
        Refusal::NotRefundable {
            under_review: true, ..
        } => "the charge awaits a person's review; it can be refunded once it is resolved as \
              captured. Nothing was stored; the Idempotency-Key is still free"
            .to_owned(),
        Refusal::NotRefundable { status, .. } => format!(
            "the charge is {}, and only a captured charge can be refunded. Nothing was stored; \
             the Idempotency-Key is still free",
            status.as_str()
        ),
        Refusal::Exceeds { remaining: 0 } => "the charge has nothing left to refund (refunds \
            succeeded or pending take all of it). Nothing was stored; the Idempotency-Key is \
            still free"
            .to_owned(),
        Refusal::Exceeds { remaining } => format!(
            "the refund is more than the charge has left to refund, {remaining} cents \
             (remaining_cents). Nothing was stored; the Idempotency-Key is still free"
        ),
        Refusal::NotAuthorized {
            under_review: true, ..
        } => "the charge awaits a person's review; nothing can be captured or voided until it \
              is resolved. Nothing was stored; the Idempotency-Key is still free"
            .to_owned(),
        Refusal::NotAuthorized { status, .. } => format!(
            "the charge is {}, and only an authorized charge (made with \"capture\": false) \
             can be captured or voided. Nothing was stored; the Idempotency-Key is still free",
            status.as_str()
        ),
        Refusal::AuthorizationClosed => "a final capture or a void of this authorization is \
            pending at the acquirer; once it settles, the charge says what remains. Nothing was \
            stored; the Idempotency-Key is still free"
            .to_owned(),
        Refusal::CapturePending => "captures of this authorization are pending at the \
            acquirer, and a void would release what they are taking; void once they settle. \
            Nothing was stored; the Idempotency-Key is still free"
            .to_owned(),
        Refusal::ExceedsAuthorization { remaining: 0 } => "the authorization has nothing left \
            to capture (captures made or pending take all of it). Nothing was stored; the \
            Idempotency-Key is still free"
            .to_owned(),
        Refusal::ExceedsAuthorization { remaining } => format!(
            "the capture is more than the authorization has left, {remaining} cents \
             (remaining_cents). Nothing was stored; the Idempotency-Key is still free"
        ),
    };
    let mut p = Problem::new(refusal_kind(refusal), detail);
    if let Refusal::Exceeds { remaining } | Refusal::ExceedsAuthorization { remaining } = refusal {
        p.remaining_cents = Some(*remaining);
    }
    StoredResponse {
        status: p.status,
        body: p.to_bytes().into(),
    }
}

/// The webhook event `event` of `refund` (as it is after the decision).
fn new_webhook(event: WebhookEvent, merchant: &Merchant, refund: &Refund) -> NewWebhook {
    let event_id = MessageId::event();
    let body = WebhookBody::of_refund(&event_id, event, &merchant.name, refund).to_bytes();
    NewWebhook {
        event_id,
        event_type: event.as_str(),
        body: body.into(),
    }
}

/// What the acquirer is asked for a refund: its own reference, the capture
/// it gives back from, and the amount and currency its echo is checked against.
fn acquirer_refund(merchant: &Merchant, refund: &Refund) -> AcquirerRefund {
    AcquirerRefund {
        reference: refund.acquirer_reference.as_str().to_owned(),
        capture_reference: refund.capture_reference.as_str().to_owned(),
        merchant: merchant.name.clone(),
        amount_cents: refund.amount_cents.get(),
        currency: refund.currency.as_str().to_owned(),
    }
}
