//! Events: what subscribers of `idem.events` learn when a charge reaches a
//! final outcome, however it arrived (HTTP or queue), and when a refund is
//! paid back.

use chrono::{SecondsFormat, Utc};
use serde::Serialize;

use super::{Charge, ChargeStatus, MessageId, Refund};

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
}

impl EventType {
    /// The event a final status produces. `failed` (the acquirer refused the
    /// request itself) and `processing` produce none: the contract names only
    /// these two.
    pub fn of(status: ChargeStatus) -> Option<Self> {
        match status {
            ChargeStatus::Captured => Some(Self::Captured),
            ChargeStatus::Declined => Some(Self::Declined),
            ChargeStatus::Processing | ChargeStatus::Failed => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Captured => "charge.captured",
            Self::Declined => "charge.declined",
            Self::Refunded => "refund.succeeded",
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
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        super::to_json(self)
    }
}
