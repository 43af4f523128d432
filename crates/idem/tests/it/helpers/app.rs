//! The engine, the reconciler and `idem serve`'s router in process, and the
//! usual set-up of all of them (`Env`).

use std::time::Duration;

use idem::http::{self, AppState};
use idem::workers::{Reconciler, ReconcilerConfig};
use idem_core::acquirer::AcquirerClient;
use idem_core::idempotency::{Engine, EngineConfig};
use idem_core::store::Store;
use idem_lab::sim::Faults;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::http::Client;
use super::sim::TestSim;
use idem_testkit::db::TestDb;

/// Engine settings for in-process servers: short enough for tests to wait out.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        lease: Duration::from_secs(3),
        key_ttl: Duration::from_secs(24 * 3600),
        replay_cache_bytes: 1 << 20,
    }
}

/// An engine on `store`, talking to the simulator.
pub fn test_engine(
    store: Store,
    sim: &TestSim,
    config: EngineConfig,
    acquirer_timeout: Duration,
) -> Engine {
    let acquirer = AcquirerClient::new(&sim.url, acquirer_timeout, None).expect("acquirer client");
    Engine::new(store, acquirer, config)
}

/// A reconciler on the test database, talking to the simulator with a 500 ms
/// acquirer timeout; charges older than `settle_deadline` get their last look.
pub fn test_reconciler(db: &TestDb, sim: &TestSim, settle_deadline: Duration) -> Reconciler {
    test_reconciler_with(db, sim, Duration::from_millis(500), settle_deadline)
}

/// A reconciler of its own engine (the test's settings, `acquirer_timeout`)
/// on the test database, passing every 50 ms; charges older than
/// `settle_deadline` get their last look (`Duration::ZERO`: every one does).
pub fn test_reconciler_with(
    db: &TestDb,
    sim: &TestSim,
    acquirer_timeout: Duration,
    settle_deadline: Duration,
) -> Reconciler {
    Reconciler::new(
        test_engine(db.store.clone(), sim, test_config(), acquirer_timeout),
        db.store.clone(),
        ReconcilerConfig::new(Duration::from_millis(50), settle_deadline),
    )
}

/// `idem serve`'s router, in process, on port 0.
pub struct TestApp {
    pub url: String,
    stop: CancellationToken,
}

impl TestApp {
    pub async fn start(db: &TestDb, sim: &TestSim) -> Self {
        Self::start_with(db, sim, test_config(), Duration::from_secs(2)).await
    }

    pub async fn start_with(
        db: &TestDb,
        sim: &TestSim,
        config: EngineConfig,
        acquirer_timeout: Duration,
    ) -> Self {
        Self::start_on(
            test_engine(db.store.clone(), sim, config, acquirer_timeout),
            db.store.clone(),
            acquirer_timeout,
        )
        .await
    }

    /// On a given engine and its store (e.g. one that goes through a [`DbProxy`]).
    pub async fn start_on(engine: Engine, store: Store, acquirer_timeout: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = CancellationToken::new();
        tokio::spawn(http::serve(
            listener,
            AppState::new(engine, store),
            http::request_timeout(acquirer_timeout),
            stop.clone(),
        ));
        Self { url, stop }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The usual set-up: a database, a simulator, an in-process server and a
/// client for a merchant named `loja`.
pub struct Env {
    pub db: TestDb,
    pub sim: TestSim,
    pub app: TestApp,
    pub client: Client,
}

impl Env {
    pub async fn start(faults: Faults) -> Self {
        Self::start_with(faults, test_config(), Duration::from_secs(2)).await
    }

    /// The usual set-up with a short key TTL (and acquirer timeout).
    pub async fn with_key_ttl(key_ttl: Duration, acquirer_timeout: Duration) -> Self {
        let config = EngineConfig {
            key_ttl,
            ..test_config()
        };
        Self::start_with(Faults::default(), config, acquirer_timeout).await
    }

    pub async fn start_with(
        faults: Faults,
        config: EngineConfig,
        acquirer_timeout: Duration,
    ) -> Self {
        let db = TestDb::new().await;
        let sim = TestSim::start(faults).await;
        let app = TestApp::start_with(&db, &sim, config, acquirer_timeout).await;
        let client = Client::new(&app.url, &db.merchant("loja").await);
        Self {
            db,
            sim,
            app,
            client,
        }
    }
}
