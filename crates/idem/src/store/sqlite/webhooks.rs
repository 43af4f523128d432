//! The `webhook_endpoints` table on SQLite: as in `postgres/webhooks.rs`,
//! each change with its audit record in one write. `events` is a JSON array.

use chrono::{DateTime, Utc};
use const_format::concatcp;

use super::{audit, SqliteStore, NOW};
use crate::store::model::{
    Audit, AuditEntry, EndpointChange, EndpointInfo, MerchantError, NewEndpoint,
};
use crate::store::{millis, StoreError};

const ADD_SQL: &str = concatcp!(
    "insert into webhook_endpoints (id, merchant_id, url, events, secret, created_at)
     select $1, m.id, $3, $4, $5, ",
    NOW,
    " from merchants m where m.name = $2"
);

/// Times as the RFC 3339 text they decode from, as elsewhere on SQLite.
const LIST_SQL: &str = concatcp!(
    "select e.id, m.name, e.url, e.events,
            strftime('%Y-%m-%dT%H:%M:%fZ', e.created_at / 1000.0, 'unixepoch'),
            strftime('%Y-%m-%dT%H:%M:%fZ', e.disabled_at / 1000.0, 'unixepoch'),
            case when e.previous_secret_until > ",
    NOW,
    " then strftime('%Y-%m-%dT%H:%M:%fZ', e.previous_secret_until / 1000.0, 'unixepoch') end
       from webhook_endpoints e join merchants m on m.id = e.merchant_id
      order by m.name, e.created_at, e.id"
);

const DISABLE_SQL: &str = concatcp!(
    "update webhook_endpoints set disabled_at = ",
    NOW,
    " where id = $1 and disabled_at is null"
);

const ROTATE_SQL: &str = concatcp!(
    "update webhook_endpoints
        set previous_secret = case when $3 > 0 then secret end,
            previous_secret_until = case when $3 > 0 then ",
    NOW,
    " + $3 end,
            secret = $2
      where id = $1"
);

type ListRow = (
    String,
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

impl SqliteStore {
    pub(in crate::store) async fn add_webhook_endpoint(
        &self,
        new: &NewEndpoint<'_>,
        audit: &Audit<'_>,
    ) -> Result<(), MerchantError> {
        // Text, not a blob: SQLite's JSON functions read it.
        let events = new
            .events
            .map(|e| String::from_utf8_lossy(&crate::domain::to_json(e)).into_owned());
        let added = self
            .write(async |db| {
                let done = sqlx::query(ADD_SQL)
                    .bind(new.id)
                    .bind(new.merchant)
                    .bind(new.url)
                    .bind(events.as_deref())
                    .bind(new.secret)
                    .execute(&mut *db)
                    .await?;
                if done.rows_affected() == 0 {
                    return Ok(false);
                }
                let detail = format!("{} for {}", new.url, new.merchant);
                let entry = AuditEntry {
                    audit: *audit,
                    action: "webhook.add",
                    subject: new.id,
                    detail: &detail,
                };
                audit::record(&mut *db, &entry).await?;
                Ok(true)
            })
            .await?;
        if added {
            Ok(())
        } else {
            Err(MerchantError::Unknown(new.merchant.to_owned()))
        }
    }

    pub(in crate::store) async fn webhook_endpoints(
        &self,
    ) -> Result<Vec<EndpointInfo>, StoreError> {
        let rows: Vec<ListRow> = sqlx::query_as(LIST_SQL).fetch_all(&self.pool).await?;
        rows.into_iter()
            .map(
                |(id, merchant, url, events, created_at, disabled_at, previous_secret_until)| {
                    let events = events
                        .map(|json| serde_json::from_slice::<Vec<String>>(json.as_bytes()))
                        .transpose()
                        .map_err(|e| StoreError::Corrupt(format!("endpoint {id}'s events: {e}")))?;
                    Ok(EndpointInfo {
                        id,
                        merchant,
                        url,
                        events,
                        created_at,
                        disabled_at,
                        previous_secret_until,
                    })
                },
            )
            .collect()
    }

    pub(in crate::store) async fn change_webhook_endpoint(
        &self,
        id: &str,
        change: EndpointChange<'_>,
        audit: &Audit<'_>,
    ) -> Result<bool, StoreError> {
        self.write(async |db| {
            let query = match change {
                EndpointChange::Remove => {
                    sqlx::query("delete from webhook_endpoints where id = $1").bind(id)
                }
                EndpointChange::Disable => sqlx::query(DISABLE_SQL).bind(id),
                EndpointChange::Enable => sqlx::query(
                    "update webhook_endpoints set disabled_at = null
                      where id = $1 and disabled_at is not null",
                )
                .bind(id),
                EndpointChange::RotateSecret { secret, grace } => sqlx::query(ROTATE_SQL)
                    .bind(id)
                    .bind(secret)
                    .bind(millis(grace)),
            };
            if query.execute(&mut *db).await?.rows_affected() == 0 {
                return Ok(false);
            }
            let entry = AuditEntry {
                audit: *audit,
                action: change.action(),
                subject: id,
                detail: "",
            };
            audit::record(&mut *db, &entry).await?;
            Ok(true)
        })
        .await
    }
}
