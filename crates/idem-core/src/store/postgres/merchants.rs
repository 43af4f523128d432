//! The `merchants` and `merchant_secrets` tables on PostgreSQL: creation,
//! look-up, and the operator's rotate, disable and enable, each with its
//! audit record in one transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{audit, PgStore};
use crate::domain::{Merchant, SecretHash};
use crate::store::error::StoreError;
use crate::store::model::{Audit, MerchantError, MerchantListing, Rotation, SecretMatch};
use crate::store::ops::Merchants;
use crate::store::rows::{self, MerchantListingRow};
use crate::store::said;
use crate::store::shared::millis;

/// The merchant a live secret authenticates, and the seconds that secret has left.
const BY_SECRET_SQL: &str = "
    select m.id, m.name, extract(epoch from s.expires_at - now())::float8
      from merchant_secrets s join merchants m on m.id = s.merchant_id
     where s.secret_hash = $1
       and m.disabled_at is null
       and (s.expires_at is null or s.expires_at > now())";

/// Every instance forgets its cached merchants when this moves (see
/// `MerchantCache`); part of every change to who may authenticate.
const BUMP_VERSION_SQL: &str = "update settings set merchants_version = merchants_version + 1";

#[async_trait::async_trait]
impl Merchants for PgStore {
    async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
        audit: &Audit<'_>,
    ) -> Result<Merchant, MerchantError> {
        let created = self
            .in_tx(async |db| {
                let (id,): (i64,) =
                    sqlx::query_as("insert into merchants (name) values ($1) returning id")
                        .bind(name)
                        .fetch_one(&mut *db)
                        .await?;
                add_secret(&mut *db, id, secret_hash).await?;
                audit::record(&mut *db, &said::merchant_created().entry(audit, name)).await?;
                Ok(id)
            })
            .await;
        match created {
            Ok(id) => Ok(Merchant {
                id,
                name: name.to_owned(),
            }),
            Err(StoreError::Database(sqlx::Error::Database(e)))
                if e.constraint() == Some("merchants_name_key") =>
            {
                Err(MerchantError::NameTaken(name.to_owned()))
            }
            Err(e) => Err(MerchantError::Store(e)),
        }
    }

    async fn merchant_by_secret(
        &self,
        secret_hash: &SecretHash,
    ) -> Result<Option<SecretMatch>, StoreError> {
        let row: Option<(i64, String, Option<f64>)> = self
            .on_conn(async |db| {
                sqlx::query_as(BY_SECRET_SQL)
                    .bind(secret_hash.as_bytes())
                    .fetch_optional(db)
                    .await
            })
            .await?;
        Ok(row.map(|(id, name, left)| SecretMatch {
            merchant: Merchant { id, name },
            expires_in: left.map(|s| Duration::from_secs_f64(s.max(0.0))),
        }))
    }

    async fn merchant_by_name(&self, name: &str) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> = self
            .on_conn(async |db| {
                sqlx::query_as(
                    "select id, name from merchants where name = $1 and disabled_at is null",
                )
                .bind(name)
                .fetch_optional(db)
                .await
            })
            .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }

    async fn merchants_version(&self) -> Result<i64, StoreError> {
        let (version,): (i64,) = self
            .on_conn(async |db| {
                sqlx::query_as("select merchants_version from settings")
                    .fetch_one(db)
                    .await
            })
            .await?;
        Ok(version)
    }

    async fn merchant_listing(&self) -> Result<Vec<MerchantListing>, StoreError> {
        let rows: Vec<MerchantListingRow> = self
            .on_conn(async |db| {
                sqlx::query_as(
                    "select m.id, m.name, m.created_at, m.disabled_at, s.id, s.created_at, s.expires_at
                       from merchants m left join merchant_secrets s on s.merchant_id = m.id
                      order by m.name, s.id",
                )
                .fetch_all(db)
                .await
            })
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
        let grace_ms = millis(grace);
        let rotated = self
            .in_tx(async |db| {
                let Some(id) = merchant_id(&mut *db, name).await? else {
                    return Ok(None);
                };
                let (retired, until): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
                    "with retired as (
                        update merchant_secrets
                           set expires_at = least(coalesce(expires_at, 'infinity'),
                                                  now() + $2 * interval '1 millisecond')
                         where merchant_id = $1 and (expires_at is null or expires_at > now())
                     returning expires_at)
                     select count(*), max(expires_at) from retired",
                )
                .bind(id)
                .bind(grace_ms)
                .fetch_one(&mut *db)
                .await?;
                add_secret(&mut *db, id, secret_hash).await?;
                sqlx::query(BUMP_VERSION_SQL).execute(&mut *db).await?;
                let said = said::secret_rotated(retired.unsigned_abs(), until);
                audit::record(&mut *db, &said.entry(audit, name)).await?;
                Ok(Some(Rotation {
                    retired: retired.unsigned_abs(),
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
            .in_tx(async |db| {
                let Some(id) = merchant_id(&mut *db, name).await? else {
                    return Ok(None);
                };
                let done = sqlx::query(
                    "update merchants set disabled_at = case when $2 then now() end
                      where id = $1 and (disabled_at is null) = $2",
                )
                .bind(id)
                .bind(disabled)
                .execute(&mut *db)
                .await?;
                if done.rows_affected() == 0 {
                    return Ok(Some(false));
                }
                sqlx::query(BUMP_VERSION_SQL).execute(&mut *db).await?;
                let said = said::merchant_disabled(disabled);
                audit::record(&mut *db, &said.entry(audit, name)).await?;
                Ok(Some(true))
            })
            .await?;
        changed.ok_or_else(|| MerchantError::Unknown(name.to_owned()))
    }
}

/// The id of the merchant named `name`, locked until the transaction ends so
/// that two operators' changes to one merchant take turns.
async fn merchant_id(db: &mut PgConnection, name: &str) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as("select id from merchants where name = $1 for update")
        .bind(name)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(id,)| id))
}

async fn add_secret(
    db: &mut PgConnection,
    merchant_id: i64,
    secret_hash: &SecretHash,
) -> Result<(), StoreError> {
    sqlx::query("insert into merchant_secrets (merchant_id, secret_hash) values ($1, $2)")
        .bind(merchant_id)
        .bind(secret_hash.as_bytes())
        .execute(db)
        .await?;
    Ok(())
}
