//! The `merchants` table on SQLite: creation and look-up.

use const_format::concatcp;

use super::{SqliteStore, NOW};
use crate::domain::{Merchant, SecretHash};
use crate::store::model::MerchantError;
use crate::store::StoreError;

const CREATE_SQL: &str = concatcp!(
    "insert into merchants (name, secret_hash, created_at) values ($1, $2, ",
    NOW,
    ") returning id"
);

/// Whether `e` is the unique violation of the merchant's name (SQLite names
/// the column, not the constraint).
fn name_taken(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.is_unique_violation() && db.message().contains("merchants.name")
}

impl SqliteStore {
    pub(in crate::store) async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
    ) -> Result<Merchant, MerchantError> {
        let created = self
            .write(async |tx| {
                let (id,): (i64,) = sqlx::query_as(CREATE_SQL)
                    .bind(name)
                    .bind(secret_hash.as_bytes())
                    .fetch_one(&mut *tx)
                    .await?;
                Ok(id)
            })
            .await;
        match created {
            Ok(id) => Ok(Merchant {
                id,
                name: name.to_owned(),
            }),
            Err(e) if name_taken(&e) => Err(MerchantError::NameTaken(name.to_owned())),
            Err(e) => Err(MerchantError::Store(e)),
        }
    }

    pub(in crate::store) async fn merchant_by_secret(
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

    pub(in crate::store) async fn merchant_by_name(
        &self,
        name: &str,
    ) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("select id, name from merchants where name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }
}
