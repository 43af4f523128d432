//! Faults a hostile world brings that the happy path never meets: the disk
//! under the store fills up, the database's network drops every packet
//! without a reset, the acquirer confirms a capture of something else.
//! Each with real processes on the store it concerns.

use std::time::{Duration, Instant};

use idem_core::domain::MerchantSecret;
use idem_core::store::{Audit, Backend, MerchantError, Store, StoreError, STORE_BOUND};
use idem_lab::sim::{Fault, Faults};

use crate::helpers::{
    body, latency, new_key, run_idem, runs_on, Answer, Client, DbProxy, ServeProcess, SmallDisk,
    TestDb, TestSim,
};

/// Retries a charge until it is final, as a client keeps one key per intent.
async fn settle(c: &Client, key: &str, body: &str) -> Answer {
    c.charge_until_final(key, body).await
}

async fn readyz(c: &Client, base: &str) -> Answer {
    c.send(c.raw().get(format!("{base}/readyz"))).await
}

/// The disk under a SQLite store fills up while a server runs: every charge
/// that needs a write is `503` with `Retry-After` and a problem type of its
/// own (never `500`), readiness turns red, a capture whose answer could not
/// be saved stays `processing`; once space is freed the same process is ready
/// again by itself and every intent settles, each captured once.
#[tokio::test]
async fn a_full_disk_is_503_and_the_same_process_recovers_when_space_is_freed() {
    if !runs_on(
        Backend::Sqlite,
        "it fills the disk under an embedded SQLite file; a PostgreSQL server's disk is its own",
    ) {
        return;
    }
    let disk = SmallDisk::mount(8 << 20);
    let db = TestDb::sqlite_in(&disk.dir).await;
    let sim = TestSim::start(latency(400)).await;
    let secret = db.merchant("loja").await;
    let server = ServeProcess::start_on(
        &db.url,
        &sim.url,
        &["--acquirer-timeout", "1s", "--lease", "2s"],
        &[],
    )
    .await;
    let c = Client::new(&server.url, &secret);

    let before = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(before.status, 201, "{:?}", before.body);

    // A charge whose claim is stored, then the disk fills while the acquirer
    // captures: its answer cannot be saved.
    let (mid_key, mid_body) = (new_key(), body(2, 200));
    let mid = tokio::spawn({
        let (c, key, body) = (c.clone(), mid_key.clone(), mid_body.clone());
        async move { c.charge(&key, &body).await }
    });
    while db.count("idempotency_keys").await < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    disk.fill();
    let mid = mid.await.expect("join");
    assert_eq!(mid.status, 503, "{:?}", mid.body);
    assert_eq!(mid.problem_type(), "urn:idem:problem:store-unwritable");
    assert!(mid.header("retry-after").is_some());
    assert_eq!(sim.ledger().await.captures.len(), 2, "the money moved");

    let mut refused = Vec::new();
    for order in 3..6 {
        let (key, body) = (new_key(), body(order, 100 * order));
        let a = c.charge(&key, &body).await;
        assert_eq!(a.status, 503, "{:?}", a.body);
        assert_eq!(a.problem_type(), "urn:idem:problem:store-unwritable");
        assert!(a.header("retry-after").is_some());
        refused.push((key, body));
    }
    assert_eq!(
        readyz(&c, &server.url).await.status,
        503,
        "readiness is red while the store cannot write"
    );

    disk.free();
    let started = Instant::now();
    while readyz(&c, &server.url).await.status != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the same process never became ready again after space was freed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (key, body) in &refused {
        let a = settle(&c, key, body).await;
        assert_eq!(a.status, 201, "{:?}", a.body);
        assert!(!a.replayed(), "a refused request stored nothing");
    }
    let a = settle(&c, &mid_key, &mid_body).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    let ledger = sim.ledger().await;
    assert_eq!(ledger.captures.len(), 5, "{ledger:?}");
    assert!(
        ledger.counts.iter().all(|n| n.captures == 1),
        "no intent charged twice: {ledger:?}"
    );
}

/// PostgreSQL partitioned away from a running server, packets dropped and
/// sockets left open (no reset, nothing refused): a charge is `503` with
/// `Retry-After` within the store's deadline, whether the partition comes
/// before its claim or while the acquirer captures; after it heals every
/// intent settles, each captured once.
#[tokio::test]
async fn a_partitioned_database_is_503_within_the_store_bound_and_heals() {
    if !runs_on(
        Backend::Postgres,
        "it partitions the network between idem and its database server; an embedded SQLite file has none",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(300)).await;
    let secret = db.merchant("loja").await;
    let proxy = DbProxy::start(&db).await;
    let server = ServeProcess::start_on(
        &proxy.url,
        &sim.url,
        &["--acquirer-timeout", "1s", "--lease", "2s"],
        &[],
    )
    .await;
    let c = Client::new(&server.url, &secret);
    // The bound: the store's, and room for a loaded machine.
    let bound = STORE_BOUND + Duration::from_millis(1500);

    let before = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(before.status, 201, "{:?}", before.body);

    // Before the claim.
    proxy.freeze();
    let (first_key, first_body) = (new_key(), body(2, 200));
    let a = c.charge(&first_key, &first_body).await;
    assert_eq!(a.status, 503, "{:?} after {:?}", a.body, a.elapsed);
    assert_eq!(a.problem_type(), "urn:idem:problem:service-unavailable");
    assert!(a.header("retry-after").is_some());
    assert!(a.elapsed < bound, "answered after {:?}", a.elapsed);
    assert_eq!(readyz(&c, &server.url).await.status, 503);

    // While the acquirer captures: the claim is stored, the finalize is not.
    proxy.thaw();
    let (mid_key, mid_body) = (new_key(), body(3, 300));
    let mid = tokio::spawn({
        let (c, key, body) = (c.clone(), mid_key.clone(), mid_body.clone());
        async move { c.charge(&key, &body).await }
    });
    let started = Instant::now();
    while db.count("charges where order_id = 3").await == 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.freeze();
    let mid = mid.await.expect("join");
    assert_eq!(mid.status, 503, "{:?} after {:?}", mid.body, mid.elapsed);
    assert!(mid.header("retry-after").is_some());
    assert!(
        mid.elapsed < bound + Duration::from_millis(300),
        "answered after {:?}",
        mid.elapsed
    );

    proxy.thaw();
    for (key, body) in [(&first_key, &first_body), (&mid_key, &mid_body)] {
        let a = settle(&c, key, body).await;
        assert_eq!(a.status, 201, "{:?}", a.body);
    }
    let ledger = sim.ledger().await;
    assert_eq!(ledger.captures.len(), 3, "{ledger:?}");
    assert!(
        ledger.counts.iter().all(|n| n.captures == 1),
        "no intent charged twice: {ledger:?}"
    );
}

/// An acquirer that confirms a capture of something else than asked: another
/// amount, currency or order under this charge's reference. The charge is not
/// stored `captured`: it goes to review at once, the client gets `503`
/// (`charge-under-review`), the alert metric counts it, and no retry, no
/// reconciler pass, calls the acquirer for it again until a person resolves
/// it; then the key replays the person's decision.
#[tokio::test]
async fn a_capture_that_names_another_amount_currency_or_order_goes_to_review_not_captured() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let server = ServeProcess::start(
        &db,
        &sim,
        &[
            "--acquirer-timeout",
            "1s",
            "--lease",
            "2s",
            "--reconcile-interval",
            "100ms",
        ],
    )
    .await;
    let c = Client::new(&server.url, &secret);

    let lies = [
        (1, Fault::WrongAmount, "amount_cents 4401 (asked 4400)"),
        (2, Fault::WrongCurrency, "currency USD (asked BRL)"),
        (3, Fault::WrongOrder, "order_id 4 (asked 3)"),
    ];
    let mut reviewed = Vec::new();
    for (order, fault, differs) in lies {
        sim.set_faults(Faults {
            fault,
            fault_count: Some(1),
            ..Faults::default()
        })
        .await;
        let (key, body) = (new_key(), body(order, 4400));
        let a = c.charge(&key, &body).await;
        assert_eq!(a.status, 503, "{fault}: {:?}", a.body);
        assert_eq!(a.problem_type(), "urn:idem:problem:charge-under-review");
        assert!(a.header("retry-after").is_some());
        let id = a.json()["charge_id"]
            .as_str()
            .expect("charge_id")
            .to_owned();
        let (status, reason): (String, Option<String>) =
            sqlx::query_as("select status, review_reason from charges where id = $1")
                .bind(&id)
                .fetch_one(&db.pool)
                .await
                .expect("the charge");
        assert_eq!(status, "processing", "{fault}: not stored as captured");
        let reason = reason.expect("awaiting review");
        assert!(reason.contains(differs), "{fault}: {reason}");
        reviewed.push((key, body, id));
    }
    let calls = |text: &str| -> (String, String) {
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in /metrics"))
                .to_owned()
        };
        (
            line("idem_acquirer_calls_total{outcome=\"contradicted\"}"),
            line("idem_acquirer_contradicted_total"),
        )
    };
    let metrics = || async {
        let m = c.send(c.raw().get(format!("{}/metrics", server.url))).await;
        String::from_utf8_lossy(&m.body).into_owned()
    };
    let counted = calls(&metrics().await);
    assert!(counted.1.ends_with(" 3"), "{counted:?}");

    // Retries, and the reconciler's passes, leave the acquirer alone.
    for (key, body, _) in &reviewed {
        let a = c.charge(key, body).await;
        assert_eq!(a.status, 503, "{:?}", a.body);
        assert_eq!(a.problem_type(), "urn:idem:problem:charge-under-review");
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        calls(&metrics().await),
        counted,
        "the acquirer was called again"
    );
    assert_eq!(
        sim.ledger().await.captures.len(),
        3,
        "one capture each, as it was"
    );

    // A person decides; the key replays the decision.
    let (key, first_body, id) = &reviewed[0];
    let (status, _, stderr) = run_idem(
        &db,
        &[
            "charges",
            "resolve",
            id,
            "--as",
            "captured",
            "--reason",
            "the acquirer's records",
            "--acquirer-url",
            &sim.url,
            "--actor",
            "ana",
        ],
    )
    .await;
    assert!(status.success(), "{stderr}");
    let a = c.charge(key, first_body).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert!(a.replayed());

    // An honest capture is stored as ever.
    let a = c.charge(&new_key(), &body(9, 4400)).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
}

/// A store that answers but cannot write (here a SQLite file opened
/// read-only, as on a read-only file system): the write is `Unwritable`, a
/// class of its own (the API's `503` `store-unwritable`), not a refusal that
/// would be a `500` or a dead letter; readiness says so too.
#[tokio::test]
async fn a_read_only_store_is_unwritable_weather_not_a_refusal() {
    if !runs_on(
        Backend::Sqlite,
        "it opens the SQLite file read-only; a PostgreSQL server's read-only mode is a failover's",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let read_only = Store::connect(&format!("{}?mode=ro", db.url), 2)
        .await
        .expect("open read-only");
    let refused = read_only
        .create_merchant(
            "loja",
            &MerchantSecret::generate().hash(),
            &Audit {
                actor: "test",
                reason: None,
            },
        )
        .await
        .expect_err("a read-only file takes no write");
    let MerchantError::Store(refused) = refused else {
        panic!("{refused:?}")
    };
    assert!(matches!(refused, StoreError::Unwritable(_)), "{refused:?}");
    assert!(refused.is_transient());
    assert!(matches!(
        read_only.ready().await,
        Err(StoreError::Unwritable(_))
    ));
    assert!(
        db.store.ready().await.is_ok(),
        "the writable store is ready"
    );
}
