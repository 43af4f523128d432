//! The `outbox` table: messages for the broker, written with the decision that
//! makes them and published later by the relay.
//!
//! Charge events are written by the finalize itself,
//! in the statement that stores the outcome, so an outcome without its event
//! (or an event without its outcome) cannot exist. Results of queue commands
//! are written by [`Store::enqueue_result`] before the command is acknowledged.
//!
//! A relay's batch is held by a row-locking transaction on PostgreSQL and by
//! a lease on SQLite (see each backend's `outbox` module). Either way a batch
//! that is not marked published goes out again: at-least-once.
//!
//! A row the broker can never take (see `queue::relay`) is set aside instead:
//! `set_aside_at` and `set_aside_reason` are set, and it is skipped by every
//! later batch, left out of the backlog, and never pruned, so that it neither
//! blocks the rows behind it nor disappears.

use super::model::{NewResult, OutboxMessage, ResultAnswer};
use super::postgres::PgBatch;
use super::sqlite::SqliteStore;
use super::StoreError;
use crate::domain::MessageId;

/// What a batch reads of the rows it took: a waiting result takes its key's
/// stored outcome. `o` is the outbox, `k` the awaited key record.
pub(super) const BATCH_COLUMNS: &str =
    "o.id, o.kind, o.message_id, o.exchange, o.routing_key, o.tenant, o.event_type,
     o.correlation_id, o.idempotency_key, o.replayed,
     coalesce(o.status, k.response_status) as status,
     coalesce(o.body, k.response_body) as body";

/// Joins each outbox row `o` to the key record whose outcome it waits for.
pub(super) const AWAITED_KEY: &str = "left join idempotency_keys k
       on o.body is null
      and k.merchant_id = o.await_merchant_id and k.idempotency_key = o.idempotency_key
      and k.charge_id = o.await_charge_id and k.state = 'completed'";

/// A result's answer as its outbox columns: a status and body known now, or
/// the key record (merchant, charge) whose stored outcome it waits for.
pub(super) struct AnswerColumns<'a> {
    pub(super) status: Option<i16>,
    pub(super) body: Option<&'a [u8]>,
    pub(super) await_merchant_id: Option<i64>,
    pub(super) await_charge_id: Option<&'a str>,
}

impl<'a> AnswerColumns<'a> {
    pub(super) fn of(answer: &ResultAnswer<'a>) -> Self {
        match answer {
            ResultAnswer::Now(r) => Self {
                status: Some(i16::try_from(r.status).unwrap_or(i16::MAX)),
                body: Some(r.body.as_ref()),
                await_merchant_id: None,
                await_charge_id: None,
            },
            ResultAnswer::WhenSettled {
                merchant_id,
                charge_id,
            } => Self {
                status: None,
                body: None,
                await_merchant_id: Some(*merchant_id),
                await_charge_id: Some(charge_id.as_str()),
            },
        }
    }
}

/// A queue command's result, owned: what a batch of results carries to its
/// worker. Its columns are the outbox's, in the order the inserts name them.
#[derive(Debug, Clone)]
pub(super) struct ResultRow {
    pub(super) message_id: String,
    pub(super) exchange: String,
    pub(super) routing_key: String,
    pub(super) tenant: String,
    pub(super) correlation_id: Option<String>,
    pub(super) key: String,
    pub(super) replayed: bool,
    pub(super) status: Option<i16>,
    pub(super) body: Option<bytes::Bytes>,
    pub(super) await_merchant_id: Option<i64>,
    pub(super) await_charge_id: Option<String>,
}

impl ResultRow {
    /// The row for `new`, with a fresh message id.
    pub(super) fn new(new: &NewResult<'_>) -> Self {
        let answer = AnswerColumns::of(&new.answer);
        Self {
            message_id: MessageId::result().as_str().to_owned(),
            exchange: new.exchange.to_owned(),
            routing_key: new.routing_key.to_owned(),
            tenant: new.tenant.to_owned(),
            correlation_id: new.correlation_id.map(str::to_owned),
            key: new.key.as_str().to_owned(),
            replayed: new.replayed,
            status: answer.status,
            body: match &new.answer {
                ResultAnswer::Now(r) => Some(r.body.clone()),
                ResultAnswer::WhenSettled { .. } => None,
            },
            await_merchant_id: answer.await_merchant_id,
            await_charge_id: answer.await_charge_id.map(str::to_owned),
        }
    }
}

/// A batch taken by one relay: its rows are skipped by other relays until
/// [`OutboxBatch::finish`], or, if the relay dies first, until its transaction
/// ends (PostgreSQL) or its lease runs out (SQLite).
pub struct OutboxBatch {
    pub(super) hold: BatchHold,
    pub messages: Vec<OutboxMessage>,
}

pub(super) enum BatchHold {
    Postgres(PgBatch),
    /// The batch is leased; finishing it is a write like any other.
    Sqlite(SqliteStore),
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
        match self.hold {
            BatchHold::Postgres(batch) => {
                let (ids, reasons): (Vec<i64>, Vec<&str>) = set_aside
                    .iter()
                    .map(|(id, reason)| (*id, reason.as_str()))
                    .unzip();
                batch.finish(published, &ids, &reasons).await
            }
            BatchHold::Sqlite(store) => {
                let taken: Vec<i64> = self.messages.iter().map(|m| m.id).collect();
                store.finish_batch(&taken, published, set_aside).await
            }
        }
    }
}
