//! `idem refunds`: operators' view of refunds and what they may do to one,
//! as `idem charges` does for charges. `stuck` prints tab-separated lines;
//! `retry` and `resolve` act through the engine (the same operations as a
//! charge's), as `--actor`, audited.

use anyhow::Context;
use clap::{Subcommand, ValueEnum};

use super::args::{ActorArgs, DbArgs, EngineArgs};
use super::charges::{resolve, retry};
use idem_core::domain::RefundIntent;
use idem_core::idempotency::Resolution;
use idem_core::store::Store;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// List the refunds awaiting review (the acquirer's answer contradicted
    /// them, or it had none by the settle deadline): each stays pending, its
    /// amount reserved against its charge.
    Stuck(DbArgs),
    /// Re-drive a pending refund now: look its reference up at the acquirer,
    /// and refund with the same reference only where the acquirer has no
    /// outcome. Refused while another attempt holds it.
    Retry {
        id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Settle a refund awaiting review as the acquirer's records show it: the
    /// stored answer is the one idem would have stored (a failed refund gives
    /// its amount back to the charge), replayed to any late retry; its
    /// webhook and event go out. No acquirer call.
    Resolve {
        id: String,
        /// What the acquirer's records show.
        #[arg(long = "as", value_enum)]
        resolution: ResolutionArg,
        /// Why, for the audit trail (e.g. the acquirer's ticket).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub(crate) enum ResolutionArg {
    /// The acquirer paid it.
    Succeeded,
    /// It did not.
    Failed,
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Stuck(db) => stuck(&db).await,
        Command::Retry { id, actor, engine } => retry::<RefundIntent>(&id, &actor, &engine).await,
        Command::Resolve {
            id,
            resolution,
            reason,
            actor,
            engine,
        } => {
            let resolution = match resolution {
                ResolutionArg::Succeeded => Resolution::Succeeded,
                ResolutionArg::Failed => Resolution::Failed,
            };
            resolve::<RefundIntent>(&id, resolution, &reason, &actor, &engine).await
        }
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
