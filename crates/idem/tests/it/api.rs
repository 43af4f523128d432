//! The HTTP contract's surface: every bad input refused with problem+json and
//! nothing stored; authentication; tenant isolation; operational endpoints.

use std::time::Duration;

use idem_lab::sim::Faults;

use crate::helpers::*;

const PROBLEM: &str = "urn:idem:problem:";

/// Asserts nothing was stored by a refused request.
async fn assert_nothing_stored(db: &TestDb) {
    assert_eq!(db.count("idempotency_keys").await, 0, "no key stored");
    assert_eq!(db.count("charges").await, 0, "no charge stored");
}

#[tokio::test]
async fn every_bad_input_is_a_problem_and_stores_nothing() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start(Faults::default()).await;
    let key = new_key();
    let good = body(123, 25000);
    let long_description = format!(
        r#"{{"order_id":1,"amount_cents":1,"description":"{}"}}"#,
        "d".repeat(501)
    );

    let cases: Vec<(&str, String, &str, u16, &str)> = vec![
        // (what, key header, body, status, problem slug)
        (
            "long key",
            "k".repeat(256),
            &good,
            400,
            "malformed-idempotency-key",
        ),
        (
            "non-ASCII key",
            "chave-\u{e7}".into(),
            &good,
            400,
            "malformed-idempotency-key",
        ),
        (
            "key with a space",
            "two words".into(),
            &good,
            400,
            "malformed-idempotency-key",
        ),
        (
            "unclosed quoted key",
            "\"open".into(),
            &good,
            400,
            "malformed-idempotency-key",
        ),
        (
            "empty quoted key",
            "\"\"".into(),
            &good,
            400,
            "malformed-idempotency-key",
        ),
        (
            "bad JSON",
            key.clone(),
            "{\"order_id\": 1,",
            400,
            "invalid-body",
        ),
        ("not an object", key.clone(), "[1, 2]", 400, "invalid-body"),
        (
            "unknown field",
            key.clone(),
            r#"{"order_id":1,"amount_cents":1,"amount":5}"#,
            400,
            "invalid-body",
        ),
        (
            "missing field",
            key.clone(),
            r#"{"order_id":1}"#,
            400,
            "invalid-body",
        ),
        (
            "amount as string",
            key.clone(),
            r#"{"order_id":1,"amount_cents":"100"}"#,
            400,
            "invalid-body",
        ),
        (
            "amount as float",
            key.clone(),
            r#"{"order_id":1,"amount_cents":1.5}"#,
            400,
            "invalid-body",
        ),
        (
            "zero amount",
            key.clone(),
            r#"{"order_id":1,"amount_cents":0}"#,
            400,
            "invalid-body",
        ),
        (
            "negative amount",
            key.clone(),
            r#"{"order_id":1,"amount_cents":-250}"#,
            400,
            "invalid-body",
        ),
        (
            "amount over the cap",
            key.clone(),
            r#"{"order_id":1,"amount_cents":10000000001}"#,
            400,
            "invalid-body",
        ),
        (
            "zero order",
            key.clone(),
            r#"{"order_id":0,"amount_cents":1}"#,
            400,
            "invalid-body",
        ),
        (
            "order too big for i64",
            key.clone(),
            r#"{"order_id":9223372036854775808,"amount_cents":1}"#,
            400,
            "invalid-body",
        ),
        (
            "lower-case currency",
            key.clone(),
            r#"{"order_id":1,"amount_cents":1,"currency":"brl"}"#,
            400,
            "invalid-body",
        ),
        (
            "currency of four letters",
            key.clone(),
            r#"{"order_id":1,"amount_cents":1,"currency":"BRLS"}"#,
            400,
            "invalid-body",
        ),
        (
            "long description",
            key.clone(),
            &long_description,
            400,
            "invalid-body",
        ),
    ];
    for (what, key, body, status, slug) in &cases {
        let a = c.charge(key, body).await;
        assert_eq!(a.status, *status, "{what}: {:?}", a.body);
        assert_eq!(a.problem_type(), format!("{PROBLEM}{slug}"), "{what}");
    }
    assert_nothing_stored(&db).await;

    // The field is named where there is one.
    let a = c.charge(&key, r#"{"order_id":1,"amount_cents":"x"}"#).await;
    assert_eq!(a.json()["field"], "amount_cents");
    let a = c
        .charge(&key, r#"{"order_id":1,"amount_cents":1,"currency":"brl"}"#)
        .await;
    assert_eq!(a.json()["field"], "currency");
    let a = c
        .charge(&key, r#"{"order_id":1,"amount_cents":1,"extra":1}"#)
        .await;
    assert!(
        a.json()["detail"].as_str().unwrap().contains("extra"),
        "{:?}",
        a.body
    );

    // Missing key, oversized body and a non-JSON content type.
    let missing = c
        .send(
            c.raw()
                .post(format!("{}/v1/charges", c.base))
                .bearer_auth(&c.secret)
                .header("content-type", "application/json")
                .body(good.clone()),
        )
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.problem_type(),
        format!("{PROBLEM}missing-idempotency-key")
    );

    let huge = format!(
        r#"{{"order_id":1,"amount_cents":1,"description":"{}"}}"#,
        "x".repeat(20_000)
    );
    let a = c.charge(&key, &huge).await;
    assert_eq!(a.status, 413);
    assert_eq!(a.problem_type(), format!("{PROBLEM}body-too-large"));

    let form = c
        .send(
            c.raw()
                .post(format!("{}/v1/charges", c.base))
                .bearer_auth(&c.secret)
                .header("Idempotency-Key", &key)
                .header("content-type", "text/plain")
                .body(good.clone()),
        )
        .await;
    assert_eq!(form.status, 415);
    assert_eq!(
        form.problem_type(),
        format!("{PROBLEM}unsupported-media-type")
    );

    let twice = c
        .send(
            c.raw()
                .post(format!("{}/v1/charges", c.base))
                .bearer_auth(&c.secret)
                .header("Idempotency-Key", &key)
                .header("Idempotency-Key", "other")
                .header("content-type", "application/json")
                .body(good.clone()),
        )
        .await;
    assert_eq!(twice.status, 400);
    assert_eq!(
        twice.problem_type(),
        format!("{PROBLEM}malformed-idempotency-key")
    );
    assert_nothing_stored(&db).await;

    // Validation came before the claim: the same key now works with a good body.
    let a = c.charge(&key, &good).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert!(!a.replayed());
    assert_eq!(sim.ledger().await.captures.len(), 1);
}

#[tokio::test]
async fn missing_or_wrong_secrets_are_401_and_store_nothing() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let app = TestApp::start(&db, &sim).await;
    let real = db.merchant("loja").await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/charges", app.url);
    let attempts = [
        http.post(&url),
        http.post(&url).bearer_auth("sk_wrong"),
        http.post(&url)
            .header("Authorization", format!("Basic {real}")),
        http.post(&url).header("Authorization", "Bearer"),
    ];
    let c = Client::new(&app.url, &real);
    for req in attempts {
        let a = c
            .send(
                req.header("Idempotency-Key", new_key())
                    .header("content-type", "application/json")
                    .body(body(1, 100)),
            )
            .await;
        assert_eq!(a.status, 401);
        assert_eq!(a.problem_type(), format!("{PROBLEM}unauthorized"));
        assert_eq!(a.header("www-authenticate"), Some("Bearer"));
    }
    let a = Client::new(&app.url, "sk_wrong")
        .get_charge("ch_aaaaaaaaaaaaaaaaaaaaaaaa")
        .await;
    assert_eq!(a.status, 401);
    assert_nothing_stored(&db).await;
    assert!(sim.ledger().await.captures.is_empty());
}

#[tokio::test]
async fn merchants_never_see_each_others_keys_or_charges() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let app = TestApp::start(&db, &sim).await;
    let a = Client::new(&app.url, &db.merchant("loja-a").await);
    let b = Client::new(&app.url, &db.merchant("loja-b").await);
    let key = new_key();

    let from_a = a.charge(&key, &body(1, 100)).await;
    // Same key, another merchant, even another body: a separate intent, not a 422.
    let from_b = b.charge(&key, &body(2, 999)).await;
    assert_eq!(from_a.status, 201);
    assert_eq!(from_b.status, 201, "{:?}", from_b.body);
    assert!(!from_b.replayed());
    assert_ne!(from_a.json()["id"], from_b.json()["id"]);

    let id_a = from_a.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(a.get_charge(&id_a).await.status, 200);
    let peek = b.get_charge(&id_a).await;
    assert_eq!(peek.status, 404);
    assert_eq!(peek.problem_type(), format!("{PROBLEM}not-found"));

    let ledger = sim.ledger().await;
    let merchants: Vec<_> = ledger.counts.iter().map(|c| c.merchant.as_str()).collect();
    assert_eq!(merchants, ["loja-a", "loja-b"]);
}

#[tokio::test]
async fn get_returns_the_charge_as_it_is_now() {
    let Env {
        db: _db,
        sim: _sim,
        app: _app,
        client: c,
    } = Env::start(Faults::default()).await;
    let created = c
        .charge(
            &new_key(),
            r#"{"order_id":7,"amount_cents":990,"currency":"USD","description":"pedido 7"}"#,
        )
        .await;
    assert_eq!(created.status, 201);
    let location = created.header("location").unwrap().to_owned();
    let got = c
        .send(
            c.raw()
                .get(format!("{}{location}", c.base))
                .bearer_auth(&c.secret),
        )
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-type"), Some("application/json"));
    // The charge as it was made, and what its refunds gave back since.
    let mut now = got.json();
    assert_eq!(now["amount_refunded_cents"], 0);
    now.as_object_mut()
        .expect("object")
        .remove("amount_refunded_cents");
    assert_eq!(now, created.json());
    let charge = got.json();
    assert_eq!(charge["status"], "captured");
    assert_eq!(charge["currency"], "USD");
    assert_eq!(charge["amount_cents"], 990);
    assert!(charge["acquirer_reference"]
        .as_str()
        .unwrap()
        .starts_with("ref_"));
    assert!(charge["decline_reason"].is_null());

    for missing in [
        "ch_doesnotexistdoesnotexis",
        "ch_aaaaaaaaaaaaaaaaaaaaaaaa",
        "nonsense",
    ] {
        let a = c.get_charge(missing).await;
        assert_eq!(a.status, 404, "{missing}");
        assert_eq!(a.problem_type(), format!("{PROBLEM}not-found"));
    }
}

#[tokio::test]
async fn framework_errors_and_operations_speak_problem_json() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let app = TestApp::start(&db, &sim).await;
    let c = Client::new(&app.url, "unused");

    let a = c.send(c.raw().get(format!("{}/nowhere", app.url))).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.problem_type(), format!("{PROBLEM}not-found"));
    let a = c
        .send(c.raw().delete(format!("{}/v1/charges", app.url)))
        .await;
    assert_eq!(a.status, 405);
    assert_eq!(a.problem_type(), format!("{PROBLEM}method-not-allowed"));
    assert!(a.header("allow").is_some());

    let a = c.send(c.raw().get(format!("{}/healthz", app.url))).await;
    assert_eq!(a.status, 200);
    let a = c.send(c.raw().get(format!("{}/readyz", app.url))).await;
    assert_eq!(a.status, 200);
    assert!(a.header("x-request-id").is_some(), "a request id is echoed");
}

#[tokio::test]
async fn metrics_count_requests_outcomes_and_acquirer_calls() {
    let Env {
        db: _db,
        sim: _sim,
        app,
        client: c,
    } = Env::start(Faults::default()).await;
    let key = new_key();
    assert_eq!(c.charge(&key, &body(1, 100)).await.status, 201);
    assert!(c.charge(&key, &body(1, 100)).await.replayed());
    let m = c.send(c.raw().get(format!("{}/metrics", app.url))).await;
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    let text = String::from_utf8_lossy(&m.body);
    for line in [
        r#"idem_charge_outcomes_total{outcome="captured"}"#,
        r#"idem_charge_outcomes_total{outcome="replayed"}"#,
        r#"idem_acquirer_calls_total{outcome="captured"}"#,
        r#"route="/v1/charges""#,
        "idem_acquirer_call_seconds",
        "idem_oldest_processing_charge_seconds",
        r#"idem_db_pool_connections{state="idle"}"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}

#[tokio::test]
async fn trailing_bytes_and_unreadable_bodies_are_400_and_the_key_stays_free() {
    let Env {
        db,
        sim,
        app,
        client: c,
    } = Env::start(Faults::default()).await;
    let key = new_key();
    let good = body(5, 500);
    for tail in ["garbage", "{}", good.as_str(), "]"] {
        let a = c.charge(&key, &format!("{good}{tail}")).await;
        assert_eq!(a.status, 400, "{tail:?}: {:?}", a.body);
        assert_eq!(
            a.problem_type(),
            format!("{PROBLEM}invalid-body"),
            "{tail:?}"
        );
        assert!(
            a.json()["detail"].as_str().unwrap().contains("trailing"),
            "{:?}",
            a.body
        );
    }
    assert_nothing_stored(&db).await;

    // A chunked body whose chunk size is not hexadecimal never arrives whole.
    let chunked = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: idem\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{good}\r\n0\r\n\r\n",
        c.secret
    );
    let a = raw_request(
        authority(&app.url),
        chunked.as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_eq!(a.json()["type"], format!("{PROBLEM}invalid-body"));
    assert_nothing_stored(&db).await;

    // The key is still free; whitespace after the object is fine.
    let a = c.charge(&key, &format!("{good} \n")).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert_eq!(sim.ledger().await.captures.len(), 1);
}
