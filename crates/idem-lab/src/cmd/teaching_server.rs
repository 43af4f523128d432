//! `idem-lab teaching-server`: one of the article's wrong answers as a server
//! on an address, so anyone can send it charges (or point `idem-lab verify`
//! at it) and see the race for themselves.

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use idem_core::acquirer::AcquirerClient;

use crate::demo::teaching::{self, Teaching};

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// check-then-act (charges twice under a race) or hold-transaction
    /// (charges once, holding a lock across the acquirer call).
    #[arg(value_enum)]
    strategy: Teaching,
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Where its one table lives: postgres://... or sqlite://FILE.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The acquirer it captures at.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    acquirer_url: String,
    /// The merchant it captures for (any bearer secret is taken).
    #[arg(long, default_value = "teaching")]
    merchant: String,
    /// How long one call to the acquirer may take.
    #[arg(long, value_parser = idem::cmd::parse_duration, default_value = "10s")]
    acquirer_timeout: Duration,
    /// Its pool's connections to the database.
    #[arg(long, default_value_t = 20)]
    db_max_connections: u32,
}

pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "idem-lab teaching-server: {} on http://{}",
        args.strategy.name(),
        listener.local_addr()?
    );
    let pool =
        teaching::connect(&args.database_url, args.db_max_connections, args.strategy).await?;
    let acquirer = AcquirerClient::new(&args.acquirer_url, args.acquirer_timeout, None)?;
    teaching::serve(
        args.strategy,
        listener,
        pool,
        acquirer,
        args.merchant,
        shutdown,
    )
    .await
}
