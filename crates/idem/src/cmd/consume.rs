//! `idem consume`: charge commands from RabbitMQ, and the outbox relay, with
//! the workers beside them. Parses its flags into `app::Consume`; `app`
//! starts and stops it.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use super::args::{EngineArgs, QueueArgs, WorkerArgs, DEFAULT_AMQP_URL};
use crate::app;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// RabbitMQ URL; a cluster's nodes as several URLs, comma-separated.
    #[arg(long, env = "IDEM_AMQP_URL", default_value = DEFAULT_AMQP_URL)]
    pub(crate) amqp_url: String,
    /// Serve /healthz, /readyz and /metrics on this address.
    #[arg(long, env = "IDEM_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub(crate) queue: QueueArgs,
    #[command(flatten)]
    pub(crate) workers: WorkerArgs,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// The consumer and the relay, with the workers beside them, until `shutdown`.
pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = app::Consume {
        engine: args.engine.settings()?,
        metrics_listen: args.metrics_listen,
        queue: args.queue.queue(args.amqp_url),
        workers: args.workers.workers(),
    };
    app::consume(config, shutdown).await
}
