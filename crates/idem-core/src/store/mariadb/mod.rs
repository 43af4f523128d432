//! The MariaDB backend (10.10 or later; `mysql://` or `mariadb://` URLs):
//! the same operations as the others, each one short transaction on a pooled
//! connection. MariaDB, not MySQL: it relies on MariaDB's `returning`,
//! `max_statement_time` and collations.
//!
//! MariaDB cannot write from a CTE, has no `update ... returning` and no
//! `on conflict do nothing returning`, so an operation that PostgreSQL does
//! in one statement is a few statements here, in one transaction, as on
//! SQLite. Unlike SQLite, several connections write at once, so what SQLite
//! gets from its one file lock this backend gets from InnoDB's row locks,
//! under a level and rules set for every connection (docs/design.md, "The
//! MariaDB store"):
//! - `read committed`: each statement reads the latest commit (no snapshot
//!   kept from a transaction's start, so no read in a write is stale), and no
//!   gap locks: inserts of different keys never wait on each other;
//! - every rule on money or on a key is a guarded write (`update ... where`
//!   the rule holds, or an insert against a unique key), which InnoDB runs on
//!   the row's latest version under its lock, never a plain read then a write;
//!   where a read must stay true until the commit, it is `for update`;
//! - a statement waits at most [`LOCK_WAIT`] for a row lock and runs at most
//!   [`STATEMENT_TIME`]; a deadlock's victim is a 503, like any weather.
//!
//! Times are integer milliseconds of the server's clock ([`NOW`]), as on
//! SQLite; statements are written with numbered parameters ([`sql`]).

mod audit;
mod charges;
mod console;
mod key_space;
mod keys;
mod merchants;
mod outbox;
mod refunds;
mod sql;
mod steps;
mod webhooks;

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::Executor;

use super::batch::Batched;
use super::error::StoreError;
use super::health::{Check, WriteHealth};
use super::model::PoolStats;
use super::model::{Claim, NewClaim};
use super::ops::{Base, LocalFuture};
use super::params::FinalizeValues;
use super::shared::{past_deadline, ACQUIRE_TIMEOUT, STORE_DEADLINE};
use crate::domain::{AcquirerReference, ChargeId};

/// MariaDB's "now", in the integer milliseconds its schema stores: the
/// server's clock, fixed for the length of one statement.
const NOW: &str = "cast(unix_timestamp(now(3)) * 1000 as signed)";

/// How long a statement waits for another transaction's row lock: every
/// transaction idem opens is a few statements long (never across the
/// acquirer), so a wait this long means something is stuck, and the request
/// answers 503. (MariaDB's default is 50 s.)
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The longest one statement runs (`max_statement_time`), as PostgreSQL's
/// `statement_timeout`: a stuck statement ends as a transient error well
/// inside [`STORE_DEADLINE`].
const STATEMENT_TIME: Duration = Duration::from_secs(2);

/// A time as the schema stores it, in SQL: the epoch plus its milliseconds,
/// a `datetime` that reads back as a `DateTime<Utc>` (the session's time
/// zone is UTC). Not `from_unixtime`, which is null past 2038-01-19.
macro_rules! at {
    ($column:literal) => {
        concat!(
            "timestampadd(microsecond, ",
            $column,
            " * 1000, timestamp'1970-01-01 00:00:00')"
        )
    };
}
pub(super) use at;

/// A MariaDB store; cheap to clone.
#[derive(Clone)]
pub struct MariaDbStore {
    pool: MySqlPool,
    /// What the writes found: readiness reads it.
    health: WriteHealth,
}

impl MariaDbStore {
    /// The pool, connecting on first use; each connection set as the head of
    /// this module says, before its first statement.
    pub(super) fn lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(&url.replacen("mariadb://", "mysql://", 1))?
            .charset("utf8mb4")
            .timezone(Some("+00:00".to_owned()));
        let session = format!(
            "set session innodb_lock_wait_timeout = {}, session max_statement_time = {}",
            LOCK_WAIT.as_secs(),
            STATEMENT_TIME.as_secs()
        );
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let session = session.clone();
                Box::pin(async move {
                    conn.execute("set session transaction isolation level read committed")
                        .await?;
                    // `update t set a = a + 1, b = a` reads the old `a`, as
                    // on PostgreSQL and SQLite; MariaDB's own order would
                    // read the new one.
                    conn.execute(
                        "set session sql_mode = concat(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')",
                    )
                    .await?;
                    conn.execute(session.as_str()).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            health: WriteHealth::default(),
        })
    }

    /// Runs `op` as one transaction, committed if it succeeds, rolled back if
    /// it fails (or, if the future is dropped, when sqlx next uses the
    /// connection). Every write of this backend runs through here; those
    /// that can meet a deadlock run under [`again_on_deadlock!`].
    async fn write<T>(
        &self,
        op: impl AsyncFnOnce(&mut MySqlConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let written = within_deadline(async {
            let mut tx = self.pool.begin().await?;
            match op(&mut tx).await {
                Ok(out) => {
                    tx.commit().await?;
                    Ok(out)
                }
                Err(e) => {
                    // At once, on this connection, before it goes back to
                    // the pool (which would otherwise send the rollback).
                    let _ = tx.rollback().await;
                    Err(e)
                }
            }
        })
        .await;
        self.health.saw(&written, true);
        written
    }

    /// Runs `op` on a pooled connection, outside any transaction (a read).
    async fn read<T>(
        &self,
        op: impl AsyncFnOnce(&mut MySqlConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        within_deadline(async {
            let mut conn = self.pool.acquire().await?;
            op(&mut conn).await
        })
        .await
    }

    /// Creates or upgrades the schema, on a connection of its own: without
    /// the statement time limit (a migration may rebuild a big table), and
    /// under a named lock of idem's, so that instances started together run
    /// the migrations one after the other. (sqlx's own lock asks MariaDB to
    /// wait forever, `get_lock(name, -1)`, which 10.11 refuses with a warning
    /// and takes no lock.)
    async fn migrate_now(&self) -> Result<(), sqlx::migrate::MigrateError> {
        let mut conn = self.pool.acquire().await?;
        conn.execute("set session max_statement_time = 0").await?;
        let (locked,): (Option<i64>,) = sqlx::query_as("select get_lock('idem_migrate', ?)")
            .bind(MIGRATE_LOCK_WAIT.as_secs() as i64)
            .fetch_one(&mut *conn)
            .await?;
        let (migrated, released) = if locked == Some(1) {
            let mut migrator = sqlx::migrate!("./migrations/mariadb");
            migrator.set_locking(false);
            let migrated = migrator.run(&mut *conn).await;
            let released = sqlx::query("select release_lock('idem_migrate')")
                .execute(&mut *conn)
                .await
                .map(drop);
            (migrated, released)
        } else {
            let waited = sqlx::migrate::MigrateError::Execute(sqlx::Error::Protocol(format!(
                "another migration held the lock for {} s",
                MIGRATE_LOCK_WAIT.as_secs()
            )));
            (Err(waited), Ok(()))
        };
        // The connection goes back to the pool with the statement limit again,
        // whatever happened.
        let restored = conn
            .execute(
                format!(
                    "set session max_statement_time = {}",
                    STATEMENT_TIME.as_secs()
                )
                .as_str(),
            )
            .await;
        migrated?;
        released?;
        restored?;
        Ok(())
    }
}

/// How long a migration waits for another process's to end.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(300);

/// How many times a transaction InnoDB chose as a deadlock's victim runs,
/// whole, before the error is the caller's (a 503): a victim is rolled back
/// entirely, so running it again is safe. Claims of one key meet one when
/// several lose the insert at once and one of them reclaims.
const DEADLOCK_TRIES: u32 = 3;

/// Whether InnoDB rolled the transaction back as a deadlock's victim (1213).
fn is_deadlock(e: &StoreError) -> bool {
    let StoreError::Unavailable(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .is_some_and(|e| e.number() == 1213)
}

/// `$write`, an awaited [`MariaDbStore::write`], run again whole while InnoDB
/// chooses it as a deadlock's victim, [`DEADLOCK_TRIES`] times at most. (A
/// macro: the transaction's closure is made afresh for each run.)
macro_rules! again_on_deadlock {
    ($write:expr) => {{
        // One deadline for every run: a store operation stays within it.
        $crate::store::mariadb::within_deadline(async {
            let mut tries = 0;
            loop {
                tries += 1;
                match $write {
                    Err(e)
                        if $crate::store::mariadb::is_deadlock(&e)
                            && tries < $crate::store::mariadb::DEADLOCK_TRIES =>
                    {
                        continue
                    }
                    done => break done,
                }
            }
        })
        .await
    }};
}
pub(super) use again_on_deadlock;

/// `work`'s answer, or [`StoreError::Unavailable`] at [`STORE_DEADLINE`].
async fn within_deadline<T>(
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(STORE_DEADLINE, work)
        .await
        .unwrap_or_else(|_| Err(past_deadline()))
}

/// The readiness probe's write: one row, rewritten in place.
const PROBE_SQL: &str = const_format::concatcp!(
    "insert into write_probe (id, probed_at) values (1, ",
    NOW,
    ") on duplicate key update probed_at = values(probed_at)"
);

#[async_trait::async_trait]
impl Base for MariaDbStore {
    fn system_name(&self) -> &'static str {
        "mariadb"
    }

    fn migrate(&self) -> LocalFuture<'_, Result<(), sqlx::migrate::MigrateError>> {
        Box::pin(self.migrate_now())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(async |db| {
            db.execute("select 1").await?;
            Ok(())
        })
        .await
    }

    /// Whether the database can take a write, as the writes found it; while
    /// it could not, one small write of its own now and then.
    async fn writable(&self) -> Result<(), StoreError> {
        match self.health.check() {
            Check::Writable => Ok(()),
            Check::Unwritable(e) => Err(e),
            Check::ProbeDue => {
                self.write(async |tx| {
                    tx.execute(PROBE_SQL).await?;
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

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn claim(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError> {
        self.claim_one(new).await
    }

    /// No batches on MariaDB yet: each claim is one transaction of its own.
    async fn batch_claims(&self, claims: &[NewClaim<'_>]) -> Vec<Batched<Claim>> {
        claims.iter().map(|_| Batched::Alone).collect()
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
        again_on_deadlock!(
            self.write(async |tx| keys::finalize_in(tx, values).await)
                .await
        )
    }
}

/// A time as the schema stores it (milliseconds since the epoch, UTC).
fn from_millis(ms: i64) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
    chrono::DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("{ms} is not a time in milliseconds")))
}
