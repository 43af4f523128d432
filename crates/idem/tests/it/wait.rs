//! `Prefer: wait=N` (RFC 7240): a duplicate of an attempt in flight waits for
//! its outcome instead of hearing `409` at once, across instances, holding
//! no database connection, and never more of them than the instance lets wait.

use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::*;

/// Two real `idem serve` processes on one database, and a merchant's client
/// for each, against a simulator that takes `latency_ms` per capture.
async fn two_instances(
    latency_ms: u64,
    second: &[&str],
) -> (TestDb, TestSim, [ServeProcess; 2], [Client; 2]) {
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(latency_ms)).await;
    let secret = db.merchant("loja").await;
    let a = ServeProcess::start(&db, &sim, &[]).await;
    let b = ServeProcess::start(&db, &sim, second).await;
    let clients = [Client::new(&a.url, &secret), Client::new(&b.url, &secret)];
    (db, sim, [a, b], clients)
}

/// Starts a charge on `client` and returns once its claim is committed
/// (the attempt is then at the acquirer).
async fn start_first(db: &TestDb, client: &Client, key: &str) -> tokio::task::JoinHandle<Answer> {
    let first = tokio::spawn({
        let (c, key) = (client.clone(), key.to_owned());
        async move { c.charge(&key, &body(7, 25_000)).await }
    });
    while db.count("idempotency_keys").await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first
}

#[tokio::test]
async fn a_duplicate_that_prefers_to_wait_gets_the_outcome_another_instance_stored() {
    let (db, sim, _servers, [a, b]) = two_instances(1_500, &["--db-max-connections", "2"]).await;
    let key = new_key();
    let first = start_first(&db, &a, &key).await;

    // Eight duplicates wait on B, whose pool has two connections, while a key
    // read on B still gets one at once: the waiters hold none.
    let same = body(7, 25_000);
    let waiting = join_all((0..8).map(|_| b.charge_preferring(&key, &same, "wait=5")));
    let (answers, read) = tokio::join!(waiting, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.send(
            b.raw()
                .get(format!("{}/v1/idempotency-keys/{key}", b.base))
                .bearer_auth(&b.secret),
        )
        .await
    });
    assert_eq!(read.status, 200, "{:?}", read.body);
    assert!(
        read.elapsed < Duration::from_millis(500),
        "a key read while eight requests wait took {:?}",
        read.elapsed
    );
    let first = first.await.expect("first");
    assert_eq!(first.status, 201, "{:?}", first.body);
    for waited in &answers {
        assert_eq!(waited.status, 201, "{:?}", waited.body);
        assert_eq!(waited.body, first.body, "the stored outcome, byte for byte");
        assert!(waited.replayed(), "Idempotent-Replayed: true");
        assert_eq!(waited.header("preference-applied"), Some("wait=5"));
        assert!(
            waited.elapsed < Duration::from_secs(4),
            "answered when the outcome was stored, not at the end of the wait: {:?}",
            waited.elapsed
        );
    }
    assert_eq!(sim.ledger().await.captures.len(), 1, "charged once");

    // Past ten seconds the preference is capped, and says so.
    let replay = b
        .charge_preferring(&key, &body(7, 25_000), "respond-async, wait=600")
        .await;
    assert_eq!(replay.status, 201);
    assert_eq!(
        replay.header("preference-applied"),
        None,
        "nothing was in flight: nothing waited"
    );
}

#[tokio::test]
async fn a_wait_that_ends_before_the_outcome_is_a_409_that_says_it_waited() {
    let (db, sim, _servers, [a, b]) = two_instances(3_000, &[]).await;
    let key = new_key();
    let first = start_first(&db, &a, &key).await;

    let waited = b.charge_preferring(&key, &body(7, 25_000), "wait=1").await;
    assert_eq!(waited.status, 409, "{:?}", waited.body);
    assert_eq!(waited.problem_type(), "urn:idem:problem:request-in-flight");
    assert_eq!(waited.header("preference-applied"), Some("wait=1"));
    assert!(
        waited.elapsed >= Duration::from_secs(1) && waited.elapsed < Duration::from_millis(2_500),
        "waited about a second: {:?}",
        waited.elapsed
    );
    // A preference idem cannot read is ignored: 409 at once, nothing applied.
    for unreadable in ["wait=soon", "wait=0", "handling=strict"] {
        let at_once = b
            .charge_preferring(&key, &body(7, 25_000), unreadable)
            .await;
        assert_eq!(at_once.status, 409, "{unreadable}: {:?}", at_once.body);
        assert_eq!(at_once.header("preference-applied"), None, "{unreadable}");
        assert!(at_once.elapsed < Duration::from_millis(500), "{unreadable}");
    }
    assert_eq!(first.await.expect("first").status, 201);
    assert_eq!(sim.ledger().await.captures.len(), 1);
}

#[tokio::test]
async fn waiters_past_the_bound_are_shed_with_503_at_once() {
    let (db, _sim, servers, [a, b]) = two_instances(2_000, &["--max-waiters", "1"]).await;
    let key = new_key();
    let first = start_first(&db, &a, &key).await;

    let waiting = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.charge_preferring(&key, &body(7, 25_000), "wait=8").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let shed = b.charge_preferring(&key, &body(7, 25_000), "wait=8").await;
    assert_eq!(shed.status, 503, "{:?}", shed.body);
    assert_eq!(shed.problem_type(), "urn:idem:problem:overloaded");
    assert!(shed.header("retry-after").is_some());
    assert!(
        shed.elapsed < Duration::from_millis(500),
        "at once: {:?}",
        shed.elapsed
    );
    // Counted by its type, for the shed-rate alert (deploy/prometheus).
    let metrics = b
        .send(b.raw().get(format!("{}/metrics", servers[1].url)))
        .await;
    let text = String::from_utf8_lossy(&metrics.body);
    let line = r#"idem_http_problems_total{type="overloaded"} 1"#;
    assert!(text.contains(line), "{line} in\n{text}");

    let first = first.await.expect("first");
    let waited = waiting.await.expect("waiter");
    assert_eq!(waited.status, 201, "{:?}", waited.body);
    assert_eq!(waited.body, first.body);
}
