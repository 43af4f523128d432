//! The `charges` table on PostgreSQL, as read on its own, and the charge
//! columns the key statements select with it.

use super::PgStore;
use crate::domain::{AcquirerReference, Charge, ChargeId, Merchant};
use crate::store::error::StoreError;
use crate::store::model::{
    ChargeDetail, ChargeFilter, ChargeRecord, ChargeSummary, KeyDetail, NewWebhook,
    ProcessingStats, StuckCharge,
};
use crate::store::ops::Charges;
use crate::store::rows::ChargeRow;
use crate::store::shared::NO_REFUSED_EXPIRY_VOID;

/// The columns of a charge, as selected under the alias `c`.
pub(super) const CHARGE_COLUMNS: &str =
    "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
     c.acquirer_reference, c.decline_reason, c.created_at, c.captured_cents, \
     c.capture_reserved_cents, c.capture_closed_by is not null as capture_closed";

const CHARGE_SQL: &str = const_format::concatcp!(
    "select ",
    CHARGE_COLUMNS,
    " from charges c where c.id = $1 and c.merchant_id = $2"
);

/// `$1` status, `$2` awaiting review only, `$3` since, `$4` order id, `$5`
/// limit, `$6` oldest first, `$7` merchant's name, `$8` key. The order id and
/// the key are read from the charges themselves (a key record is swept after
/// its time to live; the charge keeps its key), with no index of their own:
/// an operator's search, not a path of every charge.
const LIST_SQL: &str = "
    select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency, c.status,
           c.created_at, c.review_since, c.review_reason
      from charges c join merchants m on m.id = c.merchant_id
     where ($1::text is null or c.status = $1)
       and (not $2 or (c.status = 'processing' and c.review_since is not null))
       and ($3::timestamptz is null or c.created_at >= $3)
       and ($4::bigint is null or c.order_id = $4)
       and ($7::text is null or m.name = $7)
       and ($8::text is null or c.idempotency_key = $8)
     order by case when $6 then c.created_at end,
              case when not $6 then c.created_at end desc, c.id
     limit $5";

const DETAIL_SQL: &str = "
    select c.id, m.name as merchant, c.merchant_id, c.order_id, c.amount_cents, c.currency,
           c.description, c.status, c.acquirer_reference, c.acquirer_capture_id,
           c.decline_reason, c.created_at, c.updated_at, c.reconcile_attempts,
           c.next_reconcile_at, c.review_since, c.review_reason, c.idempotency_key
      from charges c join merchants m on m.id = c.merchant_id
     where c.id = $1";

/// `$1` merchant, `$2` key (null for a charge made before charges kept
/// theirs: then among the in-flight records, which the partial index holds),
/// `$3` charge.
const KEY_DETAIL_SQL: &str = "
    select idempotency_key, state, attempt, locked_until, response_status, expires_at
      from idempotency_keys
     where merchant_id = $1 and charge_id = $3
       and (idempotency_key = $2 or ($2 is null and state = 'in_flight'))";

/// `$1` the authorizations' time to live in ms, `$2` limit.
const EXPIRED_AUTHORIZATIONS_SQL: &str = const_format::concatcp!(
    "select c.merchant_id, m.name, c.id
       from charges c join merchants m on m.id = c.merchant_id
      where c.status = 'authorized' and c.created_at <= now() - $1 * interval '1 millisecond'
        and c.capture_closed_by is null and c.capture_reserved_cents = c.captured_cents
        and c.review_since is null
        and ",
    NO_REFUSED_EXPIRY_VOID,
    "
      order by c.created_at
      limit $2"
);

#[async_trait::async_trait]
impl Charges for PgStore {
    async fn expired_authorizations(
        &self,
        ttl: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<(Merchant, ChargeId)>, StoreError> {
        let rows: Vec<(i64, String, String)> = self
            .on_conn(async |db| {
                sqlx::query_as(EXPIRED_AUTHORIZATIONS_SQL)
                    .bind(crate::store::shared::millis(ttl))
                    .bind(limit)
                    .fetch_all(db)
                    .await
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name, charge)| (Merchant { id, name }, ChargeId::from_trusted(charge)))
            .collect())
    }

    async fn charges(&self, filter: &ChargeFilter) -> Result<Vec<ChargeSummary>, StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(LIST_SQL)
                .bind(filter.status.map(|s| s.as_str()))
                .bind(filter.awaiting_review)
                .bind(filter.since)
                .bind(filter.order_id)
                .bind(filter.limit)
                .bind(filter.oldest_first)
                .bind(filter.merchant.as_deref())
                .bind(filter.idempotency_key.as_deref())
                .fetch_all(db)
                .await
        })
        .await
    }

    async fn charge_record(&self, id: &str) -> Result<Option<ChargeRecord>, StoreError> {
        self.on_conn(async |db| -> Result<_, sqlx::Error> {
            let charge: Option<ChargeDetail> = sqlx::query_as(DETAIL_SQL)
                .bind(id)
                .fetch_optional(&mut *db)
                .await?;
            let Some(charge) = charge else {
                return Ok(None);
            };
            let key: Option<KeyDetail> = sqlx::query_as(KEY_DETAIL_SQL)
                .bind(charge.merchant_id)
                .bind(charge.idempotency_key.as_deref())
                .bind(&charge.id)
                .fetch_optional(db)
                .await?;
            Ok(Some(ChargeRecord { charge, key }))
        })
        .await
    }

    async fn charge(&self, merchant_id: i64, id: &ChargeId) -> Result<Option<Charge>, StoreError> {
        let row: Option<ChargeRow> = self
            .on_conn(async |db| {
                sqlx::query_as(CHARGE_SQL)
                    .bind(id.as_str())
                    .bind(merchant_id)
                    .fetch_optional(db)
                    .await
            })
            .await?;
        row.map(Charge::try_from).transpose()
    }

    async fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(
                "select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency,
                        c.acquirer_reference, c.created_at, c.review_since, c.review_reason
                   from charges c join merchants m on m.id = c.merchant_id
                  where c.status = 'processing' and c.review_since is not null
                  order by c.created_at",
            )
            .fetch_all(db)
            .await
        })
        .await
    }

    async fn processing_stats(&self) -> Result<ProcessingStats, StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(
                "select coalesce(extract(epoch from now() - min(created_at)), 0)::float8
                          as oldest_processing_seconds,
                        count(*) filter (where review_since is not null) as awaiting_review,
                        (select count(*) from refunds
                          where status = 'pending' and review_since is not null)
                          as refunds_awaiting_review,
                        (select count(*) from authorization_steps
                          where status = 'pending' and review_since is not null)
                          as steps_awaiting_review
                   from charges where status = 'processing'",
            )
            .fetch_one(db)
            .await
        })
        .await
    }

    async fn mark_for_review(
        &self,
        id: &ChargeId,
        reason: &str,
        webhook: &NewWebhook,
    ) -> Result<(), StoreError> {
        self.on_conn(async |db| {
            sqlx::query(
                "with m as (
                     update charges set review_since = now(), review_reason = $2
                      where id = $1 and status = 'processing' and review_since is null
                     returning id, merchant_id
                 )
                 insert into webhook_deliveries (event_id, endpoint_id, event_type, body, charge_id)
                 select $3, we.id, $4, $5, m.id from m
                   join webhook_endpoints we on we.merchant_id = m.merchant_id
                  where we.disabled_at is null and (we.events is null or $4 = any(we.events))",
            )
            .bind(id.as_str())
            .bind(reason)
            .bind(webhook.event_id.as_str())
            .bind(webhook.event_type)
            .bind(webhook.body.as_ref())
            .execute(db)
            .await
        })
        .await?;
        Ok(())
    }
}

impl PgStore {
    /// The merchant's charge made under this acquirer reference, if any.
    pub(in crate::store) async fn charge_holding(
        &self,
        merchant_id: i64,
        reference: &AcquirerReference,
    ) -> Result<Option<ChargeId>, StoreError> {
        let row: Option<(String,)> = self
            .on_conn(async |db| {
                sqlx::query_as(
                    "select id from charges where acquirer_reference = $1 and merchant_id = $2",
                )
                .bind(reference.as_str())
                .bind(merchant_id)
                .fetch_optional(db)
                .await
            })
            .await?;
        Ok(row.map(|(id,)| ChargeId::from_trusted(id)))
    }
}
