//! The `webhook_endpoints` and `webhook_deliveries` tables on MariaDB: as in
//! `postgres/webhooks.rs`, each change with its audit record in one
//! transaction. Deliveries are leased in one transaction that first locks
//! the endpoints with deliveries due (`for update`): two deliverers leasing
//! at once take turns per endpoint, so each counts what the other leased and
//! the per-endpoint share holds. `events` is a JSON array.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use const_format::concatcp;

use super::sql::{params, query, query_as};
use super::{at, audit, MariaDbStore, NOW};
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
    and (we.events is null or json_contains(we.events, json_quote(i.webhook_event_type)))";

const ADD_SQL: &str = concatcp!(
    "insert into webhook_endpoints (id, merchant_id, url, events, secret, created_at)
     select $1, m.id, $3, $4, $5, ",
    NOW,
    " from merchants m where m.name = $2"
);

/// Times as the RFC 3339 text they decode from, as elsewhere on SQLite.
const LIST_SQL: &str = concatcp!(
    "select e.id, m.name, e.url, e.events,
            ",
    at!("e.created_at"),
    ", ",
    at!("e.disabled_at"),
    ",
            case when e.previous_secret_until > ",
    NOW,
    " then ",
    at!("e.previous_secret_until"),
    " end
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

/// The endpoints with deliveries due, locked until the lease commits.
const LOCK_ENDPOINTS_SQL: &str = concatcp!(
    "select e.id from webhook_endpoints e
      where e.disabled_at is null
        and e.id in (select d.endpoint_id from webhook_deliveries d
                      where d.state = 'pending' and d.next_attempt_at <= ",
    NOW,
    ")
      order by e.id
      for update"
);

/// As on PostgreSQL: up to `$1` due deliveries, at most `$3` in flight per
/// endpoint, oldest due first (`$2` unused here).
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
    select id from candidates"
);

/// `$1` the deliveries taken (a JSON array), `$2` the lease in ms; each
/// still pending and free (the endpoints' lock already holds them so).
const LEASE_SQL: &str = concatcp!(
    "update webhook_deliveries d
       join json_table($1, '$[*]' columns (id bigint path '$')) j on d.id = j.id
       set d.locked_until = ",
    NOW,
    " + $2, d.attempts = d.attempts + 1
     where d.state = 'pending' and (d.locked_until is null or d.locked_until <= ",
    NOW,
    ")"
);

/// `$1` the deliveries taken (a JSON array).
const TAKEN_SQL: &str = "select d.id, d.attempts, d.event_id, d.event_type, d.body, d.endpoint_id
       from json_table($1, '$[*]' columns (id bigint path '$')) j
       join webhook_deliveries d on d.id = j.id
      order by d.next_attempt_at, d.id";

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
    "select e.id, e.url, e.secret, case when e.previous_secret_until > ",
    NOW,
    " then e.previous_secret end
       from json_table($1, '$[*]' columns (id varchar(64) character set utf8mb4
                                             collate utf8mb4_uca1400_nopad_as_cs path '$')) j
       join webhook_endpoints e on e.id = j.id"
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
           timestampadd(microsecond, created_at * 1000, timestamp'1970-01-01 00:00:00') as created_at,
           timestampadd(microsecond, next_attempt_at * 1000, timestamp'1970-01-01 00:00:00')
             as next_attempt_at
      from webhook_deliveries order by id desc limit $1";

/// `$1` charge, `$2` limit.
const CHARGE_DELIVERIES_SQL: &str = "select event_id, endpoint_id, event_type, state, attempts,
           last_status, last_error,
           timestampadd(microsecond, created_at * 1000, timestamp'1970-01-01 00:00:00') as created_at,
           timestampadd(microsecond, next_attempt_at * 1000, timestamp'1970-01-01 00:00:00')
             as next_attempt_at
      from webhook_deliveries where charge_id = $1 order by id limit $2";

const BACKLOG_SQL: &str = concatcp!(
    "select count(*), cast(coalesce((",
    NOW,
    " - min(created_at)) / 1000, 0) as double)
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
impl Webhooks for MariaDbStore {
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
                let done = query(
                    ADD_SQL,
                    params![new.id, new.merchant, new.url, events.as_deref(), new.secret],
                )?
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
        let rows: Vec<ListRow> = query_as(LIST_SQL, params![])?.fetch_all(&self.pool).await?;
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
                    query("delete from webhook_endpoints where id = $1", params![id])?
                }
                EndpointChange::Disable => query(DISABLE_SQL, params![id])?,
                EndpointChange::Enable => query(
                    "update webhook_endpoints set disabled_at = null
                      where id = $1 and disabled_at is not null",
                    params![id],
                )?,
                EndpointChange::RotateSecret { secret, grace } => {
                    query(ROTATE_SQL, params![id, secret, millis(grace)])?
                }
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
        // look opens no transaction and locks nothing.
        let (due,): (bool,) = query_as(ANY_DUE_SQL, params![])?
            .fetch_one(&self.pool)
            .await?;
        if !due {
            return Ok(Vec::new());
        }
        self.write(async |db| {
            query(LOCK_ENDPOINTS_SQL, params![])?
                .execute(&mut *db)
                .await?;
            let candidates: Vec<(i64,)> =
                query_as(TAKE_SQL, params![limit, millis(lease), per_endpoint])?
                    .fetch_all(&mut *db)
                    .await?;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<i64> = candidates.into_iter().map(|(id,)| id).collect();
            let count = ids.len() as u64;
            let ids = String::from_utf8_lossy(&crate::domain::to_json(&ids)).into_owned();
            let leased = query(LEASE_SQL, params![ids.as_str(), millis(lease)])?
                .execute(&mut *db)
                .await?
                .rows_affected();
            if leased != count {
                // Under the endpoints' lock no other deliverer leases them:
                // a delivery that was not free is a bug, and takes nothing.
                return Err(StoreError::Corrupt(format!(
                    "{leased} of {count} due deliveries leased under their endpoints' lock"
                )));
            }
            let taken: Vec<TakenRow> = query_as(TAKEN_SQL, params![ids.as_str()])?
                .fetch_all(&mut *db)
                .await?;
            let ids: Vec<&str> = taken.iter().map(|t| t.5.as_str()).collect();
            let ids = String::from_utf8_lossy(&crate::domain::to_json(&ids)).into_owned();
            let endpoints: Vec<(String, String, String, Option<String>)> =
                query_as(ENDPOINTS_OF_SQL, params![ids.as_str()])?
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
            let done = query(
                FINISH_SQL,
                params![id, attempt, state, status, error, after],
            )?
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
            let n = query(REDELIVER_SQL, params![event_id])?
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
        Ok(query_as(CHARGE_DELIVERIES_SQL, params![charge_id, limit])?
            .fetch_all(&self.pool)
            .await?)
    }

    async fn webhook_deliveries(&self, limit: i64) -> Result<Vec<DeliveryInfo>, StoreError> {
        Ok(query_as(DELIVERIES_SQL, params![limit])?
            .fetch_all(&self.pool)
            .await?)
    }

    async fn webhook_backlog(&self) -> Result<(i64, f64), StoreError> {
        Ok(query_as(BACKLOG_SQL, params![])?
            .fetch_one(&self.pool)
            .await?)
    }
}
