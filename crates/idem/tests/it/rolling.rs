//! A rolling deploy: the previous release's `idem` (scripts/previous-release)
//! and this tree's, real processes of both, side by side on one database while
//! this release's migrations run under the old one's traffic. Every outcome
//! either stored replays byte for byte on the other, a claim either made is
//! settled by the other after a crash, and the acquirer sees one capture per
//! intent.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

use idem_core::store::Backend;
use tokio::task::JoinSet;

use crate::helpers::*;

/// Keys in flight across the migration, and settled before it.
const IN_FLIGHT: i64 = 6;
const SETTLED_BEFORE: i64 = 4;

#[tokio::test]
async fn the_previous_release_and_this_one_serve_one_database_across_the_migration() {
    if !runs_on(
        Backend::Postgres,
        "an SQLite file is one deployment's own: no instance of another release runs beside it",
    ) {
        return;
    }
    let old = previous_idem();
    let db = TestDb::unmigrated().await;
    let (status, _, err) = run_bin(&old, &db.url, &["migrate"], &[]).await;
    assert!(status.success(), "the previous release migrates: {err}");
    let (status, secret, err) = run_bin(&old, &db.url, &["tenant", "create", "loja"], &[]).await;
    assert!(status.success(), "{err}");
    let secret = secret.trim().to_owned();
    let sim = TestSim::start(latency(200)).await;
    let flags = ["--lease", "6s", "--acquirer-timeout", "5s"];
    let mut a = ServeProcess::start_bin(&old, &db.url, &sim.url, &flags, &[]).await;
    let on_a = Client::new(&a.url, &secret);

    // Outcomes the previous release stored.
    let mut settled = Vec::new();
    for order in 1..=SETTLED_BEFORE {
        let (key, body) = (new_key(), body(order, 1_000 + order));
        let first = on_a.charge(&key, &body).await;
        assert_eq!(first.status, 201, "{:?}", first.body);
        settled.push((key, body, first));
    }

    // Charges in flight on the previous release while this one migrates: at
    // the acquirer for 3 s, far longer than the migration takes.
    sim.set_faults(latency(3_000)).await;
    let mut flying = JoinSet::new();
    for order in 100..100 + IN_FLIGHT {
        let (c, key, body) = (on_a.clone(), new_key(), body(order, 2_000 + order));
        flying.spawn(async move {
            let first = c.charge(&key, &body).await;
            (key, body, first)
        });
    }
    until(
        || async { in_flight(&db).await == IN_FLIGHT },
        "charges in flight",
    )
    .await;
    let (status, _, err) = run_idem_on(&db.url, &["migrate"], &[]).await;
    assert!(
        status.success(),
        "this release migrates under traffic: {err}"
    );
    assert_eq!(
        in_flight(&db).await,
        IN_FLIGHT,
        "the migration ran while the previous release's charges were at the acquirer"
    );
    sim.set_faults(latency(200)).await;
    let mut b = ServeProcess::start_on(&db.url, &sim.url, &flags, &[]).await;
    let on_b = Client::new(&b.url, &secret);
    while let Some(done) = flying.join_next().await {
        let (key, body, first) = done.expect("join");
        assert_eq!(
            first.status, 201,
            "settled by the previous release after the migration: {:?}",
            first.body
        );
        settled.push((key, body, first));
    }

    // This release's outcomes, stored by its finalize.
    for order in 200..204 {
        let (key, body) = (new_key(), body(order, 3_000 + order));
        let first = on_b.charge(&key, &body).await;
        assert_eq!(first.status, 201, "{:?}", first.body);
        settled.push((key, body, first));
    }

    // Each release replays every outcome, whichever stored it, byte for byte.
    for (key, body, first) in &settled {
        for (release, client) in [("previous", &on_a), ("this", &on_b)] {
            let again = client.charge(key, body).await;
            assert_eq!(
                (again.status, &again.body),
                (first.status, &first.body),
                "{release} release replays {key}"
            );
            assert!(again.replayed(), "{release} release: {key} is a replay");
        }
    }

    // Duplicates of one new intent on both releases at once: one charge.
    let (key, dup_body) = (new_key(), body(300, 4_300));
    let mut dups = JoinSet::new();
    for n in 0..6 {
        let (c, key, body) = (
            if n % 2 == 0 {
                on_a.clone()
            } else {
                on_b.clone()
            },
            key.clone(),
            dup_body.clone(),
        );
        dups.spawn(async move { c.charge_until_final(&key, &body).await });
    }
    let answers: Vec<Answer> = dups.join_all().await;
    assert!(
        answers
            .iter()
            .all(|x| x.status == 201 && x.body == answers[0].body),
        "every duplicate gets the one outcome: {answers:?}"
    );

    // A claim each release made, orphaned by kill -9 mid-call, settled by the other.
    let taken_over_by_this = orphan_and_settle(&db, &mut a, &on_a, &on_b, 400).await;
    let a2 = ServeProcess::start_bin(&old, &db.url, &sim.url, &flags, &[]).await;
    let on_a2 = Client::new(&a2.url, &secret);
    let taken_over_by_previous = orphan_and_settle(&db, &mut b, &on_b, &on_a2, 500).await;

    // The acquirer's word: one capture per intent, none twice.
    let ledger = sim.ledger().await;
    let references: HashSet<&str> = ledger
        .captures
        .iter()
        .map(|c| c.reference.as_str())
        .collect();
    assert_eq!(
        references.len(),
        ledger.captures.len(),
        "no reference captured twice"
    );
    assert_eq!(
        ledger.captures.len(),
        settled.len() + 3,
        "one capture per intent: {} settled, the duplicates' one, two taken over",
        settled.len()
    );
    for taken in [&taken_over_by_this, &taken_over_by_previous] {
        let reference = taken.json()["acquirer_reference"]
            .as_str()
            .expect("reference")
            .to_owned();
        assert!(
            references.contains(reference.as_str()),
            "{reference} captured"
        );
    }
}

/// Records in flight now.
async fn in_flight(db: &TestDb) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("select count(*) from idempotency_keys where state = 'in_flight'")
            .fetch_one(&db.pool)
            .await
            .expect("count in flight");
    n
}

/// Waits until `done`, for at most 20 s.
async fn until<F: Future<Output = bool>>(done: impl Fn() -> F, what: &str) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < Duration::from_secs(20), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts a charge on `holder`, kills it with the claim at the acquirer, and
/// retries on `other` until final: its answer.
async fn orphan_and_settle(
    db: &TestDb,
    holder: &mut ServeProcess,
    on_holder: &Client,
    other: &Client,
    order: i64,
) -> Answer {
    let (key, body) = (new_key(), body(order, 5_000 + order));
    let before = in_flight(db).await;
    let doomed = tokio::spawn({
        let (c, key, body) = (on_holder.clone(), key.clone(), body.clone());
        async move { c.charge(&key, &body).await }
    });
    until(
        || async { in_flight(db).await > before },
        "a claim in flight",
    )
    .await;
    holder.kill_9();
    doomed.abort();
    let settled = other.charge_until_final(&key, &body).await;
    assert_eq!(
        settled.status, 201,
        "taken over and settled: {:?}",
        settled.body
    );
    settled
}

/// This release's refunds beside the previous release, which knows nothing
/// of them: a refund's key record names its refund, its `charge_id` null, so
/// the previous release's reconciler (which joins records to charges) never
/// takes a stuck refund over as a charge and captures nothing for it, and
/// its sweeper still sweeps an expired refund's key.
#[tokio::test]
async fn the_previous_release_never_mistakes_a_refund_for_a_charge() {
    use idem_core::domain::{Fingerprint, IdempotencyKey, RefundRequest};
    use idem_core::store::{NewRefundClaim, RefundClaim};

    if !runs_on(
        Backend::Postgres,
        "an SQLite file is one deployment's own: no instance of another release runs beside it",
    ) {
        return;
    }
    let old = previous_idem();
    let db = TestDb::unmigrated().await;
    let (status, _, err) = run_idem_on(&db.url, &["migrate"], &[]).await;
    assert!(status.success(), "{err}");
    let (status, secret, err) = run_bin(&old, &db.url, &["tenant", "create", "loja"], &[]).await;
    assert!(status.success(), "{err}");
    let sim = TestSim::start(latency(0)).await;
    let flags = ["--reconcile-interval", "100ms", "--sweep-interval", "200ms"];
    let a = ServeProcess::start_bin(&old, &db.url, &sim.url, &flags, &[]).await;
    let on_a = Client::new(&a.url, secret.trim());
    let captured = on_a.charge(&new_key(), &body(1, 10_000)).await;
    assert_eq!(captured.status, 201, "{:?}", captured.body);
    let charge_id =
        idem_core::domain::ChargeId::parse(captured.json()["id"].as_str().expect("charge id"))
            .expect("an id");
    let merchant_id = db.merchant_id("loja").await;

    // A refund stuck in flight (its lease over at once), and one completed
    // and expired, as this release leaves them.
    let claim = async |key: &str, lease: Duration| {
        let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
        let request = RefundRequest::from_json(br#"{"amount_cents": 100}"#).expect("refund");
        let claim = NewRefundClaim {
            merchant_id,
            key: &key,
            fingerprint: Fingerprint::of_refund(&charge_id, &request),
            charge_id: &charge_id,
            request: &request,
            lease,
            key_ttl: Duration::ZERO,
            traceparent: None,
        };
        match db.store.claim_refund(&claim).await.expect("claim refund") {
            RefundClaim::Won(record) => record,
            other => panic!("{other:?}"),
        }
    };
    let stuck = claim("stuck-refund", Duration::from_millis(1)).await;
    let done = claim("done-refund", Duration::from_secs(30)).await;
    db.exec(&format!(
        "update idempotency_keys set state = 'completed', response_status = 201,
                response_body = '\\x7b7d', expires_at = now() - interval '1 second'
          where refund_id = '{}'",
        done.subject.id.as_str()
    ))
    .await;

    // The previous release's sweeper takes the expired refund's key ...
    until(
        || async { db.count("key_tombstones").await == 1 },
        "the previous release sweeps the expired refund's key",
    )
    .await;
    // ... and its reconciler, passing every 100 ms, leaves the stuck one be.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (attempt, state): (i64, String) = sqlx::query_as(&format!(
        "select attempt, state from idempotency_keys where refund_id = '{}'",
        stuck.subject.id.as_str()
    ))
    .fetch_one(&db.pool)
    .await
    .expect("the stuck refund's key");
    assert_eq!(
        (attempt, state.as_str()),
        (1, "in_flight"),
        "never taken over"
    );
    let ledger = sim.ledger().await;
    assert_eq!(
        ledger.captures.len(),
        1,
        "only the charge's capture: {ledger:?}"
    );
    assert!(
        reqwest::get(format!("{}/healthz", a.url))
            .await
            .is_ok_and(|r| r.status().is_success()),
        "the previous release keeps serving"
    );
}
