//! The test run's settings, from the environment `scripts/test` sets.

use idem_core::store::Backend;

/// The PostgreSQL server tests make their databases on (`IDEM_TEST_ADMIN_URL`,
/// which `scripts/ensure-postgres` prints; else the local default).
pub fn admin_url() -> String {
    std::env::var("IDEM_TEST_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The MariaDB server the tests make their databases on
/// (`IDEM_TEST_MARIADB_URL`, by default root at 127.0.0.1:3306, as
/// `scripts/ensure-mariadb` prints it).
pub fn mariadb_admin_url() -> String {
    std::env::var("IDEM_TEST_MARIADB_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".to_owned())
}

/// The backend this run of the suite tests: `IDEM_TEST_STORE=sqlite` runs the
/// whole suite on the embedded store, `IDEM_TEST_STORE=mariadb` on MariaDB,
/// anything else on PostgreSQL. One suite, every backend: scripts/test runs
/// it once for each.
pub fn test_backend() -> Backend {
    match std::env::var("IDEM_TEST_STORE").as_deref() {
        Ok("sqlite") => Backend::Sqlite,
        Ok("mariadb") => Backend::MariaDb,
        _ => Backend::Postgres,
    }
}

/// Whether this run is on `backend`; if not, says why the calling test has
/// nothing to check here (it runs, and asserts, in the other backend's run).
pub fn runs_on(backend: Backend, why: &str) -> bool {
    let here = test_backend();
    if here != backend {
        eprintln!("not on {here:?}: {why}");
    }
    here == backend
}

/// Tests whose verdicts depend on time (the demo's lock waits and timeline,
/// the flood's latency, the bench's rounds) take turns here, so that one of
/// them loading this 2-core machine does not become another's failure. Every
/// other test still runs beside them. (Cargo runs test binaries one after
/// another, so a turn within one binary is a turn in the whole run.)
pub async fn timing_sensitive() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}
