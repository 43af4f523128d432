//! The `webhook_endpoints` and `webhook_deliveries` tables on PostgreSQL: a
//! merchant's endpoints, added, listed and changed, each change with its
//! audit record in one transaction; and the deliveries, which a deliverer
//! leases (`for update skip locked`, so several share the work without
//! taking one twice), and settles under the attempt it took them at.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{audit, PgStore};
use crate::store::error::StoreError;
use crate::store::model::{
    AttemptOutcome, Audit, DeliveryInfo, DueDelivery, EndpointChange, EndpointInfo, MerchantError,
    NewEndpoint,
};
use crate::store::ops::Webhooks;
use crate::store::said;
use crate::store::shared::millis;

const ADD_SQL: &str = "insert into webhook_endpoints (id, merchant_id, url, events, secret)
    select $1, m.id, $3, $4, $5 from merchants m where m.name = $2";

const LIST_SQL: &str = "select e.id, m.name, e.url, e.events, e.created_at, e.disabled_at,
           case when e.previous_secret_until > now() then e.previous_secret_until end
      from webhook_endpoints e join merchants m on m.id = e.merchant_id
     order by m.name, e.created_at, e.id";

/// Leases up to `$1` due deliveries for `$2` ms, at most `$3` in flight per
/// endpoint (counting those other deliverers hold), oldest due first: one
/// hanging endpoint holds a few of a deliverer's places, never all of them.
const TAKE_SQL: &str = "with leased as (
        select endpoint_id, count(*) as n from webhook_deliveries
         where state = 'pending' and locked_until > now()
         group by endpoint_id
    ), candidates as (
        select id from (
            select d.id, d.next_attempt_at, coalesce(l.n, 0)
                   + row_number() over (partition by d.endpoint_id order by d.next_attempt_at, d.id)
                   as place
              from webhook_deliveries d
              join webhook_endpoints e on e.id = d.endpoint_id
              left join leased l on l.endpoint_id = d.endpoint_id
             where d.state = 'pending' and d.next_attempt_at <= now()
               and (d.locked_until is null or d.locked_until <= now())
               and e.disabled_at is null
        ) c
         where c.place <= $3
         order by c.next_attempt_at, c.id
         limit $1
    ), due as (
        select d.id from webhook_deliveries d
         where d.id in (select id from candidates)
           and d.state = 'pending' and (d.locked_until is null or d.locked_until <= now())
           for update skip locked
    ), taken as (
        update webhook_deliveries d
           set locked_until = now() + $2 * interval '1 millisecond', attempts = d.attempts + 1
          from due where d.id = due.id
        returning d.id, d.attempts, d.event_id, d.event_type, d.body, d.endpoint_id
    )
    select t.id, t.attempts, t.event_id, t.event_type, t.body, t.endpoint_id, e.url, e.secret,
           case when e.previous_secret_until > now() then e.previous_secret end
      from taken t join webhook_endpoints e on e.id = t.endpoint_id";

/// Settles one attempt, fenced by it: `$1` id, `$2` attempt, `$3` the new
/// state, `$4` status, `$5` error, `$6` the wait before the next attempt in
/// ms (null: none).
const FINISH_SQL: &str = "update webhook_deliveries
       set state = $3, locked_until = null, last_status = $4, last_error = $5,
           next_attempt_at = case when $6::bigint is null then next_attempt_at
               else now() + $6 * interval '1 millisecond' end,
           finished_at = case when $3 = 'pending' then null else now() end
     where id = $1 and attempts = $2 and state = 'pending'";

const REDELIVER_SQL: &str = "update webhook_deliveries
       set state = 'pending', attempts = 0, next_attempt_at = now(), locked_until = null,
           finished_at = null
     where event_id = $1 and state <> 'pending'";

const DELIVERIES_SQL: &str = "select event_id, endpoint_id, event_type, state, attempts,
           last_status, last_error, created_at, next_attempt_at
      from webhook_deliveries order by id desc limit $1";

/// `$1` charge, `$2` limit.
const CHARGE_DELIVERIES_SQL: &str = "select event_id, endpoint_id, event_type, state, attempts,
           last_status, last_error, created_at, next_attempt_at
      from webhook_deliveries where charge_id = $1 order by id limit $2";

type DueRow = (
    i64,
    i32,
    String,
    String,
    Vec<u8>,
    String,
    String,
    String,
    Option<String>,
);

type ListRow = (
    String,
    String,
    String,
    Option<Vec<String>>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

#[async_trait::async_trait]
impl Webhooks for PgStore {
    async fn add_webhook_endpoint(
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

    async fn change_webhook_endpoint(
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
        let rows: Vec<DueRow> = self
            .on_conn(async |db| {
                sqlx::query_as(TAKE_SQL)
                    .bind(limit)
                    .bind(millis(lease))
                    .bind(per_endpoint)
                    .fetch_all(db)
                    .await
            })
            .await?;
        Ok(rows.into_iter().map(due).collect())
    }

    async fn finish_webhook_delivery(
        &self,
        id: i64,
        attempt: i32,
        outcome: &AttemptOutcome,
    ) -> Result<bool, StoreError> {
        let (state, status, error, after) = outcome.columns();
        let done = self
            .on_conn(async |db| {
                sqlx::query(FINISH_SQL)
                    .bind(id)
                    .bind(attempt)
                    .bind(state)
                    .bind(status)
                    .bind(error)
                    .bind(after)
                    .execute(db)
                    .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn redeliver_webhook(
        &self,
        event_id: &str,
        audit: &Audit<'_>,
    ) -> Result<u64, StoreError> {
        self.in_tx(async |db| {
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

    async fn webhook_deliveries(&self, limit: i64) -> Result<Vec<DeliveryInfo>, StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(DELIVERIES_SQL)
                .bind(limit)
                .fetch_all(db)
                .await
        })
        .await
    }

    async fn charge_deliveries(
        &self,
        charge_id: &str,
        limit: i64,
    ) -> Result<Vec<DeliveryInfo>, StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(CHARGE_DELIVERIES_SQL)
                .bind(charge_id)
                .bind(limit)
                .fetch_all(db)
                .await
        })
        .await
    }

    async fn webhook_backlog(&self) -> Result<(i64, f64), StoreError> {
        self.on_conn(async |db| {
            sqlx::query_as(
                "select count(*),
                        coalesce(extract(epoch from now() - min(created_at)), 0)::float8
                   from webhook_deliveries where state = 'pending'",
            )
            .fetch_one(db)
            .await
        })
        .await
    }
}

fn due(r: DueRow) -> DueDelivery {
    let (id, attempt, event_id, event_type, body, endpoint_id, url, secret, previous_secret) = r;
    DueDelivery {
        id,
        attempt,
        event_id,
        event_type,
        body: body.into(),
        endpoint_id,
        url,
        secret,
        previous_secret,
    }
}
