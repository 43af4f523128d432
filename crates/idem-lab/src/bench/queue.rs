//! The `queue` scenario: commands through RabbitMQ instead of HTTP. `idem
//! serve --consume` consumes them (its outbox relay publishes the results);
//! each of `--concurrency` publishers sends a new command (persistent, with a
//! publisher confirm, as a real publisher would) and waits for its result on a
//! reply queue before sending the next. The latency is publish to result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{body, BenchResult, Part, WARM_UP};
use idem::queue::{self, COMMANDS_QUEUE};

/// The longest a command may take before it counts as an error.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<u16>>>>;

/// Drives the load on a deployment already consuming from `amqp_url`.
pub(super) async fn drive(
    amqp_url: &str,
    merchant: &str,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<BenchResult> {
    let connection = queue::connect(amqp_url)
        .await
        .with_context(|| format!("connecting to RabbitMQ at {amqp_url}"))?;
    let listen = connection.create_channel().await?;
    queue::declare(&listen).await?;
    let replies = listen
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?
        .name()
        .as_str()
        .to_owned();
    let waiting: Waiting = Arc::default();
    let mut results = listen
        .basic_consume(
            replies.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let dispatch = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = results.next().await {
                let status = match d
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get("status"))
                {
                    Some(AMQPValue::ShortInt(s)) => u16::try_from(*s).unwrap_or(0),
                    _ => 0,
                };
                let id = d
                    .properties
                    .correlation_id()
                    .as_ref()
                    .map(|c| c.to_string());
                if let Some(tx) = id.and_then(|id| waiting.lock().ok()?.remove(&id)) {
                    let _ = tx.send(status);
                }
            }
        })
    };

    let measuring = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let mut publishers = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let publisher = Publisher {
            channel,
            replies: replies.clone(),
            merchant: merchant.to_owned(),
            waiting: waiting.clone(),
        };
        let (measuring, stop) = (measuring.clone(), stop.clone());
        publishers.push(tokio::spawn(async move {
            publisher.run(w, &measuring, &stop).await
        }));
    }
    tokio::time::sleep(WARM_UP).await;
    measuring.store(true, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.cancel();
    let seconds = started.elapsed().as_secs_f64();
    let mut parts = Vec::with_capacity(concurrency);
    for p in publishers {
        parts.push(p.await??);
    }
    dispatch.abort();
    let _ = connection.close(200, "bench done".into()).await;
    super::combine(super::Scenario::Queue, concurrency, seconds, parts)
}

struct Publisher {
    channel: Channel,
    replies: String,
    merchant: String,
    waiting: Waiting,
}

impl Publisher {
    async fn run(
        &self,
        w: usize,
        measuring: &AtomicBool,
        stop: &CancellationToken,
    ) -> anyhow::Result<Part> {
        let mut part = Part::new()?;
        let mut i = 0usize;
        while !stop.is_cancelled() {
            i += 1;
            let id = format!("bench-q-{w}-{i}");
            let sent = Instant::now();
            let mut confirmed = None;
            let status = self.command(&id, i, &mut confirmed).await;
            if measuring.load(Ordering::Relaxed) {
                part.record(sent, status)?;
                if let Some(at) = confirmed {
                    let micros = u64::try_from((at - sent).as_micros()).unwrap_or(u64::MAX);
                    part.confirms.record(micros.max(1))?;
                }
            }
        }
        Ok(part)
    }

    /// Publishes one command and waits for its result's status; `confirmed`
    /// is when the broker confirmed the command.
    async fn command(
        &self,
        id: &str,
        order: usize,
        confirmed: &mut Option<Instant>,
    ) -> anyhow::Result<u16> {
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(id.to_owned(), tx);
        let mut headers = FieldTable::default();
        headers.insert(
            "tenant".into(),
            AMQPValue::LongString(self.merchant.as_str().into()),
        );
        let properties = BasicProperties::default()
            .with_message_id(id.into())
            .with_correlation_id(id.into())
            .with_reply_to(self.replies.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                COMMANDS_QUEUE.into(),
                BasicPublishOptions::default(),
                body(order).as_bytes(),
                properties,
            )
            .await?
            .await?;
        anyhow::ensure!(confirm.is_ack(), "the broker refused the command");
        *confirmed = Some(Instant::now());
        let status = tokio::time::timeout(COMMAND_TIMEOUT, rx)
            .await
            .context("no result in time")??;
        Ok(status)
    }
}
