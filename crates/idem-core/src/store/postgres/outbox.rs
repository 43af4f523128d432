//! The `outbox` table on PostgreSQL. A relay takes its batch with `for update
//! skip locked` and keeps that transaction open while the broker confirms the
//! batch: the one transaction idem holds across a call to another system, and
//! deliberately: the rows it locks are the relay's own, no request ever waits
//! on them, and another relay skips them instead of waiting.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use const_format::concatcp;

use super::pool::{PgConn, PgPool};
use super::PgStore;
use crate::store::batch::{self, Batched};
use crate::store::error::StoreError;
use crate::store::model::NewResult;
use crate::store::ops::Outbox;
use crate::store::outbox::ResultRow;
use crate::store::outbox::{AWAITED_KEY, BATCH_COLUMNS};
use crate::store::relay_batch::{BatchHold, OutboxBatch};
use crate::store::shared::millis;

/// Queue commands' results, as many as there are arrays' elements, in their
/// order. The statement reads no table, so one prepared plan serves every
/// batch size (unlike the claim's, see [`super::batched`]).
const INSERT_RESULTS_SQL: &str = "insert into outbox
        (kind, message_id, exchange, routing_key, tenant, correlation_id, idempotency_key,
         replayed, status, body, await_merchant_id, await_charge_id, traceparent)
    select 'result', r.message_id, r.exchange, r.routing_key, r.tenant, r.correlation_id,
           r.idempotency_key, r.replayed, r.status, r.body, r.await_merchant_id,
           r.await_charge_id, r.traceparent
      from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                  $7::bool[], $8::smallint[], $9::bytea[], $10::bigint[], $11::text[],
                  $12::text[])
           with ordinality as r(message_id, exchange, routing_key, tenant, correlation_id,
                                idempotency_key, replayed, status, body, await_merchant_id,
                                await_charge_id, traceparent, n)
     order by r.n";

/// Writes `rows` in one statement.
pub(super) async fn insert_results(pool: &PgPool, rows: &[ResultRow]) -> Result<(), StoreError> {
    fn column<'r, T>(rows: &'r [ResultRow], f: impl Fn(&'r ResultRow) -> T) -> Vec<T> {
        rows.iter().map(f).collect()
    }
    super::on_pool(pool, async |db| {
        sqlx::query(INSERT_RESULTS_SQL)
            .bind(column(rows, |r| r.message_id.as_str()))
            .bind(column(rows, |r| r.exchange.as_str()))
            .bind(column(rows, |r| r.routing_key.as_str()))
            .bind(column(rows, |r| r.tenant.as_str()))
            .bind(column(rows, |r| r.correlation_id.as_deref()))
            .bind(column(rows, |r| r.key.as_str()))
            .bind(column(rows, |r| r.replayed))
            .bind(column(rows, |r| r.status))
            .bind(column(rows, |r| r.body.as_deref()))
            .bind(column(rows, |r| r.await_merchant_id))
            .bind(column(rows, |r| r.await_charge_id.as_deref()))
            .bind(column(rows, |r| r.traceparent.as_deref()))
            .execute(db)
            .await
    })
    .await?;
    Ok(())
}

/// A batch of results for the batcher: each row's answer is the batch's.
pub(super) async fn results(pool: &PgPool, rows: Vec<ResultRow>) -> Vec<Batched<()>> {
    match insert_results(pool, &rows).await {
        Ok(()) => rows.iter().map(|_| Batched::Done(Ok(()))).collect(),
        Err(e) => {
            tracing::debug!(error = %e, rows = rows.len(), "a batch of results failed; each goes alone");
            batch::failed(rows.len(), &e)
        }
    }
}

/// A batch's open transaction, on its own connection: its row locks hold the
/// batch. Dropped unfinished, the connection is closed and the server rolls back.
struct PgBatch(PgConn);

#[async_trait::async_trait]
impl Outbox for PgStore {
    async fn outbox_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError> {
        self.take_batch(limit).await
    }

    /// Writes a result, in a batch with the results written at the same
    /// time (one statement, one commit), or alone where its batch failed.
    async fn enqueue_result(&self, new: &NewResult<'_>) -> Result<(), StoreError> {
        let row = ResultRow::new(new);
        match self.results.submit(row.clone()).await {
            Batched::Done(written) => written,
            Batched::Alone => insert_results(&self.pool, std::slice::from_ref(&row)).await,
        }
    }

    async fn prune_outbox(&self, retention: Duration, limit: i64) -> Result<u64, StoreError> {
        let done = self
            .on_conn(async |db| {
                sqlx::query(
                    "delete from outbox
                      where id = any(array(
                            select id from outbox
                             where published_at <= now() - $1 * interval '1 millisecond'
                             limit $2
                             for update skip locked))",
                )
                .bind(millis(retention))
                .bind(limit)
                .execute(db)
                .await
            })
            .await?;
        Ok(done.rows_affected())
    }

    async fn events_enabled(&self) -> Result<bool, StoreError> {
        let (enabled,): (bool,) = self
            .on_conn(async |db| {
                sqlx::query_as("select events_enabled from settings")
                    .fetch_one(db)
                    .await
            })
            .await?;
        Ok(enabled)
    }

    async fn set_events_enabled(&self, enabled: bool) -> Result<bool, StoreError> {
        let done = self
            .on_conn(async |db| {
                sqlx::query(
                    "update settings set events_enabled = $1, updated_at = now()
                      where events_enabled <> $1",
                )
                .bind(enabled)
                .execute(db)
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn outbox_backlog(&self) -> Result<(i64, f64), StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(
                "select count(*),
                            coalesce(extract(epoch from now() - min(created_at)), 0)::float8
                       from outbox where published_at is null and set_aside_at is null",
            )
            .fetch_one(db)
            .await
        })
        .await
    }
}

impl PgStore {
    async fn take_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError> {
        super::within_deadline(async {
            let mut conn = self.pool.get().await?;
            // `query`, not `raw_sql`: sqlx 0.8's `raw_sql` future is not `Send`
            // for every lifetime, and the relay runs on a spawned task.
            sqlx::query("begin").execute(conn.raw()).await?;
            let messages = sqlx::query_as(concatcp!(
                "select ",
                BATCH_COLUMNS,
                " from outbox o ",
                AWAITED_KEY,
                " where o.published_at is null and o.set_aside_at is null
                and (o.body is not null or k.response_body is not null)
              order by o.id
              limit $1
                for update of o skip locked"
            ))
            .bind(limit)
            .fetch_all(conn.raw())
            .await?;
            Ok(OutboxBatch {
                hold: Box::new(PgBatch(conn)),
                messages,
            })
        })
        .await
    }
}

impl BatchHold for PgBatch {
    /// Marks the published rows, sets aside the refused ones with their
    /// reasons, and commits, which releases the whole batch (the rows it
    /// took are the ones its transaction locked).
    fn finish<'a>(
        mut self: Box<Self>,
        published: &'a [i64],
        set_aside: &'a [(i64, String)],
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>> {
        Box::pin(super::within_deadline(async move {
            let (ids, reasons): (Vec<i64>, Vec<&str>) = set_aside
                .iter()
                .map(|(id, reason)| (*id, reason.as_str()))
                .unzip();
            self.finish_now(published, &ids, &reasons).await?;
            self.0.release();
            Ok(())
        }))
    }
}

impl PgBatch {
    async fn finish_now(
        &mut self,
        published: &[i64],
        aside_ids: &[i64],
        aside_reasons: &[&str],
    ) -> Result<(), sqlx::Error> {
        let db = self.0.raw();
        if !published.is_empty() {
            sqlx::query("update outbox set published_at = now() where id = any($1)")
                .bind(published)
                .execute(&mut *db)
                .await?;
        }
        if !aside_ids.is_empty() {
            sqlx::query(
                "update outbox set set_aside_at = now(), set_aside_reason = aside.reason
                   from unnest($1::bigint[], $2::text[]) as aside (id, reason)
                  where outbox.id = aside.id",
            )
            .bind(aside_ids)
            .bind(aside_reasons)
            .execute(&mut *db)
            .await?;
        }
        sqlx::query("commit").execute(&mut *db).await?;
        Ok(())
    }
}
