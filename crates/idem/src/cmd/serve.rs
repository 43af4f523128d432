//! `idem serve`: the charge API, with the workers beside it and, given a
//! broker, the outbox relay (and the consumer). Parses its flags into
//! `app::Serve`; `app` starts and stops it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::args::{parse_duration, EngineArgs, QueueArgs, WorkerArgs};
use crate::app;
use crate::http;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// Address to listen on.
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,
    /// RabbitMQ URL (a cluster's nodes as several URLs, comma-separated): when
    /// set, this process also relays the outbox (charge events).
    #[arg(long, env = "IDEM_AMQP_URL")]
    pub(crate) amqp_url: Option<String>,
    /// Also consume charge commands from the queue (needs --amqp-url).
    #[arg(long, env = "IDEM_CONSUME", requires = "amqp_url")]
    pub(crate) consume: bool,
    /// Serve /metrics (with /healthz and /readyz) on this address instead of
    /// the API's: keep it off the public port in production.
    #[arg(long, env = "IDEM_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Serve the operator console on this address (off by default; keep it
    /// off the public network). Sign in with --admin-token or a token made
    /// by `idem admin token`.
    #[arg(long, env = "IDEM_ADMIN_LISTEN")]
    pub(crate) admin_listen: Option<SocketAddr>,
    /// A token that signs in to the console (its actions are audited as
    /// "console (--admin-token)"); named tokens from `idem admin token` work too.
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        requires = "admin_listen",
        hide_env_values = true
    )]
    pub(crate) admin_token: Option<String>,
    /// How long a connection may take to send a request's head, from when it
    /// opens or its previous answer goes out; also how long an idle kept-alive
    /// connection stays open. Keep a load balancer's idle timeout below it.
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub(crate) header_read_timeout: Duration,
    /// /v1 requests worked at once; more are answered at once with 503 and Retry-After.
    #[arg(long, env = "IDEM_MAX_IN_FLIGHT", default_value_t = http::MAX_IN_FLIGHT, value_parser = parse_positive)]
    pub(crate) max_in_flight: usize,
    /// Of those, requests that wait for a duplicate's outcome (`Prefer:
    /// wait`) at once; one more is answered `503` at once.
    #[arg(long, env = "IDEM_MAX_WAITERS", default_value_t = http::MAX_WAITERS, value_parser = parse_positive)]
    pub(crate) max_waiters: usize,
    #[command(flatten)]
    pub(crate) queue: QueueArgs,
    #[command(flatten)]
    pub(crate) workers: WorkerArgs,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("a whole number, at least 1".to_owned()),
    }
}

/// Starts the API on its configured address, with the reconciler and the
/// sweeper beside it, and runs them until `shutdown`.
pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = app::Serve {
        engine: args.engine.settings()?,
        listen: args.listen,
        metrics_listen: args.metrics_listen,
        console: args.admin_listen.map(|listen| app::Console {
            listen,
            token: args.admin_token.clone(),
        }),
        header_read_timeout: args.header_read_timeout,
        max_in_flight: args.max_in_flight,
        max_waiters: args.max_waiters,
        queue: args.amqp_url.map(|url| args.queue.queue(url)),
        consume: args.consume,
        workers: args.workers.workers(),
    };
    app::serve(config, shutdown).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use crate::http;

    #[test]
    fn serve_defaults_are_the_http_layers_constants() {
        let cli = Cli::try_parse_from(["idem", "serve"]).expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.header_read_timeout, http::HEADER_READ_TIMEOUT);
        assert_eq!(args.max_in_flight, http::MAX_IN_FLIGHT);
        assert_eq!(args.max_waiters, http::MAX_WAITERS);
        assert_eq!(args.metrics_listen, None);
    }
}
