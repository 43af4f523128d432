//! The `outbox` table: messages for the broker, written with the decision that
//! makes them and published later by the relay. What both backends share of
//! it: the batch's columns and join, and a result's row.
//!
//! Charge events are written by the finalize itself,
//! in the statement that stores the outcome, so an outcome without its event
//! (or an event without its outcome) cannot exist. Results of queue commands
//! are written by [`Store::enqueue_result`] before the command is acknowledged.
//!
//! A relay's batch is held by a row-locking transaction on PostgreSQL and by
//! a lease on SQLite (see each backend's `outbox` module, and
//! [`super::relay_batch`]). Either way a batch that is not marked published
//! goes out again: at-least-once.
//!
//! A row the broker can never take (see `queue::relay`) is set aside instead:
//! `set_aside_at` and `set_aside_reason` are set, and it is skipped by every
//! later batch, left out of the backlog, and never pruned, so that it neither
//! blocks the rows behind it nor disappears.

use super::model::{NewResult, ResultAnswer};

/// What a batch reads of the rows it took: a waiting result takes its key's
/// stored outcome, and its charge's `traceparent` if it has none of its own. `o` is the outbox, `k` the awaited key record.
pub(super) const BATCH_COLUMNS: &str =
    "o.id, o.kind, o.message_id, o.exchange, o.routing_key, o.tenant, o.event_type,
     o.correlation_id, o.idempotency_key, o.replayed,
     coalesce(o.status, k.response_status) as status,
     coalesce(o.body, k.response_body) as body,
     coalesce(o.traceparent,
              (select c.traceparent from charges c where c.id = o.await_charge_id),
              (select r.traceparent from refunds r where r.id = o.await_charge_id)) as traceparent";

/// Joins each outbox row `o` to the key record whose outcome it waits for.
/// `await_charge_id` (named before refunds) holds the record's subject: a
/// charge's id or a refund's.
pub(super) const AWAITED_KEY: &str = "left join idempotency_keys k
       on o.body is null
      and k.merchant_id = o.await_merchant_id and k.idempotency_key = o.idempotency_key
      and coalesce(k.charge_id, k.refund_id) = o.await_charge_id and k.state = 'completed'";

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
                subject,
            } => Self {
                status: None,
                body: None,
                await_merchant_id: Some(*merchant_id),
                await_charge_id: Some(subject.as_str()),
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
    pub(super) traceparent: Option<String>,
}

impl ResultRow {
    /// The row for `new`, with a fresh message id.
    pub(super) fn new(new: &NewResult<'_>) -> Self {
        let answer = AnswerColumns::of(&new.answer);
        Self {
            message_id: new.message_id.as_str().to_owned(),
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
            traceparent: new.traceparent.map(str::to_owned),
        }
    }
}
