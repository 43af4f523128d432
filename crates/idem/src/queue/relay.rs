//! The outbox relay: publishes what the outbox holds, with publisher confirms,
//! and marks it published. Runs in `idem consume`, and in `idem serve` when it
//! has a broker URL; any number may run at once, since each takes its batch
//! with `for update skip locked` (PostgreSQL) or a lease (SQLite), and
//! releases it when the broker has confirmed it or failed.
//!
//! Out is at-least-once: a relay that dies after the broker confirmed a batch
//! but before its commit leaves the batch unpublished in the table, and it goes
//! out again. Every message carries its own `message_id` (`evt_...`,
//! `res_...`) so subscribers can drop the copy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::PublisherConfirm;
use lapin::{BasicProperties, Channel};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::command::TENANT_HEADER;
use super::{connect, declare, reconnecting, short, Reconnect, PERSISTENT};
use crate::problem::PROBLEM_JSON;
use crate::store::{OutboxMessage, Store, StoreError};

/// Messages per batch: one transaction, one round of confirms.
const BATCH: i64 = 200;
/// Pruned per statement, so pruning never holds many locks.
const PRUNE_BATCH: i64 = 1_000;
/// Between prunes of published messages.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub amqp_url: String,
    /// Between looks at the outbox when nothing woke the relay (messages
    /// written by other processes are found this way).
    pub poll_interval: Duration,
    /// How long published messages are kept before they are pruned.
    pub retention: Duration,
    /// How long the broker may take to confirm a batch.
    pub confirm_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error("the broker did not confirm within {0:?}")]
    ConfirmTimeout(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Relay {
    store: Store,
    config: RelayConfig,
    wake: Arc<Notify>,
}

impl Relay {
    /// `wake` lets writers in this process (the consumer) call the relay at once.
    pub fn new(store: Store, config: RelayConfig, wake: Arc<Notify>) -> Self {
        Self {
            store,
            config,
            wake,
        }
    }

    /// Relays until `shutdown`, reconnecting with backoff when the broker goes;
    /// one last pass on the way out. Stop it after the writers of this process
    /// (the consumer, the API) have stopped.
    pub async fn run(self, shutdown: CancellationToken) {
        let (this, stop) = (&self, &shutdown);
        reconnecting("relay", stop, |mut reconnect| async move {
            let ended = this.session(stop, &mut reconnect).await;
            (reconnect, ended)
        })
        .await;
    }

    async fn session(
        &self,
        shutdown: &CancellationToken,
        reconnect: &mut Reconnect,
    ) -> Result<(), RelayError> {
        let connection = connect(&self.config.amqp_url).await?;
        let channel = connection.create_channel().await?;
        declare(&channel).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        reconnect.reset();
        tracing::info!("relaying the outbox");
        let mut pruned_at = Instant::now();
        let ended = loop {
            let published = match self.pass(&channel).await {
                Ok(n) => n,
                Err(RelayError::Store(e)) => {
                    tracing::warn!(error = %e, "relay cannot read the outbox");
                    0
                }
                Err(e) => break Err(e),
            };
            if pruned_at.elapsed() >= PRUNE_EVERY {
                pruned_at = Instant::now();
                self.prune().await;
            }
            if published >= BATCH as usize {
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    // What the last writers of this process left goes out now,
                    // not at the next relay's start.
                    if let Err(e) = self.pass(&channel).await {
                        tracing::warn!(error = %e, "the relay's last pass failed; another relay will publish it");
                    }
                    break Ok(());
                }
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.config.poll_interval) => {}
            }
        };
        let _ = connection.close(200, "relay stopping".into()).await;
        ended
    }

    /// Publishes one batch; returns how many messages the broker confirmed.
    /// The batch is released whatever happens, so what did not go out goes
    /// in the next batch, this relay's or another's.
    async fn pass(&self, channel: &Channel) -> Result<usize, RelayError> {
        let batch = self.store.outbox_batch(BATCH).await?;
        if batch.messages.is_empty() {
            return Ok(0);
        }
        let batch_len = batch.messages.len();
        let sent = self.publish(channel, &batch.messages).await;
        batch.finish(sent.as_deref().unwrap_or_default()).await?;
        let confirmed = sent?.len();
        let refused = batch_len - confirmed;
        if refused > 0 {
            tracing::warn!(
                refused,
                "the broker refused messages; they go out again later"
            );
        }
        metrics::counter!(crate::metrics::OUTBOX_PUBLISHED).increment(confirmed as u64);
        Ok(confirmed)
    }

    /// Publishes messages with confirms; returns the ids the broker acked.
    async fn publish(
        &self,
        channel: &Channel,
        messages: &[OutboxMessage],
    ) -> Result<Vec<i64>, RelayError> {
        let mut pending: Vec<(i64, PublisherConfirm)> = Vec::with_capacity(messages.len());
        for message in messages {
            let confirm = channel
                .basic_publish(
                    message.exchange.as_str().into(),
                    message.routing_key.as_str().into(),
                    BasicPublishOptions::default(),
                    &message.body,
                    properties(message),
                )
                .await?;
            pending.push((message.id, confirm));
        }
        tokio::time::timeout(self.config.confirm_timeout, async {
            let mut acked = Vec::with_capacity(pending.len());
            for (id, confirm) in pending {
                if confirm.await?.is_ack() {
                    acked.push(id);
                }
            }
            Ok::<_, lapin::Error>(acked)
        })
        .await
        .map_err(|_| RelayError::ConfirmTimeout(self.config.confirm_timeout))?
        .map_err(RelayError::from)
    }

    async fn prune(&self) {
        loop {
            match self
                .store
                .prune_outbox(self.config.retention, PRUNE_BATCH)
                .await
            {
                Ok(n) if n < PRUNE_BATCH.unsigned_abs() => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "pruning the outbox failed");
                    return;
                }
            }
        }
    }
}

/// A message's AMQP properties: persistent, its unique id, and what the
/// contract puts in the headers of an event or a result.
fn properties(message: &OutboxMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        TENANT_HEADER.into(),
        AMQPValue::LongString(message.tenant.as_str().into()),
    );
    let mut p = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_timestamp(unix_now());
    if let Some(id) = short(&message.message_id) {
        p = p.with_message_id(id);
    }
    if let Some(event_type) = message.event_type.as_deref().and_then(short) {
        p = p.with_type(event_type);
    }
    if let Some(correlation_id) = message.correlation_id.as_deref().and_then(short) {
        p = p.with_correlation_id(correlation_id);
    }
    let content_type = if let Some(status) = message.status {
        headers.insert("status".into(), AMQPValue::ShortInt(status));
        if let Some(key) = &message.idempotency_key {
            headers.insert(
                "idempotency-key".into(),
                AMQPValue::LongString(key.as_str().into()),
            );
        }
        headers.insert(
            "idempotent-replayed".into(),
            AMQPValue::Boolean(message.replayed.unwrap_or(false)),
        );
        if (200..300).contains(&status) {
            "application/json"
        } else {
            PROBLEM_JSON
        }
    } else {
        "application/json"
    };
    p.with_content_type(content_type.into())
        .with_headers(headers)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
