//! `idem merchant` (or `idem tenant`, its older name): manages merchants and their
//! secrets. `create` and `rotate` print the new secret alone on stdout; every
//! change is recorded in the audit trail with `--actor`.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

use super::args::{parse_duration, ActorArgs, DbArgs};
use idem_core::domain::{parse_merchant_name, MerchantSecret};
use idem_core::store::{Audit, MerchantListing, Store};

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Add a merchant and print its new secret (once, alone on stdout).
    Create {
        /// The merchant's name, also sent to the acquirer: a slug, 1 to 100
        /// of a-z, 0-9, '.', '_' and '-' (it is a routing key on the broker).
        name: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List the merchants: name, created, state, and each secret's creation
    /// and expiry (never the secrets).
    List(DbArgs),
    /// Give a merchant a new secret and print it (once, alone on stdout). Its
    /// older secrets stop working when the grace ends: at once by default.
    Rotate {
        name: String,
        /// How long the older secrets keep working, for clients to move to
        /// the new one (e.g. 10m, 24h).
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        grace: Duration,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Refuse every secret of a merchant, and dead-letter its queue commands.
    Disable {
        name: String,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Accept a disabled merchant's live secrets again.
    Enable {
        name: String,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Create { name, actor, db } => create(&name, &actor, &db).await,
        Command::List(db) => list(&db).await,
        Command::Rotate {
            name,
            grace,
            actor,
            db,
        } => rotate(&name, grace, &actor, &db).await,
        Command::Disable {
            name,
            reason,
            actor,
            db,
        } => set_disabled(&name, true, reason.as_deref(), &actor, &db).await,
        Command::Enable {
            name,
            reason,
            actor,
            db,
        } => set_disabled(&name, false, reason.as_deref(), &actor, &db).await,
    }
}

async fn connect(db: &DbArgs) -> anyhow::Result<Store> {
    Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")
}

async fn create(name: &str, actor: &ActorArgs, db: &DbArgs) -> anyhow::Result<()> {
    let name =
        parse_merchant_name(name).map_err(|rule| anyhow::anyhow!("refusing {name:?}: {rule}"))?;
    let actor = actor.actor()?;
    let store = connect(db).await?;
    let secret = MerchantSecret::generate();
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    let merchant = store.create_merchant(name, &secret.hash(), &audit).await?;
    tracing::info!(merchant = %merchant.name, "merchant created");
    println!("{}", secret.expose());
    Ok(())
}

async fn list(db: &DbArgs) -> anyhow::Result<()> {
    let store = connect(db).await?;
    let listing = store.merchant_listing().await?;
    let now = chrono::Utc::now();
    println!("name\tcreated_at\tstate\tsecrets");
    for t in &listing {
        println!(
            "{}\t{}\t{}\t{}",
            t.merchant.name,
            t.created_at.to_rfc3339(),
            state(t),
            secrets(t, now)
        );
    }
    eprintln!("{} merchant(s)", listing.len());
    Ok(())
}

fn state(t: &MerchantListing) -> String {
    match t.disabled_at {
        Some(at) => format!("disabled since {}", at.to_rfc3339()),
        None => "enabled".to_owned(),
    }
}

/// Each secret as `#id created ... (live | live until ... | expired ...)`, `; `-separated.
fn secrets(t: &MerchantListing, now: chrono::DateTime<chrono::Utc>) -> String {
    let described: Vec<String> = t
        .secrets
        .iter()
        .map(|s| {
            let state = match s.expires_at {
                None => "live".to_owned(),
                Some(at) if at > now => format!("live until {}", at.to_rfc3339()),
                Some(at) => format!("expired {}", at.to_rfc3339()),
            };
            format!("#{} created {} ({state})", s.id, s.created_at.to_rfc3339())
        })
        .collect();
    described.join("; ")
}

async fn rotate(name: &str, grace: Duration, actor: &ActorArgs, db: &DbArgs) -> anyhow::Result<()> {
    let actor = actor.actor()?;
    let store = connect(db).await?;
    let secret = MerchantSecret::generate();
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    let rotation = store
        .rotate_secret(name, &secret.hash(), grace, &audit)
        .await?;
    match rotation.retired_until {
        Some(until) => eprintln!(
            "{name}: new secret; {} older secret(s) work until {}",
            rotation.retired,
            until.to_rfc3339()
        ),
        None => eprintln!("{name}: new secret; no older secret was live"),
    }
    println!("{}", secret.expose());
    Ok(())
}

async fn set_disabled(
    name: &str,
    disabled: bool,
    reason: Option<&str>,
    actor: &ActorArgs,
    db: &DbArgs,
) -> anyhow::Result<()> {
    let actor = actor.actor()?;
    let store = connect(db).await?;
    let audit = Audit {
        actor: &actor,
        reason,
    };
    let changed = store.set_merchant_disabled(name, disabled, &audit).await?;
    let state = if disabled { "disabled" } else { "enabled" };
    if changed {
        eprintln!("{name}: {state}");
    } else {
        eprintln!("{name}: already {state}; nothing changed");
    }
    Ok(())
}
