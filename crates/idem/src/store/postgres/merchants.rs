//! The `merchants` table on PostgreSQL: creation and look-up.

use super::PgStore;
use crate::domain::{Merchant, SecretHash};
use crate::store::model::MerchantError;
use crate::store::StoreError;

impl PgStore {
    pub(in crate::store) async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
    ) -> Result<Merchant, MerchantError> {
        let row: Result<(i64,), sqlx::Error> = self
            .on_conn(async |db| {
                sqlx::query_as(
                    "insert into merchants (name, secret_hash) values ($1, $2) returning id",
                )
                .bind(name)
                .bind(secret_hash.as_bytes())
                .fetch_one(db)
                .await
            })
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

    pub(in crate::store) async fn merchant_by_secret(
        &self,
        secret_hash: &SecretHash,
    ) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> = self
            .on_conn(async |db| {
                sqlx::query_as("select id, name from merchants where secret_hash = $1")
                    .bind(secret_hash.as_bytes())
                    .fetch_optional(db)
                    .await
            })
            .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }

    pub(in crate::store) async fn merchant_by_name(
        &self,
        name: &str,
    ) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> = self
            .on_conn(async |db| {
                sqlx::query_as("select id, name from merchants where name = $1")
                    .bind(name)
                    .fetch_optional(db)
                    .await
            })
            .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }
}
