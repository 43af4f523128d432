//! A database of a test's own, on the backend a test names or the one this
//! run tests ([`crate::run::test_backend`]), and a claim to store: what both
//! the store's contract suite (idem-core) and the service's suite (idem)
//! start from.

use std::time::Duration;

use crate::run::{admin_url, mariadb_admin_url, test_backend};
use idem_core::domain::MerchantSecret;
use idem_core::store::{Audit, Backend, Store};
use sqlx::Connection;

/// A database of its own for one test, dropped when the test ends: a fresh
/// PostgreSQL or MariaDB database, or a fresh SQLite file in a scratch
/// directory.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    pub store: Store,
    /// For the tests' own SQL, on either backend.
    pub pool: sqlx::AnyPool,
    /// PostgreSQL, MariaDB: the database's name. SQLite: the scratch directory.
    place: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let db = Self::unmigrated().await;
        db.store.migrate().await.expect("migrate test db");
        db
    }

    /// A migrated database of its own on `backend`, whatever backend this run
    /// tests.
    pub async fn on(backend: Backend) -> Self {
        let db = Self::unmigrated_on(backend, &std::env::temp_dir()).await;
        db.store.migrate().await.expect("migrate test db");
        db
    }

    /// A database of its own without idem's schema, for a test of the
    /// migrations themselves.
    pub async fn unmigrated() -> Self {
        Self::unmigrated_on(test_backend(), &std::env::temp_dir()).await
    }

    /// A migrated SQLite database in a scratch directory under `parent` (a
    /// small disk of a test's own, say), whatever backend this run tests.
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
                let mut conn = sqlx::PgConnection::connect(&admin).await.expect(
                    "PostgreSQL must be reachable at IDEM_TEST_ADMIN_URL (see docs/testing.md)",
                );
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
            Backend::MariaDb => {
                let name = format!("idem_test_{id}");
                let admin = mariadb_admin_url();
                let mut conn = sqlx::MySqlConnection::connect(&admin).await.expect(
                    "MariaDB must be reachable at IDEM_TEST_MARIADB_URL (see docs/testing.md)",
                );
                sqlx::query(&format!("create database {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                conn.close().await.ok();
                let url = match admin.rfind('/') {
                    Some(i) => format!("{}/{name}", &admin[..i]),
                    None => panic!("MariaDB admin url has no database part"),
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
        let (id,): (i64,) = sqlx::query_as(&self.sql("select id from merchants where name = $1"))
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
            Backend::MariaDb => {
                // `before update of status on charges`: MariaDB has no
                // `of <column>`, so the trigger fires on every update of the
                // table, and `when` decides.
                let (timing, table) = event.rsplit_once(" on ").unwrap_or((event, ""));
                let timing = timing.split(" of ").next().unwrap_or(timing);
                let when = when.unwrap_or("true");
                self.exec(&format!(
                    "create trigger {name} {timing} on {table} for each row
                     if {when} then signal sqlstate '45000' set message_text = 'test: {name}'; end if"
                ))
                .await;
            }
        }
    }

    /// `sql` written with numbered parameters (`$1`), as this backend takes
    /// it: MariaDB's `?`, in order (each number used once, in order).
    pub fn sql(&self, sql: &str) -> String {
        match self.backend {
            Backend::MariaDb => {
                let mut out = String::with_capacity(sql.len());
                let mut chars = sql.chars().peekable();
                while let Some(c) = chars.next() {
                    if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
                        while chars.peek().is_some_and(char::is_ascii_digit) {
                            chars.next();
                        }
                        out.push('?');
                    } else {
                        out.push(c);
                    }
                }
                out
            }
            _ => sql.to_owned(),
        }
    }

    /// This backend's name for a 64-bit integer in a `cast`, for tests' own
    /// SQL (MariaDB casts to `signed`).
    pub fn bigint(&self) -> &'static str {
        match self.backend {
            Backend::MariaDb => "signed",
            _ => "bigint",
        }
    }

    /// This backend's SQL for "now" in its time columns, for tests' own SQL.
    pub fn now(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "now()",
            Backend::Sqlite => "cast(unixepoch('subsec') * 1000 as integer)",
            Backend::MariaDb => "cast(unix_timestamp(now(3)) * 1000 as signed)",
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
        let backend = self.backend;
        // A runtime of its own: Drop cannot await, and the test's may be gone.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if backend == Backend::MariaDb {
                    if let Ok(mut conn) = sqlx::MySqlConnection::connect(&mariadb_admin_url()).await
                    {
                        // As PostgreSQL's `with (force)`: the test's pools may
                        // still hold connections to it.
                        let held: Vec<(i64,)> = sqlx::query_as(
                            "select id from information_schema.processlist where db = ?",
                        )
                        .bind(&place)
                        .fetch_all(&mut conn)
                        .await
                        .unwrap_or_default();
                        for (id,) in held {
                            let _ = sqlx::query(&format!("kill {id}")).execute(&mut conn).await;
                        }
                        let _ = sqlx::query(&format!("drop database if exists {place}"))
                            .execute(&mut conn)
                            .await;
                    }
                    return;
                }
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
        traceparent: None,
    }
}

/// A fresh random key, as a client makes one per intent.
pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A charge request's body.
pub fn body(order_id: i64, amount_cents: i64) -> String {
    format!(r#"{{"order_id": {order_id}, "amount_cents": {amount_cents}}}"#)
}
