//! The `charges` table as read on its own, and the row shape shared with the
//! idempotency statements that create and settle charges.

use chrono::{DateTime, Utc};

use super::{Store, StoreError};
use crate::domain::{
    AcquirerReference, AmountCents, Charge, ChargeId, ChargeStatus, Currency, Description, OrderId,
};

/// The columns of a charge, as selected under the alias `c` (PostgreSQL).
macro_rules! charge_columns {
    () => {
        "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
         c.acquirer_reference, c.decline_reason, c.created_at"
    };
}
pub(super) use charge_columns;

/// The same columns in SQLite, whose times are integer milliseconds.
macro_rules! sqlite_charge_columns {
    () => {
        concat!(
            "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
             c.acquirer_reference, c.decline_reason, ",
            sqlite_time!("c.created_at"),
            " as created_at"
        )
    };
}
pub(super) use sqlite_charge_columns;

#[derive(sqlx::FromRow)]
pub(super) struct ChargeRow {
    id: String,
    order_id: i64,
    amount_cents: i64,
    currency: String,
    description: Option<String>,
    status: String,
    acquirer_reference: String,
    decline_reason: Option<String>,
    created_at: DateTime<Utc>,
}

impl TryFrom<ChargeRow> for Charge {
    type Error = StoreError;

    fn try_from(r: ChargeRow) -> Result<Self, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("charge {}: {what}", r.id));
        Ok(Charge {
            order_id: OrderId::parse(r.order_id).map_err(|e| corrupt(e.to_string()))?,
            amount_cents: AmountCents::parse(r.amount_cents).map_err(|e| corrupt(e.to_string()))?,
            currency: Currency::parse(&r.currency).map_err(|e| corrupt(e.to_string()))?,
            description: r
                .description
                .map(Description::parse)
                .transpose()
                .map_err(|e| corrupt(e.to_string()))?,
            status: ChargeStatus::parse(&r.status)
                .ok_or_else(|| corrupt(format!("status {:?}", r.status)))?,
            acquirer_reference: AcquirerReference::from_trusted(r.acquirer_reference),
            decline_reason: r.decline_reason,
            created_at: r.created_at,
            id: ChargeId::from_trusted(r.id),
        })
    }
}

impl Store {
    /// A merchant's charge as it is now; `None` when absent or another merchant's.
    pub async fn charge(
        &self,
        merchant_id: i64,
        id: &ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        let row: Option<ChargeRow> = on_backend!(
            self,
            concat!(
                "select ",
                charge_columns!(),
                " from charges c where c.id = $1 and c.merchant_id = $2"
            ),
            concat!(
                "select ",
                sqlite_charge_columns!(),
                " from charges c where c.id = $1 and c.merchant_id = $2"
            ),
            |sql, db| sqlx::query_as(sql)
                .bind(id.as_str())
                .bind(merchant_id)
                .fetch_optional(db)
                .await
        )?;
        row.map(Charge::try_from).transpose()
    }
}

/// A charge the reconciler gave up on: past the settle deadline without the
/// acquirer's word. A person decides, with the acquirer's records.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StuckCharge {
    pub id: String,
    pub merchant: String,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
    pub acquirer_reference: String,
    pub created_at: DateTime<Utc>,
    pub review_since: DateTime<Utc>,
    pub review_reason: Option<String>,
}

impl Store {
    /// Stops the reconciler trying this charge; it stays `processing`, because
    /// only the acquirer's word may make it captured or failed.
    pub async fn mark_for_review(&self, id: &ChargeId, reason: &str) -> Result<(), StoreError> {
        on_backend!(
            write self,
            "update charges set review_since = now(), review_reason = $2
              where id = $1 and status = 'processing' and review_since is null",
            concat!(
                "update charges set review_since = ",
                sqlite_now!(),
                ", review_reason = $2
                  where id = $1 and status = 'processing' and review_since is null"
            ),
            |sql, db| sqlx::query(sql)
                .bind(id.as_str())
                .bind(reason)
                .execute(db)
                .await
                .map(drop)
        )?;
        Ok(())
    }

    /// Charges awaiting review, oldest first.
    pub async fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError> {
        Ok(on_backend!(
            self,
            "select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency,
                    c.acquirer_reference, c.created_at, c.review_since, c.review_reason
               from charges c join merchants m on m.id = c.merchant_id
              where c.status = 'processing' and c.review_since is not null
              order by c.created_at",
            concat!(
                "select c.id, m.name as merchant, c.order_id, c.amount_cents, c.currency,
                        c.acquirer_reference, ",
                sqlite_time!("c.created_at"),
                " as created_at, ",
                sqlite_time!("c.review_since"),
                " as review_since, c.review_reason
                   from charges c join merchants m on m.id = c.merchant_id
                  where c.status = 'processing' and c.review_since is not null
                  order by c.created_at"
            ),
            |sql, db| sqlx::query_as(sql).fetch_all(db).await
        )?)
    }
}

/// What the `/metrics` gauges show about unsettled charges.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct ProcessingStats {
    pub oldest_processing_seconds: f64,
    pub awaiting_review: i64,
}

impl Store {
    pub async fn processing_stats(&self) -> Result<ProcessingStats, StoreError> {
        Ok(on_backend!(
            self,
            "select coalesce(extract(epoch from now() - min(created_at)), 0)::float8
                      as oldest_processing_seconds,
                    count(*) filter (where review_since is not null) as awaiting_review
               from charges where status = 'processing'",
            concat!(
                "select coalesce((",
                sqlite_now!(),
                " - min(created_at)) / 1000.0, 0.0) as oldest_processing_seconds,
                        count(*) filter (where review_since is not null) as awaiting_review
                   from charges where status = 'processing'"
            ),
            |sql, db| sqlx::query_as(sql).fetch_one(db).await
        )?)
    }
}
