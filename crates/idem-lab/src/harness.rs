//! Real `idem serve` processes on scratch databases, for the commands that
//! measure or show idem from outside (`idem-lab demo`, `idem-lab bench`): a fresh
//! database on the server a URL names (or a SQLite file of this process's
//! own), the instances started from this very binary, and everything stopped
//! when the run ends.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

use idem_core::domain::MerchantSecret;
use idem_core::store::{Audit, Backend, Store};

/// The log filter of `idem-lab demo` and `idem-lab bench` when `IDEM_LOG` is not set,
/// for that process and the `idem serve` instances it starts. The demo's
/// teaching strategies are slow on purpose: under hold-transaction every pool
/// waits seconds for a connection, and sqlx warns about each such acquire
/// (thousands of lines in one run) in words that read like idem failing. The
/// demo's own figures say what happened; any other warning still shows.
/// `IDEM_LOG=warn` brings those lines back.
pub const LOG_FILTER: &str = "warn,sqlx::pool::acquire=error";

/// Things started for one run (a demo strategy, a bench scenario), stopped
/// on drop (also on Ctrl-C).
pub(crate) struct Started {
    pub(crate) children: Vec<Child>,
    pub(crate) stop: CancellationToken,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.stop.cancel();
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A fresh, empty database named `name` beside the one `url` names; returns
/// its URL. PostgreSQL: dropped and recreated on the same server (connecting
/// to `url` itself, or to that server's `postgres` database); MariaDB, the
/// same on its server. SQLite: a new file in this process's [`scratch_dir`].
pub(crate) async fn fresh_database(url: &str, name: &str) -> anyhow::Result<String> {
    match Backend::of_url(url)? {
        Backend::Postgres => fresh_postgres_database(url, name).await,
        Backend::MariaDb => fresh_mariadb_database(url, name).await,
        Backend::Sqlite => {
            let dir = scratch_dir();
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(dir.join(format!("{name}.db{suffix}")));
            }
            let url = format!("sqlite://{}/{name}.db", dir.display());
            // Made once here, so the file is in WAL mode (a setting the file
            // keeps) before the strategies' own pools open it.
            Store::connect(&url, 1).await?.close().await;
            Ok(url)
        }
    }
}

/// Where the demo and the bench keep SQLite files of their own; removed by
/// [`remove_scratch_dir`] when they end.
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("idem-scratch-{}", std::process::id()))
}

/// Removes the SQLite files [`fresh_database`] made, if any.
pub(crate) fn remove_scratch_dir() {
    let _ = std::fs::remove_dir_all(scratch_dir());
}

async fn fresh_mariadb_database(url: &str, name: &str) -> anyhow::Result<String> {
    let base = &url[..url
        .rfind('/')
        .context("the database URL has no database name")?];
    let mut admin = sqlx::MySqlConnection::connect(&format!("{base}/mysql"))
        .await
        .context(
            "connecting to MariaDB (is DATABASE_URL right? scripts/ensure-mariadb starts one)",
        )?;
    sqlx::query(&format!("drop database if exists {name}"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("create database {name}"))
        .execute(&mut admin)
        .await?;
    Ok(format!("{base}/{name}"))
}

async fn fresh_postgres_database(url: &str, name: &str) -> anyhow::Result<String> {
    let base = &url[..url
        .rfind('/')
        .context("the database URL has no database name")?];
    let mut admin = sqlx::PgConnection::connect(url)
        .await
        .or(sqlx::PgConnection::connect(&format!("{base}/postgres")).await)
        .context("connecting to PostgreSQL (is DATABASE_URL right? scripts/demo starts one)")?;
    sqlx::query(&format!("drop database if exists {name} with (force)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("create database {name}"))
        .execute(&mut admin)
        .await?;
    Ok(format!("{base}/{name}"))
}

/// `instances` real `idem serve` processes on a fresh database, with a
/// merchant; returns their base URLs and the merchant's secret.
pub(crate) async fn start_idem(
    db_url: &str,
    sim_url: &str,
    merchant: &str,
    instances: usize,
    flags: &[&str],
    started: &mut Started,
) -> anyhow::Result<(Vec<String>, String)> {
    let store = Store::connect(db_url, 1).await?;
    store.migrate().await?;
    let secret = MerchantSecret::generate();
    store
        .create_merchant(
            merchant,
            &secret.hash(),
            &Audit {
                actor: "idem harness",
                reason: None,
            },
        )
        .await?;
    // This binary carries `idem serve` (idem-lab offers every idem command).
    let exe =
        std::env::current_exe().context("finding this binary, to start idem serve from it")?;
    let mut endpoints = Vec::new();
    for _ in 0..instances {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut command = Command::new(&exe);
        command
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--acquirer-url",
                sim_url,
            ])
            .args(flags)
            .env("DATABASE_URL", db_url)
            .stdout(Stdio::null());
        // The children inherit the environment: a filter the user set reaches them as it is.
        if std::env::var_os(idem::LOG_ENV).is_none() {
            command.env(idem::LOG_ENV, LOG_FILTER);
        }
        let child = command.spawn().context("starting idem serve")?;
        started.children.push(child);
        endpoints.push(format!("http://127.0.0.1:{port}"));
    }
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for e in &endpoints {
        while http.get(format!("{e}/healthz")).send().await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "idem serve at {e} did not start");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    Ok((endpoints, secret.expose().to_owned()))
}
