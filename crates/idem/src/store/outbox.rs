//! The `outbox` table: messages for the broker, written with the decision that
//! makes them and published later by the relay.
//!
//! Charge events are written by [`FINALIZE_SQL`](super::FINALIZE_SQL) itself,
//! in the statement that stores the outcome, so an outcome without its event
//! (or an event without its outcome) cannot exist. Results of queue commands
//! are written by [`Store::enqueue_result`] before the command is acknowledged.
//!
//! On PostgreSQL the relay takes a batch with `for update skip locked` and
//! keeps that transaction open while the broker confirms the batch. This is
//! the one transaction idem holds across a call to another system, and
//! deliberately: the rows it locks are the relay's own, no request ever waits
//! on them, and another relay skips them instead of waiting.
//!
//! SQLite has no row locks, and an open write transaction there would stop
//! every request in every process; so a relay leases its batch instead
//! (`claimed_until`, committed at once), and another relay takes rows only
//! once their lease is over. Either way a batch that is not marked published
//! goes out again: at-least-once.
//!
//! A row the broker can never take (see `queue::relay`) is set aside instead:
//! `set_aside_at` and `set_aside_reason` are set, and it is skipped by every
//! later batch, left out of the backlog, and never pruned, so that it neither
//! blocks the rows behind it nor disappears.

use std::time::Duration;

use bytes::Bytes;
use sqlx::SqlitePool;

use super::pg::PgConn;
use super::{millis, Db, Store, StoreError, WriteTurns};
use crate::domain::{ChargeId, MessageId};
use crate::domain::{IdempotencyKey, StoredResponse};

/// How long a SQLite relay holds its batch before another relay may take it:
/// well past the relay's confirm timeout (10 s), so a live relay is never
/// overtaken; it is also how long the batch of a relay that died waits.
const SQLITE_BATCH_LEASE: Duration = Duration::from_secs(30);

/// A charge event to write with the outcome that produces it.
/// Its exchange is always [`EVENTS_EXCHANGE`](crate::domain::EVENTS_EXCHANGE).
pub struct NewEvent<'a> {
    pub message_id: MessageId,
    pub event_type: &'a str,
    pub tenant: &'a str,
    pub body: Bytes,
}

/// Where a command's result goes, and what it answers.
pub struct NewResult<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub tenant: &'a str,
    pub correlation_id: Option<&'a str>,
    pub key: &'a IdempotencyKey,
    pub replayed: bool,
    pub answer: ResultAnswer<'a>,
}

/// A result's status and body: known now, or the key's outcome once stored.
pub enum ResultAnswer<'a> {
    Now(&'a StoredResponse),
    /// The outcome of the key's record for this charge, whenever it is stored.
    WhenSettled {
        merchant_id: i64,
        charge_id: &'a ChargeId,
    },
}

/// What one outbox row publishes.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxMessage {
    pub id: i64,
    pub kind: String,
    pub message_id: String,
    pub exchange: String,
    pub routing_key: String,
    pub tenant: String,
    pub event_type: Option<String>,
    pub correlation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub replayed: Option<bool>,
    /// Results only.
    pub status: Option<i16>,
    pub body: Vec<u8>,
}

/// A batch taken by one relay: its rows are skipped by other relays until
/// [`OutboxBatch::finish`], or, if the relay dies first, until its transaction
/// ends (PostgreSQL) or its lease runs out (SQLite).
pub struct OutboxBatch {
    hold: BatchHold,
    pub messages: Vec<OutboxMessage>,
}

enum BatchHold {
    /// The connection whose open transaction's row locks hold the batch;
    /// dropped unfinished, it is closed, and the server rolls back.
    Postgres(PgConn),
    /// The batch is leased; marking it needs only the pool (and a turn to write).
    Sqlite(SqlitePool, WriteTurns),
}

impl OutboxBatch {
    /// Marks the rows `published` (those the broker confirmed), sets aside
    /// the rows in `set_aside` (id, reason: rows that can never be published),
    /// and releases the whole batch: rows left out (refused, or never sent
    /// because the broker went away) are free for the next batch at once.
    pub async fn finish(
        self,
        published: &[i64],
        set_aside: &[(i64, String)],
    ) -> Result<(), StoreError> {
        let (aside_ids, aside_reasons): (Vec<i64>, Vec<&str>) = set_aside
            .iter()
            .map(|(id, reason)| (*id, reason.as_str()))
            .unzip();
        match self.hold {
            BatchHold::Postgres(mut conn) => {
                sqlx::query("update outbox set published_at = now() where id = any($1)")
                    .bind(published)
                    .execute(conn.raw())
                    .await?;
                if !set_aside.is_empty() {
                    sqlx::query(
                        "update outbox set set_aside_at = now(), set_aside_reason = aside.reason
                           from unnest($1::bigint[], $2::text[]) as aside (id, reason)
                          where outbox.id = aside.id",
                    )
                    .bind(&aside_ids)
                    .bind(&aside_reasons)
                    .execute(conn.raw())
                    .await?;
                }
                sqlx::query("commit").execute(conn.raw()).await?;
                conn.release();
            }
            BatchHold::Sqlite(pool, writer) => {
                let _turn = writer.take().await?;
                let taken: Vec<i64> = self.messages.iter().map(|m| m.id).collect();
                let mut tx = pool.begin_with("begin immediate").await?;
                for (id, reason) in aside_ids.iter().zip(&aside_reasons) {
                    sqlx::query(concat!(
                        "update outbox set set_aside_at = ",
                        sqlite_now!(),
                        ", set_aside_reason = $2 where id = $1"
                    ))
                    .bind(id)
                    .bind(reason)
                    .execute(&mut *tx)
                    .await?;
                }
                sqlx::query(concat!(
                    "update outbox
                        set published_at = coalesce(published_at,
                                case when id in (select value from json_each($1))
                                     then ",
                    sqlite_now!(),
                    " end),
                            claimed_until = null
                      where id in (select value from json_each($2))"
                ))
                .bind(json_ids(published)?)
                .bind(json_ids(&taken)?)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

/// Row ids as the JSON array SQLite's `json_each` reads (it has no arrays).
fn json_ids(ids: &[i64]) -> Result<String, StoreError> {
    serde_json::to_string(ids).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// What a batch reads of the rows it took: a waiting result takes its key's
/// stored outcome. `o` is the outbox, `k` the awaited key record.
macro_rules! batch_columns {
    () => {
        "o.id, o.kind, o.message_id, o.exchange, o.routing_key, o.tenant, o.event_type,
         o.correlation_id, o.idempotency_key, o.replayed,
         coalesce(o.status, k.response_status) as status,
         coalesce(o.body, k.response_body) as body"
    };
}

/// Joins each outbox row `o` to the key record whose outcome it waits for.
macro_rules! awaited_key {
    () => {
        "left join idempotency_keys k
           on o.body is null
          and k.merchant_id = o.await_merchant_id and k.idempotency_key = o.idempotency_key
          and k.charge_id = o.await_charge_id and k.state = 'completed'"
    };
}

impl Store {
    /// Writes the result of one delivery of a queue command.
    pub async fn enqueue_result(&self, new: &NewResult<'_>) -> Result<(), StoreError> {
        let (status, body, merchant_id, charge_id) = match &new.answer {
            ResultAnswer::Now(r) => (
                Some(i16::try_from(r.status).unwrap_or(i16::MAX)),
                Some(r.body.as_ref()),
                None,
                None,
            ),
            ResultAnswer::WhenSettled {
                merchant_id,
                charge_id,
            } => (None, None, Some(*merchant_id), Some(charge_id.as_str())),
        };
        on_backend!(
            write self,
            "insert into outbox (kind, message_id, exchange, routing_key, tenant, correlation_id,
                                 idempotency_key, replayed, status, body,
                                 await_merchant_id, await_charge_id)
             values ('result', $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            concat!(
                "insert into outbox (kind, message_id, exchange, routing_key, tenant, correlation_id,
                                     idempotency_key, replayed, status, body,
                                     await_merchant_id, await_charge_id, created_at)
                 values ('result', $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, ",
                sqlite_now!(),
                ")"
            ),
            |sql, db| sqlx::query(sql)
                .bind(MessageId::result().as_str())
                .bind(new.exchange)
                .bind(new.routing_key)
                .bind(new.tenant)
                .bind(new.correlation_id)
                .bind(new.key.as_str())
                .bind(new.replayed)
                .bind(status)
                .bind(body)
                .bind(merchant_id)
                .bind(charge_id)
                .execute(db)
                .await
                .map(drop)
        )?;
        Ok(())
    }

    /// Takes up to `limit` messages ready to publish, oldest first, skipping
    /// rows another relay holds. A waiting result is ready once its key's
    /// outcome is stored, and takes that outcome's status and body.
    pub async fn outbox_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError> {
        match &self.db {
            Db::Postgres(pool) => {
                let mut conn = pool.get().await?;
                // `query`, not `raw_sql`: sqlx 0.8's `raw_sql` future is not `Send`
                // for every lifetime, and the relay runs on a spawned task.
                sqlx::query("begin").execute(conn.raw()).await?;
                let messages = sqlx::query_as(concat!(
                    "select ",
                    batch_columns!(),
                    " from outbox o ",
                    awaited_key!(),
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
                    hold: BatchHold::Postgres(conn),
                    messages,
                })
            }
            Db::Sqlite(pool) => {
                // Lease and read in one write transaction, so two relays never
                // lease the same row; it commits at once, before any publish.
                let _turn = self.writer.take().await?;
                let mut tx = pool.begin_with("begin immediate").await?;
                let taken: Vec<(i64,)> = sqlx::query_as(concat!(
                    "update outbox set claimed_until = ",
                    sqlite_now!(),
                    " + $2
                      where id in (
                            select o.id from outbox o ",
                    awaited_key!(),
                    " where o.published_at is null and o.set_aside_at is null
                               and (o.claimed_until is null or o.claimed_until <= ",
                    sqlite_now!(),
                    ")
                               and (o.body is not null or k.response_body is not null)
                             order by o.id
                             limit $1)
                     returning id"
                ))
                .bind(limit)
                .bind(millis(SQLITE_BATCH_LEASE))
                .fetch_all(&mut *tx)
                .await?;
                let ids: Vec<i64> = taken.into_iter().map(|(id,)| id).collect();
                let messages = sqlx::query_as(concat!(
                    "select ",
                    batch_columns!(),
                    " from outbox o ",
                    awaited_key!(),
                    " where o.id in (select value from json_each($1)) order by o.id"
                ))
                .bind(json_ids(&ids)?)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(OutboxBatch {
                    hold: BatchHold::Sqlite(pool.clone(), self.writer.clone()),
                    messages,
                })
            }
        }
    }

    /// Deletes up to `limit` messages published longer than `retention` ago.
    pub async fn prune_outbox(&self, retention: Duration, limit: i64) -> Result<u64, StoreError> {
        Ok(on_backend!(
            write self,
            "delete from outbox
              where id = any(array(
                    select id from outbox
                     where published_at <= now() - $1 * interval '1 millisecond'
                     limit $2
                     for update skip locked))",
            concat!(
                "delete from outbox
                  where id in (
                        select id from outbox
                         where published_at <= ",
                sqlite_now!(),
                " - $1
                         limit $2)"
            ),
            |sql, db| sqlx::query(sql)
                .bind(millis(retention))
                .bind(limit)
                .execute(db)
                .await
                .map(|done| done.rows_affected())
        )?)
    }

    /// Messages not yet published, and the age of the oldest, in seconds; rows
    /// set aside are not waiting to be published, and are not counted.
    pub async fn outbox_backlog(&self) -> Result<(i64, f64), StoreError> {
        Ok(on_backend!(
            self,
            "select count(*),
                    coalesce(extract(epoch from now() - min(created_at)), 0)::float8
               from outbox where published_at is null and set_aside_at is null",
            concat!(
                "select count(*), coalesce((",
                sqlite_now!(),
                " - min(created_at)) / 1000.0, 0.0)
                   from outbox where published_at is null and set_aside_at is null"
            ),
            |sql, db| sqlx::query_as(sql).fetch_one(db).await
        )?)
    }
}
