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
//!
//! A row the broker can never take is set aside, with its reason, instead of
//! being published: today that is a row with an AMQP short string (the
//! exchange, the routing key, `message_id`, `type`, `correlation_id`) over
//! 255 bytes, which the client library refuses before sending (lapin's
//! `ShortString::from` panics on one; this module only ever uses
//! `ShortString::try_new`). It would otherwise come first in every batch,
//! for every relay. The routing key of a result is its merchant's name, and
//! names stored before they had to be slugs may be that long. Set-aside rows
//! are logged and counted (`idem_outbox_set_aside_total`); the rows behind
//! them go out as usual. How a row becomes an AMQP message: [`super::message`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::ConfirmSelectOptions;
use lapin::Channel;
use lapin::PublisherConfirm;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::message::{Message, Outgoing};
use super::{connect, declare, events_on, reconnecting, Reconnect};
use idem_core::store::{OutboxBatch, Store, StoreError};
use tracing::Instrument;

/// Messages per batch: one transaction, one round of confirms.
const BATCH: i64 = 200;
/// Pruned per statement, so pruning never holds many locks.
const PRUNE_BATCH: i64 = 1_000;
/// How long a woken relay waits before its pass, so that the rows written
/// just after the one that woke it go in the same batch: one transaction and
/// one round of confirms for many, at a few milliseconds of an event's latency.
const LINGER: Duration = Duration::from_millis(5);
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
    /// How long the broker may take to take a batch (the publishes, which
    /// wait when the connection does not drain) and confirm it.
    pub confirm_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error("the broker did not take and confirm a batch within {0:?}")]
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

    /// Turns charge events on for the deployment (a relay now publishes
    /// them), then relays until `shutdown`, reconnecting with backoff when the
    /// broker goes; one last pass on the way out. Stop it after the writers of
    /// this process (the consumer, the API) have stopped.
    pub async fn run(self, shutdown: CancellationToken) {
        if !events_on(&self.store, &shutdown).await {
            return;
        }
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
                // Woken by a writer of this process: more rows follow close
                // behind (a busy consumer writes one per command), so wait
                // a moment and take them in the same batch.
                _ = self.wake.notified() => tokio::time::sleep(LINGER).await,
                _ = tokio::time::sleep(self.config.poll_interval) => {}
            }
        };
        let _ = connection.close(200, "relay stopping".into()).await;
        ended
    }

    /// Publishes one batch; returns how many messages it settled (confirmed
    /// by the broker, or set aside). The batch is released whatever happens,
    /// so what did not go out goes in the next batch, this relay's or another's.
    async fn pass(&self, channel: &Channel) -> Result<usize, RelayError> {
        let batch = self.store.outbox_batch(BATCH).await?;
        if batch.messages.is_empty() {
            // Finished, not dropped: a batch dropped unfinished costs
            // PostgreSQL its connection (closed, so that the server rolls back).
            batch.finish(&[], &[]).await?;
            return Ok(0);
        }
        // A span only for a batch with messages: an idle poll is not worth a trace.
        let span = idem_core::span!("relay", otel.name = "publish", otel.kind = "producer",
            messaging.system = "rabbitmq", messaging.operation.type = "send",
            messaging.batch.message_count = i64::try_from(batch.messages.len()).unwrap_or(i64::MAX));
        self.publish_batch(channel, batch).instrument(span).await
    }

    async fn publish_batch(
        &self,
        channel: &Channel,
        batch: OutboxBatch,
    ) -> Result<usize, RelayError> {
        let batch_len = batch.messages.len();
        let mut outgoing = Vec::with_capacity(batch_len);
        let mut set_aside = Vec::new();
        for message in &batch.messages {
            match Outgoing::prepare(&Message::from(message)) {
                Ok(o) => outgoing.push((message.id, o)),
                Err(reason) => {
                    tracing::error!(
                        outbox_id = message.id,
                        kind = %message.kind,
                        tenant = %message.tenant,
                        %reason,
                        "an outbox message can never be published; setting it aside"
                    );
                    set_aside.push((message.id, reason));
                }
            }
        }
        let sent = self.publish(channel, outgoing).await;
        batch
            .finish(sent.as_deref().unwrap_or_default(), &set_aside)
            .await?;
        metrics::counter!(idem_core::metrics::OUTBOX_SET_ASIDE).increment(set_aside.len() as u64);
        let confirmed = sent?.len();
        let refused = batch_len - confirmed - set_aside.len();
        if refused > 0 {
            tracing::warn!(
                refused,
                "the broker refused messages; they go out again later"
            );
        }
        metrics::counter!(idem_core::metrics::OUTBOX_PUBLISHED).increment(confirmed as u64);
        Ok(confirmed + set_aside.len())
    }

    /// Publishes messages with confirms; returns the ids the broker acked.
    /// The publishes are inside the timeout too: one waits while the
    /// connection does not drain (a broker under flow control, a dead peer
    /// whose socket buffer is full), and the batch's rows stay locked meanwhile.
    async fn publish(
        &self,
        channel: &Channel,
        outgoing: Vec<(i64, Outgoing<'_>)>,
    ) -> Result<Vec<i64>, RelayError> {
        tokio::time::timeout(self.config.confirm_timeout, async {
            let mut pending: Vec<(i64, PublisherConfirm)> = Vec::with_capacity(outgoing.len());
            for (id, o) in outgoing {
                pending.push((id, o.publish(channel).await?));
            }
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
