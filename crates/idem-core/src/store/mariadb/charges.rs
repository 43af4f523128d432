//! The `charges` table on MariaDB, as read on its own, and the charge columns
//! the key statements select with it: as on SQLite, in MariaDB's functions.

use const_format::concatcp;

use super::sql::{params, query, query_as};
use super::{at, MariaDbStore, NOW};
use crate::domain::{AcquirerReference, Charge, ChargeId, Merchant};
use crate::store::error::StoreError;
use crate::store::model::{
    ChargeDetail, ChargeFilter, ChargeRecord, ChargeSummary, KeyDetail, NewWebhook,
    ProcessingStats, StuckCharge,
};
use crate::store::ops::Charges;
use crate::store::rows::ChargeRow;
use crate::store::shared::{millis, NO_REFUSED_EXPIRY_VOID};

/// The columns of a charge, as selected under the alias `c`.
pub(super) const CHARGE_COLUMNS: &str = concatcp!(
    "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
     c.acquirer_reference, c.decline_reason, ",
    at!("c.created_at"),
    " as created_at, \
     c.captured_cents, c.capture_reserved_cents, c.capture_closed_by is not null as capture_closed"
);

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
    "insert into webhook_deliveries
         (event_id, endpoint_id, event_type, body, charge_id, next_attempt_at, created_at)
     select $2, we.id, i.webhook_event_type, $4, c.id, ",
    NOW,
    ", ",
    NOW,
    " from (select $3 as webhook_event_type) i
       join charges c on c.id = $1
       join webhook_endpoints we on we.merchant_id = c.merchant_id
      where ",
    super::webhooks::ENDPOINT_HEARS
);

const PROCESSING_STATS_SQL: &str = concatcp!(
    "select cast(coalesce((",
    NOW,
    " - min(created_at)) / 1000, 0) as double) as oldest_processing_seconds,
            cast(coalesce(sum(review_since is not null), 0) as signed) as awaiting_review,
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
const LIST_SQL: &str = concatcp!(
    "select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency, c.status, ",
    at!("c.created_at"),
    " as created_at, ",
    at!("c.review_since"),
    " as review_since, c.review_reason
      from charges c join merchants m on m.id = c.merchant_id
     where ($1 is null or c.status = $1)
       and (not $2 or (c.status = 'processing' and c.review_since is not null))
       and ($3 is null or c.created_at >= $3)
       and ($4 is null or c.order_id = $4)
       and ($7 is null or m.name = $7)
       and ($8 is null or c.idempotency_key = $8)
     order by case when $6 then c.created_at end,
              case when not $6 then c.created_at end desc, c.id
     limit $5"
);

const DETAIL_SQL: &str = concatcp!(
    "select c.id, m.name as merchant, c.merchant_id, c.order_id, c.amount_cents, c.currency,
           c.description, c.status, c.acquirer_reference, c.acquirer_capture_id,
           c.decline_reason, ",
    at!("c.created_at"),
    " as created_at, ",
    at!("c.updated_at"),
    " as updated_at, c.reconcile_attempts, ",
    at!("c.next_reconcile_at"),
    " as next_reconcile_at, ",
    at!("c.review_since"),
    " as review_since, c.review_reason, c.idempotency_key
      from charges c join merchants m on m.id = c.merchant_id
     where c.id = $1"
);

/// As on PostgreSQL.
const KEY_DETAIL_SQL: &str = concatcp!(
    "select idempotency_key, state, attempt, ",
    at!("locked_until"),
    " as locked_until, response_status, ",
    at!("expires_at"),
    " as expires_at
      from idempotency_keys
     where merchant_id = $1 and charge_id = $3
       and (idempotency_key = $2 or ($2 is null and state = 'in_flight'))"
);

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

const STUCK_SQL: &str = concatcp!(
    "select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency,
            c.acquirer_reference, ",
    at!("c.created_at"),
    " as created_at, ",
    at!("c.review_since"),
    " as review_since, c.review_reason
       from charges c join merchants m on m.id = c.merchant_id
      where c.status = 'processing' and c.review_since is not null
      order by c.created_at"
);

#[async_trait::async_trait]
impl Charges for MariaDbStore {
    async fn expired_authorizations(
        &self,
        ttl: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<(Merchant, ChargeId)>, StoreError> {
        let rows: Vec<(i64, String, String)> = self
            .read(async |db| {
                Ok(
                    query_as(EXPIRED_AUTHORIZATIONS_SQL, params![millis(ttl), limit])?
                        .fetch_all(db)
                        .await?,
                )
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name, charge)| (Merchant { id, name }, ChargeId::from_trusted(charge)))
            .collect())
    }

    async fn charges(&self, filter: &ChargeFilter) -> Result<Vec<ChargeSummary>, StoreError> {
        self.read(async |db| {
            Ok(query_as(
                LIST_SQL,
                params![
                    filter.status.map(|s| s.as_str()),
                    i64::from(filter.awaiting_review),
                    filter.since.map(|t| t.timestamp_millis()),
                    filter.order_id,
                    filter.limit,
                    i64::from(filter.oldest_first),
                    filter.merchant.as_deref(),
                    filter.idempotency_key.as_deref(),
                ],
            )?
            .fetch_all(db)
            .await?)
        })
        .await
    }

    async fn charge_record(&self, id: &str) -> Result<Option<ChargeRecord>, StoreError> {
        self.read(async |db| {
            let charge: Option<ChargeDetail> = query_as(DETAIL_SQL, params![id])?
                .fetch_optional(&mut *db)
                .await?;
            let Some(charge) = charge else {
                return Ok(None);
            };
            let key: Option<KeyDetail> = query_as(
                KEY_DETAIL_SQL,
                params![
                    charge.merchant_id,
                    charge.idempotency_key.as_deref(),
                    charge.id.as_str()
                ],
            )?
            .fetch_optional(&mut *db)
            .await?;
            Ok(Some(ChargeRecord { charge, key }))
        })
        .await
    }

    async fn charge(&self, merchant_id: i64, id: &ChargeId) -> Result<Option<Charge>, StoreError> {
        let row: Option<ChargeRow> = self
            .read(async |db| {
                Ok(query_as(CHARGE_SQL, params![id.as_str(), merchant_id])?
                    .fetch_optional(db)
                    .await?)
            })
            .await?;
        row.map(Charge::try_from).transpose()
    }

    async fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError> {
        self.read(async |db| Ok(query_as(STUCK_SQL, params![])?.fetch_all(db).await?))
            .await
    }

    async fn processing_stats(&self) -> Result<ProcessingStats, StoreError> {
        self.read(async |db| {
            Ok(query_as(PROCESSING_STATS_SQL, params![])?
                .fetch_one(db)
                .await?)
        })
        .await
    }

    async fn mark_for_review(
        &self,
        id: &ChargeId,
        reason: &str,
        webhook: &NewWebhook,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            let marked = query(MARK_FOR_REVIEW_SQL, params![id.as_str(), reason])?
                .execute(&mut *tx)
                .await?;
            if marked.rows_affected() == 1 {
                query(
                    REVIEW_WEBHOOK_SQL,
                    params![
                        id.as_str(),
                        webhook.event_id.as_str(),
                        webhook.event_type,
                        webhook.body.as_ref()
                    ],
                )?
                .execute(&mut *tx)
                .await?;
            }
            Ok(())
        })
        .await
    }
}

impl MariaDbStore {
    /// The merchant's charge made under this acquirer reference, if any.
    pub(in crate::store) async fn charge_holding(
        &self,
        merchant_id: i64,
        reference: &AcquirerReference,
    ) -> Result<Option<ChargeId>, StoreError> {
        let row: Option<(String,)> = self
            .read(async |db| {
                Ok(query_as(
                    "select id from charges where acquirer_reference = $1 and merchant_id = $2",
                    params![reference.as_str(), merchant_id],
                )?
                .fetch_optional(db)
                .await?)
            })
            .await?;
        Ok(row.map(|(id,)| ChargeId::from_trusted(id)))
    }
}
