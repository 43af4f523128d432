//! The PostgreSQL store: every SQL statement idem runs, one function per domain
//! operation, beside the table it owns.
//!
//! Invariants the schema and these statements keep together:
//! - one idempotency record per `(merchant, key)` (the primary key decides races);
//! - a record and its charge are created in one statement, so neither exists alone;
//! - a record's outcome is written once, by the holder of its current `attempt`
//!   (the fencing token), in the same statement that settles the charge;
//! - no statement here is ever left open across a call to the acquirer: each
//!   function is one round trip in its own implicit transaction.

mod charges;
mod idempotency;
mod merchants;
mod outbox;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

pub use charges::{ProcessingStats, StuckCharge};
pub use idempotency::{
    Claim, KeyRecord, KeyState, NewClaim, Orphan, Settlement, CLAIM_SQL, FINALIZE_SQL,
};
pub use merchants::{MerchantCache, MerchantError};
pub use outbox::{NewEvent, NewResult, OutboxBatch, OutboxMessage, ResultAnswer};

/// How long a request waits for a pooled connection before answering 503:
/// long enough to ride out a burst, short enough that a client retries on a
/// healthy instance instead of hanging on a sick one.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Errors in the store's words.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached now; retrying later may work.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// Anything else the database refused: a bug, not weather.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// A row that the schema's checks should have made impossible.
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Protocol(_) => Self::Unavailable(e),
            _ => Self::Database(e),
        }
    }
}

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    /// Connects a pool. No connection ping before each use: a dead connection
    /// shows up as an I/O error on the statement itself, which is a 503 anyway,
    /// and a ping would add a round trip to every request.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let (pool, options) = Self::pool_options(url, max_connections)?;
        Ok(Self {
            pool: pool.connect_with(options).await?,
        })
    }

    /// Like [`Store::connect`], but connects on first use: a server started
    /// while the database is down comes up, answers 503 (readiness red), and
    /// starts working when the database does, with no restart.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let (pool, options) = Self::pool_options(url, max_connections)?;
        Ok(Self {
            pool: pool.connect_lazy_with(options),
        })
    }

    fn pool_options(
        url: &str,
        max_connections: u32,
    ) -> Result<(PgPoolOptions, PgConnectOptions), StoreError> {
        let options: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false);
        Ok((pool, options.application_name("idem")))
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates or upgrades the schema. Safe to run from several processes at
    /// once: sqlx serializes migrations with an advisory lock.
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        sqlx::migrate!("./migrations").run(&self.pool).await
    }

    /// One trivial round trip: is the database answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// Milliseconds as `i64` for interval arithmetic in SQL.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
