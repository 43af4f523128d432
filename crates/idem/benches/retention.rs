//! What retention costs: the bytes one stored key takes in table and indexes
//! with a million keys, and how fast the sweeper deletes expired keys while
//! charges keep flowing.
//!
//! `cargo bench --bench retention` (PostgreSQL at `IDEM_TEST_ADMIN_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `IDEM_BENCH_KEYS` sets the
//! count). Under `cargo test` it runs the same steps on a few keys, as a smoke test.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::workers::Sweeper;
use idem_core::domain::{ChargeRequest, ChargeStatus, MerchantSecret};
use idem_core::domain::{Fingerprint, IdempotencyKey, StoredResponse};
use idem_core::store::{Claim, NewClaim, Settlement, Store};
use sqlx::Connection;

/// Concurrent writers of new charges during the sweep: a moderate load for a
/// 2-core machine, leaving room for the sweeper and PostgreSQL itself.
const WRITERS: usize = 4;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let keys: i64 = match std::env::var("IDEM_BENCH_KEYS") {
        Ok(n) => n.parse()?,
        Err(_) if full => 1_000_000,
        Err(_) => 2_000,
    };
    let admin = std::env::var("IDEM_TEST_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let name = format!("idem_bench_{}", std::process::id());
    let url = format!(
        "{}/{name}",
        &admin[..admin.rfind('/').unwrap_or(admin.len())]
    );
    let mut conn = sqlx::PgConnection::connect(&admin).await?;
    sqlx::query(&format!("create database {name}"))
        .execute(&mut conn)
        .await?;
    let result = run(&url, keys).await;
    sqlx::query(&format!("drop database {name} with (force)"))
        .execute(&mut conn)
        .await?;
    result
}

async fn run(url: &str, keys: i64) -> anyhow::Result<()> {
    let store = Store::connect(url, (WRITERS + 2) as u32).await?;
    store.migrate().await?;
    // The bench's own set-up and measuring SQL is PostgreSQL's (relation sizes).
    let pg = sqlx::PgPool::connect(url).await?;
    let merchant = store
        .create_merchant(
            "bench",
            &MerchantSecret::generate().hash(),
            &idem_core::store::Audit {
                actor: "bench",
                reason: None,
            },
        )
        .await?;

    // Keys shaped like real ones: a UUID, a SHA-256 fingerprint, a ~220-byte body.
    let started = Instant::now();
    sqlx::query(
        "insert into charges (id, merchant_id, order_id, amount_cents, currency, status,
                              acquirer_reference, acquirer_capture_id)
         select 'ch_' || substr(md5(i::text), 1, 24), $1, i, 25000, 'BRL', 'captured',
                'ref_' || substr(md5('r' || i), 1, 24), 'cap_' || i
           from generate_series(1, $2) i",
    )
    .bind(merchant.id)
    .bind(keys)
    .execute(&pg)
    .await?;
    sqlx::query(
        "insert into idempotency_keys (merchant_id, idempotency_key, fingerprint, charge_id, state,
                                       response_status, response_body, expires_at)
         select $1, gen_random_uuid()::text, sha256(i::text::bytea),
                'ch_' || substr(md5(i::text), 1, 24), 'completed', 201,
                convert_to(json_build_object('id', 'ch_' || substr(md5(i::text), 1, 24),
                    'order_id', i, 'amount_cents', 25000, 'currency', 'BRL', 'status', 'captured',
                    'acquirer_reference', 'ref_' || substr(md5('r' || i), 1, 24),
                    'decline_reason', null, 'created_at', '2026-12-02T07:00:00Z')::text, 'UTF8'),
                now() + interval '1 day'
           from generate_series(1, $2) i",
    )
    .bind(merchant.id)
    .bind(keys)
    .execute(&pg)
    .await?;
    sqlx::query("vacuum analyze idempotency_keys")
        .execute(&pg)
        .await?;
    sqlx::query("vacuum analyze charges").execute(&pg).await?;
    println!(
        "loaded {keys} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let (table, indexes, charges): (i64, i64, i64) = sqlx::query_as(
        "select pg_table_size('idempotency_keys'), pg_indexes_size('idempotency_keys'),
                pg_total_relation_size('charges')",
    )
    .fetch_one(&pg)
    .await?;
    let per = |bytes: i64| bytes as f64 / keys as f64;
    println!(
        "one stored key: {:.0} B table + {:.0} B indexes = {:.0} B (the charge it points to, kept for ever: {:.0} B)",
        per(table),
        per(indexes),
        per(table + indexes),
        per(charges)
    );
    println!(
        "  => {:.0} MiB per million keys held for the TTL",
        (table + indexes) as f64 / 1_048_576.0 * 1_000_000.0 / keys as f64
    );

    let (alone, _) = flow(&store, merchant.id, None).await?;
    sqlx::query("update idempotency_keys set expires_at = now() - interval '1 second' where state = 'completed'")
        .execute(&pg)
        .await?;
    sqlx::query("vacuum analyze idempotency_keys")
        .execute(&pg)
        .await?;
    let sweeper = Sweeper::new(store.clone(), Duration::from_secs(60));
    let (during, swept) = flow(&store, merchant.id, Some(&sweeper)).await?;
    let (deleted, secs) = swept.unwrap_or((0, 1.0));
    println!(
        "sweep: {deleted} expired keys in {secs:.2} s = {:.0} keys/s",
        deleted as f64 / secs
    );
    println!(
        "charges flowing ({WRITERS} writers, claim + finalize): {alone:.0}/s alone, {during:.0}/s during the sweep ({:.2}x)",
        during / alone
    );
    Ok(())
}

/// Runs claim + finalize from several writers, for a fixed time or for as long
/// as the sweep takes; returns charges per second and the sweep's figures.
async fn flow(
    store: &Store,
    merchant_id: i64,
    sweeper: Option<&Sweeper>,
) -> anyhow::Result<(f64, Option<(u64, f64)>)> {
    let tag = if sweeper.is_some() { "during" } else { "alone" };
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
            tokio::spawn(
                async move { write_charges(&store, merchant_id, w, tag, &stop, &done).await },
            )
        })
        .collect();
    let started = Instant::now();
    let swept = match sweeper {
        Some(s) => {
            let n = s.sweep().await?;
            Some((n, started.elapsed().as_secs_f64()))
        }
        None => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            None
        }
    };
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((done.load(Ordering::SeqCst) as f64 / secs, swept))
}

async fn write_charges(
    store: &Store,
    merchant_id: i64,
    writer: usize,
    tag: &str,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> anyhow::Result<()> {
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let key = IdempotencyKey::parse(format!("{tag}-{writer}-{i}").as_bytes())?;
        let request = ChargeRequest::from_json(
            format!(r#"{{"order_id":{},"amount_cents":100}}"#, i).as_bytes(),
        )?;
        let claim = NewClaim {
            merchant_id,
            key: &key,
            fingerprint: Fingerprint::of_charge(&request),
            request: &request,
            lease: Duration::from_secs(30),
            key_ttl: Duration::from_secs(3600),
            traceparent: None,
        };
        let Claim::Won(record) = store.claim(&claim).await? else {
            anyhow::bail!("a fresh key lost its claim");
        };
        let response = StoredResponse {
            status: 201,
            body: Bytes::from_static(b"{}"),
        };
        let settlement = Settlement {
            status: ChargeStatus::Captured,
            capture_id: Some("cap"),
            decline_reason: None,
            response: &response,
            event: None,
            webhook: None,
            audit: None,
        };
        store
            .finalize(
                merchant_id,
                &key,
                &record,
                &settlement,
                Duration::from_secs(3600),
            )
            .await?;
        done.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}
