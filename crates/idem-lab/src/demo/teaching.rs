//! The article's two wrong answers, as small HTTP servers: three of each in
//! the demo, or one on an address (`idem-lab teaching-server`, which
//! `idem-lab verify`'s tests point at). `idem serve` cannot run them: this
//! crate is the lab's.
//!
//! - **check-then-act** (the article's "first answer"): select by key; if absent,
//!   insert and capture. No unique constraint. Two attempts that both check
//!   before either inserts both capture, each with its own reference.
//! - **hold-transaction**: insert first against a unique constraint, but call the
//!   acquirer *inside* the open transaction. It charges once, but a retry's
//!   insert waits on the row lock until the first attempt commits, holding a
//!   connection the whole time. On SQLite, whose write lock covers the whole
//!   file, the open transaction stalls every other write, of any key.
//!
//! Both run on PostgreSQL or SQLite through sqlx's `Any` driver: the article's
//! statements are the same in both. check-then-act writes down when each check
//! found no row and when each insert returned, for the demo's timeline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sqlx::AnyPool;

use idem_core::store::Backend;

use idem_core::acquirer::protocol::CaptureRequest;
use idem_core::acquirer::{Acquirer, AcquirerClient};
use idem_core::domain::IdempotencyKey;
use idem_core::domain::{AcquirerReference, ChargeRequest};

use super::timeline::ServerStep;

/// The steps the teaching servers took, by idempotency key. A std mutex: held
/// only to push, never across an await.
pub type ServerTrace = Arc<Mutex<Vec<(String, ServerStep, Instant)>>>;

fn note(trace: &ServerTrace, key: &IdempotencyKey, step: ServerStep) {
    let at = Instant::now();
    if let Ok(mut steps) = trace.lock() {
        steps.push((key.as_str().to_owned(), step, at));
    }
}

/// The work a real handler does between its check and its insert (validation,
/// a fraud score): the article's window, made as wide as it is in production.
const CHECK_TO_INSERT: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Teaching {
    CheckThenAct,
    HoldTransaction,
}

#[derive(Clone)]
struct Ctx {
    strategy: Teaching,
    pool: AnyPool,
    acquirer: AcquirerClient,
    merchant: String,
    trace: ServerTrace,
}

impl Teaching {
    pub fn name(self) -> &'static str {
        match self {
            Self::CheckThenAct => "check-then-act",
            Self::HoldTransaction => "hold-transaction",
        }
    }
}

/// A pool of `connections` on `db_url`, with the strategy's table made if
/// it is not there yet.
pub async fn connect(
    db_url: &str,
    connections: u32,
    strategy: Teaching,
) -> anyhow::Result<AnyPool> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(connections)
        .connect(db_url)
        .await?;
    create_table(&pool, Backend::of_url(db_url)?, strategy).await?;
    Ok(pool)
}

/// One server of `strategy` on `listener`, on `pool`, until `shutdown` fires.
pub async fn serve(
    strategy: Teaching,
    listener: tokio::net::TcpListener,
    pool: AnyPool,
    acquirer: AcquirerClient,
    merchant: String,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let app = router(strategy, pool, acquirer, merchant, ServerTrace::default());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Creates the strategy's table, as the article writes it, unless it is there.
pub async fn create_table(
    pool: &AnyPool,
    backend: Backend,
    strategy: Teaching,
) -> sqlx::Result<()> {
    let unique = match strategy {
        Teaching::CheckThenAct => "",
        Teaching::HoldTransaction => {
            ", constraint uq_cobranca_idempotency_key unique (idempotency_key)"
        }
    };
    let id = match backend {
        Backend::Postgres => "bigint generated always as identity primary key",
        Backend::Sqlite => "integer primary key",
        Backend::MariaDb => "bigint auto_increment primary key",
    };
    sqlx::query(&format!(
        "create table if not exists cobranca (
            id {id},
            idempotency_key text not null,
            order_id bigint not null,
            amount_cents bigint not null,
            reference text not null,
            status text not null,
            response_body text{unique})"
    ))
    .execute(pool)
    .await?;
    Ok(())
}

pub fn router(
    strategy: Teaching,
    pool: AnyPool,
    acquirer: AcquirerClient,
    merchant: String,
    trace: ServerTrace,
) -> Router {
    Router::new()
        .route("/v1/charges", post(charge))
        .with_state(Ctx {
            strategy,
            pool,
            acquirer,
            merchant,
            trace,
        })
}

async fn charge(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| IdempotencyKey::parse(v.as_bytes()));
    let (Some(Ok(key)), Ok(request)) = (key, ChargeRequest::from_json(&body)) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    // Run to the end even when the client hangs up, as a thread-per-request
    // server would: a cancelled handler would roll its transaction back and
    // show a failure the article does not describe.
    let work = tokio::spawn(async move {
        match ctx.strategy {
            Teaching::CheckThenAct => check_then_act(&ctx, &key, &request).await,
            Teaching::HoldTransaction => hold_transaction(&ctx, &key, &request).await,
        }
    });
    match work.await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Calls the acquirer with this row's own reference; returns the body to store.
async fn capture(
    ctx: &Ctx,
    id: i64,
    reference: &AcquirerReference,
    request: &ChargeRequest,
) -> String {
    let captured = ctx
        .acquirer
        .capture(&CaptureRequest {
            reference: reference.as_str().to_owned(),
            merchant: ctx.merchant.clone(),
            order_id: request.order_id.get(),
            amount_cents: request.amount_cents.get(),
            currency: request.currency.as_str().to_owned(),
        })
        .await;
    let status = if captured.is_ok() {
        "captured"
    } else {
        "failed"
    };
    format!(r#"{{"id":{id},"status":"{status}"}}"#)
}

fn answer(stored: Option<(String, Option<String>)>) -> Response {
    match stored {
        Some((_, Some(body))) => (StatusCode::CREATED, body).into_response(),
        _ => StatusCode::CONFLICT.into_response(),
    }
}

async fn check_then_act(
    ctx: &Ctx,
    key: &IdempotencyKey,
    request: &ChargeRequest,
) -> anyhow::Result<Response> {
    let found: Option<(String, Option<String>)> = sqlx::query_as(
        "select status, response_body from cobranca where idempotency_key = $1 limit 1",
    )
    .bind(key.as_str())
    .fetch_optional(&ctx.pool)
    .await?;
    if found.is_some() {
        return Ok(answer(found));
    }
    note(&ctx.trace, key, ServerStep::CheckedEmpty);
    tokio::time::sleep(CHECK_TO_INSERT).await;
    let reference = AcquirerReference::generate();
    let (id,): (i64,) = sqlx::query_as(
        "insert into cobranca (idempotency_key, order_id, amount_cents, reference, status)
         values ($1, $2, $3, $4, 'processing') returning id",
    )
    .bind(key.as_str())
    .bind(request.order_id.get())
    .bind(request.amount_cents.get())
    .bind(reference.as_str())
    .fetch_one(&ctx.pool)
    .await?;
    note(&ctx.trace, key, ServerStep::Inserted);
    let body = capture(ctx, id, &reference, request).await;
    sqlx::query("update cobranca set status = 'done', response_body = $2 where id = $1")
        .bind(id)
        .bind(&body)
        .execute(&ctx.pool)
        .await?;
    Ok((StatusCode::CREATED, body).into_response())
}

async fn hold_transaction(
    ctx: &Ctx,
    key: &IdempotencyKey,
    request: &ChargeRequest,
) -> anyhow::Result<Response> {
    let mut tx = ctx.pool.begin().await?;
    let reference = AcquirerReference::generate();
    // Waits here, holding its connection, while another attempt's insert of
    // the same key is uncommitted: that attempt is at the acquirer.
    let won: Option<(i64,)> = sqlx::query_as(
        "insert into cobranca (idempotency_key, order_id, amount_cents, reference, status)
         values ($1, $2, $3, $4, 'processing')
         on conflict (idempotency_key) do nothing returning id",
    )
    .bind(key.as_str())
    .bind(request.order_id.get())
    .bind(request.amount_cents.get())
    .bind(reference.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((id,)) = won else {
        tx.commit().await?;
        let found =
            sqlx::query_as("select status, response_body from cobranca where idempotency_key = $1")
                .bind(key.as_str())
                .fetch_optional(&ctx.pool)
                .await?;
        return Ok(answer(found));
    };
    let body = capture(ctx, id, &reference, request).await;
    sqlx::query("update cobranca set status = 'done', response_body = $2 where id = $1")
        .bind(id)
        .bind(&body)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, body).into_response())
}
