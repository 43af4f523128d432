//! `idem consume`: the idempotent consumer of `idem.charges`.
//!
//! One delivery, in order:
//! 1. parse it ([`command::parse`]) and find its merchant; a message that can
//!    never succeed is dead-lettered with its reason and acked;
//! 2. run the engine, exactly as `POST /v1/charges` does (claim committed
//!    first, acquirer with no transaction open, fenced finalize that also
//!    writes the charge event to the outbox);
//! 3. write this delivery's result to the outbox;
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
//! When the database is down, the message is returned to the queue (after a
//! pause, so a dead database does not make a hot loop) rather than acked.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::command::{self, Command, Rejection};
use super::{
    connect, declare, reconnecting, Reconnect, COMMANDS_QUEUE, DEAD_LETTER_QUEUE,
    REASON_CODE_HEADER, REASON_HEADER, RESULTS_EXCHANGE,
};
use crate::domain::Merchant;
use crate::http::ApiError;
use crate::idempotency::{Engine, Outcome, StoredResponse};
use crate::store::{MerchantCache, NewResult, ResultAnswer, StoreError};

/// How long a delivery that met a database outage waits before going back to
/// the queue.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub amqp_url: String,
    /// Unacked deliveries the broker may send ahead; also how many are worked at once.
    pub prefetch: u16,
}

/// The consumer. Cheap to clone; [`Consumer::run`] reconnects until shutdown.
#[derive(Clone)]
pub struct Consumer {
    engine: Engine,
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
    /// Database trouble: returned to the queue for a later attempt.
    Requeued,
}

impl Consumer {
    pub fn new(engine: Engine, config: ConsumerConfig, relay_wake: Arc<Notify>) -> Self {
        Self {
            engine,
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
        let (this, stop) = (&self, &shutdown);
        reconnecting("consumer", stop, |mut reconnect| async move {
            let ended = this.session(stop, &mut reconnect).await;
            (reconnect, ended)
        })
        .await;
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
                        tasks.spawn(async move { this.handle(delivery, &dead_letters).await });
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

    async fn handle(&self, delivery: Delivery, dead_letters: &Channel) {
        let span = tracing::info_span!(
            "command",
            idempotency_key = tracing::field::Empty,
            charge_id = tracing::field::Empty,
            redelivered = delivery.redelivered,
        );
        let handled = self
            .handle_in(&delivery, dead_letters)
            .instrument(span)
            .await;
        let label = match handled {
            Handled::Done(label) => label,
            Handled::DeadLettered => "dead_lettered",
            Handled::Requeued => "requeued",
        };
        metrics::counter!(crate::metrics::QUEUE_COMMANDS, "result" => label).increment(1);
    }

    async fn handle_in(&self, delivery: &Delivery, dead_letters: &Channel) -> Handled {
        let command = match command::parse(&delivery.properties, &delivery.data) {
            Ok(c) => c,
            Err(rejection) => return dead_letter(delivery, dead_letters, &rejection).await,
        };
        tracing::Span::current().record("idempotency_key", command.key.as_str());
        let store = self.engine.store();
        let merchant = match self
            .merchants
            .get_or_load(&command.tenant, || store.merchant_by_name(&command.tenant))
            .await
        {
            Ok(Some(m)) => m,
            Ok(None) => {
                let rejection = Rejection::new(
                    "unknown-tenant",
                    format!("no merchant is named {:?}", command.tenant),
                );
                return dead_letter(delivery, dead_letters, &rejection).await;
            }
            Err(e) => return requeue(delivery, &e).await,
        };
        let outcome = match self
            .engine
            .submit(&merchant, &command.key, &command.request)
            .await
        {
            Ok(o) => o,
            Err(crate::idempotency::EngineError::Store(e)) => return requeue(delivery, &e).await,
        };
        let label = outcome.label();
        if let Err(e) = self.write_result(&merchant, &command, &outcome).await {
            return requeue(delivery, &e).await;
        }
        self.relay_wake.notify_one();
        if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
            // The result is written; the broker will deliver the command
            // again and that delivery gets a result of its own (a replay).
            tracing::warn!(error = %e, "could not ack a handled command");
        }
        Handled::Done(label)
    }

    /// Writes this delivery's result to the outbox: the answer the API would
    /// give now, or, while the outcome is not final, a result that waits for it.
    async fn write_result(
        &self,
        merchant: &Merchant,
        command: &Command,
        outcome: &Outcome,
    ) -> Result<(), StoreError> {
        let mismatch;
        let (answer, replayed) = match outcome {
            Outcome::Completed {
                charge_id,
                response,
                replayed,
            } => {
                tracing::Span::current().record("charge_id", charge_id.as_str());
                (ResultAnswer::Now(response), *replayed)
            }
            Outcome::Mismatch { fields } => {
                let (status, body) = ApiError::KeyReused(fields.clone()).problem_body();
                mismatch = StoredResponse {
                    status,
                    body: body.into(),
                };
                (ResultAnswer::Now(&mismatch), false)
            }
            // Another attempt holds the key: its outcome will be this one's too.
            Outcome::InFlight { charge_id, .. } => (
                ResultAnswer::WhenSettled {
                    merchant_id: merchant.id,
                    charge_id,
                },
                true,
            ),
            Outcome::Unknown { charge_id, .. } => {
                tracing::Span::current().record("charge_id", charge_id.as_str());
                (
                    ResultAnswer::WhenSettled {
                        merchant_id: merchant.id,
                        charge_id,
                    },
                    false,
                )
            }
        };
        let (exchange, routing_key) = match &command.reply_to {
            Some(queue) => ("", queue.as_str()),
            None => (RESULTS_EXCHANGE, merchant.name.as_str()),
        };
        self.engine
            .store()
            .enqueue_result(&NewResult {
                exchange,
                routing_key,
                tenant: &merchant.name,
                correlation_id: command.correlation_id.as_deref(),
                key: &command.key,
                replayed,
                answer,
            })
            .await
    }
}

/// Sends a message that can never succeed to the dead-letter queue, with its
/// reason in a header, and acks it. If the broker will not confirm the copy,
/// the message is rejected instead and the broker dead-letters it itself
/// (without the reason): either way it never blocks the queue.
async fn dead_letter(delivery: &Delivery, channel: &Channel, rejection: &Rejection) -> Handled {
    tracing::warn!(code = rejection.code, reason = %rejection.reason, "dead-lettering a command");
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers.insert(
        REASON_HEADER.into(),
        AMQPValue::LongString(rejection.reason.as_str().into()),
    );
    headers.insert(
        REASON_CODE_HEADER.into(),
        AMQPValue::LongString(rejection.code.into()),
    );
    let properties = delivery.properties.clone().with_headers(headers);
    let confirmed = match channel
        .basic_publish(
            "".into(),
            DEAD_LETTER_QUEUE.into(),
            BasicPublishOptions::default(),
            &delivery.data,
            properties,
        )
        .await
    {
        Ok(confirm) => matches!(confirm.await, Ok(c) if c.is_ack()),
        Err(_) => false,
    };
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

/// Returns a delivery to the queue after a pause: the database could not be
/// reached, and the command is still to be done.
async fn requeue(delivery: &Delivery, error: &StoreError) -> Handled {
    tracing::warn!(%error, "database trouble; returning the command to the queue");
    tokio::time::sleep(REQUEUE_PAUSE).await;
    if let Err(e) = delivery
        .acker
        .nack(BasicNackOptions {
            multiple: false,
            requeue: true,
        })
        .await
    {
        tracing::warn!(error = %e, "could not return a command to the queue");
    }
    Handled::Requeued
}
