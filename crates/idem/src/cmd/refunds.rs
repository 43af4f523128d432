//! `idem refunds`: operators' view of refunds. `stuck` prints tab-separated
//! lines, as `idem charges stuck` does. (Settling a refund that awaits
//! review, as `idem charges resolve` does a charge, is not built yet: until
//! it is, only the acquirer's word settles one.)

use anyhow::Context;
use clap::Subcommand;

use super::args::DbArgs;
use idem_core::store::Store;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// List the refunds awaiting review (the acquirer's answer contradicted
    /// them, or it had none by the settle deadline): each stays pending, its
    /// amount reserved against its charge.
    Stuck(DbArgs),
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Stuck(db) => stuck(&db).await,
    }
}

async fn stuck(db: &DbArgs) -> anyhow::Result<()> {
    let store = Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")?;
    let stuck = store.stuck_refunds().await?;
    println!("id\tcharge_id\tmerchant\tamount_cents\tcurrency\tacquirer_reference\tcreated_at\treview_since\treason");
    for r in &stuck {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            r.id,
            r.charge_id,
            r.merchant,
            r.amount_cents,
            r.currency,
            r.acquirer_reference,
            r.created_at.to_rfc3339(),
            r.review_since.to_rfc3339(),
            r.review_reason.as_deref().unwrap_or("")
        );
    }
    eprintln!("{} refund(s) awaiting review", stuck.len());
    Ok(())
}
