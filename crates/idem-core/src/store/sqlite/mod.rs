//! The SQLite backend, the embedded default: nothing to install, several
//! processes on one host sharing one file.
//!
//! SQLite lets one connection write to the file at a time and cannot write
//! from a CTE, so every write here goes through [`SqliteStore::write`]: it
//! takes this process's one writing connection ([`Writer`]), then opens
//! `begin immediate`, which takes the file's write lock at once, so nothing
//! interleaves; an operation that PostgreSQL does in one statement is a few
//! statements in that transaction. No write transaction spans a call to the
//! acquirer, so the lock is held for microseconds. Reads use the pool as it is
//! (the write-ahead log lets them run beside the writer). Times are integer
//! milliseconds of the host's clock ([`NOW`]).

mod audit;
mod batched;
mod charges;
mod console;
mod key_space;
mod keys;
mod merchants;
mod outbox;
mod refunds;
mod steps;
mod webhooks;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use const_format::concatcp;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::SqlitePool;

use super::batch::{Batched, Batcher};
use super::error::StoreError;
use super::health::{Check, WriteHealth};
use super::model::PoolStats;
use super::model::{Claim, NewClaim};
use super::ops::{Base, LocalFuture};
use super::params::{ClaimRow, FinalizeRow, FinalizeValues};
use super::shared::{ACQUIRE_TIMEOUT, BATCH_CAP};
use crate::domain::{AcquirerReference, ChargeId};

/// How long a SQLite statement waits for another process's write transaction
/// to end. Every write transaction idem opens is a few statements long (never
/// across the acquirer), so a wait this long means the file is stuck, and the
/// request answers 503 like any other database outage.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// SQLite's "now", in the integer milliseconds its schema stores: the host's
/// clock, fixed for the length of one statement.
const NOW: &str = "cast(unixepoch('subsec') * 1000 as integer)";

/// A time as the schema stores it (milliseconds since the epoch, UTC).
fn from_millis(ms: i64) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
    chrono::DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("{ms} is not a time in milliseconds")))
}

/// A SQLite store; cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// This process's one writing connection (see [`Writer`]).
    writer: Writer,
    /// Claims and finalizes that arrive together share one write transaction
    /// (one fsync) ([`batched`]); one batch at a time, as one writer can write.
    claims: Batcher<ClaimRow, Claim>,
    finalizes: Batcher<FinalizeRow, bool>,
}

/// SQLite lets one connection write to a file at a time, and a writer that
/// finds the lock taken sleeps in steps of up to 100 ms before it looks again.
/// So a process writes through one connection of its own, which its writers
/// take in turns: in order, without sleeping, and without holding a pooled
/// connection while they wait (reads, such as a replay, keep the pool).
/// SQLite's busy timeout is then left to settle turns between processes only.
///
/// One connection also means the write statements are prepared once, not once
/// per pooled connection, and the pages they touch stay in one page cache
/// ([`WRITER_CACHE_KIB`]) instead of being read from the OS by whichever
/// connection writes next. A tokio mutex, because a turn is held across the
/// awaits of a transaction. The connection is opened on first use, and again
/// after the database failed under it.
#[derive(Clone)]
struct Writer(Arc<WriterState>);

struct WriterState {
    options: SqliteConnectOptions,
    conn: tokio::sync::Mutex<Option<SqliteConnection>>,
    /// What the writes found: readiness reads it.
    health: WriteHealth,
}

/// The writing connection's page cache: the pages of the tables and indexes
/// every claim and finalize touches.
const WRITER_CACHE_KIB: u32 = 8 * 1024;

impl Writer {
    fn new(options: &SqliteConnectOptions) -> Self {
        Self(Arc::new(WriterState {
            options: options
                .clone()
                .pragma("cache_size", format!("-{WRITER_CACHE_KIB}")),
            conn: tokio::sync::Mutex::default(),
            health: WriteHealth::default(),
        }))
    }

    /// Waits for this process's turn to write, but no longer than SQLite's own
    /// busy timeout: a turn that slow in coming means another process holds
    /// the file's lock, and the writer answers 503 like any database outage,
    /// instead of queueing through one busy timeout after another.
    async fn take(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<SqliteConnection>>, StoreError> {
        tokio::time::timeout(BUSY_TIMEOUT, self.0.conn.lock())
            .await
            .map_err(|_| StoreError::Unavailable(sqlx::Error::PoolTimedOut))
    }
}

impl SqliteStore {
    /// SQLite as a store several processes share: the write-ahead log (readers
    /// never block the writer), a busy timeout (a writer waits its turn instead
    /// of failing), foreign keys on, and `synchronous = full`, because a claim
    /// whose commit a power cut could undo would let a retry charge again under
    /// a new reference. Each connection keeps a page cache of 512 KiB (SQLite's
    /// default is 2 MiB): with a pool of 32, the default held `serve` at
    /// 102–105 MiB under load, 512 KiB at 83–85 MiB, with the same throughput
    /// (the pages are in the OS's cache anyway). The file is opened on first use.
    pub(super) fn lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .pragma("cache_size", "-512");
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false);
        let writer = Writer::new(&options);
        let pool = pool.connect_lazy_with(options);
        let claims = Batcher::new(
            "claim",
            1,
            BATCH_CAP,
            BUSY_TIMEOUT,
            writer.clone(),
            async |writer: Writer, rows| batched::claims(&writer, rows).await,
        );
        let finalizes = Batcher::new(
            "finalize",
            1,
            BATCH_CAP,
            BUSY_TIMEOUT,
            writer.clone(),
            async |writer: Writer, rows| batched::finalizes(&writer, rows).await,
        );
        Ok(Self {
            pool,
            writer,
            claims,
            finalizes,
        })
    }

    /// Runs `op` as one write transaction: this process's turn to write, then
    /// `begin immediate`; committed if `op` succeeds, rolled back if it fails
    /// or the future is dropped. Every write of this backend runs through here.
    async fn write<T>(
        &self,
        op: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        write(&self.writer, op).await
    }
}

/// The readiness probe's write: one row, rewritten in place.
const PROBE_SQL: &str = concatcp!(
    "insert into write_probe (id, probed_at) values (1, ",
    NOW,
    ") on conflict (id) do update set probed_at = excluded.probed_at"
);

/// [`SqliteStore::write`] on the writer alone (for the batch workers, which
/// must not hold the store).
///
/// After an error the connection is kept only if it is known to be clean:
/// `op` failed and an explicit rollback then succeeded. SQLite rolls a
/// transaction back by itself on some errors (a full disk, an I/O error),
/// and sqlx's count of open transactions does not learn of it: its rollback
/// then fails, the count stays at one, and every later `begin` on that
/// connection would be refused. So a failed commit, a failed rollback or a
/// failed `begin` closes the connection, and the next write opens another.
async fn write<T>(
    writer: &Writer,
    op: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut turn = writer.take().await?;
    let mut clean = false;
    let written = async {
        let conn = match &mut *turn {
            Some(conn) => conn,
            empty => empty.insert(sqlx::ConnectOptions::connect(&writer.0.options).await?),
        };
        let mut tx = sqlx::Connection::begin_with(conn, "begin immediate").await?;
        match op(&mut tx).await {
            Ok(out) => {
                tx.commit().await?;
                clean = true;
                Ok(out)
            }
            Err(e) => {
                clean = tx.rollback().await.is_ok();
                Err(e)
            }
        }
    }
    .await;
    if !clean {
        if let Some(conn) = turn.take() {
            // Closed on its own task: a close waits for the connection's
            // worker thread, which may be inside a busy wait.
            tokio::spawn(sqlx::Connection::close(conn));
        }
    }
    writer.0.health.saw(&written, true);
    written
}

impl SqliteStore {
    /// Creates or upgrades the schema; sqlx takes the file's write lock.
    async fn migrate_now(&self) -> Result<(), sqlx::migrate::MigrateError> {
        sqlx::migrate!("./migrations/sqlite").run(&self.pool).await
    }
}

#[async_trait::async_trait]
impl Base for SqliteStore {
    fn system_name(&self) -> &'static str {
        "sqlite"
    }

    fn migrate(&self) -> LocalFuture<'_, Result<(), sqlx::migrate::MigrateError>> {
        Box::pin(self.migrate_now())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Whether the file can take a write, as the writes found it; while it
    /// could not, one small write of its own now and then
    /// ([`super::health`]).
    async fn writable(&self) -> Result<(), StoreError> {
        match self.writer.0.health.check() {
            Check::Writable => Ok(()),
            Check::Unwritable(e) => Err(e),
            Check::ProbeDue => {
                self.write(async |tx| {
                    sqlx::query(PROBE_SQL).execute(&mut *tx).await?;
                    Ok(())
                })
                .await
            }
        }
    }

    fn pool_stats(&self) -> PoolStats {
        PoolStats {
            size: self.pool.size(),
            idle: self.pool.num_idle(),
        }
    }

    /// Closes the writer and the pool; the last connection to close also
    /// checkpoints the write-ahead log.
    async fn close(&self) {
        if let Some(conn) = self.writer.0.conn.lock().await.take() {
            let _ = sqlx::Connection::close(conn).await;
        }
        self.pool.close().await;
    }

    async fn claim(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        self.claim_batched(new).await
    }

    async fn batch_claims(&self, claims: &[NewClaim<'_>]) -> Vec<Batched<Claim>> {
        self.claims_as_batch(claims).await
    }

    async fn claim_alone(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        self.claim_one(new).await
    }

    async fn charge_by_reference(
        &self,
        merchant_id: i64,
        reference: &AcquirerReference,
    ) -> Result<Option<ChargeId>, StoreError> {
        self.charge_holding(merchant_id, reference).await
    }

    async fn finalize(&self, values: &FinalizeValues<'_>) -> Result<bool, StoreError> {
        self.finalize_batched(values).await
    }
}
