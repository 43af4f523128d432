//! The `outbox` table on MariaDB. A relay leases its batch, as on SQLite
//! (`claimed_until`, committed at once), instead of holding a transaction
//! open while the broker confirms: another relay takes rows only once their
//! lease is over, and the lease is taken with `for update skip locked`, so
//! two relays leasing at once take different rows. Lists of ids travel as
//! JSON arrays, read with `json_table`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use const_format::concatcp;

use super::sql::{params, query, query_as};
use super::{MariaDbStore, NOW};
use crate::store::error::StoreError;
use crate::store::model::{NewResult, OutboxMessage};
use crate::store::ops::Outbox;
use crate::store::outbox::{AnswerColumns, AWAITED_KEY, BATCH_COLUMNS};
use crate::store::relay_batch::{BatchHold, OutboxBatch};
use crate::store::shared::millis;

/// How long a relay holds its batch before another relay may take it: well
/// past the relay's confirm timeout (10 s), so a live relay is never
/// overtaken; it is also how long the batch of a relay that died waits.
const BATCH_LEASE: Duration = Duration::from_secs(30);

const ENQUEUE_RESULT_SQL: &str = concatcp!(
    "insert into outbox (kind, message_id, exchange, routing_key, tenant, correlation_id,
                         idempotency_key, replayed, status, body,
                         await_merchant_id, await_charge_id, traceparent, created_at)
     values ('result', $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, ",
    NOW,
    ")"
);

/// `$1` limit: the rows ready to publish and free, read without a lock.
const READY_SQL: &str = concatcp!(
    "select o.id from outbox o ",
    AWAITED_KEY,
    " where o.published_at is null and o.set_aside_at is null
        and (o.claimed_until is null or o.claimed_until <= ",
    NOW,
    ")
        and (o.body is not null or k.response_body is not null)
      order by o.id
      limit $1"
);

/// Of the rows `$1` (a JSON array), those still free, locked (a row another
/// relay is leasing now is skipped).
const LOCK_FREE_SQL: &str = concatcp!(
    "select o.id from outbox o
       join json_table($1, '$[*]' columns (id bigint path '$')) j on o.id = j.id
      where o.published_at is null and o.set_aside_at is null
        and (o.claimed_until is null or o.claimed_until <= ",
    NOW,
    ")
      order by o.id
      for update skip locked"
);

/// `$1` the rows locked (a JSON array), `$2` lease in ms.
const LEASE_SQL: &str = concatcp!(
    "update outbox o join json_table($1, '$[*]' columns (id bigint path '$')) j on o.id = j.id
        set o.claimed_until = ",
    NOW,
    " + $2"
);

/// `$1` the leased ids, as a JSON array.
const READ_BATCH_SQL: &str = concatcp!(
    "select ",
    BATCH_COLUMNS,
    " from json_table($1, '$[*]' columns (id bigint path '$')) j
       join outbox o on o.id = j.id ",
    AWAITED_KEY,
    " order by o.id"
);

/// `$1` id, `$2` reason.
const SET_ASIDE_SQL: &str = concatcp!(
    "update outbox set set_aside_at = ",
    NOW,
    ", set_aside_reason = $2 where id = $1"
);

/// `$1` the published ids, `$2` the whole batch's, as JSON arrays.
const FINISH_BATCH_SQL: &str = concatcp!(
    "update outbox o join json_table($2, '$[*]' columns (id bigint path '$')) t on o.id = t.id
        set o.published_at = coalesce(o.published_at,
                case when o.id in (select id from json_table($1, '$[*]' columns (id bigint path '$')) j)
                     then ",
    NOW,
    " end),
            o.claimed_until = null"
);

/// `$1` retention in ms, `$2` limit.
const PRUNE_SQL: &str = concatcp!(
    "delete from outbox where published_at <= ",
    NOW,
    " - $1 order by published_at limit $2"
);

/// `$1` whether events are on.
const SET_EVENTS_SQL: &str = concatcp!(
    "update settings set events_enabled = $1, updated_at = ",
    NOW,
    " where events_enabled <> $1"
);

const BACKLOG_SQL: &str = concatcp!(
    "select count(*), cast(coalesce((",
    NOW,
    " - min(created_at)) / 1000, 0) as double)
       from outbox where published_at is null and set_aside_at is null"
);

#[async_trait::async_trait]
impl Outbox for MariaDbStore {
    async fn outbox_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError> {
        let messages = self.lease_batch(limit).await?;
        let taken = messages.iter().map(|m| m.id).collect();
        Ok(OutboxBatch {
            messages,
            hold: Box::new(Lease {
                store: self.clone(),
                taken,
            }),
        })
    }

    async fn enqueue_result(&self, new: &NewResult<'_>) -> Result<(), StoreError> {
        let answer = AnswerColumns::of(&new.answer);
        self.write(async |tx| {
            query(
                ENQUEUE_RESULT_SQL,
                params![
                    new.message_id.as_str(),
                    new.exchange,
                    new.routing_key,
                    new.tenant,
                    new.correlation_id,
                    new.key.as_str(),
                    new.replayed,
                    answer.status.map(i64::from),
                    answer.body,
                    answer.await_merchant_id,
                    answer.await_charge_id,
                    new.traceparent
                ],
            )?
            .execute(&mut *tx)
            .await?;
            Ok(())
        })
        .await
    }

    async fn prune_outbox(&self, retention: Duration, limit: i64) -> Result<u64, StoreError> {
        self.write(async |tx| {
            let done = query(PRUNE_SQL, params![millis(retention), limit])?
                .execute(&mut *tx)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn events_enabled(&self) -> Result<bool, StoreError> {
        let (enabled,): (bool,) = query_as("select events_enabled from settings", params![])?
            .fetch_one(&self.pool)
            .await?;
        Ok(enabled)
    }

    async fn set_events_enabled(&self, enabled: bool) -> Result<bool, StoreError> {
        self.write(async |tx| {
            let done = query(SET_EVENTS_SQL, params![enabled])?
                .execute(&mut *tx)
                .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn outbox_backlog(&self) -> Result<(i64, f64), StoreError> {
        Ok(query_as(BACKLOG_SQL, params![])?
            .fetch_one(&self.pool)
            .await?)
    }
}

impl MariaDbStore {
    /// Leases and reads a batch in one write transaction, so two relays never
    /// lease the same row; it commits at once, before any publish.
    async fn lease_batch(&self, limit: i64) -> Result<Vec<OutboxMessage>, StoreError> {
        self.write(async |tx| {
            let ready: Vec<(i64,)> = query_as(READY_SQL, params![limit])?
                .fetch_all(&mut *tx)
                .await?;
            if ready.is_empty() {
                return Ok(Vec::new());
            }
            let ready: Vec<i64> = ready.into_iter().map(|(id,)| id).collect();
            let locked: Vec<(i64,)> = query_as(LOCK_FREE_SQL, params![json_ids(&ready)?.as_str()])?
                .fetch_all(&mut *tx)
                .await?;
            let ids: Vec<i64> = locked.into_iter().map(|(id,)| id).collect();
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            query(
                LEASE_SQL,
                params![json_ids(&ids)?.as_str(), millis(BATCH_LEASE)],
            )?
            .execute(&mut *tx)
            .await?;
            Ok(query_as(READ_BATCH_SQL, params![json_ids(&ids)?.as_str()])?
                .fetch_all(&mut *tx)
                .await?)
        })
        .await
    }

    /// Marks the published rows and sets aside the refused ones with their
    /// reasons; ends the lease of every row of the batch (`taken`).
    async fn finish_batch(
        &self,
        taken: &[i64],
        published: &[i64],
        set_aside: &[(i64, String)],
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            for (id, reason) in set_aside {
                query(SET_ASIDE_SQL, params![*id, reason.as_str()])?
                    .execute(&mut *tx)
                    .await?;
            }
            query(
                FINISH_BATCH_SQL,
                params![json_ids(published)?.as_str(), json_ids(taken)?.as_str()],
            )?
            .execute(&mut *tx)
            .await?;
            Ok(())
        })
        .await
    }
}

/// A batch held by its lease on the rows it `taken`: finishing it is a write
/// like any other, and a relay that dies holding it leaves the lease to run out.
struct Lease {
    store: MariaDbStore,
    taken: Vec<i64>,
}

impl BatchHold for Lease {
    fn finish<'a>(
        self: Box<Self>,
        published: &'a [i64],
        set_aside: &'a [(i64, String)],
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>> {
        Box::pin(async move {
            if self.taken.is_empty() {
                return Ok(()); // nothing leased: no write
            }
            self.store
                .finish_batch(&self.taken, published, set_aside)
                .await
        })
    }
}

/// Row ids as the JSON array `json_table` reads (MariaDB has no arrays).
fn json_ids(ids: &[i64]) -> Result<String, StoreError> {
    serde_json::to_string(ids).map_err(|e| StoreError::Corrupt(e.to_string()))
}
