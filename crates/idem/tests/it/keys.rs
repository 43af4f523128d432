//! `GET /v1/idempotency-keys/{key}`: a key's state without sending the
//! request again.

use std::time::Duration;

use idem::workers::Sweeper;

use crate::helpers::*;

async fn key_state(c: &Client, key: &str) -> Answer {
    let url = format!("{}/v1/idempotency-keys/{}", c.base, urlencode(key));
    c.send(c.raw().get(url).bearer_auth(&c.secret)).await
}

/// Percent-encodes everything but unreserved characters.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn a_key_is_in_flight_then_completed_then_expired_then_unknown() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_millis(400), Duration::from_millis(1500)).await;
    let key = format!("k/{}?#", new_key());
    assert_eq!(key_state(&c, &key).await.status, 404, "never used");
    assert_eq!(
        key_state(&c, &key).await.problem_type(),
        "urn:idem:problem:not-found"
    );

    // In flight: a slow capture holds it.
    sim.set_faults(latency(800)).await;
    let pending = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move { c.charge(&key, &body(1, 100)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = key_state(&c, &key).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let j = a.json();
    assert_eq!(j["state"], "in_flight", "{j}");
    assert_eq!(j["key"], key.as_str());
    assert!(j["retry_after_seconds"].as_u64().unwrap() >= 1, "{j}");
    assert!(j.get("expires_at").is_none(), "{j}");
    let first = pending.await.expect("charge");
    assert_eq!(first.status, 201);
    let charge_id = first.json()["id"].clone();
    assert_eq!(j["charge_id"], charge_id);

    // Completed: the stored status, until expires_at.
    let j = key_state(&c, &key).await.json();
    assert_eq!(j["state"], "completed", "{j}");
    assert_eq!(j["status"], 201);
    assert_eq!(j["charge_id"], charge_id);
    assert!(j["expires_at"].is_string(), "{j}");

    // Expired: first from the record, then from its tombstone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let j = key_state(&c, &key).await.json();
    assert_eq!(j["state"], "expired", "{j}");
    assert_eq!(j["charge_id"], charge_id);
    Sweeper::new(db.store.clone(), Duration::from_secs(60))
        .with_tombstone_ttl(Duration::from_millis(1_000))
        .sweep()
        .await
        .expect("sweep");
    let j = key_state(&c, &key).await.json();
    assert_eq!(j["state"], "expired", "{j}");
    assert_eq!(j["charge_id"], charge_id);
    assert!(j["expires_at"].is_string(), "the tombstone's end: {j}");

    // Another merchant sees nothing of it; a malformed key is a 400.
    let other = Client::new(&c.base, &db.merchant("outra").await);
    assert_eq!(key_state(&other, &key).await.status, 404);
    let bad = key_state(&c, "a b").await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.problem_type(),
        "urn:idem:problem:malformed-idempotency-key"
    );
}
