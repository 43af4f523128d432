//! `idem consume`: the idempotent consumer of `idem.charges`.
//!
//! One delivery, in order:
//! 1. parse it ([`command::parse`]) and find its merchant; a message that can
//!    never succeed is dead-lettered with its reason and acked;
//! 2. run the engine, exactly as `POST /v1/charges` does (claim committed
//!    first, acquirer with no transaction open, fenced finalize that also
//!    writes the charge event to the outbox);
//! 3. make this delivery's result durable: a final answer is published at
//!    once and confirmed by the broker; a result that waits for the outcome
//!    (or that the broker did not confirm) is written to the outbox;
//! 4. ack.
//!
//! A crash anywhere before 4 leaves the message unacked, so the broker
//! delivers it again (to this consumer after a restart, or to another): the
//! engine then replays the stored outcome, or takes the in-flight record over
//! when its lease is over and re-drives it with the same acquirer reference,
//! so there is never a second capture. Each delivery gets its own result
//! (at-least-once out), the later ones marked `idempotent-replayed`.
//!
//! An unknown acquirer outcome, or an attempt still in flight elsewhere, is
//! not a final answer: the result is written as waiting for the key's outcome,
//! the message is acked (the command is durably accepted and nothing is
//! lost), and the relay publishes the result when the charge settles, by a
//! retry, another delivery or the reconciler.
//!
//! A store error decides what becomes of the command (see [`StoreError`]):
//! - transient (the database unreachable, a timeout, a deadlock): the command
//!   goes back to the queue after a pause that doubles (so a dead database
//!   does not make a hot loop), at most [`MAX_ATTEMPTS`] times in all; then it
//!   is dead-lettered as `retries-exhausted`;
//! - anything else (text the database refuses, a broken invariant): trying
//!   again would give the same answer, so it is dead-lettered at once as
//!   `store-refused`.
//!
//! Either way the command is never lost: it sits in the dead-letter queue with
//! its reason, and with `x-idem-charge-id` when its charge already exists
//! (captured, perhaps), so the charge can be found. Publishing it again as it
//! is, once the cause is fixed, is safe: same key, same intent.
//!
//! The attempts are counted by idem, in the header [`ATTEMPTS_HEADER`]: the
//! command is published again with the count (confirmed), then the delivery is
//! acked. A plain requeue would not do alone: `idem.charges` is a quorum
//! queue, which counts a message's failed deliveries (`x-delivery-count`,
//! RabbitMQ's "poison message handling"), but a republished copy starts
//! again at zero; the broker's count of this copy is added in.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, PublisherConfirm};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::command::{self, Command, Rejection, Request};
use super::message::{HeaderCarrier, Message, Outgoing, ResultHeaders};
use super::{
    connect, declare, reconnecting, Reconnect, ATTEMPTS_HEADER, CHARGE_ID_HEADER, COMMANDS_QUEUE,
    DEAD_LETTER_QUEUE, REASON_CODE_HEADER, REASON_HEADER, RESULTS_EXCHANGE,
};
use idem_core::domain::{Merchant, MessageId};
use idem_core::domain::{StoredResponse, SubjectId};
use idem_core::idempotency::{refusal_response, Engine, Outcome};
use idem_core::problem::Problem;
use idem_core::store::{KeyStatus, MerchantCache, NewResult, ResultAnswer, Store, StoreError};

/// How many attempts a command gets when each meets a transient store error
/// (the database unreachable, a timeout, a deadlock) before it is
/// dead-lettered as `retries-exhausted`. With the pauses between them
/// ([`RETRY_PAUSE`] doubling up to [`RETRY_PAUSE_CAP`]) 20 attempts span
/// about 7.5 minutes: longer than a database failover or restart takes, and
/// short enough that a command which fails the same way every time (an error
/// classified as transient that is not) leaves the queue in bounded time.
pub const MAX_ATTEMPTS: u32 = 20;
/// The pause after a command's first transient failure, doubled after each
/// next one: long enough that a dead database does not make a hot loop.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause: the delivery is held (a prefetch slot) while it waits,
/// and a recovered database should be noticed within half a minute.
const RETRY_PAUSE_CAP: Duration = Duration::from_secs(30);
/// How long a copy this consumer publishes itself (a dead letter, a command
/// to try again) may wait for the broker's confirm before the delivery is
/// settled the other way (rejected to the broker's own dead-lettering, or
/// requeued).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// The broker's count of a message's failed deliveries; quorum queues only.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub amqp_url: String,
    /// Unacked deliveries the broker may send ahead; also how many are worked at once.
    pub prefetch: u16,
}

/// The consumer. Cheap to clone; [`Consumer::run`] reconnects until shutdown.
#[derive(Clone)]
pub struct Consumer {
    /// The charge each command asks for.
    engine: Engine,
    /// Merchants, results, and what a dead letter names.
    store: Store,
    config: Arc<ConsumerConfig>,
    /// Wakes the relay in this process when a result is written.
    relay_wake: Arc<Notify>,
    /// Merchants by name (the `tenant` header).
    merchants: MerchantCache<String>,
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// Result written, message acked; the label of the engine's outcome.
    Done(&'static str),
    DeadLettered,
    /// Transient database trouble: back in the queue for a later attempt.
    Requeued,
}

impl Consumer {
    pub fn new(
        engine: Engine,
        store: Store,
        config: ConsumerConfig,
        relay_wake: Arc<Notify>,
    ) -> Self {
        Self {
            engine,
            store,
            config: Arc::new(config),
            relay_wake,
            merchants: MerchantCache::default(),
        }
    }

    /// Consumes until `shutdown`, reconnecting with backoff whenever the
    /// broker goes away. Deliveries being worked on when the connection drops
    /// finish their database work; their ack fails and the broker delivers
    /// them again, which the engine answers with a replay.
    pub async fn run(self, shutdown: CancellationToken) {
        if !super::events_on(&self.store, &shutdown).await {
            return;
        }
        let fresh = tokio::spawn(
            self.merchants
                .clone()
                .keep_fresh(self.store.clone(), shutdown.clone()),
        );
        let (this, stop) = (&self, &shutdown);
        reconnecting("consumer", stop, |mut reconnect| async move {
            let ended = this.session(stop, &mut reconnect).await;
            (reconnect, ended)
        })
        .await;
        let _ = fresh.await;
    }

    /// One connection's life: `Ok` on shutdown, `Err` when the broker is lost.
    async fn session(
        &self,
        shutdown: &CancellationToken,
        reconnect: &mut Reconnect,
    ) -> anyhow::Result<()> {
        let connection = connect(&self.config.amqp_url).await?;
        let channel = connection.create_channel().await?;
        declare(&channel).await?;
        channel
            .basic_qos(self.config.prefetch, BasicQosOptions::default())
            .await?;
        let dead_letters = connection.create_channel().await?;
        dead_letters
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let mut deliveries = channel
            .basic_consume(
                COMMANDS_QUEUE.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        reconnect.reset();
        tracing::info!(
            queue = COMMANDS_QUEUE,
            prefetch = self.config.prefetch,
            "consuming"
        );
        let tasks = TaskTracker::new();
        let ended = loop {
            tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        let this = self.clone();
                        let dead_letters = dead_letters.clone();
                        let shutdown = shutdown.clone();
                        tasks.spawn(async move { this.handle(delivery, &dead_letters, &shutdown).await });
                    }
                    Some(Err(e)) => break Err(e.into()),
                    None => break Err(anyhow::anyhow!("the broker cancelled the consumer")),
                },
            }
        };
        if ended.is_ok() {
            // Stop new deliveries; those prefetched but not started go back.
            let _ = channel
                .basic_cancel(deliveries.tag(), BasicCancelOptions::default())
                .await;
        }
        tasks.close();
        tasks.wait().await;
        let _ = connection.close(200, "consumer stopping".into()).await;
        ended
    }

    /// `confirmed` is a channel in confirm mode, for the copies this consumer
    /// publishes itself (dead letters, and commands to try again).
    async fn handle(&self, delivery: Delivery, confirmed: &Channel, shutdown: &CancellationToken) {
        let span = command_span(&delivery);
        let handled = self
            .handle_in(&delivery, confirmed, shutdown)
            .instrument(span)
            .await;
        let label = match handled {
            Handled::Done(label) => label,
            Handled::DeadLettered => "dead_lettered",
            Handled::Requeued => "requeued",
        };
        metrics::counter!(idem_core::metrics::QUEUE_COMMANDS, "result" => label).increment(1);
    }

    async fn handle_in(
        &self,
        delivery: &Delivery,
        confirmed: &Channel,
        shutdown: &CancellationToken,
    ) -> Handled {
        let command = match command::parse(&delivery.properties, &delivery.data) {
            Ok(c) => c,
            Err(rejection) => return dead_letter(delivery, confirmed, &rejection).await,
        };
        tracing::Span::current().record("idempotency_key", command.key.as_str());
        let store = &self.store;
        let merchant = match self
            .merchants
            .get_or_load(&command.tenant, || async {
                let found = store.merchant_by_name(&command.tenant).await?;
                Ok(found.map(|m| (m, None)))
            })
            .await
        {
            Ok(Some(m)) => m,
            Ok(None) => {
                let rejection = Rejection::new(
                    "unknown-tenant",
                    format!("no enabled merchant is named {:?}", command.tenant),
                );
                return dead_letter(delivery, confirmed, &rejection).await;
            }
            Err(e) => return store_failed(delivery, confirmed, &e, None, shutdown).await,
        };
        let submitted = match &command.request {
            Request::Charge(request) => self.engine.submit(&merchant, &command.key, request).await,
            Request::Refund(intent) => self.engine.submit(&merchant, &command.key, intent).await,
            Request::Capture(intent) => self.engine.submit(&merchant, &command.key, intent).await,
            Request::Void(intent) => self.engine.submit(&merchant, &command.key, intent).await,
        };
        let outcome = match submitted {
            Ok(o) => o,
            Err(idem_core::idempotency::EngineError::Store(e)) => {
                // The claim may have made a charge before the store failed
                // (a refused finalize, say): name it in the dead letter, if
                // the store still answers.
                let made = match self.store.key_status(merchant.id, &command.key).await {
                    Ok(Some(
                        KeyStatus::InFlight { subject, .. }
                        | KeyStatus::Completed { subject, .. }
                        | KeyStatus::Expired { subject, .. },
                    )) => Some(subject),
                    _ => None,
                };
                let charge = made.as_ref().map(|id| id.as_str());
                return store_failed(delivery, confirmed, &e, charge, shutdown).await;
            }
        };
        let label = outcome.label();
        if let Err(e) = self.answer(&merchant, &command, &outcome, confirmed).await {
            let charge = charge_of(&outcome);
            return store_failed(delivery, confirmed, &e, charge, shutdown).await;
        }
        // The finalize may have written the charge's event: out it goes now,
        // not at the relay's next poll.
        self.relay_wake.notify_one();
        if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
            // The result is written; the broker will deliver the command
            // again and that delivery gets a result of its own (a replay).
            tracing::warn!(error = %e, "could not ack a handled command");
        }
        Handled::Done(label)
    }

    /// Makes this delivery's result durable before the delivery is acked. A
    /// final answer (the answer the API would give now) is published at once
    /// on `confirmed` and is durable when the broker confirms it, with no row
    /// written; a result that waits for the outcome, or one the broker did not
    /// confirm, is written to the outbox, and the relay publishes it.
    async fn answer(
        &self,
        merchant: &Merchant,
        command: &Command,
        outcome: &Outcome,
        confirmed: &Channel,
    ) -> Result<(), StoreError> {
        let mismatch;
        let (answer, replayed) = match outcome {
            Outcome::Completed {
                subject,
                response,
                replayed,
                ..
            } => {
                tracing::Span::current().record("charge_id", subject.as_str());
                (ResultAnswer::Now(response), *replayed)
            }
            Outcome::Mismatch { subject, fields } => {
                let problem = Problem::key_reused(subject, fields);
                mismatch = StoredResponse {
                    status: problem.status,
                    body: problem.to_bytes().into(),
                };
                (ResultAnswer::Now(&mismatch), false)
            }
            Outcome::Expired { subject } => {
                tracing::Span::current().record("charge_id", subject.as_str());
                let problem = Problem::key_expired(subject);
                mismatch = StoredResponse {
                    status: problem.status,
                    body: problem.to_bytes().into(),
                };
                (ResultAnswer::Now(&mismatch), false)
            }
            // Another attempt holds the key: its outcome will be this one's too.
            Outcome::InFlight { subject, .. } => (
                ResultAnswer::WhenSettled {
                    merchant_id: merchant.id,
                    subject,
                },
                true,
            ),
            // Answered once it is settled: by a retry, the reconciler, or a person.
            Outcome::Unknown { subject, .. } | Outcome::UnderReview { subject, .. } => {
                tracing::Span::current().record("charge_id", subject.as_str());
                (
                    ResultAnswer::WhenSettled {
                        merchant_id: merchant.id,
                        subject,
                    },
                    false,
                )
            }
            // A refund its charge cannot give: the API's answer, now.
            Outcome::Refused(refusal) => {
                mismatch = refusal_response(refusal);
                (ResultAnswer::Now(&mismatch), false)
            }
        };
        let (exchange, routing_key) = match &command.reply_to {
            Some(queue) => ("", queue.as_str()),
            None => (RESULTS_EXCHANGE, merchant.name.as_str()),
        };
        // One id whichever way it goes out, so a subscriber can drop a copy
        // (a publish confirmed too late, then written to the outbox as well).
        let message_id = MessageId::result();
        let traceparent = idem_core::trace::current_traceparent();
        if let ResultAnswer::Now(response) = &answer {
            let message = Message {
                message_id: message_id.as_str(),
                exchange,
                routing_key,
                tenant: &merchant.name,
                event_type: None,
                correlation_id: command.correlation_id.as_deref(),
                result: Some(ResultHeaders {
                    idempotency_key: Some(command.key.as_str()),
                    status: i16::try_from(response.status).unwrap_or(i16::MAX),
                    replayed,
                }),
                traceparent: traceparent.as_deref(),
                body: &response.body,
            };
            // A message the broker can never take goes to the outbox too,
            // where the relay sets it aside with its reason.
            if let Ok(outgoing) = Outgoing::prepare(&message) {
                if await_confirm(routing_key, outgoing.publish(confirmed)).await {
                    metrics::counter!(idem_core::metrics::QUEUE_RESULTS, "via" => "broker")
                        .increment(1);
                    return Ok(());
                }
            }
        }
        self.store
            .enqueue_result(&NewResult {
                message_id: &message_id,
                exchange,
                routing_key,
                tenant: &merchant.name,
                correlation_id: command.correlation_id.as_deref(),
                key: &command.key,
                replayed,
                answer,
                traceparent: traceparent.as_deref(),
            })
            .await?;
        metrics::counter!(idem_core::metrics::QUEUE_RESULTS, "via" => "outbox").increment(1);
        Ok(())
    }
}

/// A command's span: its fields are in every log line written for it. With
/// tracing on, it is also the trace's consumer span (OpenTelemetry's
/// messaging conventions), the child of the command's `traceparent` header
/// if it has one.
fn command_span(delivery: &Delivery) -> tracing::Span {
    if !idem_core::trace::is_on() {
        return tracing::info_span!(
            "command",
            idempotency_key = tracing::field::Empty,
            charge_id = tracing::field::Empty,
            redelivered = delivery.redelivered,
        );
    }
    let message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map_or("", |m| m.as_str());
    let span = tracing::info_span!(
        "command",
        idempotency_key = tracing::field::Empty,
        charge_id = tracing::field::Empty,
        redelivered = delivery.redelivered,
        otel.name = %format_args!("process {}", super::COMMANDS_QUEUE),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.destination.name = super::COMMANDS_QUEUE,
        messaging.message.id = message_id,
    );
    let headers = delivery.properties.headers().as_ref();
    idem_core::trace::continue_from(&span, &HeaderCarrier(headers));
    span
}

/// The charge an outcome is about, if it has one.
fn charge_of(outcome: &Outcome) -> Option<&str> {
    match outcome {
        // Another request's charge (or refund): this command made none.
        Outcome::Mismatch { .. } => None,
        other => other.subject().map(SubjectId::as_str),
    }
}

/// What to do with a command that met a store error: try it again later if
/// the error is transient and attempts are left, else dead-letter it (see the
/// module's header). `charge` is the charge it made already, if known.
async fn store_failed(
    delivery: &Delivery,
    channel: &Channel,
    error: &StoreError,
    charge: Option<&str>,
    shutdown: &CancellationToken,
) -> Handled {
    let rejection = if !error.is_transient() {
        Rejection::new(
            "store-refused",
            format!("the database refused this command, and would again: {error}"),
        )
    } else {
        let attempt = attempts_before(&delivery.properties).saturating_add(1);
        if attempt < MAX_ATTEMPTS {
            return retry_later(delivery, channel, attempt, error, shutdown).await;
        }
        Rejection::new(
            "retries-exhausted",
            format!(
                "the database was unavailable on each of {attempt} attempts (the last: {error}); \
                 the command is safe to publish again as it is"
            ),
        )
    };
    dead_letter(delivery, channel, &rejection.with_charge(charge)).await
}

/// The failed attempts this command has had before this delivery: idem's own
/// count, plus the broker's count of this copy's failed deliveries (a quorum
/// queue's; a classic queue keeps none).
fn attempts_before(properties: &BasicProperties) -> u32 {
    let Some(headers) = properties.headers() else {
        return 0;
    };
    let count = |name: &str| headers.inner().get(name).and_then(integer).unwrap_or(0);
    count(ATTEMPTS_HEADER).saturating_add(count(DELIVERY_COUNT_HEADER))
}

/// A header's value as a count, whatever integer type the publisher used.
fn integer(value: &AMQPValue) -> Option<u32> {
    let n: i64 = match value {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    };
    Some(u32::try_from(n.max(0)).unwrap_or(u32::MAX))
}

/// The pause before attempt `attempt + 1`: [`RETRY_PAUSE`] doubled per
/// failure so far, at most [`RETRY_PAUSE_CAP`].
fn retry_pause(attempt: u32) -> Duration {
    RETRY_PAUSE
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
        .min(RETRY_PAUSE_CAP)
}

/// Puts a command back in the queue for another attempt after a pause: a copy
/// carrying the count of attempts so far is published (confirmed), then this
/// delivery is acked. If the copy is not confirmed, or the process is
/// stopping, the delivery is returned to the queue as it is instead (that
/// attempt is not counted: the broker or the process is going away too).
async fn retry_later(
    delivery: &Delivery,
    channel: &Channel,
    attempt: u32,
    error: &StoreError,
    shutdown: &CancellationToken,
) -> Handled {
    let pause = retry_pause(attempt);
    tracing::warn!(%error, attempt, max_attempts = MAX_ATTEMPTS, ?pause,
        "database trouble; the command goes back to the queue");
    let stopping = tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(pause) => false,
    };
    let copied = !stopping && {
        // The broker's count of this copy is folded into idem's.
        let mut headers: std::collections::BTreeMap<_, _> = delivery
            .properties
            .headers()
            .as_ref()
            .map(|h| h.inner().clone())
            .unwrap_or_default();
        headers.remove(DELIVERY_COUNT_HEADER);
        headers.insert(
            ATTEMPTS_HEADER.into(),
            AMQPValue::LongLongInt(i64::from(attempt)),
        );
        let properties = delivery.properties.clone().with_headers(headers.into());
        publish_confirmed(channel, COMMANDS_QUEUE, &delivery.data, properties).await
    };
    let settled = if copied {
        delivery.acker.ack(BasicAckOptions::default()).await
    } else {
        delivery
            .acker
            .nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
    };
    if let Err(e) = settled {
        // The channel is gone, and the broker requeues the delivery itself.
        tracing::warn!(error = %e, "could not return a command to the queue");
    }
    Handled::Requeued
}

/// Publishes `body` to `queue` (through the default exchange) and waits for
/// the broker's confirm, at most [`CONFIRM_TIMEOUT`]; `false` if it did not
/// confirm it in that time. The delivery being settled holds a prefetch slot
/// while this waits, so the wait is bounded like every other.
async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    body: &[u8],
    properties: BasicProperties,
) -> bool {
    let published = channel.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body,
        properties,
    );
    await_confirm(queue, published).await
}

/// Waits for a publish and the broker's confirm of it, at most
/// [`CONFIRM_TIMEOUT`]; `false` if the broker refused it or did not confirm
/// it in that time. `to` names where it went, for the log.
async fn await_confirm(
    to: &str,
    published: impl std::future::Future<Output = lapin::Result<PublisherConfirm>>,
) -> bool {
    let confirmed = tokio::time::timeout(CONFIRM_TIMEOUT, async {
        match published.await {
            Ok(confirm) => matches!(confirm.await, Ok(c) if c.is_ack()),
            Err(_) => false,
        }
    })
    .await;
    match confirmed {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(to, "the broker refused a message, or the channel failed");
            false
        }
        Err(_) => {
            tracing::warn!(
                to,
                timeout_s = CONFIRM_TIMEOUT.as_secs(),
                "the broker did not confirm a message in time"
            );
            false
        }
    }
}

/// Sends a message that will never succeed to the dead-letter queue, with its
/// reason in headers (and its charge, if it made one), and acks it. If the
/// broker will not confirm the copy, the message is rejected instead and the
/// broker dead-letters it itself (without the reason): either way it never
/// blocks the queue.
async fn dead_letter(delivery: &Delivery, channel: &Channel, rejection: &Rejection) -> Handled {
    tracing::warn!(
        code = rejection.code,
        reason = %rejection.reason,
        charge_id = rejection.charge_id.as_deref(),
        "dead-lettering a command"
    );
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers.insert(
        REASON_HEADER.into(),
        AMQPValue::LongString(rejection.reason.as_str().into()),
    );
    headers.insert(
        REASON_CODE_HEADER.into(),
        AMQPValue::LongString(rejection.code.into()),
    );
    if let Some(charge_id) = &rejection.charge_id {
        headers.insert(
            CHARGE_ID_HEADER.into(),
            AMQPValue::LongString(charge_id.as_str().into()),
        );
    }
    let properties = delivery.properties.clone().with_headers(headers);
    let confirmed = publish_confirmed(channel, DEAD_LETTER_QUEUE, &delivery.data, properties).await;
    let settled = if confirmed {
        delivery.acker.ack(BasicAckOptions::default()).await
    } else {
        tracing::warn!("the dead-letter copy was not confirmed; rejecting the message instead");
        delivery
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await
    };
    if let Err(e) = settled {
        tracing::warn!(error = %e, "could not settle a dead-lettered command");
    }
    Handled::DeadLettered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_from_one_second_to_the_cap() {
        let pauses: Vec<u64> = (1..MAX_ATTEMPTS)
            .map(|a| retry_pause(a).as_secs())
            .collect();
        assert_eq!(&pauses[..7], &[1, 2, 4, 8, 16, 30, 30]);
        assert!(pauses.iter().all(|p| *p <= RETRY_PAUSE_CAP.as_secs()));
        // The span the attempts cover before a command is dead-lettered.
        let total: u64 = pauses.iter().sum();
        assert!((400..=500).contains(&total), "{total} s");
    }

    #[test]
    fn attempts_are_idem_s_count_plus_the_broker_s() {
        let with = |pairs: &[(&str, AMQPValue)]| {
            let mut h = FieldTable::default();
            for (k, v) in pairs {
                h.insert((*k).into(), v.clone());
            }
            BasicProperties::default().with_headers(h)
        };
        assert_eq!(attempts_before(&BasicProperties::default()), 0);
        assert_eq!(
            attempts_before(&with(&[(ATTEMPTS_HEADER, AMQPValue::LongLongInt(3))])),
            3
        );
        assert_eq!(
            attempts_before(&with(&[
                (ATTEMPTS_HEADER, AMQPValue::LongInt(3)),
                (DELIVERY_COUNT_HEADER, AMQPValue::LongLongInt(2)),
            ])),
            5
        );
        assert_eq!(
            attempts_before(&with(&[(ATTEMPTS_HEADER, AMQPValue::LongLongInt(-4))])),
            0
        );
        assert_eq!(
            attempts_before(&with(&[(
                ATTEMPTS_HEADER,
                AMQPValue::LongString("7".into())
            )])),
            0,
            "not a number: not counted"
        );
    }
}
