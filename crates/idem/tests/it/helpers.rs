//! Test harness: a database per test, an in-process simulator and server on
//! port 0, `idem serve` child processes, and a small HTTP client.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::http::{self, AppState};
use idem::workers::{Reconciler, ReconcilerConfig};
use idem_core::acquirer::AcquirerClient;
use idem_core::domain::MerchantSecret;
use idem_core::idempotency::{Engine, EngineConfig};
use idem_core::store::{Audit, Backend, Store};
use idem_lab::sim::{self, Faults, Ledger};
use reqwest::header::HeaderMap;
use sqlx::Connection;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use idem_testkit::run::{admin_url, runs_on, test_backend, timing_sensitive};

/// A database of its own for one test, dropped when the test ends: a fresh
/// PostgreSQL database, or a fresh SQLite file in a scratch directory.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    pub store: Store,
    /// For the tests' own SQL, on either backend.
    pub pool: sqlx::AnyPool,
    /// PostgreSQL: the database's name. SQLite: the scratch directory.
    place: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let db = Self::unmigrated().await;
        db.store.migrate().await.expect("migrate test db");
        db
    }

    /// A database of its own without idem's schema, for a test of the
    /// migrations themselves.
    pub async fn unmigrated() -> Self {
        Self::unmigrated_on(test_backend(), &std::env::temp_dir()).await
    }

    /// A migrated SQLite database in a scratch directory under `parent` (a
    /// [`SmallDisk`], say), whatever backend this run tests.
    pub async fn sqlite_in(parent: &std::path::Path) -> Self {
        let db = Self::unmigrated_on(Backend::Sqlite, parent).await;
        db.store.migrate().await.expect("migrate test db");
        db
    }

    async fn unmigrated_on(backend: Backend, parent: &std::path::Path) -> Self {
        sqlx::any::install_default_drivers();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (url, place) = match backend {
            Backend::Postgres => {
                let name = format!("idem_test_{id}");
                let admin = admin_url();
                let mut conn = sqlx::PgConnection::connect(&admin)
                    .await
                    .expect("PostgreSQL must be reachable at IDEM_TEST_ADMIN_URL (see README)");
                sqlx::query(&format!("create database {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                conn.close().await.ok();
                let url = match admin.rfind('/') {
                    Some(i) => format!("{}/{name}", &admin[..i]),
                    None => panic!("admin url has no database part"),
                };
                (url, name)
            }
            Backend::Sqlite => {
                let dir = parent.join(format!("idem_test_{id}"));
                std::fs::create_dir_all(&dir).expect("scratch directory");
                let url = format!("sqlite://{}/idem.db", dir.display());
                (url, dir.display().to_string())
            }
        };
        let store = Store::connect(&url, 5).await.expect("connect test db");
        let pool = sqlx::pool::PoolOptions::<sqlx::Any>::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("connect the tests' own pool");
        Self {
            url,
            backend,
            store,
            pool,
            place,
        }
    }

    /// A new merchant; returns its secret.
    pub async fn merchant(&self, name: &str) -> String {
        let secret = MerchantSecret::generate();
        self.store
            .create_merchant(
                name,
                &secret.hash(),
                &Audit {
                    actor: "test",
                    reason: None,
                },
            )
            .await
            .expect("create merchant");
        secret.expose().to_owned()
    }

    /// The store's id of the merchant named `name`.
    pub async fn merchant_id(&self, name: &str) -> i64 {
        let (id,): (i64,) = sqlx::query_as("select id from merchants where name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .expect("merchant id");
        id
    }

    pub async fn count(&self, table: &str) -> i64 {
        let (n,): (i64,) = sqlx::query_as(&format!("select count(*) from {table}"))
            .fetch_one(&self.pool)
            .await
            .expect("count");
        n
    }

    /// Runs one SQL statement (for tests that set up scenarios by hand).
    pub async fn exec(&self, sql: &str) {
        sqlx::query(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A trigger named `name` that makes the database refuse `event` (e.g.
    /// `before update of status on charges`) for the rows matching `when`
    /// (SQL on `new`), as a database can refuse what no parse foresaw.
    pub async fn refuse(&self, name: &str, event: &str, when: Option<&str>) {
        match self.backend {
            Backend::Postgres => {
                self.exec(&format!(
                    "create function {name}() returns trigger language plpgsql as $$
                     begin raise exception 'test: {name}'; end $$"
                ))
                .await;
                let when = when.map(|w| format!("when ({w})")).unwrap_or_default();
                self.exec(&format!(
                    "create trigger {name} {event} for each row {when} execute function {name}()"
                ))
                .await;
            }
            Backend::Sqlite => {
                let when = when.map(|w| format!("when {w}")).unwrap_or_default();
                self.exec(&format!(
                    "create trigger {name} {event} {when}
                     begin select raise(abort, 'test: {name}'); end"
                ))
                .await;
            }
        }
    }

    /// This backend's SQL for "now" in its time columns, for tests' own SQL.
    pub fn now(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "now()",
            Backend::Sqlite => "cast(unixepoch('subsec') * 1000 as integer)",
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let place = self.place.clone();
        if self.backend == Backend::Sqlite {
            let _ = std::fs::remove_dir_all(&place);
            return;
        }
        // A runtime of its own: Drop cannot await, and the test's may be gone.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("drop database if exists {place} with (force)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// The acquirer simulator, in process, over loopback.
pub struct TestSim {
    pub url: String,
    http: reqwest::Client,
    stop: CancellationToken,
}

impl TestSim {
    pub async fn start(faults: Faults) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind sim");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = CancellationToken::new();
        tokio::spawn(sim::serve(listener, faults, None, stop.clone()));
        Self {
            url,
            http: reqwest::Client::new(),
            stop,
        }
    }

    pub async fn set_faults(&self, faults: Faults) {
        let r = self
            .http
            .put(format!("{}/_sim/faults", self.url))
            .json(&faults)
            .send()
            .await
            .expect("set faults");
        assert!(r.status().is_success(), "set faults: {}", r.status());
    }

    pub async fn ledger(&self) -> Ledger {
        self.http
            .get(format!("{}/_sim/ledger", self.url))
            .send()
            .await
            .expect("ledger")
            .json()
            .await
            .expect("ledger json")
    }
}

impl Drop for TestSim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

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
    Reconciler::new(
        test_engine(
            db.store.clone(),
            sim,
            test_config(),
            Duration::from_millis(500),
        ),
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

/// A real `idem` child process (killed when dropped).
pub struct IdemProcess {
    child: Child,
}

impl IdemProcess {
    /// Starts `idem ARGS` against the test database, with extra environment.
    pub fn spawn(db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_on(&db.url, args, env)
    }

    /// Starts `idem ARGS` against the database at `db_url`.
    pub fn spawn_on(db_url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_bin(Path::new(env!("CARGO_BIN_EXE_idem")), db_url, args, env)
    }

    /// Starts the `idem` binary at `bin` (another release's, say) with `ARGS`.
    pub fn spawn_bin(bin: &Path, db_url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let child = Command::new(bin)
            .args(args)
            .env("DATABASE_URL", db_url)
            .envs(env.iter().copied())
            .env("IDEM_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn idem");
        Self { child }
    }

    /// Waits for the process to exit by itself (e.g. at a crash point).
    #[cfg(feature = "crash-points")]
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait")
    }

    /// SIGKILL: no shutdown, no cleanup, like a crash.
    pub fn kill_9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        self.child.wait().expect("wait")
    }
}

impl Drop for IdemProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `idem serve` process.
pub struct ServeProcess {
    pub url: String,
    process: IdemProcess,
}

impl std::ops::Deref for ServeProcess {
    type Target = IdemProcess;

    fn deref(&self) -> &IdemProcess {
        &self.process
    }
}

impl std::ops::DerefMut for ServeProcess {
    fn deref_mut(&mut self) -> &mut IdemProcess {
        &mut self.process
    }
}

impl ServeProcess {
    pub async fn start(db: &TestDb, sim: &TestSim, extra: &[&str]) -> Self {
        Self::start_env(db, sim, extra, &[]).await
    }

    /// With extra environment, e.g. `IDEM_CRASH_AT`.
    pub async fn start_env(
        db: &TestDb,
        sim: &TestSim,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_against(db, &sim.url, extra, env).await
    }

    /// Against the acquirer at `acquirer_url` (e.g. a simulator process on HTTPS).
    pub async fn start_against(
        db: &TestDb,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_on(&db.url, acquirer_url, extra, env).await
    }

    /// On the database at `db_url`, against the acquirer at `acquirer_url`.
    pub async fn start_on(
        db_url: &str,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let bin = Path::new(env!("CARGO_BIN_EXE_idem"));
        Self::start_bin(bin, db_url, acquirer_url, extra, env).await
    }

    /// [`ServeProcess::start_on`] with the `idem` binary at `bin`.
    pub async fn start_bin(
        bin: &Path,
        db_url: &str,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["serve", "--listen", &listen, "--acquirer-url", acquirer_url];
        args.extend_from_slice(extra);
        let process = IdemProcess::spawn_bin(bin, db_url, &args, env);
        let url = format!("http://{listen}");
        let started = Instant::now();
        let http = reqwest::Client::new();
        while http.get(format!("{url}/healthz")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "idem serve did not start"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Self { url, process }
    }
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr: SocketAddr = l.local_addr().expect("addr");
    addr.port()
}

/// One HTTP answer, kept whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
    pub elapsed: Duration,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem `type` of an error answer, checking its media type.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "status {} body {:?}",
            self.status,
            self.body
        );
        let p = self.json();
        assert_eq!(p["status"], self.status, "problem status matches");
        assert!(p["title"].is_string() && p["detail"].is_string(), "{p}");
        p["type"].as_str().expect("type").to_owned()
    }
}

/// A client for the charge API.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub secret: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, secret: &str) -> Self {
        Self {
            base: base.to_owned(),
            secret: secret.to_owned(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .expect("client"),
        }
    }

    /// `POST /v1/charges` with a JSON body given as text (so tests can send any bytes).
    pub async fn charge(&self, key: &str, body: &str) -> Answer {
        self.send(
            self.http
                .post(format!("{}/v1/charges", self.base))
                .bearer_auth(&self.secret)
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(body.to_owned()),
        )
        .await
    }

    pub async fn get_charge(&self, id: &str) -> Answer {
        self.send(
            self.http
                .get(format!("{}/v1/charges/{id}", self.base))
                .bearer_auth(&self.secret),
        )
        .await
    }

    /// Any request, built by the caller.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let started = Instant::now();
        let r = request.send().await.expect("request");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.bytes().await.expect("body");
        Answer {
            status,
            headers,
            body,
            elapsed: started.elapsed(),
        }
    }

    pub fn raw(&self) -> &reqwest::Client {
        &self.http
    }

    /// Retries a charge on `409` and `503` until it is final, as a good client would.
    pub async fn charge_until_final(&self, key: &str, body: &str) -> Answer {
        let started = Instant::now();
        loop {
            let a = self.charge(key, body).await;
            if a.status != 409 && a.status != 503 {
                return a;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "never final: {a:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A fresh random key, as a client makes one per intent.
pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub fn body(order_id: i64, amount_cents: i64) -> String {
    format!(r#"{{"order_id": {order_id}, "amount_cents": {amount_cents}}}"#)
}

/// Faults that make every capture call suffer `fault`.
pub fn failing(fault: idem_lab::sim::Fault) -> Faults {
    Faults {
        fault,
        ..Faults::default()
    }
}

/// Faults with only latency set.
pub fn latency(ms: u64) -> Faults {
    Faults {
        latency_ms: ms,
        ..Faults::default()
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

/// Runs `idem ARGS` to completion against the test database; returns its
/// exit status, stdout and stderr.
pub async fn run_idem(db: &TestDb, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    run_idem_env(db, args, &[]).await
}

/// [`run_idem`] with extra environment (which may override `DATABASE_URL`).
pub async fn run_idem_env(
    db: &TestDb,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    run_idem_on(&db.url, args, env).await
}

/// [`run_idem_env`] against the database at `db_url`.
pub async fn run_idem_on(
    db_url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    run_bin(Path::new(env!("CARGO_BIN_EXE_idem")), db_url, args, env).await
}

/// [`run_idem_on`] with the `idem` binary at `bin`.
pub async fn run_bin(
    bin: &Path,
    db_url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env("DATABASE_URL", db_url)
        .env("IDEM_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run idem");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A TCP proxy in front of PostgreSQL that a test can cut and restore, to take
/// the database away from a running server as a network failure would, or
/// freeze and thaw, as a partition that drops packets without a reset would.
pub struct DbProxy {
    pub url: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
    frozen: tokio::sync::watch::Sender<bool>,
    stop: CancellationToken,
}

impl DbProxy {
    pub async fn start(db: &TestDb) -> Self {
        Self::start_with_latency(db, Duration::ZERO).await
    }

    /// A proxy that holds each chunk from client to database for `latency`, so
    /// every statement takes at least that long: a slow or distant database.
    pub async fn start_with_latency(db: &TestDb, latency: Duration) -> Self {
        let target = reqwest::Url::parse(&db.url).expect("db url");
        let upstream = format!(
            "{}:{}",
            target.host_str().expect("host"),
            target.port().unwrap_or(5432)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let mut url = target.clone();
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(port)).expect("port");
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let (frozen, _) = tokio::sync::watch::channel(false);
        let stop = CancellationToken::new();
        let (cut2, gen2, frozen2, stop2) = (
            cut.clone(),
            generation.clone(),
            frozen.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            loop {
                let (inbound, _) = tokio::select! {
                    _ = stop2.cancelled() => return,
                    accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
                };
                if cut2.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut severed = gen2.subscribe();
                let frozen = frozen2.subscribe();
                tokio::spawn(async move {
                    // A connection opened during a freeze hangs, as a SYN
                    // into a partition does.
                    thawed(frozen.clone()).await;
                    let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (from_client, to_client) = inbound.into_split();
                    let (from_db, to_db) = outbound.into_split();
                    tokio::select! {
                        _ = pump(from_client, to_db, latency, frozen.clone()) => {}
                        _ = pump(from_db, to_client, Duration::ZERO, frozen) => {}
                        _ = severed.changed() => {}
                    }
                });
            }
        });
        Self {
            url: url.to_string(),
            cut,
            generation,
            frozen,
            stop,
        }
    }

    /// Severs every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// A partition: no byte crosses either way, and nothing is closed or
    /// reset; a new connection hangs unanswered.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Ends the partition: what was held goes through.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

/// Waits while `frozen` says so.
async fn thawed(mut frozen: tokio::sync::watch::Receiver<bool>) {
    let _ = frozen.wait_for(|f| !*f).await;
}

/// Copies one direction of a proxied connection, each chunk held `latency`,
/// and none passed on while the proxy is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: Duration,
    frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        thawed(frozen.clone()).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.cut();
        self.thaw();
        self.stop.cancel();
    }
}

/// An HTTP/1.1 answer read off a raw socket.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    /// The head, lower-cased, for `contains` checks on header lines.
    pub head: String,
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The value of header `name` (lower case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n.trim() == name).then(|| v.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// Writes `request` as is to `addr` and reads one answer, for requests no
/// well-behaved client would send (bad framing, stalls). The request should
/// say `Connection: close` so the server ends the answer by closing.
pub async fn raw_request(addr: &str, request: &[u8], within: Duration) -> RawAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut bytes = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut bytes))
        .await
        .expect("the server answers and closes in time")
        .expect("read");
    let text = String::from_utf8_lossy(&bytes);
    let (head, _) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {text:?}"));
    let head_len = head.len() + 4;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    RawAnswer {
        status,
        head: head.to_ascii_lowercase(),
        body: bytes[head_len..].to_vec(),
    }
}

/// `host:port` of a base URL such as `http://127.0.0.1:8080`.
pub fn authority(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// A claim of `key` for `request`, as the engine makes it.
pub fn new_claim<'a>(
    merchant_id: i64,
    key: &'a idem_core::domain::IdempotencyKey,
    request: &'a idem_core::domain::ChargeRequest,
    lease: Duration,
    key_ttl: Duration,
) -> idem_core::store::NewClaim<'a> {
    idem_core::store::NewClaim {
        merchant_id,
        key,
        fingerprint: idem_core::domain::Fingerprint::of_charge(request),
        request,
        lease,
        key_ttl,
    }
}

/// A small file system of its own (a tmpfs, mounted as root, as CI runs) that
/// a test can fill to the last byte and free again: a full disk under a
/// running server. Unmounted when dropped.
pub struct SmallDisk {
    pub dir: std::path::PathBuf,
}

impl SmallDisk {
    pub fn mount(bytes: u64) -> Self {
        let dir = std::env::temp_dir().join(format!("idem_disk_{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {bytes}-byte tmpfs at {} failed: this test needs root (as CI runs)",
            dir.display()
        );
        Self { dir }
    }

    /// Writes a file until the disk refuses another byte.
    pub fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.filler()).expect("filler file");
        let chunk = vec![0u8; 4096];
        while filler.write_all(&chunk).is_ok() {}
        while filler.write_all(&[0]).is_ok() {}
        let _ = filler.sync_all();
    }

    /// Gives back what [`SmallDisk::fill`] took.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }

    fn filler(&self) -> std::path::PathBuf {
        self.dir.join("filler")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `idem` binary of the release before this one, which scripts/test
/// builds with scripts/ensure-previous-idem and names in
/// `IDEM_TEST_PREVIOUS_IDEM`.
pub fn previous_idem() -> PathBuf {
    let path = std::env::var("IDEM_TEST_PREVIOUS_IDEM").unwrap_or_else(|_| {
        panic!(
            "IDEM_TEST_PREVIOUS_IDEM must name the previous release's idem \
             (scripts/test sets it: IDEM_TEST_PREVIOUS_IDEM=$(scripts/ensure-previous-idem))"
        )
    });
    let path = PathBuf::from(path);
    assert!(path.is_file(), "no idem at {}", path.display());
    path
}
