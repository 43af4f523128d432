//! Retention: the sweeper deletes expired key records and nothing else.

use std::time::{Duration, Instant};

use idem::workers::Sweeper;
use idem_core::idempotency::EngineConfig;
use idem_lab::sim::{Fault, Faults};

use crate::helpers::*;

#[tokio::test]
async fn the_sweeper_deletes_expired_keys_but_no_charge_and_no_unsettled_key() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_millis(200), Duration::from_millis(300)).await;
    for order in 1..=5 {
        assert_eq!(c.charge(&new_key(), &body(order, 100)).await.status, 201);
    }
    sim.set_faults(failing(Fault::ErrorBefore)).await;
    assert_eq!(c.charge(&new_key(), &body(6, 100)).await.status, 503);
    let fresh_config_key = new_key();
    sim.set_faults(Faults::default()).await;

    let sweeper = Sweeper::new(db.store.clone(), Duration::from_secs(60));
    assert_eq!(
        sweeper.sweep().await.expect("sweep"),
        0,
        "nothing expired yet"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.charge(&fresh_config_key, &body(7, 100)).await.status, 201);

    assert_eq!(
        sweeper.sweep().await.expect("sweep"),
        5,
        "the five expired outcomes"
    );
    assert_eq!(db.count("charges").await, 7, "no charge deleted");
    let (left,): (i64,) = sqlx::query_as(
        "select count(*) from idempotency_keys k join charges c on c.id = k.charge_id
          where c.order_id in (6, 7)",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count");
    assert_eq!(left, 2, "the unsettled key and the live one stay");
}

/// A client that retries the same request after its key expired is not
/// charged again: the expired record, and once it is swept the tombstone it
/// leaves, answer `410 key-expired` naming the charge. The tombstone goes after
/// its own time to live; past it, the charge itself (its acquirer reference is
/// the intent's own) still refuses a second one. Another request under the key
/// is a new intent.
#[tokio::test]
async fn a_late_retry_of_the_same_request_is_gone_naming_its_charge_until_the_tombstone_goes() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_millis(200), Duration::from_millis(300)).await;
    let key = new_key();
    let first = c.charge(&key, &body(1, 25_000)).await;
    assert_eq!(first.status, 201);
    let charge_id = first.json()["id"].as_str().expect("id").to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let gone = |answer: &Answer, stage: &str| {
        assert_eq!(answer.status, 410, "{stage}: {:?}", answer.body);
        assert_eq!(answer.problem_type(), "urn:idem:problem:key-expired");
        assert_eq!(answer.json()["charge_id"], charge_id.as_str(), "{stage}");
    };
    // Expired, not yet swept: the record itself answers.
    gone(&c.charge(&key, &body(1, 25_000)).await, "expired record");

    // Swept: the tombstone answers.
    let sweeper = Sweeper::new(db.store.clone(), Duration::from_secs(60))
        .with_tombstone_ttl(Duration::from_millis(400));
    assert_eq!(sweeper.sweep().await.expect("sweep"), 1);
    assert_eq!(db.count("idempotency_keys").await, 0);
    assert_eq!(db.count("key_tombstones").await, 1);
    gone(&c.charge(&key, &body(1, 25_000)).await, "tombstone");
    assert_eq!(
        sim.ledger().await.captures.len(),
        1,
        "nothing charged again"
    );

    // The tombstone's time is over (key expiry + 400 ms): swept. The charge
    // still holds the intent's reference, so the same request is still gone.
    tokio::time::sleep(Duration::from_millis(400)).await;
    sweeper.sweep().await.expect("sweep");
    assert_eq!(db.count("key_tombstones").await, 0, "tombstones go too");
    gone(
        &c.charge(&key, &body(1, 25_000)).await,
        "the charge's reference",
    );
    assert_eq!(db.count("idempotency_keys").await, 0, "nothing claimed");
    assert_eq!(db.count("charges").await, 1);
    assert_eq!(
        sim.ledger().await.captures.len(),
        1,
        "nothing charged again"
    );
}

#[tokio::test]
async fn another_request_under_an_expired_key_is_a_new_intent_past_the_tombstone() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_millis(200), Duration::from_millis(300)).await;
    let key = new_key();
    assert_eq!(c.charge(&key, &body(1, 100)).await.status, 201);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Sweeper::new(db.store.clone(), Duration::from_secs(60))
        .sweep()
        .await
        .expect("sweep");
    assert_eq!(db.count("key_tombstones").await, 1);
    let other = c.charge(&key, &body(2, 200)).await;
    assert_eq!(other.status, 201, "{:?}", other.body);
    assert!(!other.replayed());
    assert_eq!(sim.ledger().await.captures.len(), 2);
    // And that new intent is replayed as usual while its key lives.
    let replay = c.charge(&key, &body(2, 200)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, other.body);
}

/// Every stored outcome's answer says for how many seconds, at least, its key
/// is still honoured (`Idempotency-TTL`): the key's TTL on the first answer,
/// what is left of it on a replay, from memory or from the database (the
/// same figure: not the replay cache's own, shorter, life); answers that store
/// nothing say nothing.
#[tokio::test]
async fn every_stored_outcome_says_how_long_its_key_is_honoured() {
    // Long enough that the replay cache's margin (1 % of the time left, 36 s
    // here) would show if a replay from memory said the cache's life.
    const TTL: u64 = 3_600;
    for replay_cache_bytes in [8 << 20, 0] {
        let config = EngineConfig {
            key_ttl: Duration::from_secs(TTL),
            replay_cache_bytes,
            ..test_config()
        };
        let Env {
            db: _db,
            sim,
            app: _app,
            client: c,
        } = Env::start_with(Faults::default(), config, Duration::from_secs(2)).await;
        let ttl_of = |a: &Answer| -> u64 {
            a.header("idempotency-ttl")
                .unwrap_or_else(|| panic!("Idempotency-TTL on a {}", a.status))
                .parse()
                .expect("whole seconds")
        };
        let key = new_key();
        let first = c.charge(&key, &body(1, 100)).await;
        let answered = Instant::now();
        assert_eq!(first.status, 201);
        let at_first = ttl_of(&first);
        assert!((TTL - 2..=TTL).contains(&at_first), "{at_first}");
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        let replay = c.charge(&key, &body(1, 100)).await;
        let between = answered.elapsed().as_secs() + 1;
        assert!(replay.replayed());
        let later = ttl_of(&replay);
        assert!(
            later < at_first && later + between + 1 >= at_first,
            "what is left: {at_first} then {later}, {between} s later at most \
             (cache {replay_cache_bytes})"
        );

        sim.set_faults(Faults {
            decline_rate: 1.0,
            ..Faults::default()
        })
        .await;
        let declined = c.charge(&new_key(), &body(2, 100)).await;
        assert_eq!(declined.status, 402);
        assert!(ttl_of(&declined) >= TTL - 2, "a decline is stored too");

        sim.set_faults(failing(Fault::ErrorBefore)).await;
        let unknown = c.charge(&new_key(), &body(3, 100)).await;
        assert_eq!(unknown.status, 503);
        assert_eq!(unknown.header("idempotency-ttl"), None, "nothing stored");
        let reused = c.charge(&key, &body(1, 999)).await;
        assert_eq!(reused.status, 422);
        assert_eq!(reused.header("idempotency-ttl"), None);
    }
}
