//! The `outbox` table: messages for the broker, written with the decision that
//! makes them and published later by the relay.
//!
//! Charge events are written by [`FINALIZE_SQL`](super::FINALIZE_SQL) itself,
//! in the statement that stores the outcome, so an outcome without its event
//! (or an event without its outcome) cannot exist. Results of queue commands
//! are written by [`Store::enqueue_result`] before the command is acknowledged.
//!
//! The relay takes a batch with `for update skip locked` and keeps that
//! transaction open while the broker confirms the batch. This is the one
//! transaction idem holds across a call to another system, and deliberately:
//! the rows it locks are the relay's own, no request ever waits on them, and
//! another relay skips them instead of waiting.

use std::time::Duration;

use bytes::Bytes;
use sqlx::{Postgres, Transaction};

use super::{millis, Store, StoreError};
use crate::domain::{ChargeId, MessageId};
use crate::idempotency::{IdempotencyKey, StoredResponse};

/// A charge event to write with the outcome that produces it.
pub struct NewEvent<'a> {
    pub message_id: MessageId,
    pub exchange: &'a str,
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

/// A batch taken by one relay: its rows stay locked (skipped by other relays)
/// until [`OutboxBatch::published`] commits or the batch is dropped.
pub struct OutboxBatch {
    tx: Transaction<'static, Postgres>,
    pub messages: Vec<OutboxMessage>,
}

impl OutboxBatch {
    /// Marks these rows published and releases the batch. Rows of the batch
    /// left out (the broker refused them) go out again in a later batch.
    pub async fn published(mut self, ids: &[i64]) -> Result<(), StoreError> {
        sqlx::query("update outbox set published_at = now() where id = any($1)")
            .bind(ids)
            .execute(&mut *self.tx)
            .await?;
        self.tx.commit().await?;
        Ok(())
    }
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
        sqlx::query(
            "insert into outbox (kind, message_id, exchange, routing_key, tenant, correlation_id,
                                 idempotency_key, replayed, status, body,
                                 await_merchant_id, await_charge_id)
             values ('result', $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
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
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Takes up to `limit` messages ready to publish, oldest first, skipping
    /// rows another relay holds. A waiting result is ready once its key's
    /// outcome is stored, and takes that outcome's status and body.
    pub async fn outbox_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError> {
        let mut tx = self.pool.begin().await?;
        let messages = sqlx::query_as(
            "select o.id, o.kind, o.message_id, o.exchange, o.routing_key, o.tenant, o.event_type,
                    o.correlation_id, o.idempotency_key, o.replayed,
                    coalesce(o.status, k.response_status) as status,
                    coalesce(o.body, k.response_body) as body
               from outbox o
               left join idempotency_keys k
                 on o.body is null
                and k.merchant_id = o.await_merchant_id and k.idempotency_key = o.idempotency_key
                and k.charge_id = o.await_charge_id and k.state = 'completed'
              where o.published_at is null and (o.body is not null or k.response_body is not null)
              order by o.id
              limit $1
                for update of o skip locked",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Ok(OutboxBatch { tx, messages })
    }

    /// Deletes up to `limit` messages published longer than `retention` ago.
    pub async fn prune_outbox(&self, retention: Duration, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "delete from outbox
              where id = any(array(
                    select id from outbox
                     where published_at <= now() - $1 * interval '1 millisecond'
                     limit $2
                     for update skip locked))",
        )
        .bind(millis(retention))
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Messages not yet published, and the age of the oldest, in seconds.
    pub async fn outbox_backlog(&self) -> Result<(i64, f64), StoreError> {
        let row: (i64, f64) = sqlx::query_as(
            "select count(*),
                    coalesce(extract(epoch from now() - min(created_at)), 0)::float8
               from outbox where published_at is null",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row)
    }
}
