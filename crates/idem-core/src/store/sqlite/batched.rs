//! Claims and finalizes in batches ([`crate::store::batch`]): the requests
//! waiting together share one write transaction, so one commit (one fsync,
//! with `synchronous = full`) makes all of them durable, and each statement
//! runs once for the whole batch, over its rows as one JSON parameter
//! (`json_each`). A statement per row cost more than the commit: sqlx hands
//! each statement to its SQLite worker thread and back, and at 32 clients the
//! one writer spent 1 ms of CPU per new charge in twelve of them.
//!
//! Each statement is the one-row path's over many rows, so each row means
//! what it means alone; what the statements cannot settle for a row (a second
//! claim of a key claimed in the same batch, a record to reclaim, a
//! tombstone) is left to that row's one-row path, after the batch has
//! committed ([`batch::claim_answers`]). A batch the database refuses as a
//! whole (one row's text, a constraint) is rolled back, and each of its rows
//! goes alone. A batch of one runs the one-row statements.

use std::collections::HashSet;
use std::sync::LazyLock;

use sqlx::sqlite::SqliteConnection;

use super::keys::{claim_in, finalize_in, RECORD_COLUMNS};
use super::{SqliteStore, Writer, NOW};
use crate::store::batch::{self, Batched};
use crate::store::error::StoreError;
use crate::store::model::{Claim, NewClaim};
use crate::store::params::{ClaimRow, ClaimValues, FinalizeRow, FinalizeValues, Param, Params};
use crate::store::rows::ClaimBatchRow;

/// A CTE `i` over `$1`, a JSON array of rows (as [`rows_json`] writes them):
/// a column per parameter, under its name, and `n`, the row's place from 1.
fn rows_cte<const N: usize>(params: Params<'_, N>) -> String {
    let columns: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(at, (name, param))| match param {
            Param::Bytes(_) | Param::OptBytes(_) => format!("unhex(value ->> {at}) as {name}"),
            _ => format!("value ->> {at} as {name}"),
        })
        .collect();
    format!(
        "i as (select key + 1 as n, {} from json_each($1))",
        columns.join(", ")
    )
}

/// The rows' parameters as one JSON array of arrays, in `$N` order; bytes as
/// hex (JSON has no bytes; `unhex` reads them back).
fn rows_json<const N: usize>(rows: &[Params<'_, N>]) -> String {
    fn hex(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        out
    }
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|params| {
            params
                .iter()
                .map(|(_, param)| -> serde_json::Value {
                    match *param {
                        Param::Int(v) => v.into(),
                        Param::OptInt(v) => v.into(),
                        Param::SmallInt(v) => v.into(),
                        Param::Text(v) => v.into(),
                        Param::OptText(v) => v.into(),
                        Param::Bytes(v) => hex(v).into(),
                        Param::OptBytes(v) => v.map(hex).into(),
                    }
                })
                .collect::<Vec<_>>()
                .into()
        })
        .collect();
    serde_json::Value::from(rows).to_string()
}

/// Insert first, in arrival order (of two claims of one key, the first
/// wins, as alone), where the same request left no live tombstone; returns
/// the winners' charge ids.
static CLAIM_KEYS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         insert into idempotency_keys
             (merchant_id, idempotency_key, fingerprint, charge_id, locked_until, expires_at,
              created_at)
         select i.merchant_id, i.key, i.fingerprint, i.charge_id, {NOW} + i.lease_ms,
                {NOW} + i.key_ttl_ms, {NOW}
           from i
          where not exists (
                select 1 from key_tombstones t
                 where t.merchant_id = i.merchant_id and t.idempotency_key = i.key
                   and t.fingerprint = i.fingerprint and t.expires_at > {NOW})
          order by i.n
         on conflict (merchant_id, idempotency_key) do nothing",
        i = rows_cte(ClaimValues::default().params()),
    )
});

/// The charges of the claims that won (their fresh charge id is the record's).
static CLAIM_CHARGES_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         insert into charges
             (id, merchant_id, order_id, amount_cents, currency, description, acquirer_reference,
              idempotency_key, traceparent, capture_method, captured_cents,
              capture_reserved_cents, created_at, updated_at)
         select i.charge_id, i.merchant_id, i.order_id, i.amount_cents, i.currency,
                i.description, i.reference, i.key, i.traceparent, i.capture_method,
                case when i.capture_method is not null then 0 end,
                case when i.capture_method is not null then 0 end, {NOW}, {NOW}
           from i
          where exists (
                select 1 from idempotency_keys k
                 where k.merchant_id = i.merchant_id and k.idempotency_key = i.key
                   and k.charge_id = i.charge_id)",
        i = rows_cte(ClaimValues::default().params()),
    )
});

/// Each claim's record now: the one it made (`won`), or the one it found.
static CLAIM_RECORDS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         select i.n, k.charge_id = i.charge_id as won, {RECORD_COLUMNS}
           from i
           join idempotency_keys k
             on k.merchant_id = i.merchant_id and k.idempotency_key = i.key
           join charges c on c.id = k.charge_id",
        i = rows_cte(ClaimValues::default().params()),
    )
});

/// Each finalize fenced by its own `attempt`; returns the settled charge ids.
static FINALIZE_KEYS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         update idempotency_keys as k
            set state = 'completed', locked_until = null,
                response_status = i.response_status, response_body = i.response_body,
                expires_at = {NOW} + i.key_ttl_ms
           from i
          where k.merchant_id = i.merchant_id and k.idempotency_key = i.key
            and k.charge_id = i.charge_id and k.attempt = i.attempt and k.state = 'in_flight'
         returning charge_id",
        i = rows_cte(FinalizeValues::default().params()),
    )
});

/// The settled charges' events (`$2`: their ids), when the deployment has events.
static FINALIZE_EVENTS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         insert into outbox
             (kind, message_id, exchange, routing_key, tenant, event_type, body, traceparent,
              created_at)
         select 'event', i.event_id, i.event_exchange, i.event_type, i.event_tenant,
                i.event_type, i.event_body,
                (select c.traceparent from charges c where c.id = i.charge_id), {NOW}
           from i
          where i.event_id is not null
            and i.charge_id in (select value from json_each($2))
            and (select events_enabled from settings)
          order by i.n",
        i = rows_cte(FinalizeValues::default().params()),
    )
});

/// The settled charges' webhook deliveries (`$2`: their ids): one for each
/// of the merchant's enabled endpoints that hears the event.
static FINALIZE_WEBHOOKS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         insert into webhook_deliveries
             (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
         select i.webhook_event_id, we.id, i.webhook_event_type, i.webhook_body, i.charge_id,
                {NOW}, {NOW}
           from i join webhook_endpoints we on we.merchant_id = i.merchant_id
          where i.webhook_event_id is not null
            and i.charge_id in (select value from json_each($2))
            and {HEARS}
          order by i.n",
        i = rows_cte(FinalizeValues::default().params()),
        HEARS = super::webhooks::ENDPOINT_HEARS,
    )
});

/// The settled charges (`$2`: their ids).
static FINALIZE_CHARGES_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with {i}
         update charges
            set status = i.charge_status, acquirer_capture_id = i.capture_id,
                decline_reason = i.decline_reason, updated_at = {NOW}
           from i
          where charges.id = i.charge_id and i.charge_id in (select value from json_each($2))",
        i = rows_cte(FinalizeValues::default().params()),
    )
});

/// Runs `op` as one write transaction for a batch of `n` rows; a failure
/// rolls it all back and is each row's ([`batch::failed`]).
async fn in_one_write<T>(
    writer: &Writer,
    n: usize,
    op: impl AsyncFnOnce(&mut SqliteConnection) -> Result<Vec<Batched<T>>, StoreError>,
) -> Vec<Batched<T>> {
    super::write(writer, op).await.unwrap_or_else(|e| {
        tracing::debug!(error = %e, rows = n, "a batch failed; each row goes alone");
        batch::failed(n, &e)
    })
}

pub(super) async fn claims(writer: &Writer, rows: Vec<ClaimRow>) -> Vec<Batched<Claim>> {
    let claims: Vec<ClaimValues> = rows
        .iter()
        .map(|row| ClaimValues::new(&row.claim()))
        .collect();
    in_one_write(writer, claims.len(), async |tx| {
        if let [one] = claims.as_slice() {
            return Ok(vec![Batched::Done(Ok(claim_in(tx, one).await?))]);
        }
        let params: Vec<_> = claims.iter().map(ClaimValues::params).collect();
        let json = rows_json(&params);
        for sql in [&CLAIM_KEYS_SQL, &CLAIM_CHARGES_SQL] {
            sqlx::query(sql.as_str())
                .bind(&json)
                .execute(&mut *tx)
                .await?;
        }
        let rows: Vec<ClaimBatchRow> = sqlx::query_as(CLAIM_RECORDS_SQL.as_str())
            .bind(&json)
            .fetch_all(&mut *tx)
            .await?;
        Ok(batch::claim_answers(&claims, rows))
    })
    .await
}

pub(super) async fn finalizes(writer: &Writer, rows: Vec<FinalizeRow>) -> Vec<Batched<bool>> {
    let values: Vec<FinalizeValues> = rows.iter().map(FinalizeRow::values).collect();
    in_one_write(writer, values.len(), async |tx| {
        if let [one] = values.as_slice() {
            return Ok(vec![Batched::Done(Ok(finalize_in(tx, one).await?))]);
        }
        let params: Vec<_> = values.iter().map(FinalizeValues::params).collect();
        let json = rows_json(&params);
        let settled: Vec<(String,)> = sqlx::query_as(FINALIZE_KEYS_SQL.as_str())
            .bind(&json)
            .fetch_all(&mut *tx)
            .await?;
        let settled: HashSet<String> = settled.into_iter().map(|(id,)| id).collect();
        if !settled.is_empty() {
            let ids = serde_json::to_string(&settled).map_err(|e| {
                StoreError::Corrupt(format!("the settled charges' ids as JSON: {e}"))
            })?;
            for sql in [
                &FINALIZE_EVENTS_SQL,
                &FINALIZE_WEBHOOKS_SQL,
                &FINALIZE_CHARGES_SQL,
            ] {
                sqlx::query(sql.as_str())
                    .bind(&json)
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        Ok(values
            .iter()
            .map(|v| Batched::Done(Ok(settled.contains(v.charge_id))))
            .collect())
    })
    .await
}

impl SqliteStore {
    /// `new` claims as one batch: each one's answer, or `Alone` where the
    /// one-row path must decide ([`crate::store::Store::claim_batch`] runs it).
    pub(in crate::store) async fn claims_as_batch(
        &self,
        new: &[NewClaim<'_>],
    ) -> Vec<Batched<Claim>> {
        let rows = new.iter().map(ClaimRow::new).collect();
        claims(&self.writer, rows).await
    }
}
