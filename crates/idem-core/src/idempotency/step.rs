//! The steps of a two-step payment as [`Operation`]s: a capture of an
//! authorized charge ([`CaptureIntent`]) and a void of it ([`VoidIntent`]),
//! each once per key, the captures' sum never above the authorization and
//! nothing captured after a void (the store's claim reserves both against the
//! charge's row before the acquirer is called).
//!
//! The two differ only in their request, their claim's kind and the
//! acquirer's call; everything else a step does (its record, its outcome, its
//! answers, its webhooks) is written once below, over [`Step`].

use super::memo::InFlightMemo;
use super::operation::Operable;
use super::operation::{ClaimArgs, Claimed, Final, Finalize, Operation, Said};
use super::Engine;
use crate::acquirer::protocol::{AuthorizationCaptureRequest, VoidRequest};
use crate::acquirer::{Acquirer, AcquirerError};
use crate::crash;
use crate::domain::{
    AcquirerReference, CaptureIntent, CaptureRequest, ChargeEvent, EventType, Fingerprint,
    IdempotencyKey, Merchant, MessageId, Step, StepKind, StepStatus, StoredResponse, SubjectId,
    VoidIntent, WebhookBody, WebhookEvent,
};
use crate::problem::{Problem, ProblemKind};
use crate::store::{
    NewEvent, NewStepClaim, NewWebhook, Reschedule, StepClaim, StepRecord, StepSettlement, Store,
    StoreError, Taken,
};

/// What a capture and a void do alike, written once: their subject is a
/// [`Step`], and every store call and answer below is the step's.
macro_rules! step_operation {
    () => {
        type Subject = Step;

        fn id(step: &Step) -> SubjectId {
            SubjectId::Step(step.id.clone())
        }

        fn reference(step: &Step) -> &AcquirerReference {
            &step.acquirer_reference
        }

        async fn record(
            store: &Store,
            merchant_id: i64,
            key: &IdempotencyKey,
        ) -> Result<Option<StepRecord>, StoreError> {
            store.step_record(merchant_id, key).await
        }

        async fn take_over(
            store: &Store,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            lease: std::time::Duration,
        ) -> Result<Option<StepRecord>, StoreError> {
            store.take_over_step(merchant_id, key, attempt, lease).await
        }

        async fn release(
            store: &Store,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            reschedule: &Reschedule,
        ) -> Result<(), StoreError> {
            store
                .release_step(merchant_id, key, attempt, reschedule)
                .await
        }

        async fn mark_for_review(
            store: &Store,
            merchant: &Merchant,
            step: &Step,
            reason: &str,
        ) -> Result<(), StoreError> {
            mark_for_review(store, merchant, step, reason).await
        }

        async fn finalize(store: &Store, f: Finalize<'_, Step>) -> Result<bool, StoreError> {
            finalize(store, f).await
        }

        async fn operable(store: &Store, id: &str) -> Result<Option<Operable>, StoreError> {
            operable(store, id).await
        }

        fn status(step: &Step) -> &'static str {
            step.status.as_str()
        }

        fn settled(step: &Step, outcome: &Final) -> Step {
            settled(step, outcome)
        }

        fn response(step: &Step) -> StoredResponse {
            response(step)
        }
    };
}

impl Operation for CaptureIntent {
    step_operation!();

    const ACQUIRER_PATH: &'static str = "/v1/captures";
    const KIND: &'static str = "capture";

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_capture(&self.charge_id, &self.request)
    }

    fn request_of(step: &Step) -> Self {
        CaptureIntent {
            charge_id: step.charge_id.clone(),
            request: CaptureRequest {
                amount_cents: Some(step.amount_cents),
                final_capture: step.final_capture.unwrap_or(true),
            },
        }
    }

    fn differing_fields(&self, held: &Self) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.charge_id != held.charge_id {
            fields.push("charge_id");
        }
        if self.request.amount_cents != held.request.amount_cents {
            fields.push("amount_cents");
        }
        if self.request.final_capture != held.request.final_capture {
            fields.push("final");
        }
        if fields.is_empty() {
            // The held capture named no amount (what remained), which the
            // step's reserved amount cannot tell apart from this one's.
            fields.push("amount_cents");
        }
        fields
    }

    fn memo(engine: &Engine) -> &InFlightMemo<Self> {
        &engine.captures_in_flight
    }

    async fn claim(&self, store: &Store, a: ClaimArgs<'_>) -> Result<Claimed<Step>, StoreError> {
        claim(
            store,
            NewStepClaim {
                merchant_id: a.merchant_id,
                key: a.key,
                fingerprint: a.fingerprint,
                charge_id: &self.charge_id,
                kind: StepKind::Capture,
                amount: self.request.amount_cents,
                final_capture: self.request.final_capture,
                lease: a.lease,
                key_ttl: a.key_ttl,
                traceparent: a.traceparent,
            },
        )
        .await
    }

    async fn call(acquirer: &dyn Acquirer, merchant: &Merchant, step: &Step) -> Said {
        acquirer
            .capture_authorization(&capture_request(merchant, step))
            .await
            .map(|captured| captured.capture_id)
    }

    async fn look_up(
        acquirer: &dyn Acquirer,
        merchant: &Merchant,
        step: &Step,
    ) -> Result<Option<Said>, AcquirerError> {
        let found = acquirer
            .lookup_authorization_capture(&capture_request(merchant, step))
            .await?;
        Ok(found.map(|settled| settled.map(|captured| captured.capture_id)))
    }
}

impl Operation for VoidIntent {
    step_operation!();

    const ACQUIRER_PATH: &'static str = "/v1/voids";
    const KIND: &'static str = "void";

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_void(&self.charge_id)
    }

    fn request_of(step: &Step) -> Self {
        VoidIntent {
            charge_id: step.charge_id.clone(),
        }
    }

    fn differing_fields(&self, held: &Self) -> Vec<&'static str> {
        // A void's only parameter is its charge (in its path).
        let _ = held;
        vec!["charge_id"]
    }

    fn memo(engine: &Engine) -> &InFlightMemo<Self> {
        &engine.voids_in_flight
    }

    async fn claim(&self, store: &Store, a: ClaimArgs<'_>) -> Result<Claimed<Step>, StoreError> {
        claim(
            store,
            NewStepClaim {
                merchant_id: a.merchant_id,
                key: a.key,
                fingerprint: a.fingerprint,
                charge_id: &self.charge_id,
                kind: StepKind::Void,
                amount: None,
                final_capture: true,
                lease: a.lease,
                key_ttl: a.key_ttl,
                traceparent: a.traceparent,
            },
        )
        .await
    }

    async fn call(acquirer: &dyn Acquirer, merchant: &Merchant, step: &Step) -> Said {
        acquirer
            .void(&void_request(merchant, step))
            .await
            .map(|voided| voided.void_id)
    }

    async fn look_up(
        acquirer: &dyn Acquirer,
        merchant: &Merchant,
        step: &Step,
    ) -> Result<Option<Said>, AcquirerError> {
        let found = acquirer.lookup_void(&void_request(merchant, step)).await?;
        Ok(found.map(|settled| settled.map(|voided| voided.void_id)))
    }
}

async fn claim(store: &Store, new: NewStepClaim<'_>) -> Result<Claimed<Step>, StoreError> {
    Ok(match store.claim_step(&new).await? {
        StepClaim::Won(record) => Claimed::Won(*record),
        StepClaim::Lost(taken) => match *taken {
            Taken::Step(record) => Claimed::Lost(record),
            Taken::Charge(record) => Claimed::Other(SubjectId::Charge(record.subject.id)),
            Taken::Refund(record) => Claimed::Other(SubjectId::Refund(record.subject.id)),
        },
        StepClaim::Refused(refusal) => Claimed::Refused(refusal),
        StepClaim::Expired(id) => Claimed::Expired(id.into()),
    })
}

/// The step's webhook events: made, refused, awaiting review, resolved.
fn events(step: &Step) -> [WebhookEvent; 4] {
    WebhookEvent::of_step(step.kind())
}

async fn mark_for_review(
    store: &Store,
    merchant: &Merchant,
    step: &Step,
    reason: &str,
) -> Result<(), StoreError> {
    let [_, _, review_required, _] = events(step);
    let webhook = new_webhook(review_required, merchant, step);
    store
        .mark_step_for_review(merchant.id, &step.id, reason, &webhook)
        .await
}

async fn finalize(store: &Store, f: Finalize<'_, Step>) -> Result<bool, StoreError> {
    let (acquirer_id, failure_reason) = match f.outcome {
        Final::Done { acquirer_id } => (acquirer_id.as_deref(), None),
        Final::Declined { .. } | Final::Refused { .. } => {
            (None, f.settled.failure_reason.as_deref())
        }
    };
    let succeeded = f.settled.status == StepStatus::Succeeded;
    let event = succeeded.then(|| {
        let message_id = MessageId::event();
        let body = ChargeEvent::of_step(&message_id, &f.merchant.name, f.settled).to_bytes();
        NewEvent {
            message_id,
            event_type: EventType::of_step(f.settled.kind()).as_str(),
            tenant: &f.merchant.name,
            body: body.into(),
        }
    });
    // A person's decision is `*.resolved`; the acquirer's, its outcome.
    let [made, refused, _, resolved] = events(f.settled);
    let webhook_event = if f.audit.is_some() {
        resolved
    } else if succeeded {
        made
    } else {
        refused
    };
    let webhook = new_webhook(webhook_event, f.merchant, f.settled);
    crash::around_finalize(store.finalize_step(
        f.merchant.id,
        f.key,
        f.record,
        &StepSettlement {
            status: f.settled.status,
            acquirer_id,
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

async fn operable(store: &Store, id: &str) -> Result<Option<Operable>, StoreError> {
    Ok(store.step_detail(id).await?.map(|s| Operable {
        merchant: Merchant {
            id: s.merchant_id,
            name: s.merchant.clone(),
        },
        pending: s.status == StepStatus::Pending.as_str(),
        awaiting_review: s.awaiting_review(),
        status: s.status,
        key: s.key,
    }))
}

fn settled(step: &Step, outcome: &Final) -> Step {
    let (status, failure_reason) = match outcome {
        Final::Done { .. } => (StepStatus::Succeeded, None),
        Final::Declined { reason } => (StepStatus::Failed, Some(reason.clone())),
        Final::Refused { reason } => (
            StepStatus::Failed,
            Some(reason.clone().unwrap_or_else(|| "refused".to_owned())),
        ),
    };
    Step {
        status,
        failure_reason,
        ..step.clone()
    }
}

fn response(step: &Step) -> StoredResponse {
    let (status, body) = match step.status {
        StepStatus::Succeeded => (201, crate::domain::to_json(step)),
        StepStatus::Failed | StepStatus::Pending => {
            let reason = step.failure_reason.as_deref().unwrap_or("unspecified");
            let mut p = match step.kind() {
                StepKind::Capture => Problem::new(
                    ProblemKind::CaptureFailed,
                    format!(
                        "The acquirer refused the capture: {reason}. Nothing was captured, and \
                         its amount is the authorization's to capture again, with a new \
                         Idempotency-Key."
                    ),
                ),
                StepKind::Void => Problem::new(
                    ProblemKind::VoidFailed,
                    format!(
                        "The acquirer refused the void: {reason}. Nothing was released; the \
                         authorization is open again."
                    ),
                ),
            };
            match step.kind() {
                StepKind::Capture => p.capture = Some(step),
                StepKind::Void => p.void = Some(step),
            }
            (p.status, p.to_bytes())
        }
    };
    StoredResponse {
        status,
        body: body.into(),
    }
}

/// The webhook event `event` of `step` (as it is after the decision).
fn new_webhook(event: WebhookEvent, merchant: &Merchant, step: &Step) -> NewWebhook {
    let event_id = MessageId::event();
    let body = WebhookBody::of_step(&event_id, event, &merchant.name, step).to_bytes();
    NewWebhook {
        event_id,
        event_type: event.as_str(),
        body: body.into(),
    }
}

/// What the acquirer is asked for a capture: its own reference, the
/// authorization's, and the amount, currency and `final` its echo is checked
/// against.
fn capture_request(merchant: &Merchant, step: &Step) -> AuthorizationCaptureRequest {
    AuthorizationCaptureRequest {
        reference: step.acquirer_reference.as_str().to_owned(),
        authorization_reference: step.authorization_reference.as_str().to_owned(),
        merchant: merchant.name.clone(),
        amount_cents: step.amount_cents.get(),
        currency: step.currency.as_str().to_owned(),
        final_capture: step.final_capture.unwrap_or(true),
    }
}

fn void_request(merchant: &Merchant, step: &Step) -> VoidRequest {
    VoidRequest {
        reference: step.acquirer_reference.as_str().to_owned(),
        authorization_reference: step.authorization_reference.as_str().to_owned(),
        merchant: merchant.name.clone(),
    }
}
