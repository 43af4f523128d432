//! The PostgreSQL backend, the deployment for many hosts: every operation is
//! one statement (data-modifying CTEs where it writes several tables), so each
//! is its own short transaction and one round trip, on a connection from
//! idem's own pool ([`pool`]).

mod audit;
mod batched;
mod charges;
mod console;
mod key_space;
mod keys;
mod merchants;
mod outbox;
mod pool;
mod refunds;
mod steps;
mod webhooks;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::PgConnection;

use super::batch::{Batched, Batcher};
use super::error::StoreError;
use super::health::Check;
use super::model::PoolStats;
use super::model::{Claim, NewClaim};
use super::ops::{Base, LocalFuture};
use super::outbox::ResultRow;
use super::params::{ClaimRow, FinalizeRow, FinalizeValues};
use super::shared::{
    millis, past_deadline, ACQUIRE_TIMEOUT, BATCHES_AT_ONCE, BATCH_CAP, STORE_DEADLINE,
};
use crate::domain::{AcquirerReference, ChargeId};
use pool::PgPool;

pub use keys::{CLAIM_SQL, FINALIZE_SQL};

/// PostgreSQL's `statement_timeout` on idem's connections. Every statement
/// idem runs is short (a claim, a finalize, a batch of at most 1 000 rows), so
/// one still running after 2 s is stuck behind a lock or on a sick server. It
/// then ends as a transient error (SQLSTATE 57014: a 503, or another attempt
/// for a queue command) instead of holding its connection, well inside the
/// store's own deadline ([`STORE_DEADLINE`], which also bounds the answer
/// that never comes). Migrations lift it.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// TCP keepalives, as PostgreSQL's own settings for the server's end of each
/// connection: probes start after 30 s idle, every 10 s, and 3 unanswered
/// ones end it, so a connection whose client vanished (a host lost, a
/// partition) is gone within about a minute, with its transaction and locks
/// (a relay's batch, say). sqlx 0.8 sets no keepalive on its own end (it
/// opens the socket itself and sets only `TCP_NODELAY`, and ignores libpq's
/// `keepalives*` URL parameters): see docs/operations.md.
const TCP_KEEPALIVES: [(&str, &str); 3] = [
    ("tcp_keepalives_idle", "30"),
    ("tcp_keepalives_interval", "10"),
    ("tcp_keepalives_count", "3"),
];

/// A PostgreSQL store; cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The batch workers' connections ([`batch_connections`]).
    batch_pool: PgPool,
    /// Claims and finalizes go to the database in batches ([`batched`]).
    claims: Batcher<ClaimRow, Claim>,
    finalizes: Batcher<FinalizeRow, bool>,
    /// Queue commands' results, likewise ([`outbox`]).
    results: Batcher<ResultRow, ()>,
    /// Refunds' claims and finalizes, likewise ([`refunds`]).
    refund_claims: Batcher<refunds::ClaimRow, refunds::ClaimAnswer>,
    refund_finalizes: Batcher<refunds::FinalizeRow, bool>,
}

impl PgStore {
    /// The pool, connecting on first use: idem's name in `pg_stat_activity`,
    /// the statement timeout and the server's keepalives, sent as startup
    /// options (`-c`), so they hold from the connection's first statement with
    /// no round trip. A `statement_timeout` or `options` given in the URL comes
    /// first and is overridden.
    pub(super) fn lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse()?;
        let statement_timeout = format!("{}ms", millis(STATEMENT_TIMEOUT));
        let options = options
            .application_name("idem")
            .options([("statement_timeout", statement_timeout.as_str())])
            .options(TCP_KEEPALIVES);
        // The command line refuses fewer than two (`--db-max-connections`).
        let max_connections = max_connections.max(2);
        let batch_connections = batch_connections(max_connections);
        let pool = PgPool::new(
            options.clone(),
            max_connections - batch_connections,
            ACQUIRE_TIMEOUT,
        )?;
        let batch_pool = pool.sibling(
            options.options(BATCH_PLANNER),
            batch_connections,
            ACQUIRE_TIMEOUT,
        )?;
        let claims = Batcher::new(
            "claim",
            BATCHES_AT_ONCE,
            BATCH_CAP,
            ACQUIRE_TIMEOUT,
            batch_pool.clone(),
            async |pool: PgPool, rows| batched::claims(&pool, rows).await,
        );
        let finalizes = Batcher::new(
            "finalize",
            BATCHES_AT_ONCE,
            BATCH_CAP,
            ACQUIRE_TIMEOUT,
            batch_pool.clone(),
            async |pool: PgPool, rows| batched::finalizes(&pool, rows).await,
        );
        let results = Batcher::new(
            "result",
            BATCHES_AT_ONCE,
            BATCH_CAP,
            ACQUIRE_TIMEOUT,
            batch_pool.clone(),
            async |pool: PgPool, rows| outbox::results(&pool, rows).await,
        );
        let refund_claims = Batcher::new(
            "refund_claim",
            BATCHES_AT_ONCE,
            BATCH_CAP,
            ACQUIRE_TIMEOUT,
            batch_pool.clone(),
            async |pool: PgPool, rows| refunds::claims(&pool, rows).await,
        );
        let refund_finalizes = Batcher::new(
            "refund_finalize",
            BATCHES_AT_ONCE,
            BATCH_CAP,
            ACQUIRE_TIMEOUT,
            batch_pool.clone(),
            async |pool: PgPool, rows| refunds::finalizes(&pool, rows).await,
        );
        Ok(Self {
            pool,
            batch_pool,
            claims,
            finalizes,
            results,
            refund_claims,
            refund_finalizes,
        })
    }

    /// Runs `op` on one connection of the pool, within [`STORE_DEADLINE`].
    /// The connection goes back to the pool only if `op` succeeds; on an
    /// error, past the deadline, or if the future is dropped before `op`
    /// ends, it is closed (see [`pool`] for why). Every operation of this
    /// backend runs through here, but for the relay's batch (bounded the same
    /// way) and migrations (unbounded).
    async fn on_conn<T, E>(
        &self,
        op: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, StoreError>
    where
        E: Into<StoreError>,
    {
        on_pool(&self.pool, op).await
    }

    /// Runs `op` as one transaction on one connection (through
    /// [`PgStore::on_conn`]): for an operator's action, which writes a few
    /// rows and its audit record together or not at all.
    async fn in_tx<T>(
        &self,
        op: impl AsyncFnOnce(&mut PgConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.on_conn(async |db| -> Result<T, StoreError> {
            let mut tx = sqlx::Connection::begin(db).await?;
            let out = op(&mut tx).await?;
            tx.commit().await?;
            Ok(out)
        })
        .await
    }
}

/// Connections of `max_connections` (at least 2) kept for the batch
/// workers: one per kind of batch (claims, finalizes, queue results, refund
/// claims, refund finalizes) when there are enough, and never more than
/// half. Their planner is set by [`BATCH_PLANNER`].
fn batch_connections(max_connections: u32) -> u32 {
    (max_connections / 2).clamp(1, 5)
}

/// How PostgreSQL plans on the batch workers' connections, which run only
/// the batch statements ([`batched`], [`outbox`]'s results), written so that
/// every row they read has a primary key to be read by:
/// - each statement is planned once and its plan kept (`plan_cache_mode`):
///   left to choose, PostgreSQL planned the claim's afresh for every batch
///   (it sees each batch's size), 9 % of its CPU per new charge;
/// - that plan reads by index and joins by nested loop (no sequential or
///   bitmap scan where an index serves, no hash or merge join): a plan made
///   while a table was empty, and kept, would otherwise scan it whole for
///   every batch as it grows, and a bitmap scan of the in-flight index reads
///   every dead entry in it (migration 0011);
/// - without JIT compilation: a path PostgreSQL is told to avoid is costed
///   at 10^10, over `jit_above_cost`, and compiling took 0.66 s per batch.
///
/// The other connections keep PostgreSQL's own choices (docs/benchmarks.md).
const BATCH_PLANNER: [(&str, &str); 6] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("jit", "off"),
];

/// The readiness probe's write: one row, rewritten in place.
const PROBE_SQL: &str = "insert into write_probe (id, probed_at) values (1, now())
    on conflict (id) do update set probed_at = excluded.probed_at";

/// [`PgStore::on_conn`] on a pool alone (for the batch workers, which must not
/// hold the store).
async fn on_pool<T, E>(
    pool: &PgPool,
    op: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, StoreError>
where
    E: Into<StoreError>,
{
    let result = within_deadline(async {
        let mut conn = pool.get().await?;
        let result = op(conn.raw()).await.map_err(Into::into);
        if result.is_ok() {
            conn.release();
        }
        result
    })
    .await;
    pool.health().saw(&result, false);
    result
}

/// `work`'s answer, or [`StoreError::Unavailable`] at [`STORE_DEADLINE`]:
/// the work is dropped there, and a connection it held is closed with it.
async fn within_deadline<T>(
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(STORE_DEADLINE, work)
        .await
        .unwrap_or_else(|_| Err(past_deadline()))
}

impl PgStore {
    /// Creates or upgrades the schema; sqlx serializes concurrent runs with an
    /// advisory lock. A migration may build an index on a big table: no
    /// statement timeout for it; the connection gets the usual one back after.
    async fn migrate_now(&self) -> Result<(), sqlx::migrate::MigrateError> {
        let mut conn = self.pool.get().await?;
        let db = conn.raw();
        sqlx::query("set statement_timeout = 0")
            .execute(&mut *db)
            .await?;
        sqlx::migrate!("./migrations/postgres")
            .run(&mut *db)
            .await?;
        sqlx::query("reset statement_timeout")
            .execute(&mut *db)
            .await?;
        conn.release();
        Ok(())
    }
}

#[async_trait::async_trait]
impl Base for PgStore {
    fn system_name(&self) -> &'static str {
        "postgresql"
    }

    fn migrate(&self) -> LocalFuture<'_, Result<(), sqlx::migrate::MigrateError>> {
        Box::pin(self.migrate_now())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.on_conn(async |db| sqlx::query("select 1").execute(db).await)
            .await
            .map(drop)
    }

    /// Whether the database can take a write, as the operations found it;
    /// while it could not, one small write of its own now and then
    /// ([`crate::store::health`]).
    async fn writable(&self) -> Result<(), StoreError> {
        match self.pool.health().check() {
            Check::Writable => Ok(()),
            Check::Unwritable(e) => Err(e),
            Check::ProbeDue => {
                let probed = self
                    .on_conn(async |db| sqlx::query(PROBE_SQL).execute(db).await)
                    .await
                    .map(drop);
                self.pool.health().saw(&probed, true);
                probed
            }
        }
    }

    fn pool_stats(&self) -> PoolStats {
        let (size, idle) = self.pool.stats();
        let (batch_size, batch_idle) = self.batch_pool.stats();
        PoolStats {
            size: size + batch_size,
            idle: idle + batch_idle,
        }
    }

    async fn close(&self) {
        self.pool.close().await;
        self.batch_pool.close().await;
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
