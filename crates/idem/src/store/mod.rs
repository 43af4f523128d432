//! The store: every SQL statement idem runs, one function per domain
//! operation, beside the table it owns, for two backends chosen by the URL:
//! PostgreSQL (`postgres://...`, the deployment for many hosts) and SQLite
//! (`sqlite://path`, the embedded default: nothing to install, several
//! processes on one host sharing one file).
//!
//! Invariants the schema and these statements keep together, on both backends:
//! - one idempotency record per `(merchant, key)` (the primary key decides races);
//! - a record and its charge are created in one transaction, so neither exists alone;
//! - a record's outcome is written once, by the holder of its current `attempt`
//!   (the fencing token), in the same transaction that settles the charge;
//! - no transaction here is ever left open across a call to the acquirer: each
//!   function is one short transaction (one statement on PostgreSQL; on SQLite,
//!   which cannot write from a CTE, a few statements under `begin immediate`).

/// Runs `$body` on one connection of a [`pg::PgPool`], bound to `$db`; the
/// body evaluates to a `Result`. The connection goes back to the pool if the
/// body succeeds; on an error, or if the future is dropped before the body
/// ends, it is closed (see [`pg`] for why).
macro_rules! on_pg {
    ($pool:expr, |$db:ident| $body:expr) => {
        match $pool.get().await {
            Ok(mut conn) => {
                let result = {
                    let $db = conn.raw();
                    $body
                };
                if result.is_ok() {
                    conn.release();
                }
                result
            }
            Err(e) => Err(e.into()),
        }
    };
}

/// Runs `$body` once per backend, with `$db` bound to that backend's executor
/// (a pooled PostgreSQL connection, or the SQLite pool) and `$sql` to its
/// statement text (`$pg` or `$sqlite`); the body is type-checked against each
/// backend in turn, so one chain of binds serves both. The body evaluates to a
/// `Result<_, sqlx::Error>`.
///
/// `on_backend!(write store, ...)` marks a statement that writes: on SQLite it
/// first waits for this process's turn to write (see [`WriteTurns`]).
macro_rules! on_backend {
    (write $store:expr, $pg:expr, $sqlite:expr, |$sql:ident, $db:ident| $body:expr) => {{
        let _turn = match &$store.db {
            $crate::store::Db::Sqlite(_) => Some($store.writer.take().await?),
            $crate::store::Db::Postgres(_) => None,
        };
        on_backend!($store, $pg, $sqlite, |$sql, $db| $body)
    }};
    ($store:expr, $pg:expr, $sqlite:expr, |$sql:ident, $db:ident| $body:expr) => {
        match &$store.db {
            $crate::store::Db::Postgres(pool) => {
                let $sql: &str = $pg;
                let result: Result<_, sqlx::Error> = on_pg!(pool, |$db| $body);
                result
            }
            $crate::store::Db::Sqlite($db) => {
                let $sql: &str = $sqlite;
                $body
            }
        }
    };
}

/// SQLite's "now", in the integer milliseconds its schema stores: the host's
/// clock, fixed for the length of one statement.
macro_rules! sqlite_now {
    () => {
        "cast(unixepoch('subsec') * 1000 as integer)"
    };
}

/// A SQLite time column (integer milliseconds) as the RFC 3339 text the
/// domain's timestamps decode from.
macro_rules! sqlite_time {
    ($column:literal) => {
        concat!(
            "strftime('%Y-%m-%dT%H:%M:%fZ', ",
            $column,
            " / 1000.0, 'unixepoch')"
        )
    };
}

mod charges;
mod idempotency;
mod merchants;
mod outbox;
mod pg;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use pg::PgPool;

pub use charges::{ProcessingStats, StuckCharge};
pub use idempotency::{
    Claim, KeyRecord, KeyState, NewClaim, Orphan, Reschedule, Settlement, CLAIM_SQL, FINALIZE_SQL,
};
pub use merchants::{MerchantCache, MerchantError};
pub use outbox::{NewEvent, NewResult, OutboxBatch, OutboxMessage, ResultAnswer};

/// How long a request waits for a pooled connection before answering 503:
/// long enough to ride out a burst, short enough that a client retries on a
/// healthy instance instead of hanging on a sick one.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// PostgreSQL's `statement_timeout` on idem's connections. Every statement
/// idem runs is short (a claim, a finalize, a batch of at most 1 000 rows), so
/// one still running after 2 s is stuck behind a lock or on a sick server. It
/// then ends as a transient error (SQLSTATE 57014: a 503, or another attempt
/// for a queue command) instead of holding its connection. 2 s keeps a request
/// inside its own bound, the acquirer timeout + 5 s, even when both of its
/// statements (claim and finalize) run out. Migrations lift it.
const PG_STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// TCP keepalives, as PostgreSQL's own settings for the server's end of each
/// connection: probes start after 30 s idle, every 10 s, and 3 unanswered
/// ones end it, so a connection whose client vanished (a host lost, a
/// partition) is gone within about a minute, with its transaction and locks
/// (a relay's batch, say). sqlx 0.8 sets no keepalive on its own end (it
/// opens the socket itself and sets only `TCP_NODELAY`, and ignores libpq's
/// `keepalives*` URL parameters): see docs/operations.md.
const PG_TCP_KEEPALIVES: [(&str, &str); 3] = [
    ("tcp_keepalives_idle", "30"),
    ("tcp_keepalives_interval", "10"),
    ("tcp_keepalives_count", "3"),
];

/// How long a SQLite statement waits for another process's write transaction
/// to end. Every write transaction idem opens is a few statements long (never
/// across the acquirer), so a wait this long means the file is stuck, and the
/// request answers 503 like any other database outage.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL used when none is given: an embedded SQLite file in the working
/// directory, so that idem runs with nothing installed.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db";

/// Errors in the store's words.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Weather: the same operation may well work if tried again later. The
    /// database cannot be reached (I/O, TLS, the pool timed out or closed), or
    /// it said so itself: see [`is_pg_transient`] and [`is_sqlite_busy`].
    /// The API answers 503; the queue consumer retries, a bounded number of times.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// Anything else the database refused (a constraint, text it cannot store
    /// such as a NUL byte): trying again gives the same answer. A bug or bad
    /// data, not weather.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// A row that the schema's checks should have made impossible.
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    /// The database URL names no backend idem has.
    #[error("unsupported database URL (use postgres://... or sqlite://path): {0}")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// Whether trying the same operation again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// PostgreSQL's SQLSTATEs that mean "try again": the server is going away,
/// starting or overloaded, the statement ran past `statement_timeout`, or
/// the transaction lost a race it can win next time. Class 08 (connection exception), class 53 (insufficient resources:
/// too many connections, out of memory, disk full), `40001`
/// serialization_failure, `40P01` deadlock_detected, `40003`
/// statement_completion_unknown, `55P03` lock_not_available, `57014`
/// query_canceled, `57P01` admin_shutdown, `57P02` crash_shutdown, `57P03`
/// cannot_connect_now, and `25006` read_only_sql_transaction (a connection
/// left on a primary that became a standby; it is closed on the error, and the
/// next one finds the new primary). Everything else (`22021`, the NUL byte in
/// text, among them) is an answer that will not change.
fn is_pg_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "40001" | "40P01" | "40003" | "55P03" | "57014" | "57P01" | "57P02" | "57P03" | "25006"
        )
}

/// SQLite's primary result codes for "another connection holds the lock":
/// `SQLITE_BUSY` (5) and `SQLITE_LOCKED` (6); extended codes keep them in the low byte.
fn is_sqlite_busy(code: &str) -> bool {
    code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Protocol(_) => Self::Unavailable(e),
            sqlx::Error::Database(db)
                if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                    && db.code().is_some_and(|c| is_sqlite_busy(&c)) =>
            {
                Self::Unavailable(e)
            }
            sqlx::Error::Database(db)
                if db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some()
                    && db.code().is_some_and(|c| is_pg_transient(&c)) =>
            {
                Self::Unavailable(e)
            }
            _ => Self::Database(e),
        }
    }
}

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    /// The backend a URL names, by its scheme.
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else {
            Err(StoreError::UnsupportedUrl(url.to_owned()))
        }
    }
}

/// The pool of one backend (PostgreSQL's is idem's own, see [`pg`]). Each
/// store operation matches on it and runs its backend's statements; the SQL of
/// both sits side by side in the module that owns the table, so the two cannot
/// drift apart unnoticed.
#[derive(Clone)]
enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Db,
    /// SQLite's writers of this process take turns here (see [`WriteTurns`]).
    writer: WriteTurns,
}

/// SQLite lets one connection write to a file at a time, and a writer that
/// finds the lock taken sleeps in steps of up to 100 ms before it looks again.
/// So the writers of one process take turns here first: in order, without
/// sleeping, and without holding a pooled connection while they wait (reads,
/// such as a replay, keep getting one). SQLite's busy timeout is then left to
/// settle turns between processes only. Unused on PostgreSQL, whose row locks
/// need no such help. A tokio mutex, because a turn is held across the awaits
/// of a transaction.
#[derive(Clone, Default)]
struct WriteTurns(Arc<tokio::sync::Mutex<()>>);

impl WriteTurns {
    /// Waits for this process's turn to write, but no longer than SQLite's own
    /// busy timeout: a turn that slow in coming means another process holds
    /// the file's lock, and the writer answers 503 like any database outage,
    /// instead of queueing through one busy timeout after another.
    async fn take(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, StoreError> {
        tokio::time::timeout(SQLITE_BUSY_TIMEOUT, self.0.lock())
            .await
            .map_err(|_| StoreError::Unavailable(sqlx::Error::PoolTimedOut))
    }
}

/// How many connections a pool holds now, and how many of them are idle.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub size: u32,
    pub idle: usize,
}

impl Store {
    /// Connects a pool. No connection ping before each use: a dead connection
    /// shows up as an I/O error on the statement itself, which is a 503 anyway,
    /// and a ping would add a round trip to every request.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let db = match Backend::of_url(url)? {
            Backend::Postgres => {
                let pool = pg_pool(url, max_connections)?;
                pool.get().await?.release();
                Db::Postgres(pool)
            }
            Backend::Sqlite => {
                let (pool, options) = sqlite_options(url, max_connections)?;
                Db::Sqlite(pool.connect_with(options).await?)
            }
        };
        Ok(Self::on(db))
    }

    /// Like [`Store::connect`], but connects on first use: a server started
    /// while the database is down comes up, answers 503 (readiness red), and
    /// starts working when the database does, with no restart.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let db = match Backend::of_url(url)? {
            Backend::Postgres => Db::Postgres(pg_pool(url, max_connections)?),
            Backend::Sqlite => {
                let (pool, options) = sqlite_options(url, max_connections)?;
                Db::Sqlite(pool.connect_lazy_with(options))
            }
        };
        Ok(Self::on(db))
    }

    fn on(db: Db) -> Self {
        Self {
            db,
            writer: WriteTurns::default(),
        }
    }

    /// Creates or upgrades the schema. Safe to run from several processes at
    /// once: sqlx serializes migrations (an advisory lock on PostgreSQL, the
    /// write lock on SQLite).
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        match &self.db {
            // A migration may build an index on a big table: no statement
            // timeout for it; the connection gets the usual one back after.
            Db::Postgres(pool) => on_pg!(pool, |db| {
                async {
                    sqlx::query("set statement_timeout = 0")
                        .execute(&mut *db)
                        .await?;
                    sqlx::migrate!("./migrations/postgres")
                        .run(&mut *db)
                        .await?;
                    sqlx::query("reset statement_timeout")
                        .execute(&mut *db)
                        .await?;
                    Ok(())
                }
                .await
            }),
            Db::Sqlite(pool) => sqlx::migrate!("./migrations/sqlite").run(pool).await,
        }
    }

    /// One trivial round trip: is the database answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_backend!(self, "select 1", "select 1", |sql, db| {
            sqlx::query(sql).execute(db).await.map(drop)
        })?;
        Ok(())
    }

    pub fn pool_stats(&self) -> PoolStats {
        match &self.db {
            Db::Postgres(pool) => {
                let (size, idle) = pool.stats();
                PoolStats { size, idle }
            }
            Db::Sqlite(pool) => PoolStats {
                size: pool.size(),
                idle: pool.num_idle(),
            },
        }
    }

    /// Closes the pool; for SQLite this also checkpoints the write-ahead log.
    pub async fn close(&self) {
        match &self.db {
            Db::Postgres(pool) => pool.close().await,
            Db::Sqlite(pool) => pool.close().await,
        }
    }
}

/// The PostgreSQL pool: idem's name in `pg_stat_activity`, the statement
/// timeout and the server's keepalives, sent as startup options (`-c`), so
/// they hold from the connection's first statement with no round trip. A
/// `statement_timeout` or `options` given in the URL comes first and is
/// overridden.
fn pg_pool(url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let options: PgConnectOptions = url.parse()?;
    let statement_timeout = format!("{}ms", millis(PG_STATEMENT_TIMEOUT));
    let options = options
        .application_name("idem")
        .options([("statement_timeout", statement_timeout.as_str())])
        .options(PG_TCP_KEEPALIVES);
    Ok(PgPool::new(options, max_connections, ACQUIRE_TIMEOUT)?)
}

/// SQLite as a store several processes share: the write-ahead log (readers
/// never block the writer), a busy timeout (a writer waits its turn instead of
/// failing), foreign keys on, and `synchronous = full`, because a claim whose
/// commit a power cut could undo would let a retry charge again under a new
/// reference.
fn sqlite_options(
    url: &str,
    max_connections: u32,
) -> Result<(SqlitePoolOptions, SqliteConnectOptions), StoreError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false);
    Ok((pool, options))
}

/// Milliseconds as `i64` for interval arithmetic in SQL.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Whether `e` is a unique violation of the named constraint (PostgreSQL) or
/// of the named `table.column` (SQLite, which reports columns, not names).
fn violates_unique(e: &sqlx::Error, pg_constraint: &str, sqlite_column: &str) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    db.is_unique_violation()
        && (db.constraint() == Some(pg_constraint) || db.message().contains(sqlite_column))
}
