//! The `merchants` and `merchant_secrets` tables on MariaDB: as in
//! `postgres/merchants.rs`, each change with its audit record in one
//! transaction. A change to one merchant first locks its row (`for update`),
//! so two operators' rotations of one merchant run one after the other.

use std::time::Duration;

use const_format::concatcp;
use sqlx::mysql::MySqlConnection;

use super::sql::{params, query, query_as};
use super::{at, from_millis, MariaDbStore, NOW};
use crate::domain::{Merchant, SecretHash};
use crate::store::error::StoreError;
use crate::store::model::{Audit, MerchantError, MerchantListing, Rotation, SecretMatch};
use crate::store::ops::Merchants;
use crate::store::rows::{self, MerchantListingRow};
use crate::store::said;
use crate::store::shared::millis;

/// `secret_hash` here is the first secret's, read by nothing;
/// `merchant_secrets` decides.
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

/// Now, and the end of a grace of `$1` milliseconds, on the server's clock.
const GRACE_SQL: &str = concatcp!("select ", NOW, ", ", NOW, " + $1");

/// Retires a merchant's (`$1`) secrets live at `$2`: they work until `$3` (or
/// less, if they were to end sooner).
const RETIRE_SQL: &str =
    "update merchant_secrets set expires_at = least(coalesce(expires_at, $3), $3)
      where merchant_id = $1 and (expires_at is null or expires_at > $2)";

/// The latest end of the secrets just retired: every secret of the merchant
/// (`$1`) still live at `$2`.
const RETIRED_UNTIL_SQL: &str = "select max(expires_at) from merchant_secrets
      where merchant_id = $1 and expires_at > $2";

const DISABLE_SQL: &str = concatcp!(
    "update merchants set disabled_at = case when $2 then ",
    NOW,
    " end where id = $1 and (disabled_at is null) = $2"
);

/// As on PostgreSQL.
const MERCHANT_LISTING_SQL: &str = concatcp!(
    "select m.id, m.name, ",
    at!("m.created_at"),
    ", ",
    at!("m.disabled_at"),
    ", s.id, ",
    at!("s.created_at"),
    ", ",
    at!("s.expires_at"),
    " from merchants m left join merchant_secrets s on s.merchant_id = m.id
     order by m.name, s.id"
);

/// As on PostgreSQL: every instance forgets its cached merchants when this moves.
const BUMP_VERSION_SQL: &str = "update settings set merchants_version = merchants_version + 1";

/// Whether `e` is the unique violation of the merchant's name (MariaDB names
/// the key, `name`, in its message).
fn name_taken(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.is_unique_violation() && db.message().contains("for key 'name'")
}

#[async_trait::async_trait]
impl Merchants for MariaDbStore {
    async fn create_merchant(
        &self,
        name: &str,
        secret_hash: &SecretHash,
        audit: &Audit<'_>,
    ) -> Result<Merchant, MerchantError> {
        let created = self
            .write(async |tx| {
                let (id,): (i64,) = query_as(CREATE_SQL, params![name, secret_hash.as_bytes()])?
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
        let row: Option<(i64, String, Option<i64>)> = self
            .read(async |db| {
                Ok(query_as(BY_SECRET_SQL, params![secret_hash.as_bytes()])?
                    .fetch_optional(db)
                    .await?)
            })
            .await?;
        Ok(row.map(|(id, name, left)| SecretMatch {
            merchant: Merchant { id, name },
            expires_in: left.map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())),
        }))
    }

    async fn merchant_by_name(&self, name: &str) -> Result<Option<Merchant>, StoreError> {
        let row: Option<(i64, String)> = self
            .read(async |db| {
                Ok(query_as(
                    "select id, name from merchants where name = $1 and disabled_at is null",
                    params![name],
                )?
                .fetch_optional(db)
                .await?)
            })
            .await?;
        Ok(row.map(|(id, name)| Merchant { id, name }))
    }

    async fn merchants_version(&self) -> Result<i64, StoreError> {
        let (version,): (i64,) = self
            .read(async |db| {
                Ok(
                    query_as("select merchants_version from settings", params![])?
                        .fetch_one(db)
                        .await?,
                )
            })
            .await?;
        Ok(version)
    }

    async fn merchant_listing(&self) -> Result<Vec<MerchantListing>, StoreError> {
        let rows: Vec<MerchantListingRow> = self
            .read(async |db| {
                Ok(query_as(MERCHANT_LISTING_SQL, params![])?
                    .fetch_all(db)
                    .await?)
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
        // Half the range at most: the statement adds it to now's milliseconds.
        let grace_ms = millis(grace).min(i64::MAX / 2);
        let rotated = self
            .write(async |tx| {
                let Some(id) = merchant_for_update(&mut *tx, name).await? else {
                    return Ok(None);
                };
                let (now, until): (i64, i64) = query_as(GRACE_SQL, params![grace_ms])?
                    .fetch_one(&mut *tx)
                    .await?;
                let retired = query(RETIRE_SQL, params![id, now, until])?
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let (latest,): (Option<i64>,) = query_as(RETIRED_UNTIL_SQL, params![id, now])?
                    .fetch_one(&mut *tx)
                    .await?;
                let until = latest.map(from_millis).transpose()?;
                add_secret(&mut *tx, id, secret_hash).await?;
                query(BUMP_VERSION_SQL, params![])?
                    .execute(&mut *tx)
                    .await?;
                let said = said::secret_rotated(retired, until);
                super::audit::record(tx, &said.entry(audit, name)).await?;
                Ok(Some(Rotation {
                    retired,
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
                let Some(id) = merchant_for_update(&mut *tx, name).await? else {
                    return Ok(None);
                };
                let done = query(DISABLE_SQL, params![id, i64::from(disabled)])?
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() == 0 {
                    return Ok(Some(false));
                }
                query(BUMP_VERSION_SQL, params![])?
                    .execute(&mut *tx)
                    .await?;
                let said = said::merchant_disabled(disabled);
                super::audit::record(tx, &said.entry(audit, name)).await?;
                Ok(Some(true))
            })
            .await?;
        changed.ok_or_else(|| MerchantError::Unknown(name.to_owned()))
    }
}

/// The merchant named `name`, its row locked until the caller's commit.
async fn merchant_for_update(
    db: &mut MySqlConnection,
    name: &str,
) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64,)> = query_as(
        "select id from merchants where name = $1 for update",
        params![name],
    )?
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(id,)| id))
}

async fn add_secret(
    db: &mut MySqlConnection,
    merchant_id: i64,
    secret_hash: &SecretHash,
) -> Result<(), StoreError> {
    query(ADD_SECRET_SQL, params![merchant_id, secret_hash.as_bytes()])?
        .execute(db)
        .await?;
    Ok(())
}
