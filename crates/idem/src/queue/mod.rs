//! Charges from a queue (RabbitMQ), by the contract in `docs/contract/queue.md`.
//!
//! Delivery is at-least-once, so a command may arrive twice, or again after a
//! consumer died half-way. The effect is still once, because each command goes
//! through the same engine as an HTTP request, under the merchant's key space:
//!
//! ```text
//! idem.charges ─► consumer ─► engine (claim, acquirer, finalize + event) ─► result ─► ack
//!   ▲  │ malformed, refused by the store, or out of attempts     final: published, confirmed ─► reply_to / idem.results
//!   │  └─► idem.charges.dead (reason in a header)                waiting: outbox ─┐
//!   └── database unreachable: again, after a pause (x-idem-attempts)              relay (skip locked, confirms)
//!                                                                 outbox: events ─┘ ├─► reply_to / idem.results
//!                                                                                   └─► idem.events
//! ```
//!
//! - [`command`]: what a delivery must carry, parsed before anything is claimed;
//! - [`consumer`]: `idem consume`: manual acks, bounded prefetch, reconnects;
//! - [`relay`]: publishes the outbox with publisher confirms; several may run;
//! - [`message`]: how a result or an event becomes an AMQP message, for both.

pub mod command;
pub mod consumer;
mod message;
pub mod relay;

use std::future::Future;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio_util::sync::CancellationToken;

use idem_core::store::Store;

pub use consumer::{Consumer, ConsumerConfig};
pub use relay::{Relay, RelayConfig};

/// Commands in: durable; what is rejected there goes to [`DEAD_LETTER_QUEUE`].
pub const COMMANDS_QUEUE: &str = "idem.charges";
/// Commands that can never succeed, each with the reason in a header.
pub const DEAD_LETTER_QUEUE: &str = "idem.charges.dead";
/// Results of commands without `reply_to`: topic, routing key = merchant name.
pub const RESULTS_EXCHANGE: &str = "idem.results";
/// Charge events (`charge.captured`, `charge.declined`): topic, routing key = type.
pub use idem_core::domain::EVENTS_EXCHANGE;

/// The header a dead letter carries its reason in (a sentence), and its code.
pub const REASON_HEADER: &str = "x-idem-reason";
pub const REASON_CODE_HEADER: &str = "x-idem-reason-code";
/// The header of a dead letter that had made a charge before it was refused:
/// the charge's id, so it can be found (`GET /v1/charges/{id}`).
pub const CHARGE_ID_HEADER: &str = "x-idem-charge-id";
/// The header in which the consumer counts a command's attempts that met a
/// transient store error (see [`consumer::MAX_ATTEMPTS`]).
pub const ATTEMPTS_HEADER: &str = "x-idem-attempts";

/// AMQP delivery mode 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;

/// Connects to the broker: to the first of `urls` that answers, when they are
/// several, comma-separated (a cluster's nodes). The first one tried is picked
/// at random, so that processes spread over the nodes; a process whose node
/// dies comes here again on its next reconnect, and finds a live one.
pub async fn connect(urls: &str) -> lapin::Result<Connection> {
    let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
    let first = rand::random_range(0..urls.len());
    let mut failed = None;
    for i in 0..urls.len() {
        let url = urls[(first + i) % urls.len()];
        match Connection::connect(url, ConnectionProperties::default()).await {
            Ok(connection) => return Ok(connection),
            Err(e) => {
                if urls.len() > 1 {
                    tracing::warn!(node = i, error = %e, "a broker node does not answer; trying the next");
                }
                failed = Some(e);
            }
        }
    }
    Err(failed.expect("split yields at least one URL"))
}

/// Declares everything idem uses, durable; both queues are quorum queues, so
/// a cluster keeps them, replicated, when a node dies. Declarations are
/// idempotent, so every consumer and relay makes them at start. A queue that
/// exists with other arguments (a classic `idem.charges` from before idem
/// declared quorum queues: docs/deployment.md says how to move it) makes this
/// fail with the broker's PRECONDITION_FAILED, rather than run with a topology
/// that loses commands when a node dies.
pub async fn declare(channel: &Channel) -> lapin::Result<()> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    for exchange in [RESULTS_EXCHANGE, EVENTS_EXCHANGE] {
        channel
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await?;
    }
    let quorum = || {
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        arguments
    };
    channel
        .queue_declare(
            DEAD_LETTER_QUEUE.into(),
            QueueDeclareOptions::durable(),
            quorum(),
        )
        .await?;
    let mut dead_lettered = quorum();
    dead_lettered.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    dead_lettered.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(DEAD_LETTER_QUEUE.into()),
    );
    channel
        .queue_declare(
            COMMANDS_QUEUE.into(),
            QueueDeclareOptions::durable(),
            dead_lettered,
        )
        .await
        .inspect_err(|e| {
            tracing::error!(
                error = %e,
                "cannot declare {COMMANDS_QUEUE} as a quorum queue; if it exists as a classic \
                 queue, docs/deployment.md says how to move it"
            );
        })?;
    Ok(())
}

/// Turns charge events on for the whole deployment, trying until the
/// database answers: the relay does it as it starts (some relay now publishes
/// them), and so does the consumer before its first command, so that no
/// outcome it stores misses its event. Events stay on whether or not the
/// broker answers now: what is written waits in the outbox. `false`: shut down
/// before the database answered.
async fn events_on(store: &Store, shutdown: &CancellationToken) -> bool {
    loop {
        match store.set_events_enabled(true).await {
            Ok(changed) => {
                if changed {
                    tracing::info!(
                        "charge events turned on for the deployment: a relay publishes them"
                    );
                }
                return true;
            }
            Err(e) => tracing::warn!(error = %e, "cannot turn charge events on yet"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Runs `session` (one connection's life: `Ok` on shutdown, `Err` when the
/// broker is lost) again and again until `shutdown`, with backoff between tries.
async fn reconnecting<F, Fut, E>(what: &str, shutdown: &CancellationToken, mut session: F)
where
    F: FnMut(Reconnect) -> Fut,
    Fut: Future<Output = (Reconnect, Result<(), E>)>,
    E: std::fmt::Display,
{
    let mut reconnect = Reconnect::new();
    loop {
        let (r, ended) = session(reconnect).await;
        reconnect = r;
        match ended {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "{what} lost the broker; reconnecting"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(reconnect.next_delay()) => {}
        }
    }
}

/// Exponential backoff with full jitter between reconnects: 100 ms doubling to 5 s.
#[derive(Debug)]
struct Reconnect {
    failures: u32,
}

impl Reconnect {
    const BASE: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Self { failures: 0 }
    }

    fn next_delay(&mut self) -> Duration {
        let exp = Self::BASE
            .saturating_mul(2u32.saturating_pow(self.failures.min(16)))
            .min(Self::CAP);
        self.failures += 1;
        exp.mul_f64(rand::random::<f64>())
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_grow_to_the_cap_and_reset() {
        let mut r = Reconnect::new();
        for _ in 0..40 {
            assert!(r.next_delay() <= Reconnect::CAP);
        }
        assert_eq!(r.failures, 40);
        r.reset();
        assert!(r.next_delay() <= Reconnect::BASE);
    }
}
