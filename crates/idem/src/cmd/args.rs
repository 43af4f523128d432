//! The argument groups that several subcommands flatten (the database, the
//! engine, the workers, the queue), the duration parser they share, and their
//! conversion into `app`'s settings.

use std::time::Duration;

use clap::Args;

use crate::app;
use crate::workers::ReconcilerConfig;

/// RabbitMQ on this machine, as `docs/contract/queue.md` starts it.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[derive(Args, Debug, Clone)]
pub(crate) struct DbArgs {
    /// `postgres://...` or `sqlite://path`; without one, the embedded store
    /// `sqlite://idem.db` in the working directory.
    #[arg(long, env = "DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Connections in this process's pool, at least 2 (on PostgreSQL, up to
    /// 3 of them, never more than half, carry the batches).
    #[arg(long, env = "IDEM_DB_MAX_CONNECTIONS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub(crate) db_max_connections: u32,
}

/// Who does an operator's action, for the audit trail.
#[derive(Args, Debug, Clone)]
pub(crate) struct ActorArgs {
    /// The operator's name in the audit trail (1 to 100 characters); by
    /// default the OS user running the command.
    #[arg(long, env = "IDEM_ACTOR")]
    pub(crate) actor: Option<String>,
}

impl ActorArgs {
    /// `--actor`, else the OS user (by the process's user id, as `id -un`).
    pub(crate) fn actor(&self) -> anyhow::Result<String> {
        let actor = match &self.actor {
            Some(given) => given.trim().to_owned(),
            None => whoami::username()
                .map_err(|e| anyhow::anyhow!("who is acting? pass --actor NAME ({e})"))?,
        };
        anyhow::ensure!(
            (1..=100).contains(&actor.chars().count()),
            "--actor {actor:?}: write 1 to 100 characters"
        );
        Ok(actor)
    }
}

/// Where webhooks may go: shared by `idem webhooks add` and the processes
/// that deliver them.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct WebhookPolicyArgs {
    /// Allow webhook URLs to private, loopback and link-local addresses, and
    /// plain http:// (for receivers on a private network, and tests). By
    /// default only https:// to public addresses.
    #[arg(long, env = "IDEM_WEBHOOK_ALLOW_PRIVATE")]
    pub(crate) webhook_allow_private: bool,
}

impl WebhookPolicyArgs {
    pub(crate) fn policy(self) -> crate::webhooks::target::AddressPolicy {
        use crate::webhooks::target::AddressPolicy;
        if self.webhook_allow_private {
            AddressPolicy::AllowPrivate
        } else {
            AddressPolicy::PublicOnly
        }
    }
}

/// What the charge engine needs, shared by `serve` and `reconcile`.
#[derive(Args, Debug, Clone)]
pub(crate) struct EngineArgs {
    /// Base URL of the acquirer.
    #[arg(
        long,
        env = "IDEM_ACQUIRER_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub(crate) acquirer_url: String,
    /// A PEM file of CA certificates to trust for an HTTPS acquirer, beside
    /// the system's roots (for an acquirer with a private CA).
    #[arg(long, env = "IDEM_ACQUIRER_CA")]
    pub(crate) acquirer_ca: Option<std::path::PathBuf>,
    /// How long one call to the acquirer may take before its outcome is unknown.
    #[arg(long, env = "IDEM_ACQUIRER_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub(crate) acquirer_timeout: Duration,
    /// How long a claim's holder may work before another attempt may take over.
    /// Must be longer than --acquirer-timeout.
    #[arg(long, env = "IDEM_LEASE", value_parser = parse_duration, default_value = "30s")]
    pub(crate) lease: Duration,
    /// How long a key and its stored outcome are honoured after the outcome is stored.
    #[arg(long, env = "IDEM_KEY_TTL", value_parser = parse_duration, default_value = "24h")]
    pub(crate) key_ttl: Duration,
    /// Bytes of completed outcomes this process keeps to answer replays
    /// without reading the database, until each key's expiry (0: none).
    #[arg(long, env = "IDEM_REPLAY_CACHE_BYTES", default_value_t = 8 << 20)]
    pub(crate) replay_cache_bytes: u64,
    #[command(flatten)]
    pub(crate) db: DbArgs,
}

/// The reconciler's settings, shared by `serve` and `reconcile`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ReconcilerArgs {
    /// Pause between reconciler passes.
    #[arg(long, env = "IDEM_RECONCILE_INTERVAL", value_parser = parse_duration, default_value = "1s")]
    pub(crate) reconcile_interval: Duration,
    /// Past this age, a charge without the acquirer's word is marked for review.
    #[arg(long, env = "IDEM_SETTLE_DEADLINE", value_parser = parse_duration, default_value = "24h")]
    pub(crate) settle_deadline: Duration,
    /// An authorization (`"capture": false`) not captured within this is
    /// voided by the reconciler, at the acquirer, with its own reference.
    #[arg(long, env = "IDEM_AUTHORIZATION_TTL", value_parser = parse_duration, default_value = "7d")]
    pub(crate) authorization_ttl: Duration,
}

/// The background workers beside `serve` and `consume`.
#[derive(Args, Debug, Clone)]
pub(crate) struct WorkerArgs {
    /// Do not run the reconciler and the sweeper in this process.
    #[arg(long, env = "IDEM_NO_WORKERS")]
    pub(crate) no_workers: bool,
    /// Pause between sweeps of expired keys.
    #[arg(long, env = "IDEM_SWEEP_INTERVAL", value_parser = parse_duration, default_value = "60s")]
    pub(crate) sweep_interval: Duration,
    /// How long the tombstone of an expired key lives past the key's expiry:
    /// a late retry of the same request then gets 410 Gone, not a new charge.
    #[arg(long, env = "IDEM_TOMBSTONE_TTL", value_parser = parse_duration, default_value = "30d")]
    pub(crate) tombstone_ttl: Duration,
    #[command(flatten)]
    pub(crate) reconciler: ReconcilerArgs,
    #[command(flatten)]
    pub(crate) webhooks: WebhookArgs,
}

/// The webhook deliverer's settings (it runs with the workers).
#[derive(Args, Debug, Clone)]
pub(crate) struct WebhookArgs {
    #[command(flatten)]
    pub(crate) policy: WebhookPolicyArgs,
    /// The waits before each retry of a webhook that was not delivered,
    /// comma-separated; after the last, the delivery is failed. The default
    /// spans about three days.
    #[arg(
        long,
        env = "IDEM_WEBHOOK_RETRY_SCHEDULE",
        value_delimiter = ',',
        value_parser = parse_duration,
        default_value = "5s,5m,30m,2h,5h,10h,10h,14h,14h,14h"
    )]
    pub(crate) webhook_retry_schedule: Vec<Duration>,
    /// How long one webhook attempt may take in all (connecting takes at most 5 s of it).
    #[arg(long, env = "IDEM_WEBHOOK_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub(crate) webhook_timeout: Duration,
}

impl WebhookArgs {
    pub(crate) fn config(&self) -> crate::webhooks::DelivererConfig {
        let defaults = crate::webhooks::DelivererConfig::new(self.policy.policy());
        crate::webhooks::DelivererConfig {
            schedule: self.webhook_retry_schedule.clone(),
            timeout: self.webhook_timeout,
            connect_timeout: defaults.connect_timeout.min(self.webhook_timeout),
            ..defaults
        }
    }
}

/// The queue consumer's and the outbox relay's settings.
#[derive(Args, Debug, Clone)]
pub(crate) struct QueueArgs {
    /// Commands the broker may send ahead of acks; also how many are worked at once.
    #[arg(long, env = "IDEM_PREFETCH", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) prefetch: u16,
    /// Between looks at the outbox for messages that other processes wrote.
    #[arg(long, env = "IDEM_OUTBOX_POLL", value_parser = parse_duration, default_value = "250ms")]
    pub(crate) outbox_poll: Duration,
    /// How long published outbox messages are kept before they are pruned.
    #[arg(long, env = "IDEM_OUTBOX_RETENTION", value_parser = parse_duration, default_value = "24h")]
    pub(crate) outbox_retention: Duration,
}

/// `500ms`, `30s`, `24h`, `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 24h)"))
}

impl DbArgs {
    /// The database URL given, or the embedded default (said once in the log).
    pub(crate) fn url(&self) -> String {
        database_url_or_default(self.database_url.as_deref())
    }
}

fn database_url_or_default(given: Option<&str>) -> String {
    match given {
        Some(url) => url.to_owned(),
        None => {
            tracing::info!(
                database_url = idem_core::store::DEFAULT_DATABASE_URL,
                "no --database-url or DATABASE_URL: using the embedded SQLite store"
            );
            idem_core::store::DEFAULT_DATABASE_URL.to_owned()
        }
    }
}

impl EngineArgs {
    /// The engine's settings, once the flags agree with each other; resolves
    /// the database URL (after the check, so a refusal logs nothing before it).
    pub(crate) fn settings(&self) -> anyhow::Result<app::EngineSettings> {
        anyhow::ensure!(
            self.lease > self.acquirer_timeout,
            "--lease ({}) must be longer than --acquirer-timeout ({}), or live attempts would be taken over",
            humantime::format_duration(self.lease),
            humantime::format_duration(self.acquirer_timeout)
        );
        Ok(app::EngineSettings {
            database_url: self.db.url(),
            db_max_connections: self.db.db_max_connections,
            acquirer_url: self.acquirer_url.clone(),
            acquirer_ca: self.acquirer_ca.clone(),
            acquirer_timeout: self.acquirer_timeout,
            lease: self.lease,
            key_ttl: self.key_ttl,
            replay_cache_bytes: self.replay_cache_bytes,
        })
    }
}

impl ReconcilerArgs {
    /// The reconciler's pace and deadline (its backoff is its own).
    pub(crate) fn config(&self) -> ReconcilerConfig {
        ReconcilerConfig::new(self.reconcile_interval, self.settle_deadline)
            .with_authorization_ttl(self.authorization_ttl)
    }
}

impl WorkerArgs {
    /// The workers to run beside the process, none with `--no-workers`.
    pub(crate) fn workers(&self) -> Option<app::Workers> {
        (!self.no_workers).then(|| app::Workers {
            sweep_interval: self.sweep_interval,
            tombstone_ttl: self.tombstone_ttl,
            reconciler: self.reconciler.config(),
            webhooks: self.webhooks.config(),
        })
    }
}

impl QueueArgs {
    /// The relay's and the consumer's settings, on the broker at `amqp_url`.
    pub(crate) fn queue(&self, amqp_url: String) -> app::Queue {
        app::Queue {
            amqp_url,
            prefetch: self.prefetch,
            outbox_poll: self.outbox_poll,
            outbox_retention: self.outbox_retention,
        }
    }
}
