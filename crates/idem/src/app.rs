//! The composition root: builds the engine from its settings, and starts and
//! stops the long-running processes, `idem serve` and `idem consume`, in order.
//! The command line (`crate::cmd`) parses the flags into the plain settings
//! below and calls in here; this module knows nothing of flags.
//!
//! `serve` builds the engine (its pool connects lazily), binds the API's
//! listener, then starts the metrics listener, the workers and the queue's
//! tasks, and serves last; `consume` starts the workers, the queue's tasks,
//! then the metrics listener. On shutdown (the token cancelled) the API
//! finishes its requests in flight; then the consumer finishes the commands
//! it holds, and only then is the relay told to stop, so what was written is
//! published; then the process waits for every task it started (the workers
//! and the metrics listener stop on the token itself).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::http::{self, AppState};
use crate::queue::{Consumer, ConsumerConfig, Relay, RelayConfig};
use crate::webhooks::{Deliverer, DelivererConfig};
use crate::workers::{Reconciler, ReconcilerConfig, Sweeper};
use idem_core::acquirer::AcquirerClient;
use idem_core::idempotency::{Engine, EngineConfig};
use idem_core::store::Store;

/// How long the broker may take to confirm one batch of the outbox.
const RELAY_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// What the engine is built from: its store, its acquirer and its clocks.
#[derive(Debug, Clone)]
pub(crate) struct EngineSettings {
    /// `postgres://...` or `sqlite://path`, already resolved.
    pub(crate) database_url: String,
    /// Connections in this process's pool.
    pub(crate) db_max_connections: u32,
    /// Base URL of the acquirer.
    pub(crate) acquirer_url: String,
    /// CA certificates (PEM) to trust beside the system's, for an HTTPS acquirer.
    pub(crate) acquirer_ca: Option<PathBuf>,
    /// How long one call to the acquirer may take before its outcome is unknown.
    pub(crate) acquirer_timeout: Duration,
    /// How long a claim's holder may work before another attempt may take over;
    /// longer than `acquirer_timeout`.
    pub(crate) lease: Duration,
    /// How long a key and its stored outcome are honoured.
    pub(crate) key_ttl: Duration,
    /// Bytes of completed outcomes kept in memory for replays (0: none).
    pub(crate) replay_cache_bytes: u64,
}

/// The reconciler and the sweeper beside `serve` and `consume`.
#[derive(Debug, Clone)]
pub(crate) struct Workers {
    /// Pause between sweeps of expired keys.
    pub(crate) sweep_interval: Duration,
    /// How long an expired key's tombstone lives past the key's expiry.
    pub(crate) tombstone_ttl: Duration,
    pub(crate) reconciler: ReconcilerConfig,
    /// The webhook deliverer's pace and bounds.
    pub(crate) webhooks: DelivererConfig,
}

/// The outbox relay's and the queue consumer's broker and pace.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    /// RabbitMQ URL.
    pub(crate) amqp_url: String,
    /// Commands the broker may send ahead of acks; also how many are worked at once.
    pub(crate) prefetch: u16,
    /// Between looks at the outbox for messages that other processes wrote.
    pub(crate) outbox_poll: Duration,
    /// How long published outbox messages are kept before they are pruned.
    pub(crate) outbox_retention: Duration,
}

/// The operator console: where, and the flag's token (named tokens are in the database).
#[derive(Debug, Clone)]
pub(crate) struct Console {
    pub(crate) listen: SocketAddr,
    pub(crate) token: Option<String>,
}

/// `idem serve`: the API, and beside it what its settings ask for.
#[derive(Debug, Clone)]
pub(crate) struct Serve {
    /// Address to listen on.
    pub(crate) listen: SocketAddr,
    /// `/healthz`, `/readyz` and `/metrics` on this address instead of the API's.
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// The operator console, when asked for.
    pub(crate) console: Option<Console>,
    /// How long a connection may take to send a request's head (see [`http::Limits`]).
    pub(crate) header_read_timeout: Duration,
    /// /v1 requests worked at once.
    pub(crate) max_in_flight: usize,
    /// Of those, requests waiting on a duplicate's outcome (`Prefer: wait`).
    pub(crate) max_waiters: usize,
    /// The outbox relay on this broker, when there is one.
    pub(crate) queue: Option<Queue>,
    /// Also consume charge commands (only with `queue`).
    pub(crate) consume: bool,
    /// None: no reconciler and no sweeper in this process.
    pub(crate) workers: Option<Workers>,
    pub(crate) engine: EngineSettings,
}

/// `idem consume`: the consumer and the relay, and what else its settings ask for.
#[derive(Debug, Clone)]
pub(crate) struct Consume {
    /// `/healthz`, `/readyz` and `/metrics` on this address.
    pub(crate) metrics_listen: Option<SocketAddr>,
    pub(crate) queue: Queue,
    /// None: no reconciler and no sweeper in this process.
    pub(crate) workers: Option<Workers>,
    pub(crate) engine: EngineSettings,
}

/// The engine over its store, and the store: what the edges are given.
pub(crate) async fn engine(settings: &EngineSettings) -> anyhow::Result<(Engine, Store)> {
    let store = Store::connect_lazy(&settings.database_url, settings.db_max_connections)
        .context("the database URL")?;
    let acquirer = AcquirerClient::new(
        &settings.acquirer_url,
        settings.acquirer_timeout,
        settings.acquirer_ca.as_deref(),
    )?;
    let engine = Engine::new(
        store.clone(),
        acquirer,
        EngineConfig {
            lease: settings.lease,
            key_ttl: settings.key_ttl,
            replay_cache_bytes: settings.replay_cache_bytes,
        },
    );
    Ok((engine, store))
}

/// Starts the API on its configured address, with the reconciler and the
/// sweeper beside it, and runs them until `shutdown`.
pub(crate) async fn serve(config: Serve, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (engine, store) = engine(&config.engine).await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %listener.local_addr()?, acquirer = %config.engine.acquirer_url, "serving");
    let state = AppState::new(engine.clone(), store.clone());
    let workers = TaskTracker::new();
    workers.spawn(
        state
            .merchants
            .clone()
            .keep_fresh(store.clone(), shutdown.clone()),
    );
    if let Some(addr) = config.metrics_listen {
        spawn_metrics(&workers, addr, state.clone(), &shutdown).await?;
    }
    if let Some(console) = &config.console {
        let listener = TcpListener::bind(console.listen)
            .await
            .with_context(|| format!("binding {}", console.listen))?;
        tracing::info!(listen = %listener.local_addr()?, "serving the operator console");
        workers.spawn(http::serve_console(
            listener,
            engine.clone(),
            store.clone(),
            console.token.clone(),
            shutdown.clone(),
        ));
    }
    spawn_workers(
        &workers,
        &engine,
        &store,
        config.workers.as_ref(),
        &shutdown,
    )?;
    if config.queue.is_some() {
        // Before the API takes its first request, so that none of its outcomes
        // misses its event; if the database does not answer yet, the relay
        // keeps trying (and no outcome is stored meanwhile either).
        if let Err(e) = store.set_events_enabled(true).await {
            tracing::warn!(error = %e, "cannot turn charge events on yet; the relay will");
        }
    }
    let queue = config
        .queue
        .as_ref()
        .map(|queue| spawn_queue(&workers, &engine, &store, queue, config.consume, &shutdown));
    workers.close();
    let limits = http::Limits {
        request_timeout: http::request_timeout(config.engine.acquirer_timeout),
        header_read_timeout: config.header_read_timeout,
        max_in_flight: config.max_in_flight,
        max_waiters: config.max_waiters,
    };
    let with_metrics = config.metrics_listen.is_none();
    let served = http::serve_with(listener, state, limits, with_metrics, shutdown).await;
    if let Some(queue) = queue {
        queue.stop().await;
    }
    workers.wait().await;
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// `--metrics-listen`: `/healthz`, `/readyz` and `/metrics` on a listener of
/// their own, until `shutdown`.
async fn spawn_metrics(
    tracker: &TaskTracker,
    addr: SocketAddr,
    state: AppState,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(listen = %listener.local_addr()?, "serving metrics");
    tracker.spawn(http::serve_ops(listener, state, shutdown.clone()));
    Ok(())
}

/// The reconciler, the sweeper and the webhook deliverer, unless there are
/// no `workers`.
fn spawn_workers(
    tracker: &TaskTracker,
    engine: &Engine,
    store: &Store,
    workers: Option<&Workers>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let Some(workers) = workers else {
        return Ok(());
    };
    let deliverer = Deliverer::new(store.clone(), workers.webhooks.clone())
        .context("the webhook deliverer's HTTP client")?;
    let reconciler = Reconciler::new(engine.clone(), store.clone(), workers.reconciler);
    tracker.spawn(reconciler.run(shutdown.clone()));
    let sweeper = Sweeper::new(store.clone(), workers.sweep_interval)
        .with_tombstone_ttl(workers.tombstone_ttl);
    tracker.spawn(sweeper.run(shutdown.clone()));
    tracker.spawn(deliverer.run(shutdown.clone()));
    Ok(())
}

/// The outbox relay, and with `consume` the queue consumer beside it.
fn spawn_queue(
    tracker: &TaskTracker,
    engine: &Engine,
    store: &Store,
    queue: &Queue,
    consume: bool,
    shutdown: &CancellationToken,
) -> QueueTasks {
    let wake = Arc::new(Notify::new());
    let relay = Relay::new(
        store.clone(),
        RelayConfig {
            amqp_url: queue.amqp_url.clone(),
            poll_interval: queue.outbox_poll,
            retention: queue.outbox_retention,
            confirm_timeout: RELAY_CONFIRM_TIMEOUT,
        },
        wake.clone(),
    );
    let relay_stop = CancellationToken::new();
    tracker.spawn(relay.run(relay_stop.clone()));
    let consumer = consume.then(|| {
        let consumer = Consumer::new(
            engine.clone(),
            store.clone(),
            ConsumerConfig {
                amqp_url: queue.amqp_url.clone(),
                prefetch: queue.prefetch,
            },
            wake,
        );
        tracker.spawn(consumer.run(shutdown.clone()))
    });
    QueueTasks {
        relay_stop,
        consumer,
    }
}

/// The queue's tasks, stopped in order: the consumer finishes what it holds,
/// then the relay publishes what was written and stops.
struct QueueTasks {
    relay_stop: CancellationToken,
    consumer: Option<tokio::task::JoinHandle<()>>,
}

impl QueueTasks {
    /// Call once shutdown has begun and this process's other writers (the API) are done.
    async fn stop(self) {
        if let Some(consumer) = self.consumer {
            let _ = consumer.await;
        }
        self.relay_stop.cancel();
    }
}

/// `idem consume`: the consumer and the relay, with the workers beside them,
/// until `shutdown`.
pub(crate) async fn consume(config: Consume, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (engine, store) = engine(&config.engine).await?;
    tracing::info!(acquirer = %config.engine.acquirer_url, "consuming charge commands");
    let tasks = TaskTracker::new();
    // The metrics first, as in `serve`: the recorder is installed before
    // anything counts (a count made before it is lost), and a metrics address
    // that cannot be bound stops the process before it takes any command.
    let state = AppState::new(engine.clone(), store.clone());
    if let Some(addr) = config.metrics_listen {
        spawn_metrics(&tasks, addr, state, &shutdown).await?;
    }
    spawn_workers(&tasks, &engine, &store, config.workers.as_ref(), &shutdown)?;
    let queue = spawn_queue(&tasks, &engine, &store, &config.queue, true, &shutdown);
    tasks.close();
    shutdown.cancelled().await;
    queue.stop().await;
    tasks.wait().await;
    tracing::info!("stopped");
    Ok(())
}
