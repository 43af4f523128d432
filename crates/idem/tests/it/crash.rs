//! Real processes dying: kill -9 of the instance holding a claim mid-call, and
//! a graceful SIGTERM that finishes the work in flight.

use std::time::{Duration, Instant};

use crate::helpers::*;

#[tokio::test]
async fn a_retry_on_another_instance_settles_a_claim_orphaned_by_kill_9() {
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(1_000)).await;
    let secret = db.merchant("loja").await;
    let flags = ["--lease", "2s", "--acquirer-timeout", "1500ms"];
    let mut a = ServeProcess::start(&db, &sim, &flags).await;
    let b = ServeProcess::start(&db, &sim, &flags).await;
    let key = new_key();

    let doomed = tokio::spawn({
        let (c, key) = (Client::new(&a.url, &secret), key.clone());
        async move {
            c.raw()
                .post(format!("{}/v1/charges", c.base))
                .bearer_auth(&c.secret)
                .header("Idempotency-Key", key)
                .header("content-type", "application/json")
                .body(body(123, 25000))
                .send()
                .await
        }
    });
    while db.count("idempotency_keys").await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.kill_9();
    assert!(
        doomed.await.expect("join").is_err(),
        "the first attempt's client sees a dropped connection"
    );

    let on_b = Client::new(&b.url, &secret);
    let early = on_b.charge(&key, &body(123, 25000)).await;
    assert_eq!(early.status, 409, "the dead holder's lease is still alive");

    let started = Instant::now();
    let settled = on_b.charge_until_final(&key, &body(123, 25000)).await;
    assert_eq!(settled.status, 201, "{:?}", settled.body);
    assert!(started.elapsed() < Duration::from_secs(5));

    let (attempt, status): (i64, String) = sqlx::query_as(
        "select k.attempt, c.status from idempotency_keys k join charges c on c.id = k.charge_id",
    )
    .fetch_one(&db.pool)
    .await
    .expect("record");
    assert_eq!(
        (attempt, status.as_str()),
        (2, "captured"),
        "taken over once, settled"
    );
    let ledger = sim.ledger().await;
    assert_eq!(
        ledger.captures.len(),
        1,
        "the re-drive reused the reference: one capture"
    );
    assert_eq!(
        ledger.captures[0].reference,
        settled.json()["acquirer_reference"]
    );
}

#[tokio::test]
async fn sigterm_finishes_the_charge_in_flight_and_exits_cleanly() {
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(800)).await;
    let secret = db.merchant("loja").await;
    let mut server = ServeProcess::start(&db, &sim, &[]).await;
    let c = Client::new(&server.url, &secret);
    let key = new_key();

    let in_flight = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move { c.charge(&key, &body(1, 100)).await }
    });
    while db.count("idempotency_keys").await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("join");
    assert!(status.success(), "clean exit: {status:?}");
    assert_eq!(in_flight.await.expect("join").status, 201);
    let (state,): (String,) = sqlx::query_as("select state from idempotency_keys")
        .fetch_one(&db.pool)
        .await
        .expect("record");
    assert_eq!(state, "completed");
}
