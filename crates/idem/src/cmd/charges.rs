//! `idem charges`: inspects charges; `stuck` lists those awaiting review.

use anyhow::Context;
use clap::Subcommand;

use super::args::DbArgs;
use crate::store::Store;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// List the charges awaiting review: past the settle deadline without the acquirer's word.
    Stuck(DbArgs),
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Stuck(db) => stuck(&db).await,
    }
}

/// Prints the charges awaiting review, one per line, tab-separated.
async fn stuck(db: &DbArgs) -> anyhow::Result<()> {
    let store = Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")?;
    let stuck = store.stuck_charges().await?;
    println!("id\tmerchant\torder_id\tamount_cents\tcurrency\tacquirer_reference\tcreated_at\treview_since\treason");
    for c in &stuck {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            c.id,
            c.merchant,
            c.order_id,
            c.amount_cents,
            c.currency,
            c.acquirer_reference,
            c.created_at.to_rfc3339(),
            c.review_since.to_rfc3339(),
            c.review_reason.as_deref().unwrap_or("")
        );
    }
    eprintln!("{} charge(s) awaiting review", stuck.len());
    Ok(())
}
