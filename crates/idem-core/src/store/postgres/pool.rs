//! PostgreSQL connections: a pool (deadpool) of sqlx connections that takes a
//! connection back without a round trip.
//!
//! Why not sqlx's own pool: it pings every connection as it comes back
//! (`return_to_pool` in sqlx-core 0.8 and 0.9), in case a dropped future left
//! it mid-statement. For idem's operations, one statement each, that is a
//! second round trip per request: a replay cost two where the database needs
//! one. Here the same safety has a cheaper rule: a connection goes back to the
//! pool only when its operation succeeded. After an error or a cancelled future
//! (the caller gone mid-statement, a crash point) it is closed instead, and the
//! pool opens a fresh one when it needs it. Errors are rare on these paths, so
//! the reconnect is rare too.

use std::time::Duration;

use deadpool::managed::{Manager, Metrics, Object, Pool, PoolError, RecycleError, RecycleResult};
use deadpool::Runtime;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

use crate::store::health::WriteHealth;

/// A connection older than this is closed instead of reused (sqlx's default
/// too), so that a server-side change (a failover behind a name, a changed
/// setting) reaches every connection in bounded time.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// Opens connections for the pool.
pub(super) struct Connector {
    options: PgConnectOptions,
}

impl Manager for Connector {
    type Type = PgConnection;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<PgConnection, sqlx::Error> {
        self.options.connect().await
    }

    /// No round trip: a connection in the pool is known to have finished its
    /// last operation cleanly (see the module's rule).
    async fn recycle(&self, _: &mut PgConnection, metrics: &Metrics) -> RecycleResult<sqlx::Error> {
        if metrics.age() > MAX_LIFETIME {
            return Err(RecycleError::message("past its lifetime"));
        }
        Ok(())
    }
}

/// The pool of one store; cheap to clone.
#[derive(Clone)]
pub(super) struct PgPool {
    pool: Pool<Connector>,
    /// Whether the database could write, as its connections' last
    /// operations found it (readiness reads it).
    health: WriteHealth,
}

impl PgPool {
    /// A pool of up to `max_connections`, opened on demand; waiting for a
    /// connection, or opening one, gives up after `acquire_timeout`.
    pub(super) fn new(
        options: PgConnectOptions,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, sqlx::Error> {
        Self::with_health(
            options,
            max_connections,
            acquire_timeout,
            WriteHealth::default(),
        )
    }

    /// Another pool to the same database, of connections opened with
    /// `options`, whose operations tell the write health this one reads.
    pub(super) fn sibling(
        &self,
        options: PgConnectOptions,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, sqlx::Error> {
        Self::with_health(
            options,
            max_connections,
            acquire_timeout,
            self.health.clone(),
        )
    }

    fn with_health(
        options: PgConnectOptions,
        max_connections: u32,
        acquire_timeout: Duration,
        health: WriteHealth,
    ) -> Result<Self, sqlx::Error> {
        let pool = Pool::builder(Connector { options })
            .max_size(max_connections as usize)
            .wait_timeout(Some(acquire_timeout))
            .create_timeout(Some(acquire_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| sqlx::Error::Configuration(e.into()))?;
        Ok(Self { pool, health })
    }

    /// One connection, held until [`PgConn::release`] (or closed when dropped).
    pub(super) async fn get(&self) -> Result<PgConn, sqlx::Error> {
        match self.pool.get().await {
            Ok(object) => Ok(PgConn(Some(object))),
            // Opening a connection failed: whatever the server said (a wrong
            // password during a rotation, a database not there yet, a refused
            // TLS handshake), the store is unavailable to this request, which
            // answers 503 and is retried, rather than a permanent refusal of
            // the request itself (a queue command would be dead-lettered).
            Err(PoolError::Backend(e)) => Err(sqlx::Error::Io(std::io::Error::other(e))),
            Err(PoolError::Timeout(_)) => Err(sqlx::Error::PoolTimedOut),
            Err(PoolError::Closed) => Err(sqlx::Error::PoolClosed),
            Err(e) => Err(sqlx::Error::Configuration(e.to_string().into())),
        }
    }

    /// Connections open now, and how many of them are idle.
    pub(super) fn stats(&self) -> (u32, usize) {
        let status = self.pool.status();
        (
            u32::try_from(status.size).unwrap_or(u32::MAX),
            status.available,
        )
    }

    /// Closes the idle connections politely (the server sees a goodbye, not a
    /// reset) and refuses new work; busy ones close as they come back.
    pub(super) async fn close(&self) {
        for conn in self.pool.retain(|_, _| false).removed {
            let _ = conn.close().await;
        }
        self.pool.close();
    }

    pub(super) fn health(&self) -> &WriteHealth {
        &self.health
    }
}

/// A connection taken from a [`PgPool`]: closed when dropped, unless released.
pub(super) struct PgConn(Option<Object<Connector>>);

impl PgConn {
    pub(super) fn raw(&mut self) -> &mut PgConnection {
        self.0
            .as_mut()
            .expect("a PgConn holds its connection until dropped")
    }

    /// Its operation finished cleanly: back to the pool for the next one.
    pub(super) fn release(mut self) {
        drop(self.0.take());
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            // Out of the pool for good; dropping the connection closes its socket.
            drop(Object::take(object));
        }
    }
}
