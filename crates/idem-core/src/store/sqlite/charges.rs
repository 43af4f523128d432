//! The `charges` table on SQLite, as read on its own, and the charge columns
//! the key statements select with it.

use const_format::concatcp;

use super::{SqliteStore, NOW};
use crate::domain::{AcquirerReference, Charge, ChargeId, Merchant};
use crate::store::error::StoreError;
use crate::store::model::{
    ChargeDetail, ChargeFilter, ChargeRecord, ChargeSummary, KeyDetail, NewWebhook,
    ProcessingStats, StuckCharge,
};
use crate::store::ops::Charges;
use crate::store::rows::ChargeRow;
use crate::store::shared::NO_REFUSED_EXPIRY_VOID;

/// The columns of a charge, as selected under the alias `c`, its time as the
/// RFC 3339 text the domain's timestamps decode from.
pub(super) const CHARGE_COLUMNS: &str =
    "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
     c.acquirer_reference, c.decline_reason, \
     strftime('%Y-%m-%dT%H:%M:%fZ', c.created_at / 1000.0, 'unixepoch') as created_at, \
     c.captured_cents, c.capture_reserved_cents, c.capture_closed_by is not null as capture_closed";

const CHARGE_SQL: &str = concatcp!(
    "select ",
    CHARGE_COLUMNS,
    " from charges c where c.id = $1 and c.merchant_id = $2"
);

const MARK_FOR_REVIEW_SQL: &str = concatcp!(
    "update charges set review_since = ",
    NOW,
    ", review_reason = $2
      where id = $1 and status = 'processing' and review_since is null"
);

/// The `charge.review_required` deliveries of a charge just marked (`$1`):
/// `$2` event id, `$3` type, `$4` body.
const REVIEW_WEBHOOK_SQL: &str = concatcp!(
    "with i as (select $3 as webhook_event_type)
     insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select $2, we.id, i.webhook_event_type, $4, c.id, ",
    NOW,
    ", ",
    NOW,
    " from i, charges c join webhook_endpoints we on we.merchant_id = c.merchant_id
      where c.id = $1 and ",
    super::webhooks::ENDPOINT_HEARS
);

const PROCESSING_STATS_SQL: &str = concatcp!(
    "select coalesce((",
    NOW,
    " - min(created_at)) / 1000.0, 0.0) as oldest_processing_seconds,
            count(*) filter (where review_since is not null) as awaiting_review,
            (select count(*) from refunds
              where status = 'pending' and review_since is not null)
              as refunds_awaiting_review,
            (select count(*) from authorization_steps
              where status = 'pending' and review_since is not null)
              as steps_awaiting_review
       from charges where status = 'processing'"
);

/// As on PostgreSQL: `$1` status, `$2` awaiting review only, `$3` since (ms),
/// `$4` order id, `$5` limit, `$6` oldest first, `$7` merchant, `$8` key.
/// Times as the RFC 3339 text they decode from.
const LIST_SQL: &str = "
    select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency, c.status,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.created_at / 1000.0, 'unixepoch') as created_at,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.review_since / 1000.0, 'unixepoch') as review_since,
           c.review_reason
      from charges c join merchants m on m.id = c.merchant_id
     where ($1 is null or c.status = $1)
       and (not $2 or (c.status = 'processing' and c.review_since is not null))
       and ($3 is null or c.created_at >= $3)
       and ($4 is null or c.order_id = $4)
       and ($7 is null or m.name = $7)
       and ($8 is null or c.idempotency_key = $8)
     order by case when $6 then c.created_at end,
              case when not $6 then c.created_at end desc, c.id
     limit $5";

const DETAIL_SQL: &str = "
    select c.id, m.name as merchant, c.merchant_id, c.order_id, c.amount_cents, c.currency,
           c.description, c.status, c.acquirer_reference, c.acquirer_capture_id,
           c.decline_reason,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.created_at / 1000.0, 'unixepoch') as created_at,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.updated_at / 1000.0, 'unixepoch') as updated_at,
           c.reconcile_attempts,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.next_reconcile_at / 1000.0, 'unixepoch')
             as next_reconcile_at,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.review_since / 1000.0, 'unixepoch') as review_since,
           c.review_reason, c.idempotency_key
      from charges c join merchants m on m.id = c.merchant_id
     where c.id = $1";

/// As on PostgreSQL.
const KEY_DETAIL_SQL: &str = "
    select idempotency_key, state, attempt,
           strftime('%Y-%m-%dT%H:%M:%fZ', locked_until / 1000.0, 'unixepoch') as locked_until,
           response_status,
           strftime('%Y-%m-%dT%H:%M:%fZ', expires_at / 1000.0, 'unixepoch') as expires_at
      from idempotency_keys
     where merchant_id = $1 and charge_id = $3
       and (idempotency_key = $2 or ($2 is null and state = 'in_flight'))";

/// `$1` the authorizations' time to live in ms, `$2` limit.
const EXPIRED_AUTHORIZATIONS_SQL: &str = concatcp!(
    "select c.merchant_id, m.name, c.id
       from charges c join merchants m on m.id = c.merchant_id
      where c.status = 'authorized' and c.created_at <= ",
    NOW,
    " - $1
        and c.capture_closed_by is null and c.capture_reserved_cents = c.captured_cents
        and c.review_since is null
        and ",
    NO_REFUSED_EXPIRY_VOID,
    "
      order by c.created_at
      limit $2"
);

#[async_trait::async_trait]
impl Charges for SqliteStore {
    async fn expired_authorizations(
        &self,
        ttl: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<(Merchant, ChargeId)>, StoreError> {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(EXPIRED_AUTHORIZATIONS_SQL)
            .bind(crate::store::shared::millis(ttl))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name, charge)| (Merchant { id, name }, ChargeId::from_trusted(charge)))
            .collect())
    }

    async fn charges(&self, filter: &ChargeFilter) -> Result<Vec<ChargeSummary>, StoreError> {
        Ok(sqlx::query_as(LIST_SQL)
            .bind(filter.status.map(|s| s.as_str()))
            .bind(filter.awaiting_review)
            .bind(filter.since.map(|t| t.timestamp_millis()))
            .bind(filter.order_id)
            .bind(filter.limit)
            .bind(filter.oldest_first)
            .bind(filter.merchant.as_deref())
            .bind(filter.idempotency_key.as_deref())
            .fetch_all(&self.pool)
            .await?)
    }

    async fn charge_record(&self, id: &str) -> Result<Option<ChargeRecord>, StoreError> {
        let charge: Option<ChargeDetail> = sqlx::query_as(DETAIL_SQL)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(charge) = charge else {
            return Ok(None);
        };
        let key: Option<KeyDetail> = sqlx::query_as(KEY_DETAIL_SQL)
            .bind(charge.merchant_id)
            .bind(charge.idempotency_key.as_deref())
            .bind(&charge.id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(Some(ChargeRecord { charge, key }))
    }

    async fn charge(&self, merchant_id: i64, id: &ChargeId) -> Result<Option<Charge>, StoreError> {
        let row: Option<ChargeRow> = sqlx::query_as(CHARGE_SQL)
            .bind(id.as_str())
            .bind(merchant_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(Charge::try_from).transpose()
    }

    async fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError> {
        Ok(sqlx::query_as(
            "select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency,
                    c.acquirer_reference,
                    strftime('%Y-%m-%dT%H:%M:%fZ', c.created_at / 1000.0, 'unixepoch')
                      as created_at,
                    strftime('%Y-%m-%dT%H:%M:%fZ', c.review_since / 1000.0, 'unixepoch')
                      as review_since,
                    c.review_reason
               from charges c join merchants m on m.id = c.merchant_id
              where c.status = 'processing' and c.review_since is not null
              order by c.created_at",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn processing_stats(&self) -> Result<ProcessingStats, StoreError> {
        Ok(sqlx::query_as(PROCESSING_STATS_SQL)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn mark_for_review(
        &self,
        id: &ChargeId,
        reason: &str,
        webhook: &NewWebhook,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            let marked = sqlx::query(MARK_FOR_REVIEW_SQL)
                .bind(id.as_str())
                .bind(reason)
                .execute(&mut *tx)
                .await?;
            if marked.rows_affected() == 1 {
                sqlx::query(REVIEW_WEBHOOK_SQL)
                    .bind(id.as_str())
                    .bind(webhook.event_id.as_str())
                    .bind(webhook.event_type)
                    .bind(webhook.body.as_ref())
                    .execute(&mut *tx)
                    .await?;
            }
            Ok(())
        })
        .await
    }
}

impl SqliteStore {
    /// The merchant's charge made under this acquirer reference, if any.
    pub(in crate::store) async fn charge_holding(
        &self,
        merchant_id: i64,
        reference: &AcquirerReference,
    ) -> Result<Option<ChargeId>, StoreError> {
        let row: Option<(String,)> = sqlx::query_as(
            "select id from charges where acquirer_reference = $1 and merchant_id = $2",
        )
        .bind(reference.as_str())
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(id,)| ChargeId::from_trusted(id)))
    }
}
