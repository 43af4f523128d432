//! Concurrent attempts of one intent: the 409 that answers at once, and the
//! duplicate storm across real `idem serve` processes.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;

use idem_core::idempotency::EngineConfig;
use idem_core::store::Backend;

use crate::helpers::*;

/// Connections of this test's database that wait on a lock, and write
/// transactions held open (a claim held open across the acquirer call).
/// PostgreSQL shows both in `pg_stat_activity`. SQLite has one write lock for
/// the whole file: if anyone held a transaction open, taking the lock would
/// wait, so a wait there counts as an open transaction.
async fn lock_waiters_and_open_transactions(db: &TestDb) -> (i64, i64) {
    if db.backend == Backend::Sqlite {
        let mut conn = db.pool.acquire().await.expect("connection");
        let started = std::time::Instant::now();
        sqlx::query("begin immediate")
            .execute(&mut *conn)
            .await
            .expect("take the write lock");
        let waited = started.elapsed();
        sqlx::query("rollback")
            .execute(&mut *conn)
            .await
            .expect("rollback");
        return (0, i64::from(waited > Duration::from_millis(100)));
    }
    sqlx::query_as(
        "select count(*) filter (where wait_event_type = 'Lock'),
                count(*) filter (where state like 'idle in transaction%')
           from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()",
    )
    .fetch_one(&db.pool)
    .await
    .expect("pg_stat_activity")
}

#[tokio::test]
async fn a_retry_while_the_first_attempt_waits_on_the_acquirer_gets_409_at_once() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(
        latency(1_000),
        EngineConfig {
            lease: Duration::from_secs(30),
            ..test_config()
        },
        Duration::from_secs(2),
    )
    .await;
    let key = new_key();

    let first = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move { c.charge(&key, &body(123, 25000)).await }
    });
    // Wait until the claim is committed and the first attempt is at the acquirer.
    while db.count("idempotency_keys").await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let retry = c.charge(&key, &body(123, 25000)).await;
        assert_eq!(retry.status, 409, "{:?}", retry.body);
        assert_eq!(retry.problem_type(), "urn:idem:problem:request-in-flight");
        let after: u64 = retry
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .expect("seconds");
        // A short hint, from the database's answer and the memo's alike: the
        // first attempt answers within a second or two, and the 30 s lease
        // only matters if it died.
        assert_eq!(after, 1, "Retry-After is a hint, not the lease's 30 s");
        slowest = slowest.max(retry.elapsed);
        assert_eq!(lock_waiters_and_open_transactions(&db).await, (0, 0));
    }
    assert!(
        slowest < Duration::from_millis(100),
        "slowest 409 took {slowest:?}"
    );
    // Another request under the key in flight is still a 422 (the later
    // duplicates above were answered from the in-flight memo), naming the
    // charge in flight.
    let mut named = Vec::new();
    for _ in 0..2 {
        let other = c.charge(&key, &body(123, 1)).await;
        assert_eq!(other.status, 422, "{:?}", other.body);
        assert_eq!(
            other.json()["differing_fields"],
            serde_json::json!(["amount_cents"])
        );
        named.push(other.json()["charge_id"].clone());
    }

    let first = first.await.expect("first");
    assert_eq!(first.status, 201);
    assert!(first.elapsed >= Duration::from_millis(1_000));
    assert_eq!(
        named,
        [first.json()["id"].clone(), first.json()["id"].clone()]
    );
    // At once: the instance that answered 409 forgot the key when it stored the outcome.
    let replay = c.charge(&key, &body(123, 25000)).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(sim.ledger().await.captures.len(), 1);
}

#[tokio::test]
async fn a_duplicate_storm_across_three_processes_captures_each_intent_once() {
    const INTENTS: i64 = 100;
    const COPIES: usize = 8;
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(20)).await;
    let secret = db.merchant("loja").await;
    let pool = ["--db-max-connections", "8"];
    let servers = [
        ServeProcess::start(&db, &sim, &pool).await,
        ServeProcess::start(&db, &sim, &pool).await,
        ServeProcess::start(&db, &sim, &pool).await,
    ];
    let clients: Vec<Client> = servers
        .iter()
        .map(|s| Client::new(&s.url, &secret))
        .collect();
    let intents: Vec<(String, String)> = (1..=INTENTS)
        .map(|o| (new_key(), body(o, 100 + o)))
        .collect();

    let clients_ref = &clients;
    let attempts = intents.iter().flat_map(|(key, body)| {
        (0..COPIES).map(move |copy| {
            let c = clients_ref[copy % clients_ref.len()].clone();
            async move { (key.clone(), c.charge(key, body).await) }
        })
    });
    let answers = join_all(attempts).await;

    let mut created: HashMap<String, Vec<bytes::Bytes>> = HashMap::new();
    for (key, a) in &answers {
        match a.status {
            201 => created.entry(key.clone()).or_default().push(a.body.clone()),
            409 => assert_eq!(a.problem_type(), "urn:idem:problem:request-in-flight"),
            other => panic!("unexpected {other}: {:?}", a.body),
        }
    }
    for (key, bodies) in &created {
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "every 201 for {key} is the same body"
        );
    }
    // Settle the keys whose every copy got a 409, then check the final answers agree.
    for (i, (key, body)) in intents.iter().enumerate() {
        let last = clients[i % clients.len()]
            .charge_until_final(key, body)
            .await;
        assert_eq!(last.status, 201);
        if let Some(bodies) = created.get(key) {
            assert_eq!(last.body, bodies[0]);
        }
    }

    let ledger = sim.ledger().await;
    assert_eq!(
        ledger.captures.len(),
        INTENTS as usize,
        "one capture per intent"
    );
    assert!(ledger.counts.iter().all(|c| c.captures == 1));
    assert_eq!(db.count("charges").await, INTENTS);
    assert_eq!(db.count("idempotency_keys").await, INTENTS);
}
