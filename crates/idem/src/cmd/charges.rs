//! `idem charges`: operators' view of charges and what they may do to one.
//! `stuck` and `list` print tab-separated lines, `show` one JSON document;
//! `retry` and `resolve` act through the engine, as `--actor`, audited.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Subcommand, ValueEnum};

use super::args::{ActorArgs, DbArgs, EngineArgs};
use crate::app;
use idem_core::domain::{ChargeId, ChargeRequest, ChargeStatus};
use idem_core::idempotency::{Operation, Outcome, Resolution};
use idem_core::store::{Audit, ChargeFilter, Store};

/// Audit records `show` prints with a charge, newest first.
const HISTORY_LIMIT: i64 = 100;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// List the charges awaiting review: past the settle deadline without the acquirer's word.
    Stuck(DbArgs),
    /// List charges, newest first.
    List {
        /// Only charges in this state (`review`: processing and awaiting review).
        #[arg(long, value_enum)]
        status: Option<StatusFilter>,
        /// Only charges made since then: a time (RFC 3339, e.g.
        /// 2026-12-04T10:00:00Z) or a duration ago (e.g. 1h).
        #[arg(long, value_parser = parse_since)]
        since: Option<DateTime<Utc>>,
        /// Only charges for this order.
        #[arg(long)]
        order_id: Option<i64>,
        /// Only this merchant's charges (by name).
        #[arg(long)]
        merchant: Option<String>,
        /// Only the charge made under this idempotency key.
        #[arg(long)]
        key: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Show one charge: the charge, its key record (attempts, lease, stored
    /// answer), its refunds and its history (the reconciler's looks,
    /// operators' actions).
    Show {
        id: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Re-drive a processing charge now: look its reference up at the
    /// acquirer, and capture with the same reference only where the acquirer
    /// has no outcome. Refused while another attempt holds it.
    Retry {
        id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Settle a charge awaiting review as the acquirer's records show it: the
    /// stored answer is the one idem would have stored, replayed to any late
    /// retry; its event goes out through the outbox. No acquirer call.
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
pub(crate) enum StatusFilter {
    Processing,
    Captured,
    Declined,
    Failed,
    Review,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub(crate) enum ResolutionArg {
    Captured,
    Failed,
}

fn parse_since(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(ago) = humantime::parse_duration(s) {
        let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
        return Ok(Utc::now() - ago);
    }
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| "write a time (2026-12-04T10:00:00Z) or a duration ago (1h)".to_owned())
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Stuck(db) => stuck(&db).await,
        Command::List {
            status,
            since,
            order_id,
            merchant,
            key,
            limit,
            db,
        } => {
            let filter = ChargeFilter {
                status: status.and_then(|s| match s {
                    StatusFilter::Processing => Some(ChargeStatus::Processing),
                    StatusFilter::Captured => Some(ChargeStatus::Captured),
                    StatusFilter::Declined => Some(ChargeStatus::Declined),
                    StatusFilter::Failed => Some(ChargeStatus::Failed),
                    StatusFilter::Review => None,
                }),
                awaiting_review: matches!(status, Some(StatusFilter::Review)),
                since,
                order_id,
                merchant,
                idempotency_key: key,
                oldest_first: false,
                limit: limit.max(0),
            };
            list(&filter, &db).await
        }
        Command::Show { id, db } => show(&id, &db).await,
        Command::Retry { id, actor, engine } => retry::<ChargeRequest>(&id, &actor, &engine).await,
        Command::Resolve {
            id,
            resolution,
            reason,
            actor,
            engine,
        } => {
            let resolution = match resolution {
                ResolutionArg::Captured => Resolution::Succeeded,
                ResolutionArg::Failed => Resolution::Failed,
            };
            resolve::<ChargeRequest>(&id, resolution, &reason, &actor, &engine).await
        }
    }
}

/// `retry` of a charge or a refund, through the engine, audited as the actor.
pub(super) async fn retry<O: Operation>(
    id: &str,
    actor: &ActorArgs,
    engine: &EngineArgs,
) -> anyhow::Result<()> {
    let actor = actor.actor()?;
    let (engine, _) = app::engine(&engine.settings()?).await?;
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    report(engine.retry::<O>(id, audit).await?)
}

/// `resolve` of a charge or a refund, through the engine, audited as the
/// actor with the reason.
pub(super) async fn resolve<O: Operation>(
    id: &str,
    resolution: Resolution,
    reason: &str,
    actor: &ActorArgs,
    engine: &EngineArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(!reason.trim().is_empty(), "--reason: say why");
    let actor = actor.actor()?;
    let (engine, _) = app::engine(&engine.settings()?).await?;
    let audit = Audit {
        actor: &actor,
        reason: Some(reason),
    };
    report(engine.resolve::<O>(id, resolution, audit).await?)
}

async fn connect(db: &DbArgs) -> anyhow::Result<Store> {
    Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")
}

/// What a retry or resolve of a charge or a refund came to: the stored
/// answer on stdout (as a replay would send it), a line on stderr.
fn report(outcome: Outcome) -> anyhow::Result<()> {
    match outcome {
        Outcome::Completed {
            subject, response, ..
        } => {
            eprintln!("{subject}: final; answer {} stored", response.status);
            println!("{}", String::from_utf8_lossy(&response.body));
            Ok(())
        }
        Outcome::Unknown {
            subject,
            retry_after,
        } => {
            anyhow::bail!(
                "{subject}: the acquirer's outcome is still unknown; try again in {} s",
                retry_after.as_secs().max(1)
            )
        }
        Outcome::UnderReview { subject, .. } => {
            let kind = subject.kind();
            anyhow::bail!(
                "{subject}: the acquirer's answer still cannot settle it (`idem {kind}s stuck` \
                 says why); it awaits review: resolve it with `idem {kind}s resolve`"
            )
        }
        other => anyhow::bail!("another attempt holds it now ({})", other.label()),
    }
}

/// Prints the charges awaiting review, one per line, tab-separated.
async fn stuck(db: &DbArgs) -> anyhow::Result<()> {
    let store = connect(db).await?;
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

async fn list(filter: &ChargeFilter, db: &DbArgs) -> anyhow::Result<()> {
    let store = connect(db).await?;
    let charges = store.charges(filter).await?;
    println!("id\tmerchant\torder_id\tamount_cents\tcurrency\tstatus\tcreated_at\treview_since");
    for c in &charges {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            c.id,
            c.merchant,
            c.order_id,
            c.amount_cents,
            c.currency,
            c.status,
            c.created_at.to_rfc3339(),
            c.review_since.map(|t| t.to_rfc3339()).unwrap_or_default()
        );
    }
    eprintln!("{} charge(s)", charges.len());
    Ok(())
}

async fn show(id: &str, db: &DbArgs) -> anyhow::Result<()> {
    let store = connect(db).await?;
    let record = store
        .charge_record(id)
        .await?
        .with_context(|| format!("no charge has the id {id:?}"))?;
    let history = store.audit_trail(Some(id), HISTORY_LIMIT).await?;
    let refunds = match ChargeId::parse(id) {
        Some(charge_id) => {
            store
                .refunds_of(record.charge.merchant_id, &charge_id)
                .await?
        }
        None => Vec::new(),
    };
    let shown = serde_json::json!({
        "charge": record.charge,
        "key": record.key,
        "refunds": refunds,
        "history": history,
    });
    println!("{}", serde_json::to_string_pretty(&shown)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_or_a_duration_ago() {
        let t = parse_since("2026-12-04T10:00:00Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-04T10:00:00+00:00");
        let ago = Utc::now() - parse_since("1h").unwrap();
        assert!((ago - chrono::Duration::hours(1)).num_seconds().abs() <= 1);
        assert!(parse_since("yesterday").is_err());
    }
}
