//! `idem steps`: what an operator may do to one capture or void of a
//! two-step payment (`cp_...`, `vd_...`), as `idem refunds` does for a
//! refund: `retry` and `resolve`, through the engine, as `--actor`, audited.
//! The id's prefix says which operation it is.

use clap::Subcommand;

use super::args::{ActorArgs, EngineArgs};
use super::charges::{resolve, retry};
use super::refunds::ResolutionArg;
use idem_core::domain::{CaptureIntent, StepId, StepKind, VoidIntent};
use idem_core::idempotency::Resolution;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Re-drive a pending capture or void now: look its reference up at the
    /// acquirer, and call with the same reference only where the acquirer has
    /// no outcome. Refused while another attempt holds it.
    Retry {
        /// `cp_...` or `vd_...`.
        id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Settle a capture or void awaiting review as the acquirer's records
    /// show it: the stored answer is the one idem would have stored (a failed
    /// step gives its reservation back to the authorization), replayed to any
    /// late retry; its webhook and event go out. No acquirer call.
    Resolve {
        /// `cp_...` or `vd_...`.
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

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Retry { id, actor, engine } => match kind(&id)? {
            StepKind::Capture => retry::<CaptureIntent>(&id, &actor, &engine).await,
            StepKind::Void => retry::<VoidIntent>(&id, &actor, &engine).await,
        },
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
            match kind(&id)? {
                StepKind::Capture => {
                    resolve::<CaptureIntent>(&id, resolution, &reason, &actor, &engine).await
                }
                StepKind::Void => {
                    resolve::<VoidIntent>(&id, resolution, &reason, &actor, &engine).await
                }
            }
        }
    }
}

/// Which step `id` names, by its shape.
fn kind(id: &str) -> anyhow::Result<StepKind> {
    [StepKind::Capture, StepKind::Void]
        .into_iter()
        .find(|kind| StepId::parse(id, *kind).is_some())
        .ok_or_else(|| {
            anyhow::anyhow!("{id:?} is not a capture's (cp_...) or a void's (vd_...) id")
        })
}
