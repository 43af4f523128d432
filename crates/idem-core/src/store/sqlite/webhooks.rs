//! The `webhook_endpoints` and `webhook_deliveries` tables on SQLite: as in
//! `postgres/webhooks.rs`, each change with its audit record in one write,
//! and deliveries leased in one write (the file's one writer at a time, so
//! no two deliverers take the same row). `events` is a JSON array.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use const_format::concatcp;

use super::{audit, SqliteStore, NOW};
use crate::store::error::StoreError;
use crate::store::model::{
    AttemptOutcome, Audit, DeliveryInfo, DueDelivery, EndpointChange, EndpointInfo, MerchantError,
    NewEndpoint,
};
use crate::store::ops::Webhooks;
use crate::store::said;
use crate::store::shared::millis;

/// Whether the endpoint `we` is enabled and hears the event whose type is
/// `i.webhook_event_type` (its `events` a JSON array, null for every event).
pub(super) const ENDPOINT_HEARS: &str = "we.disabled_at is null
    and (we.events is null
         or exists (select 1 from json_each(we.events) where value = i.webhook_event_type))";

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

/// As on PostgreSQL: leases up to `$1` due deliveries for `$2` ms, at most
/// `$3` in flight per endpoint, oldest due first.
const TAKE_SQL: &str = concatcp!(
    "with leased as (
        select endpoint_id, count(*) as n from webhook_deliveries
         where state = 'pending' and locked_until > ",
    NOW,
    " group by endpoint_id
    ), candidates as (
        select id from (
            select d.id, d.next_attempt_at, coalesce(l.n, 0)
                   + row_number() over (partition by d.endpoint_id order by d.next_attempt_at, d.id)
                   as place
              from webhook_deliveries d
              join webhook_endpoints e on e.id = d.endpoint_id
              left join leased l on l.endpoint_id = d.endpoint_id
             where d.state = 'pending' and d.next_attempt_at <= ",
    NOW,
    " and (d.locked_until is null or d.locked_until <= ",
    NOW,
    ") and e.disabled_at is null
        ) c
         where c.place <= $3
         order by c.next_attempt_at, c.id
         limit $1
    )
    update webhook_deliveries
       set locked_until = ",
    NOW,
    " + $2, attempts = attempts + 1
     where id in (select id from candidates)
    returning id, attempts, event_id, event_type, body, endpoint_id"
);

/// Whether any delivery is due and free (the partial index of pending ones).
const ANY_DUE_SQL: &str = concatcp!(
    "select exists (select 1 from webhook_deliveries
      where state = 'pending' and next_attempt_at <= ",
    NOW,
    " and (locked_until is null or locked_until <= ",
    NOW,
    "))"
);

/// The taken deliveries' endpoints (`$1`: their ids, as JSON).
const ENDPOINTS_OF_SQL: &str = concatcp!(
    "select id, url, secret, case when previous_secret_until > ",
    NOW,
    " then previous_secret end
       from webhook_endpoints where id in (select value from json_each($1))"
);

const FINISH_SQL: &str = concatcp!(
    "update webhook_deliveries
        set state = $3, locked_until = null, last_status = $4, last_error = $5,
            next_attempt_at = case when $6 is null then next_attempt_at else ",
    NOW,
    " + $6 end,
            finished_at = case when $3 = 'pending' then null else ",
    NOW,
    " end
      where id = $1 and attempts = $2 and state = 'pending'"
);

const REDELIVER_SQL: &str = concatcp!(
    "update webhook_deliveries
        set state = 'pending', attempts = 0, next_attempt_at = ",
    NOW,
    ", locked_until = null, finished_at = null
      where event_id = $1 and state <> 'pending'"
);

const DELIVERIES_SQL: &str = "select event_id, endpoint_id, event_type, state, attempts,
           last_status, last_error,
           strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') as created_at,
           strftime('%Y-%m-%dT%H:%M:%fZ', next_attempt_at / 1000.0, 'unixepoch')
             as next_attempt_at
      from webhook_deliveries order by id desc limit $1";

/// `$1` charge, `$2` limit.
const CHARGE_DELIVERIES_SQL: &str = "select event_id, endpoint_id, event_type, state, attempts,
           last_status, last_error,
           strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') as created_at,
           strftime('%Y-%m-%dT%H:%M:%fZ', next_attempt_at / 1000.0, 'unixepoch')
             as next_attempt_at
      from webhook_deliveries where charge_id = $1 order by id limit $2";

const BACKLOG_SQL: &str = concatcp!(
    "select count(*), coalesce((",
    NOW,
    " - min(created_at)) / 1000.0, 0.0)
       from webhook_deliveries where state = 'pending'"
);

type TakenRow = (i64, i32, String, String, Vec<u8>, String);

type ListRow = (
    String,
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

#[async_trait::async_trait]
impl Webhooks for SqliteStore {
    async fn add_webhook_endpoint(
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
                let said = said::webhook_added(new.url, new.merchant);
                audit::record(&mut *db, &said.entry(audit, new.id)).await?;
                Ok(true)
            })
            .await?;
        if added {
            Ok(())
        } else {
            Err(MerchantError::Unknown(new.merchant.to_owned()))
        }
    }

    async fn webhook_endpoints(&self) -> Result<Vec<EndpointInfo>, StoreError> {
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

    async fn change_webhook_endpoint(
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
            let said = said::webhook_changed(change.action());
            audit::record(&mut *db, &said.entry(audit, id)).await?;
            Ok(true)
        })
        .await
    }

    async fn take_webhook_deliveries(
        &self,
        limit: i64,
        lease: Duration,
        per_endpoint: i64,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        // A read first: the deliverer looks four times a second, and an idle
        // look must not take the file's one write turn from the charges.
        let (due,): (bool,) = sqlx::query_as(ANY_DUE_SQL).fetch_one(&self.pool).await?;
        if !due {
            return Ok(Vec::new());
        }
        self.write(async |db| {
            let taken: Vec<TakenRow> = sqlx::query_as(TAKE_SQL)
                .bind(limit)
                .bind(millis(lease))
                .bind(per_endpoint)
                .fetch_all(&mut *db)
                .await?;
            if taken.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<&str> = taken.iter().map(|t| t.5.as_str()).collect();
            let ids = String::from_utf8_lossy(&crate::domain::to_json(&ids)).into_owned();
            let endpoints: Vec<(String, String, String, Option<String>)> =
                sqlx::query_as(ENDPOINTS_OF_SQL)
                    .bind(ids)
                    .fetch_all(&mut *db)
                    .await?;
            let endpoints: HashMap<String, (String, String, Option<String>)> = endpoints
                .into_iter()
                .map(|(id, url, secret, previous)| (id, (url, secret, previous)))
                .collect();
            taken
                .into_iter()
                .map(|(id, attempt, event_id, event_type, body, endpoint_id)| {
                    let (url, secret, previous_secret) =
                        endpoints.get(&endpoint_id).cloned().ok_or_else(|| {
                            StoreError::Corrupt(format!("delivery {id}: no endpoint {endpoint_id}"))
                        })?;
                    Ok(DueDelivery {
                        id,
                        attempt,
                        event_id,
                        event_type,
                        body: body.into(),
                        endpoint_id,
                        url,
                        secret,
                        previous_secret,
                    })
                })
                .collect()
        })
        .await
    }

    async fn finish_webhook_delivery(
        &self,
        id: i64,
        attempt: i32,
        outcome: &AttemptOutcome,
    ) -> Result<bool, StoreError> {
        let (state, status, error, after) = outcome.columns();
        self.write(async |db| {
            let done = sqlx::query(FINISH_SQL)
                .bind(id)
                .bind(attempt)
                .bind(state)
                .bind(status)
                .bind(error)
                .bind(after)
                .execute(&mut *db)
                .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn redeliver_webhook(
        &self,
        event_id: &str,
        audit: &Audit<'_>,
    ) -> Result<u64, StoreError> {
        self.write(async |db| {
            let n = sqlx::query(REDELIVER_SQL)
                .bind(event_id)
                .execute(&mut *db)
                .await?
                .rows_affected();
            if n > 0 {
                let said = said::webhook_redelivered(n);
                audit::record(&mut *db, &said.entry(audit, event_id)).await?;
            }
            Ok(n)
        })
        .await
    }

    async fn charge_deliveries(
        &self,
        charge_id: &str,
        limit: i64,
    ) -> Result<Vec<DeliveryInfo>, StoreError> {
        Ok(sqlx::query_as(CHARGE_DELIVERIES_SQL)
            .bind(charge_id)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    async fn webhook_deliveries(&self, limit: i64) -> Result<Vec<DeliveryInfo>, StoreError> {
        Ok(sqlx::query_as(DELIVERIES_SQL)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    async fn webhook_backlog(&self) -> Result<(i64, f64), StoreError> {
        Ok(sqlx::query_as(BACKLOG_SQL).fetch_one(&self.pool).await?)
    }
}
