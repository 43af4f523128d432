//! `idem reconcile`: the reconciler alone (it also runs inside `serve` and
//! `consume`), for one pass or until shutdown.

use tokio_util::sync::CancellationToken;

use super::args::{EngineArgs, ReconcilerArgs};
use crate::app;
use crate::workers::Reconciler;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// One pass, then exit (exit code 0 whatever it found; counts on stderr).
    #[arg(long)]
    pub(crate) once: bool,
    #[command(flatten)]
    pub(crate) reconciler: ReconcilerArgs,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// The reconciler alone: one pass with `--once`, else until `shutdown`.
pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (engine, store) = app::engine(&args.engine.settings()?).await?;
    let reconciler = Reconciler::new(engine, store, args.reconciler.config());
    if args.once {
        let report = reconciler.pass().await?;
        tracing::info!(?report, "reconciler pass");
        eprintln!(
            "settled {}, backed off {}, marked for review {}, skipped {}, errors {}",
            report.settled,
            report.backed_off,
            report.marked_for_review,
            report.skipped,
            report.errors
        );
        return Ok(());
    }
    reconciler.run(shutdown).await;
    Ok(())
}
