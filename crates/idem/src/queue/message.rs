//! What idem publishes (a result, an event) as the client library takes it,
//! whoever publishes it: the relay, for an outbox row, or the consumer, for
//! a result it publishes itself right after the outcome is stored.
//!
//! One mapping from a message to AMQP, so a result reads the same whichever
//! way it went out. A message the broker can never take (an AMQP short string
//! over 255 bytes) is refused here, with the reason, before anything is sent:
//! lapin's `ShortString::from` would panic on one, so only
//! `ShortString::try_new` is used.

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, PublisherConfirm};

use super::command::TENANT_HEADER;
use super::PERSISTENT;
use idem_core::problem;
use idem_core::store::OutboxMessage;

/// A message for the broker, borrowed from where it is kept.
pub(super) struct Message<'a> {
    pub(super) message_id: &'a str,
    pub(super) exchange: &'a str,
    pub(super) routing_key: &'a str,
    pub(super) tenant: &'a str,
    /// Events only.
    pub(super) event_type: Option<&'a str>,
    pub(super) correlation_id: Option<&'a str>,
    /// Results only: the command's key, its answer's status, and whether the
    /// answer was stored by an earlier attempt.
    pub(super) result: Option<ResultHeaders<'a>>,
    /// The W3C `traceparent` of the work that produced it (tracing on).
    pub(super) traceparent: Option<&'a str>,
    pub(super) body: &'a [u8],
}

#[derive(Clone, Copy)]
pub(super) struct ResultHeaders<'a> {
    pub(super) idempotency_key: Option<&'a str>,
    pub(super) status: i16,
    pub(super) replayed: bool,
}

impl<'a> From<&'a OutboxMessage> for Message<'a> {
    fn from(m: &'a OutboxMessage) -> Self {
        Self {
            message_id: &m.message_id,
            exchange: &m.exchange,
            routing_key: &m.routing_key,
            tenant: &m.tenant,
            event_type: m.event_type.as_deref(),
            correlation_id: m.correlation_id.as_deref(),
            result: m.status.map(|status| ResultHeaders {
                idempotency_key: m.idempotency_key.as_deref(),
                status,
                replayed: m.replayed.unwrap_or(false),
            }),
            traceparent: m.traceparent.as_deref(),
            body: &m.body,
        }
    }
}

/// A message as the client library will take it.
pub(super) struct Outgoing<'a> {
    exchange: ShortString,
    routing_key: ShortString,
    body: &'a [u8],
    properties: BasicProperties,
}

impl<'a> Outgoing<'a> {
    /// The message ready to publish, or why it never can be.
    pub(super) fn prepare(message: &Message<'a>) -> Result<Self, String> {
        Ok(Self {
            exchange: short("exchange", message.exchange)?,
            routing_key: short("routing key", message.routing_key)?,
            body: message.body,
            properties: properties(message)?,
        })
    }

    /// Publishes it on `channel` (in confirm mode); the confirm to await.
    pub(super) async fn publish(self, channel: &Channel) -> lapin::Result<PublisherConfirm> {
        channel
            .basic_publish(
                self.exchange,
                self.routing_key,
                BasicPublishOptions::default(),
                self.body,
                self.properties,
            )
            .await
    }
}

/// `value` as an AMQP short string, or the reason it cannot be one.
fn short(what: &str, value: &str) -> Result<ShortString, String> {
    ShortString::try_new(value).map_err(|_| {
        format!(
            "the {what} is {} bytes, over AMQP's 255-byte limit for a short string: {:?}...",
            value.len(),
            value.chars().take(32).collect::<String>()
        )
    })
}

/// A message's AMQP properties: persistent, its unique id, and what the
/// contract puts in the headers of an event or a result; or why they cannot
/// be sent.
fn properties(message: &Message<'_>) -> Result<BasicProperties, String> {
    let mut headers = FieldTable::default();
    headers.insert(
        TENANT_HEADER.into(),
        AMQPValue::LongString(message.tenant.into()),
    );
    let mut p = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_timestamp(unix_now())
        .with_message_id(short("message_id", message.message_id)?);
    if let Some(event_type) = message.event_type {
        p = p.with_type(short("type", event_type)?);
    }
    if let Some(correlation_id) = message.correlation_id {
        p = p.with_correlation_id(short("correlation_id", correlation_id)?);
    }
    let content_type = if let Some(result) = message.result {
        headers.insert("status".into(), AMQPValue::ShortInt(result.status));
        if let Some(key) = result.idempotency_key {
            headers.insert("idempotency-key".into(), AMQPValue::LongString(key.into()));
        }
        headers.insert(
            "idempotent-replayed".into(),
            AMQPValue::Boolean(result.replayed),
        );
        problem::media_type_of(u16::try_from(result.status).unwrap_or_default())
    } else {
        problem::JSON
    };
    if let Some(traceparent) = message.traceparent {
        headers.insert(
            idem_core::trace::TRACEPARENT.into(),
            AMQPValue::LongString(traceparent.into()),
        );
    }
    Ok(p.with_content_type(content_type.into())
        .with_headers(headers))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A delivery's AMQP headers as a carrier of trace context: a command's
/// `traceparent` and `tracestate`, as long or short strings.
pub(super) struct HeaderCarrier<'a>(pub(super) Option<&'a FieldTable>);

impl opentelemetry::propagation::Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0?.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .map(|t| t.inner().keys().map(|k| k.as_str()).collect())
            .unwrap_or_default()
    }
}
