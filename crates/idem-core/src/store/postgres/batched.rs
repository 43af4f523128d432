//! Claims and finalizes in batches ([`crate::store::batch`]): the requests
//! waiting together go as one statement over arrays (`unnest`), one round
//! trip and one commit for all of them. Each statement is the one-row
//! statement of [`super::keys`] over many rows, so each row means what it
//! means alone; what one statement cannot settle for a row (a second claim of
//! a key claimed in the same batch, a record to reclaim, a tombstone) is left
//! to that row's one-row path, after the batch has committed.
//!
//! The statements are prepared, so PostgreSQL plans them once per connection
//! and keeps the plan, even one made while a table was small (a fresh
//! deployment) until the table's first analyze. Written as plain joins and
//! left to the planner, the claim's plan from an empty table hashed all of
//! `idempotency_keys` for every batch (30 M rows read for 20,000 charges in
//! one bench run), and a finalize restricted to records in flight read every
//! dead entry of the in-flight index (migration 0011). So these statements
//! run only on the batch workers' connections, whose planner may not scan a
//! table it can reach by an index nor hash or merge a join
//! ([`super::batch_connections`]), and every read here has a primary key to
//! go by: for the claim, a `lateral` lookup per row (`limit 1`); for the
//! finalize, a join on the whole primary key, with a state test (`<>
//! 'completed'`) that the in-flight index cannot serve. A batch of one takes
//! the one-row statement, which is safe on any connection.

use std::collections::HashSet;

use const_format::concatcp;

use super::keys::{FINALIZE_SETTLED_WRITES, RECORD_COLUMNS};
use super::pool::PgPool;
use super::PgStore;
use crate::store::batch::{self, Batched};
use crate::store::error::StoreError;
use crate::store::model::{Claim, NewClaim};
use crate::store::params::{ClaimRow, ClaimValues, FinalizeRow, Param, Params};
use crate::store::rows::ClaimBatchRow;

/// Claims, as [`super::keys::CLAIM_SQL`] does for one: insert first (in key
/// order, so that two batches inserting the same keys wait for each other in
/// the same order and never deadlock; of two claims of one key in the batch,
/// the first to arrive wins, as it would alone), create the winners' charges,
/// and read the record that won for the others. `n` is the input's place, from 1.
const CLAIM_BATCH_SQL: &str = concatcp!(
    "with i as (
        select * from unnest($1::bigint[], $2::text[], $3::bytea[], $4::text[], $5::bigint[],
                             $6::bigint[], $7::bigint[], $8::bigint[], $9::text[], $10::text[],
                             $11::text[], $12::text[], $13::text[])
            with ordinality as i(merchant_id, idempotency_key, fingerprint, charge_id, lease_ms,
                                 key_ttl_ms, order_id, amount_cents, currency, description,
                                 reference, traceparent, capture_method, n)
    ), claimed as (
        insert into idempotency_keys
            (merchant_id, idempotency_key, fingerprint, charge_id, locked_until, expires_at)
        select i.merchant_id, i.idempotency_key, i.fingerprint, i.charge_id,
               now() + i.lease_ms * interval '1 millisecond',
               now() + i.key_ttl_ms * interval '1 millisecond'
          from i
          left join lateral (
               select true as live from key_tombstones t
                where t.merchant_id = i.merchant_id and t.idempotency_key = i.idempotency_key
                  and t.fingerprint = i.fingerprint and t.expires_at > now()
                limit 1) tomb on true
         where tomb.live is null
         order by i.merchant_id, i.idempotency_key, i.n
        on conflict (merchant_id, idempotency_key) do nothing
        returning *
    ), created as (
        insert into charges
            (id, merchant_id, order_id, amount_cents, currency, description, acquirer_reference,
             idempotency_key, traceparent, capture_method, captured_cents,
             capture_reserved_cents)
        select i.charge_id, i.merchant_id, i.order_id, i.amount_cents, i.currency,
               i.description, i.reference, i.idempotency_key, i.traceparent, i.capture_method,
               case when i.capture_method is not null then 0 end,
               case when i.capture_method is not null then 0 end
          from i join claimed on claimed.charge_id = i.charge_id
        returning *
    )
    select i.n, true as won, ",
    RECORD_COLUMNS,
    " from created c join claimed k on k.charge_id = c.id join i on i.charge_id = c.id
    union all
    select i.n, false as won, r.*
      from i cross join lateral (
           select ",
    RECORD_COLUMNS,
    " from idempotency_keys k join charges c on c.id = k.charge_id
            where k.merchant_id = i.merchant_id and k.idempotency_key = i.idempotency_key
            limit 1) r
     where not exists (select 1 from claimed where claimed.charge_id = i.charge_id)"
);

/// Finalizes, as [`super::keys::FINALIZE_SQL`] does for one: the rows from
/// arrays; each row's record updated where its own `attempt` still holds it
/// (`k`), and the charges of those rows settled (`c`), both as one update
/// over all the rows, as the function `idem_finalize` does for one; then the
/// same last step ([`FINALIZE_SETTLED_WRITES`]). Updating row by row through
/// the function instead cost 14 % more of the database's CPU per new charge at
/// 32 clients (docs/benchmarks.md): each statement the function runs starts
/// an executor and re-reads the table's check constraints.
const FINALIZE_BATCH_SQL: &str = concatcp!(
    "with i as (
        select * from unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::smallint[],
                             $6::bytea[], $7::bigint[], $8::text[], $9::text[], $10::text[],
                             $11::text[], $12::text[], $13::text[], $14::text[], $15::bytea[],
                             $16::text[], $17::text[], $18::bytea[])
            with ordinality as i(merchant_id, idempotency_key, charge_id, attempt,
                                 response_status, response_body, key_ttl_ms, charge_status,
                                 capture_id, decline_reason, event_id, event_exchange,
                                 event_type, event_tenant, event_body, webhook_event_id,
                                 webhook_event_type, webhook_body, n)
    ), k as (
        update idempotency_keys k
           set state = 'completed', locked_until = null,
               response_status = i.response_status, response_body = i.response_body,
               expires_at = now() + i.key_ttl_ms * interval '1 millisecond'
          from i
         where k.merchant_id = i.merchant_id and k.idempotency_key = i.idempotency_key
           and k.charge_id = i.charge_id and k.attempt = i.attempt
           and k.state <> 'completed'
        returning i.n, i.charge_id, i.charge_status, i.capture_id, i.decline_reason
    ), c as (
        update charges c
           set status = k.charge_status, acquirer_capture_id = k.capture_id,
               decline_reason = k.decline_reason, updated_at = now()
          from k
         where c.id = k.charge_id
    ), s as (
        select i.*, k.n is not null as settled from i left join k on k.n = i.n
    ",
    FINALIZE_SETTLED_WRITES
);

/// Binds the rows' parameters column by column, as arrays: `$k` is the array
/// of every row's `k`-th parameter.
fn bind_columns<'q, const N: usize>(
    mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    rows: &[Params<'q, N>],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    for column in 0..N {
        let values = rows.iter().map(|params| params[column].1);
        // Each column holds one type (the row's parameter of that name).
        query = match rows.first().map(|p| p[column].1) {
            Some(Param::Int(_)) => query.bind(
                values
                    .map(|p| if let Param::Int(v) = p { v } else { 0 })
                    .collect::<Vec<i64>>(),
            ),
            Some(Param::OptInt(_)) => query.bind(
                values
                    .map(|p| if let Param::OptInt(v) = p { v } else { None })
                    .collect::<Vec<Option<i64>>>(),
            ),
            Some(Param::SmallInt(_)) => query.bind(
                values
                    .map(|p| if let Param::SmallInt(v) = p { v } else { 0 })
                    .collect::<Vec<i16>>(),
            ),
            Some(Param::Text(_) | Param::OptText(_)) => query.bind(
                values
                    .map(|p| match p {
                        Param::Text(v) => Some(v),
                        Param::OptText(v) => v,
                        _ => None,
                    })
                    .collect::<Vec<Option<&str>>>(),
            ),
            Some(Param::Bytes(_) | Param::OptBytes(_)) => query.bind(
                values
                    .map(|p| match p {
                        Param::Bytes(v) => Some(v),
                        Param::OptBytes(v) => v,
                        _ => None,
                    })
                    .collect::<Vec<Option<&[u8]>>>(),
            ),
            None => query,
        };
    }
    query
}

/// Runs `sql` with the rows' parameters as arrays; its rows.
pub(super) async fn fetch<R, const N: usize>(
    pool: &PgPool,
    sql: &'static str,
    params: &[Params<'_, N>],
) -> Result<Vec<R>, StoreError>
where
    R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    super::on_pool(pool, async |db| {
        bind_columns(sqlx::query(sql), params)
            .try_map(|row| R::from_row(&row))
            .fetch_all(db)
            .await
    })
    .await
}

/// Runs `claims` as one statement: each row's [`Claim`], or [`Batched::Alone`]
/// where the one-row path must decide.
pub(super) async fn claims(pool: &PgPool, rows: Vec<ClaimRow>) -> Vec<Batched<Claim>> {
    if let [row] = rows.as_slice() {
        // A batch of one runs the one-row statement (planned once, unlike a
        // statement over arrays of a size it has not seen), here in the worker,
        // which stays busy at the database meanwhile, as the batches need.
        return vec![Batched::Done(
            super::keys::claim_on(pool, &row.claim()).await,
        )];
    }
    let claims: Vec<ClaimValues> = rows
        .iter()
        .map(|row| ClaimValues::new(&row.claim()))
        .collect();
    let params: Vec<_> = claims.iter().map(ClaimValues::params).collect();
    match fetch::<ClaimBatchRow, 13>(pool, CLAIM_BATCH_SQL, &params).await {
        Ok(rows) => batch::claim_answers(&claims, rows),
        Err(e) => {
            tracing::debug!(error = %e, rows = claims.len(), "a batch of claims failed; each goes alone");
            batch::failed(claims.len(), &e)
        }
    }
}

/// Runs `rows` as one statement: whether each settled (`false`: its attempt
/// no longer holds the record), as [`super::PgStore::finalize`] answers alone.
pub(super) async fn finalizes(pool: &PgPool, rows: Vec<FinalizeRow>) -> Vec<Batched<bool>> {
    if let [row] = rows.as_slice() {
        return vec![Batched::Done(
            super::keys::finalize_on(pool, &row.values()).await,
        )];
    }
    let values: Vec<_> = rows.iter().map(FinalizeRow::values).collect();
    let params: Vec<_> = values.iter().map(|v| v.params()).collect();
    match fetch::<(i64, bool), 18>(pool, FINALIZE_BATCH_SQL, &params).await {
        Ok(settled) => {
            let settled: HashSet<i64> = settled
                .into_iter()
                .filter_map(|(n, settled)| settled.then_some(n))
                .collect();
            (1..=rows.len())
                .map(|n| Batched::Done(Ok(i64::try_from(n).is_ok_and(|n| settled.contains(&n)))))
                .collect()
        }
        Err(e) => {
            tracing::debug!(error = %e, rows = rows.len(), "a batch of finalizes failed; each goes alone");
            batch::failed(rows.len(), &e)
        }
    }
}

impl PgStore {
    /// `new` claims as one batch: each one's answer, or `Alone` where the
    /// one-row path must decide ([`crate::store::Store::claim_batch`] runs it).
    pub(in crate::store) async fn claims_as_batch(
        &self,
        new: &[NewClaim<'_>],
    ) -> Vec<Batched<Claim>> {
        let rows = new.iter().map(ClaimRow::new).collect();
        claims(&self.pool, rows).await
    }
}
