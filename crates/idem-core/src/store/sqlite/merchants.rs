//! The `merchants` and `merchant_secrets` tables on SQLite: as in
//! `postgres/merchants.rs`, each change with its audit record in one write.

use std::time::Duration;

use const_format::concatcp;
use sqlx::SqliteConnection;

use super::{from_millis, SqliteStore, NOW};
use crate::domain::{Merchant, SecretHash};
use crate::store::error::StoreError;
use crate::store::model::{Audit, MerchantError, MerchantListing, Rotation, SecretMatch};
use crate::store::ops::Merchants;
use crate::store::rows::{self, MerchantListingRow};
use crate::store::said;
use crate::store::shared::millis;

/// `secret_hash` here is the first secret's, read by nothing (see
/// migrations/sqlite/0005_operators.sql); `merchant_secrets` decides.
const CREATE_SQL: &str = concatcp!(
    "insert into merchants (name, secret_hash, created_at) values ($1, $2, ",
    NOW,
    ") returning id"
);

const ADD_SECRET_SQL: &str = concatcp!(
    "insert into merchant_secrets (merchant_id, secret_hash, created_at) values ($1, $2, ",
    NOW,
    ")"
);

/// The merchant a live secret authenticates, and the milliseconds that secret has left.
const BY_SECRET_SQL: &str = concatcp!(
    "select m.id, m.name, s.expires_at - ",
    NOW,
    " from merchant_secrets s join merchants m on m.id = s.merchant_id
      where s.secret_hash = $1
        and m.disabled_at is null
        and (s.expires_at is null or s.expires_at > ",
    NOW,
    ")"
);

/// Retires a merchant's live secrets: they work `$2` milliseconds more (or
/// less, if they were to end sooner).
const RETIRE_SQL: &str = concatcp!(
    "update merchant_secrets set expires_at = min(coalesce(expires_at, 9223372036854775807), ",
    NOW,
    " + $2) where merchant_id = $1 and (expires_at is null or expires_at > ",
    NOW,
    ") returning expires_at"
);

const DISABLE_SQL: &str = concatcp!(
    "update merchants set disabled_at = case when $2 then ",
    NOW,
    " end where id = $1 and (disabled_at is null) = $2"
);

/// As on PostgreSQL, times as the RFC 3339 text they decode from.
const MERCHANT_LISTING_SQL: &str = "
    select m.id, m.name,
           strftime('%Y-%m-%dT%H:%M:%fZ', m.created_at / 1000.0, 'unixepoch'),
           strftime('%Y-%m-%dT%H:%M:%fZ', m.disabled_at / 1000.0, 'unixepoch'),
           s.id,
           strftime('%Y-%m-%dT%H:%M:%fZ', s.created_at / 1000.0, 'unixepoch'),
           strftime('%Y-%m-%dT%H:%M:%fZ', s.expires_at / 1000.0, 'unixepoch')
      from merchants m left join merchant_secrets s on s.merchant_id = m.id
     order by m.name, s.id";

/// As on PostgreSQL: every instance forgets its cached merchants when this moves.
const BUMP_VERSION_SQL: &str = "update settings set merchants_version = merchants_version + 1";

/// Whether `e` is the unique violation of the merchant's name (SQLite names
/// the column, not the constraint).
fn name_taken(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.is_unique_violation() && db.message().contains("merchants.name")
}

#[async_trait::async_trait]
impl Merchants for SqliteStore {
    async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
        audit: &Audit<'_>,
    ) -> Result<Merchant, MerchantError> {
        let created = self
            .write(async |tx| {
                let (id,): (i64,) = sqlx::query_as(CREATE_SQL)
                    .bind(name)
                    .bind(secret_hash.as_bytes())
                    .fetch_one(&mut *tx)
                    .await?;
                add_secret(&mut *tx, id, secret_hash).await?;
                super::audit::record(tx, &said::merchant_created().entry(audit, name)).await?;
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

    async fn merchant_by_secret(
        &self,
        secret_hash: &SecretHash,
    ) -> Result<Option<SecretMatch>, StoreError> {
        let row: Option<(i64, String, Option<i64>)> = sqlx::query_as(BY_SECRET_SQL)
            .bind(secret_hash.as_bytes())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(id, name, left)| SecretMatch {
            merchant: Merchant { id, name },
            expires_in: left.map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())),
        }))
    }

    async fn merchant_by_name(&self, name: &str) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> = sqlx::query_as(
            "select id, name from merchants where name = $1 and disabled_at is null",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }

    async fn merchants_version(&self) -> Result<i64, StoreError> {
        let (version,): (i64,) = sqlx::query_as("select merchants_version from settings")
            .fetch_one(&self.pool)
            .await?;
        Ok(version)
    }

    async fn merchant_listing(&self) -> Result<Vec<MerchantListing>, StoreError> {
        let rows: Vec<MerchantListingRow> = sqlx::query_as(MERCHANT_LISTING_SQL)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows::merchant_listing(rows))
    }

    async fn rotate_secret(
        &self,
        name: &str,
        secret_hash: &SecretHash,
        grace: Duration,
        audit: &Audit<'_>,
    ) -> Result<Rotation, MerchantError> {
        // Half the range at most: the statement adds it to now's milliseconds.
        let grace_ms = millis(grace).min(i64::MAX / 2);
        let rotated = self
            .write(async |tx| {
                let Some(id) = merchant_id(&mut *tx, name).await? else {
                    return Ok(None);
                };
                let retired: Vec<(i64,)> = sqlx::query_as(RETIRE_SQL)
                    .bind(id)
                    .bind(grace_ms)
                    .fetch_all(&mut *tx)
                    .await?;
                let until = retired
                    .iter()
                    .map(|(at,)| *at)
                    .max()
                    .map(from_millis)
                    .transpose()?;
                add_secret(&mut *tx, id, secret_hash).await?;
                sqlx::query(BUMP_VERSION_SQL).execute(&mut *tx).await?;
                let said = said::secret_rotated(retired.len() as u64, until);
                super::audit::record(tx, &said.entry(audit, name)).await?;
                Ok(Some(Rotation {
                    retired: retired.len() as u64,
                    retired_until: until,
                }))
            })
            .await?;
        rotated.ok_or_else(|| MerchantError::Unknown(name.to_owned()))
    }

    async fn set_merchant_disabled(
        &self,
        name: &str,
        disabled: bool,
        audit: &Audit<'_>,
    ) -> Result<bool, MerchantError> {
        let changed = self
            .write(async |tx| {
                let Some(id) = merchant_id(&mut *tx, name).await? else {
                    return Ok(None);
                };
                let done = sqlx::query(DISABLE_SQL)
                    .bind(id)
                    .bind(disabled)
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() == 0 {
                    return Ok(Some(false));
                }
                sqlx::query(BUMP_VERSION_SQL).execute(&mut *tx).await?;
                let said = said::merchant_disabled(disabled);
                super::audit::record(tx, &said.entry(audit, name)).await?;
                Ok(Some(true))
            })
            .await?;
        changed.ok_or_else(|| MerchantError::Unknown(name.to_owned()))
    }
}

async fn merchant_id(db: &mut SqliteConnection, name: &str) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as("select id from merchants where name = $1")
        .bind(name)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(id,)| id))
}

async fn add_secret(
    db: &mut SqliteConnection,
    merchant_id: i64,
    secret_hash: &SecretHash,
) -> Result<(), StoreError> {
    sqlx::query(ADD_SECRET_SQL)
        .bind(merchant_id)
        .bind(secret_hash.as_bytes())
        .execute(db)
        .await?;
    Ok(())
}
