//! The `merchants` table: creation and authentication by secret hash.

use super::{Store, StoreError};
use crate::domain::{Merchant, SecretHash};

#[derive(Debug, thiserror::Error)]
pub enum MerchantError {
    #[error("a merchant named {0:?} already exists")]
    NameTaken(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    pub async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
    ) -> Result<Merchant, MerchantError> {
        let row: Result<(i64,), _> = sqlx::query_as(
            "insert into merchants (name, secret_hash) values ($1, $2) returning id",
        )
        .bind(name)
        .bind(secret_hash.as_bytes())
        .fetch_one(&self.pool)
        .await;
        match row {
            Ok((id,)) => Ok(Merchant {
                id,
                name: name.to_owned(),
            }),
            Err(sqlx::Error::Database(e)) if e.constraint() == Some("merchants_name_key") => {
                Err(MerchantError::NameTaken(name.to_owned()))
            }
            Err(e) => Err(MerchantError::Store(e.into())),
        }
    }

    pub async fn merchant_by_secret(
        &self,
        secret_hash: &SecretHash,
    ) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("select id, name from merchants where secret_hash = $1")
                .bind(secret_hash.as_bytes())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }
}

impl Store {
    /// The merchant a queue command names in its `tenant` header.
    pub async fn merchant_by_name(&self, name: &str) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("select id, name from merchants where name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }
}
