//! The `webhook_endpoints` table on PostgreSQL: a merchant's endpoints, added,
//! listed and changed, each change with its audit record in one transaction.

use chrono::{DateTime, Utc};

use super::{audit, PgStore};
use crate::store::model::{
    Audit, AuditEntry, EndpointChange, EndpointInfo, MerchantError, NewEndpoint,
};
use crate::store::{millis, StoreError};

const ADD_SQL: &str = "insert into webhook_endpoints (id, merchant_id, url, events, secret)
    select $1, m.id, $3, $4, $5 from merchants m where m.name = $2";

const LIST_SQL: &str = "select e.id, m.name, e.url, e.events, e.created_at, e.disabled_at,
           case when e.previous_secret_until > now() then e.previous_secret_until end
      from webhook_endpoints e join merchants m on m.id = e.merchant_id
     order by m.name, e.created_at, e.id";

type ListRow = (
    String,
    String,
    String,
    Option<Vec<String>>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

impl PgStore {
    pub(in crate::store) async fn add_webhook_endpoint(
        &self,
        new: &NewEndpoint<'_>,
        audit: &Audit<'_>,
    ) -> Result<(), MerchantError> {
        let added = self
            .in_tx(async |db| {
                let done = sqlx::query(ADD_SQL)
                    .bind(new.id)
                    .bind(new.merchant)
                    .bind(new.url)
                    .bind(new.events)
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
        let rows: Vec<ListRow> = self
            .on_conn(async |db| sqlx::query_as(LIST_SQL).fetch_all(db).await)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, merchant, url, events, created_at, disabled_at, previous_secret_until)| {
                    EndpointInfo {
                        id,
                        merchant,
                        url,
                        events,
                        created_at,
                        disabled_at,
                        previous_secret_until,
                    }
                },
            )
            .collect())
    }

    pub(in crate::store) async fn change_webhook_endpoint(
        &self,
        id: &str,
        change: EndpointChange<'_>,
        audit: &Audit<'_>,
    ) -> Result<bool, StoreError> {
        self.in_tx(async |db| {
            let query = match change {
                EndpointChange::Remove => {
                    sqlx::query("delete from webhook_endpoints where id = $1").bind(id)
                }
                EndpointChange::Disable => sqlx::query(
                    "update webhook_endpoints set disabled_at = now()
                      where id = $1 and disabled_at is null",
                )
                .bind(id),
                EndpointChange::Enable => sqlx::query(
                    "update webhook_endpoints set disabled_at = null
                      where id = $1 and disabled_at is not null",
                )
                .bind(id),
                EndpointChange::RotateSecret { secret, grace } => sqlx::query(
                    "update webhook_endpoints
                        set previous_secret = case when $3 > 0 then secret end,
                            previous_secret_until = case when $3 > 0
                                then now() + $3 * interval '1 millisecond' end,
                            secret = $2
                      where id = $1",
                )
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
