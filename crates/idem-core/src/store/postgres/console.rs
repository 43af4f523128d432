//! What the operator console reads and writes on PostgreSQL: its tokens, and
//! the recent outcome counts it charts.

use std::time::Duration;

use super::{audit, PgStore};
use crate::domain::SecretHash;
use crate::store::error::StoreError;
use crate::store::model::Audit;
use crate::store::ops::Console;
use crate::store::said;
use crate::store::shared::millis;

#[async_trait::async_trait]
impl Console for PgStore {
    async fn create_admin_token(
        &self,
        name: &str,
        token_hash: &SecretHash,
        by: &Audit<'_>,
    ) -> Result<(), StoreError> {
        self.in_tx(async |db| {
            sqlx::query("insert into admin_tokens (name, token_hash) values ($1, $2)")
                .bind(name)
                .bind(token_hash.as_bytes())
                .execute(&mut *db)
                .await?;
            let entry = said::admin_token_made();
            audit::record(db, &entry.entry(by, name)).await
        })
        .await
    }

    async fn admin_token_name(
        &self,
        token_hash: &SecretHash,
    ) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = self
            .on_conn(async |db| {
                sqlx::query_as("select name from admin_tokens where token_hash = $1")
                    .bind(token_hash.as_bytes())
                    .fetch_optional(db)
                    .await
            })
            .await?;
        Ok(row.map(|(name,)| name))
    }

    async fn outcome_counts(&self, window: Duration) -> Result<Vec<(String, i64)>, StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(
                "select status, count(*) from charges
                      where created_at >= now() - $1 * interval '1 millisecond'
                      group by status order by status",
            )
            .bind(millis(window))
            .fetch_all(db)
            .await
        })
        .await
    }
}
