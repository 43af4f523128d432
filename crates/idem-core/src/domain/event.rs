//! Events: what subscribers of `idem.events` learn when a charge reaches a
//! final outcome, however it arrived (HTTP or queue), and when a refund is
//! paid back.

use chrono::{SecondsFormat, Utc};
use serde::Serialize;

use super::{Charge, ChargeStatus, MessageId, Refund, Step, StepKind};

/// The topic exchange every charge event is published on, with its type as the
/// routing key (docs/contract/queue.md). The outbox writes it with each event,
/// so the engine that produces events names no exchange.
pub const EVENTS_EXCHANGE: &str = "idem.events";

/// The types of charge event, also their routing keys on [`EVENTS_EXCHANGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Captured,
    Declined,
    /// A refund the acquirer paid back.
    Refunded,
    /// A charge only authorized (`"capture": false`): its amount is held.
    Authorized,
    /// A capture of an authorized charge, made.
    CaptureSucceeded,
    /// A void of an authorized charge, made.
    VoidSucceeded,
}

impl EventType {
    /// The event a final status produces. `failed` (the acquirer refused the
    /// request itself) and `processing` produce none: the contract names only
    /// these two.
    pub fn of(status: ChargeStatus) -> Option<Self> {
        match status {
            ChargeStatus::Captured => Some(Self::Captured),
            ChargeStatus::Declined => Some(Self::Declined),
            ChargeStatus::Authorized => Some(Self::Authorized),
            ChargeStatus::Processing | ChargeStatus::Failed | ChargeStatus::Voided => None,
        }
    }

    /// The event a step made produces.
    pub fn of_step(kind: StepKind) -> Self {
        match kind {
            StepKind::Capture => Self::CaptureSucceeded,
            StepKind::Void => Self::VoidSucceeded,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Captured => "charge.captured",
            Self::Declined => "charge.declined",
            Self::Refunded => "refund.succeeded",
            Self::Authorized => "charge.authorized",
            Self::CaptureSucceeded => "capture.succeeded",
            Self::VoidSucceeded => "void.succeeded",
        }
    }
}

/// One event's body, as published.
#[derive(Debug, Serialize)]
pub struct ChargeEvent<'a> {
    /// The event's unique id, also its AMQP `message_id`.
    pub id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'static str,
    /// The merchant's name.
    pub merchant: &'a str,
    /// When the outcome was decided (RFC 3339, UTC).
    pub occurred_at: String,
    /// The charge (`charge.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge: Option<&'a Charge>,
    /// The refund (`refund.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund: Option<&'a Refund>,
    /// The capture (`capture.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture: Option<&'a Step>,
    /// The void (`void.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub void: Option<&'a Step>,
}

impl<'a> ChargeEvent<'a> {
    pub fn new(
        id: &'a MessageId,
        event_type: EventType,
        merchant: &'a str,
        charge: &'a Charge,
    ) -> Self {
        Self {
            id: id.as_str(),
            event_type: event_type.as_str(),
            merchant,
            occurred_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            charge: Some(charge),
            refund: None,
            capture: None,
            void: None,
        }
    }

    /// A refund's event.
    pub fn of_refund(id: &'a MessageId, merchant: &'a str, refund: &'a Refund) -> Self {
        Self {
            id: id.as_str(),
            event_type: EventType::Refunded.as_str(),
            merchant,
            occurred_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            charge: None,
            refund: Some(refund),
            capture: None,
            void: None,
        }
    }

    /// A step's event (`capture.succeeded`, `void.succeeded`).
    pub fn of_step(id: &'a MessageId, merchant: &'a str, step: &'a Step) -> Self {
        let kind = step.kind();
        Self {
            id: id.as_str(),
            event_type: EventType::of_step(kind).as_str(),
            merchant,
            occurred_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            charge: None,
            refund: None,
            capture: (kind == StepKind::Capture).then_some(step),
            void: (kind == StepKind::Void).then_some(step),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        super::to_json(self)
    }
}
