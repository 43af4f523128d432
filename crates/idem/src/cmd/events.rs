//! `idem events`: whether the deployment writes charge events to the outbox.
//! One setting in the database for every instance; a relay (`serve
//! --amqp-url`, `consume`) turns it on when it starts.

use anyhow::Context;
use clap::Subcommand;

use super::args::DbArgs;
use idem_core::store::Store;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Print `on` or `off`.
    Status(DbArgs),
    /// Write charge events to the outbox from now on (a relay must publish them).
    Enable(DbArgs),
    /// Stop writing charge events: for a deployment that no longer has a broker.
    Disable(DbArgs),
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    let (db, set) = match &command {
        Command::Status(db) => (db, None),
        Command::Enable(db) => (db, Some(true)),
        Command::Disable(db) => (db, Some(false)),
    };
    let store = Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")?;
    if let Some(enabled) = set {
        if store.set_events_enabled(enabled).await? {
            tracing::info!(enabled, "charge events switched");
        }
    }
    let enabled = store.events_enabled().await?;
    println!("{}", if enabled { "on" } else { "off" });
    Ok(())
}
