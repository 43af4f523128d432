//! `idem webhooks`: a merchant's webhook endpoints. `add` and
//! `rotate-secret` print the signing secret alone on stdout; every change is
//! recorded in the audit trail with `--actor`.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

use super::args::{parse_duration, ActorArgs, DbArgs, WebhookPolicyArgs};
use crate::webhooks::target;
use idem_core::domain::{EndpointId, WebhookEvent, WebhookSecret};
use idem_core::store::{Audit, EndpointChange, NewEndpoint, Store};

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Add an endpoint for a merchant and print its signing secret (once,
    /// alone on stdout; the endpoint's id goes to stderr).
    Add {
        /// The merchant's name.
        merchant: String,
        /// Where to POST: https:// to a public address (see --webhook-allow-private).
        url: String,
        /// The events it hears, comma-separated (default: every event):
        /// charge.captured, charge.declined, charge.failed,
        /// charge.review_required, charge.resolved.
        #[arg(long, value_delimiter = ',', value_parser = parse_event)]
        events: Option<Vec<WebhookEvent>>,
        #[command(flatten)]
        policy: WebhookPolicyArgs,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List the endpoints: id, merchant, URL, events, state (never a secret).
    List(DbArgs),
    /// Remove an endpoint, with its deliveries.
    Remove {
        id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Give an endpoint a new signing secret and print it (once, alone on
    /// stdout). The old one signs too until the grace ends: at once by default.
    RotateSecret {
        id: String,
        /// How long the old secret keeps signing beside the new one (e.g. 24h).
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        grace: Duration,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Stop writing deliveries for an endpoint.
    Disable {
        id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Write deliveries for a disabled endpoint again.
    Enable {
        id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// The latest deliveries, newest first: event, endpoint, type, state,
    /// attempts, the last answer or error, and when the next attempt is due.
    Deliveries {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Send an event's deliveries again (a failed one, or one the merchant
    /// lost), from the schedule's start, under the same webhook-id.
    Redeliver {
        /// The event's id (`evt_...`, the webhook-id).
        event_id: String,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

fn parse_event(s: &str) -> Result<WebhookEvent, String> {
    WebhookEvent::parse(s)
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Add {
            merchant,
            url,
            events,
            policy,
            actor,
            db,
        } => add(&merchant, &url, events.as_deref(), policy, &actor, &db).await,
        Command::List(db) => list(&db).await,
        Command::Remove { id, actor, db } => change(&id, EndpointChange::Remove, &actor, &db).await,
        Command::RotateSecret {
            id,
            grace,
            actor,
            db,
        } => {
            let secret = WebhookSecret::generate();
            let rotate = EndpointChange::RotateSecret {
                secret: secret.expose(),
                grace,
            };
            change(&id, rotate, &actor, &db).await?;
            println!("{}", secret.expose());
            Ok(())
        }
        Command::Disable { id, actor, db } => {
            change(&id, EndpointChange::Disable, &actor, &db).await
        }
        Command::Enable { id, actor, db } => change(&id, EndpointChange::Enable, &actor, &db).await,
        Command::Deliveries { limit, db } => deliveries(limit, &db).await,
        Command::Redeliver {
            event_id,
            actor,
            db,
        } => redeliver(&event_id, &actor, &db).await,
    }
}

async fn deliveries(limit: i64, db: &DbArgs) -> anyhow::Result<()> {
    let store = connect(db).await?;
    println!("event_id\tendpoint\ttype\tstate\tattempts\tlast\tnext_attempt_at\tcreated_at");
    for d in store.webhook_deliveries(limit).await? {
        let last = match (d.last_status, &d.last_error) {
            (_, Some(error)) => error.replace(['\t', '\n'], " "),
            (Some(status), None) => status.to_string(),
            (None, None) => String::new(),
        };
        let next = if d.state == "pending" {
            d.next_attempt_at.to_rfc3339()
        } else {
            String::new()
        };
        println!(
            "{}\t{}\t{}\t{}\t{}\t{last}\t{next}\t{}",
            d.event_id,
            d.endpoint_id,
            d.event_type,
            d.state,
            d.attempts,
            d.created_at.to_rfc3339()
        );
    }
    Ok(())
}

async fn redeliver(event_id: &str, actor: &ActorArgs, db: &DbArgs) -> anyhow::Result<()> {
    let actor = actor.actor()?;
    let store = connect(db).await?;
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    let n = store.redeliver_webhook(event_id, &audit).await?;
    anyhow::ensure!(
        n > 0,
        "no delivered or failed delivery of event {event_id:?} (one still pending is being sent)"
    );
    eprintln!("{event_id}: {n} deliveries to send again");
    Ok(())
}

async fn connect(db: &DbArgs) -> anyhow::Result<Store> {
    Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")
}

async fn add(
    merchant: &str,
    url: &str,
    events: Option<&[WebhookEvent]>,
    policy: WebhookPolicyArgs,
    actor: &ActorArgs,
    db: &DbArgs,
) -> anyhow::Result<()> {
    let checked = target::resolve_checked(url, policy.policy())
        .await
        .with_context(|| format!("refusing {url:?}"))?;
    if policy.webhook_allow_private {
        tracing::warn!(url = %checked, "--webhook-allow-private: private addresses and http:// are allowed");
    }
    let actor = actor.actor()?;
    let store = connect(db).await?;
    let id = EndpointId::generate();
    let secret = WebhookSecret::generate();
    let names: Option<Vec<&str>> = events.map(|e| e.iter().map(|e| e.as_str()).collect());
    store
        .add_webhook_endpoint(
            &NewEndpoint {
                id: id.as_str(),
                merchant,
                url: checked.as_str(),
                events: names.as_deref(),
                secret: secret.expose(),
            },
            &Audit {
                actor: &actor,
                reason: None,
            },
        )
        .await?;
    eprintln!("endpoint {} added for {merchant}", id.as_str());
    println!("{}", secret.expose());
    Ok(())
}

async fn list(db: &DbArgs) -> anyhow::Result<()> {
    let store = connect(db).await?;
    println!("id\tmerchant\turl\tevents\tstate\tcreated_at");
    for e in store.webhook_endpoints().await? {
        let events = e.events.map_or_else(|| "all".to_owned(), |e| e.join(","));
        let state = match (e.disabled_at, e.previous_secret_until) {
            (Some(at), _) => format!("disabled since {}", at.to_rfc3339()),
            (None, Some(until)) => {
                format!("enabled; old secret signs until {}", until.to_rfc3339())
            }
            (None, None) => "enabled".to_owned(),
        };
        println!(
            "{}\t{}\t{}\t{events}\t{state}\t{}",
            e.id,
            e.merchant,
            e.url,
            e.created_at.to_rfc3339()
        );
    }
    Ok(())
}

async fn change(
    id: &str,
    change: EndpointChange<'_>,
    actor: &ActorArgs,
    db: &DbArgs,
) -> anyhow::Result<()> {
    let actor = actor.actor()?;
    let store = connect(db).await?;
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    let changed = store.change_webhook_endpoint(id, change, &audit).await?;
    let what = change.action();
    anyhow::ensure!(
        changed,
        "{what}: no endpoint {id:?}, or nothing to change (`idem webhooks list` shows them)"
    );
    eprintln!("{what}: {id}");
    Ok(())
}
