//! The `charges` table as read on its own, and the row shape shared with the
//! idempotency statements that create and settle charges.

use chrono::{DateTime, Utc};

use super::{Store, StoreError};
use crate::domain::{
    AcquirerReference, AmountCents, Charge, ChargeId, ChargeStatus, Currency, Description, OrderId,
};

/// The columns of a charge, as selected under the alias `c`.
macro_rules! charge_columns {
    () => {
        "c.id, c.order_id, c.amount_cents, c.currency, c.description, c.status, \
         c.acquirer_reference, c.decline_reason, c.created_at"
    };
}
pub(super) use charge_columns;

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
        let row: Option<ChargeRow> = sqlx::query_as(concat!(
            "select ",
            charge_columns!(),
            " from charges c where c.id = $1 and c.merchant_id = $2"
        ))
        .bind(id.as_str())
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(Charge::try_from).transpose()
    }
}
