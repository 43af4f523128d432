//! Charge events are a setting of the whole deployment: off until a relay is
//! configured (or `idem events enable`), so that a deployment without a broker
//! never fills its outbox with events nothing publishes.

use idem_lab::sim::Faults;

use crate::helpers::*;

async fn events(db: &TestDb, action: &str) -> String {
    let (status, out, err) = run_idem(db, &["events", action]).await;
    assert!(status.success(), "idem events {action}: {err}");
    out.trim().to_owned()
}

#[tokio::test]
async fn without_a_relay_charges_write_no_events_and_the_outbox_stays_empty() {
    let Env {
        db,
        sim: _sim,
        app: _app,
        client: c,
    } = Env::start(Faults::default()).await;
    assert_eq!(events(&db, "status").await, "off", "off by default");
    for order in 1..=5 {
        assert_eq!(c.charge(&new_key(), &body(order, 100)).await.status, 201);
    }
    assert_eq!(db.count("charges").await, 5);
    assert_eq!(db.count("outbox").await, 0, "nothing waits for a relay");
}

#[tokio::test]
async fn idem_events_switches_every_instance_at_once() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let a = ServeProcess::start(&db, &sim, &[]).await;
    let b = ServeProcess::start(&db, &sim, &[]).await;
    let (a, b) = (Client::new(&a.url, &secret), Client::new(&b.url, &secret));

    assert_eq!(events(&db, "enable").await, "on");
    assert_eq!(a.charge(&new_key(), &body(1, 100)).await.status, 201);
    assert_eq!(b.charge(&new_key(), &body(2, 100)).await.status, 201);
    assert_eq!(
        db.count("outbox").await,
        2,
        "one event per outcome, on both"
    );

    assert_eq!(events(&db, "disable").await, "off");
    assert_eq!(a.charge(&new_key(), &body(3, 100)).await.status, 201);
    assert_eq!(b.charge(&new_key(), &body(4, 100)).await.status, 201);
    assert_eq!(db.count("outbox").await, 2, "no more events");
    assert_eq!(events(&db, "status").await, "off");
}
