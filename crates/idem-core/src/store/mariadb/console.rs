//! What the operator console reads and writes on MariaDB: as in
//! `postgres/console.rs`.

use std::time::Duration;

use const_format::concatcp;

use super::sql::{params, query, query_as};
use super::{MariaDbStore, NOW};
use crate::domain::SecretHash;
use crate::store::error::StoreError;
use crate::store::model::Audit;
use crate::store::ops::Console;
use crate::store::said;
use crate::store::shared::millis;

const CREATE_TOKEN_SQL: &str = concatcp!(
    "insert into admin_tokens (name, token_hash, created_at) values ($1, $2, ",
    NOW,
    ")"
);

const OUTCOME_COUNTS_SQL: &str = concatcp!(
    "select status, count(*) from charges where created_at >= ",
    NOW,
    " - $1 group by status order by status"
);

#[async_trait::async_trait]
impl Console for MariaDbStore {
    async fn create_admin_token(
        &self,
        name: &str,
        token_hash: &SecretHash,
        by: &Audit<'_>,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            query(CREATE_TOKEN_SQL, params![name, token_hash.as_bytes()])?
                .execute(&mut *tx)
                .await?;
            let entry = said::admin_token_made();
            super::audit::record(tx, &entry.entry(by, name)).await
        })
        .await
    }

    async fn admin_token_name(
        &self,
        token_hash: &SecretHash,
    ) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = self
            .read(async |db| {
                Ok(query_as(
                    "select name from admin_tokens where token_hash = $1",
                    params![token_hash.as_bytes()],
                )?
                .fetch_optional(db)
                .await?)
            })
            .await?;
        Ok(row.map(|(name,)| name))
    }

    async fn outcome_counts(&self, window: Duration) -> Result<Vec<(String, i64)>, StoreError> {
        self.read(async |db| {
            Ok(query_as(OUTCOME_COUNTS_SQL, params![millis(window)])?
                .fetch_all(db)
                .await?)
        })
        .await
    }
}
