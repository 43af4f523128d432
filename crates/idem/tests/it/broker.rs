//! Queue test harness: a virtual host per test on the real RabbitMQ
//! (`idem_testkit::broker`), `idem consume` child processes, and a small AMQP
//! client.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem::queue::{self, COMMANDS_QUEUE};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::helpers::{IdemProcess, TestDb, TestSim};
pub use idem_testkit::broker::TestBroker;

/// A real `idem consume` process.
pub struct ConsumeProcess {
    process: IdemProcess,
}

impl ConsumeProcess {
    /// Starts one and waits until the broker counts `consumers` on the queue.
    pub async fn start(
        db: &TestDb,
        sim: &TestSim,
        broker: &TestBroker,
        extra: &[&str],
        env: &[(&str, &str)],
        consumers: u32,
    ) -> Self {
        let mut args = vec![
            "consume",
            "--amqp-url",
            &broker.url,
            "--acquirer-url",
            &sim.url,
            "--outbox-poll",
            "100ms",
        ];
        args.extend_from_slice(extra);
        let process = IdemProcess::spawn(db, &args, env);
        let amqp = Amqp::connect(broker).await;
        amqp.wait_for_consumers(consumers).await;
        Self { process }
    }
}

impl std::ops::Deref for ConsumeProcess {
    type Target = IdemProcess;

    fn deref(&self) -> &IdemProcess {
        &self.process
    }
}

impl std::ops::DerefMut for ConsumeProcess {
    fn deref_mut(&mut self) -> &mut IdemProcess {
        &mut self.process
    }
}

/// A message a test took from a queue.
#[derive(Debug, Clone)]
pub struct Received {
    pub properties: BasicProperties,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name))
    }

    pub fn header_str(&self, name: &str) -> Option<String> {
        match self.header(name)? {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
            _ => None,
        }
    }

    /// The `status` header of a result.
    pub fn status(&self) -> i64 {
        match self.header("status") {
            Some(AMQPValue::ShortInt(n)) => i64::from(*n),
            Some(AMQPValue::LongInt(n)) => i64::from(*n),
            Some(AMQPValue::LongLongInt(n)) => *n,
            other => panic!("status header: {other:?}"),
        }
    }

    pub fn replayed(&self) -> bool {
        match self.header("idempotent-replayed") {
            Some(AMQPValue::Boolean(b)) => *b,
            other => panic!("idempotent-replayed header: {other:?}"),
        }
    }

    pub fn message_id(&self) -> String {
        self.properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str().to_owned())
            .expect("message_id")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
}

/// A command to publish.
pub struct Cmd<'a> {
    pub key: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub body: &'a str,
    pub reply_to: Option<&'a str>,
    pub correlation_id: Option<&'a str>,
}

impl<'a> Cmd<'a> {
    pub fn new(key: &'a str, tenant: &'a str, body: &'a str) -> Self {
        Self {
            key: Some(key),
            tenant: Some(tenant),
            body,
            reply_to: None,
            correlation_id: None,
        }
    }

    pub fn reply_to(self, queue: &'a str) -> Self {
        Self {
            reply_to: Some(queue),
            ..self
        }
    }
}

/// The test's own AMQP connection, with publisher confirms.
pub struct Amqp {
    _connection: Connection,
    pub channel: Channel,
}

impl Amqp {
    pub async fn connect(broker: &TestBroker) -> Self {
        Self::connect_url(&broker.url).await
    }

    /// To the broker at `url` (one node of a cluster, say).
    pub async fn connect_url(url: &str) -> Self {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("connect to the test virtual host");
        let channel = connection.create_channel().await.expect("channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        queue::declare(&channel).await.expect("declare");
        Self {
            _connection: connection,
            channel,
        }
    }

    pub async fn publish(&self, cmd: &Cmd<'_>) {
        let mut headers = FieldTable::default();
        if let Some(t) = cmd.tenant {
            headers.insert("tenant".into(), AMQPValue::LongString(t.into()));
        }
        let mut p = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(k) = cmd.key {
            p = p.with_message_id(k.into());
        }
        if let Some(r) = cmd.reply_to {
            p = p.with_reply_to(r.into());
        }
        if let Some(c) = cmd.correlation_id {
            p = p.with_correlation_id(c.into());
        }
        self.publish_raw(p, cmd.body.as_bytes()).await;
    }

    pub async fn publish_raw(&self, properties: BasicProperties, body: &[u8]) {
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                COMMANDS_QUEUE.into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        assert!(confirm.is_ack(), "the broker refused the command");
    }

    /// A durable queue of the test's, bound to `exchange` with `pattern`
    /// (no exchange: a plain queue, e.g. for `reply_to`).
    pub async fn queue(&self, name: &str, bind: Option<(&str, &str)>) -> String {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .expect("declare a test queue");
        if let Some((exchange, pattern)) = bind {
            self.channel
                .queue_bind(
                    name.into(),
                    exchange.into(),
                    pattern.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind a test queue");
        }
        name.to_owned()
    }

    /// Takes exactly `n` messages from `queue`, waiting up to `within`, and
    /// then makes sure no more arrive for a short while.
    pub async fn take(&self, queue: &str, n: usize, within: Duration) -> Vec<Received> {
        let got = self.take_at_least(queue, n, within).await;
        assert_eq!(
            got.len(),
            n,
            "more messages than expected on {queue}: {got:#?}"
        );
        got
    }

    /// Takes at least `n` messages (all that arrive in a short quiet period after).
    pub async fn take_at_least(&self, queue: &str, n: usize, within: Duration) -> Vec<Received> {
        let mut consumer = self
            .channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume a test queue");
        let deadline = Instant::now() + within;
        let quiet = Duration::from_millis(500);
        let mut got = Vec::new();
        loop {
            let wait = if got.len() >= n {
                quiet
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            match tokio::time::timeout(wait, consumer.next()).await {
                Ok(Some(Ok(d))) => {
                    d.ack(BasicAckOptions::default()).await.expect("ack");
                    got.push(Received {
                        properties: d.properties.clone(),
                        body: d.data.clone(),
                    });
                }
                Ok(other) => panic!("test consumer ended: {other:?}"),
                Err(_) => break,
            }
        }
        let _ = self
            .channel
            .basic_cancel(consumer.tag(), Default::default())
            .await;
        assert!(
            got.len() >= n,
            "{queue}: {} of {n} messages within {within:?}",
            got.len()
        );
        got
    }

    /// Ready (not unacked) messages in a queue.
    pub async fn ready(&self, queue: &str) -> u32 {
        self.passive(queue).await.message_count()
    }

    async fn passive(&self, queue: &str) -> lapin::Queue {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare")
    }

    pub async fn wait_for_consumers(&self, n: u32) {
        let started = Instant::now();
        while self.passive(COMMANDS_QUEUE).await.consumer_count() < n {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "idem consume did not start consuming"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
