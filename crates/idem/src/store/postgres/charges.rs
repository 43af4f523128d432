//! The `charges` table on PostgreSQL, as read on its own, and the charge
//! columns the key statements select with it.

use super::PgStore;
use crate::domain::{AcquirerReference, Charge, ChargeId};
use crate::store::model::{ProcessingStats, StuckCharge};
use crate::store::rows::ChargeRow;
use crate::store::StoreError;

/// The columns of a charge, as selected under the alias `c`.
pub(super) const CHARGE_COLUMNS: &str =
    "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
     c.acquirer_reference, c.decline_reason, c.created_at";

const CHARGE_SQL: &str = const_format::concatcp!(
    "select ",
    CHARGE_COLUMNS,
    " from charges c where c.id = $1 and c.merchant_id = $2"
);

impl PgStore {
    pub(in crate::store) async fn charge(
        &self,
        merchant_id: i64,
        id: &ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
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

    /// The merchant's charge made under this acquirer reference, if any.
    pub(in crate::store) async fn charge_by_reference(
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

    pub(in crate::store) async fn mark_for_review(
        &self,
        id: &ChargeId,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.on_conn(async |db| {
            sqlx::query(
                "update charges set review_since = now(), review_reason = $2
                  where id = $1 and status = 'processing' and review_since is null",
            )
            .bind(id.as_str())
            .bind(reason)
            .execute(db)
            .await
        })
        .await?;
        Ok(())
    }

    pub(in crate::store) async fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError> {
        Ok(self
            .on_conn(async |db| {
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
            .await?)
    }

    pub(in crate::store) async fn processing_stats(&self) -> Result<ProcessingStats, StoreError> {
        Ok(self
            .on_conn(async |db| {
                sqlx::query_as(
                    "select coalesce(extract(epoch from now() - min(created_at)), 0)::float8
                          as oldest_processing_seconds,
                        count(*) filter (where review_since is not null) as awaiting_review
                   from charges where status = 'processing'",
                )
                .fetch_one(db)
                .await
            })
            .await?)
    }
}
