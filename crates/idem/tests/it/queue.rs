//! Charges from RabbitMQ (docs/contract/queue.md): at-least-once in, one capture
//! per intent, a result per delivery, and one event per outcome through the outbox.
//! Real broker (a virtual host per test), real `idem consume` processes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use idem::queue::{
    ATTEMPTS_HEADER, CHARGE_ID_HEADER, COMMANDS_QUEUE, DEAD_LETTER_QUEUE, EVENTS_EXCHANGE,
    REASON_CODE_HEADER, REASON_HEADER, RESULTS_EXCHANGE,
};
use idem_core::store::Backend;
use idem_lab::sim::Faults;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

use crate::broker::{Amqp, Cmd, ConsumeProcess, TestBroker};
use crate::helpers::{body, failing, new_key, run_idem, Client, DbProxy, TestApp, TestDb, TestSim};

const WITHIN: Duration = Duration::from_secs(20);

/// A consumer that gives up on the acquirer after 1 s, holds a claim for 2 s
/// and reconciles every 200 ms: recovery within a test's patience.
const QUICK_RECOVERY: [&str; 6] = [
    "--reconcile-interval",
    "200ms",
    "--acquirer-timeout",
    "1s",
    "--lease",
    "2s",
];

struct QueueEnv {
    db: TestDb,
    sim: TestSim,
    broker: TestBroker,
    amqp: Amqp,
}

impl QueueEnv {
    async fn start(faults: Faults) -> Self {
        let broker = TestBroker::new().await;
        Self::on(broker, faults).await
    }

    async fn on(broker: TestBroker, faults: Faults) -> Self {
        let db = TestDb::new().await;
        db.merchant("loja").await;
        let sim = TestSim::start(faults).await;
        let amqp = Amqp::connect(&broker).await;
        Self {
            db,
            sim,
            broker,
            amqp,
        }
    }

    async fn consumer(&self, extra: &[&str]) -> ConsumeProcess {
        ConsumeProcess::start(&self.db, &self.sim, &self.broker, extra, &[], 1).await
    }

    /// A queue bound to a merchant's results on `idem.results`.
    async fn results(&self, merchant: &str) -> String {
        self.amqp
            .queue("test.results", Some((RESULTS_EXCHANGE, merchant)))
            .await
    }

    /// A queue bound to every charge event.
    async fn events(&self) -> String {
        self.amqp
            .queue("test.events", Some((EVENTS_EXCHANGE, "#")))
            .await
    }
}

#[tokio::test]
async fn a_command_delivered_three_times_captures_once_and_answers_each_delivery() {
    let env = QueueEnv::start(Faults::default()).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let events = env.events().await;
    let metrics = format!("127.0.0.1:{}", crate::helpers::free_port());
    let _consumer = env.consumer(&["--metrics-listen", &metrics]).await;

    let key = new_key();
    let order = body(250, 25_000);
    for _ in 0..3 {
        let mut cmd = Cmd::new(&key, "loja", &order).reply_to(&replies);
        cmd.correlation_id = Some("pedido-250");
        env.amqp.publish(&cmd).await;
    }

    let results = env.amqp.take(&replies, 3, WITHIN).await;
    assert_eq!(env.sim.ledger().await.captures.len(), 1, "one capture");
    assert!(results.iter().all(|r| r.status() == 201));
    assert!(
        results.iter().all(|r| r.body == results[0].body),
        "the same bytes each time"
    );
    assert_eq!(results.iter().filter(|r| !r.replayed()).count(), 1);
    assert_eq!(results.iter().filter(|r| r.replayed()).count(), 2);
    for r in &results {
        assert_eq!(
            r.header_str("idempotency-key").as_deref(),
            Some(key.as_str())
        );
        assert_eq!(
            r.properties.correlation_id().as_ref().map(|c| c.as_str()),
            Some("pedido-250")
        );
        assert_eq!(r.json()["status"], "captured");
    }
    let ids: HashSet<_> = results.iter().map(|r| r.message_id()).collect();
    assert_eq!(ids.len(), 3, "each result has its own message id");

    let event = env.amqp.take(&events, 1, WITHIN).await.remove(0);
    assert_eq!(event.json()["type"], "charge.captured");
    assert_eq!(event.json()["charge"]["id"], results[0].json()["id"]);
    assert!(event.message_id().starts_with("evt_"));

    // A final result went to the broker at once, confirmed, with no row; one
    // that met the first delivery in flight waited in the outbox for its
    // outcome (how many did depends on timing); the event went through the
    // outbox. The relay counts a batch once it has marked it, just after the
    // broker delivered it: scrape until the figures settle.
    let lines = [
        r#"idem_queue_commands_total{result="captured"} 1"#,
        "idem_outbox_pending 0",
    ];
    wait_for_metrics(&metrics, &lines).await;
    let scraped = scrape(&metrics).await;
    let counted = |line: &str| -> u64 {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let direct = counted(r#"idem_queue_results_total{via="broker"}"#);
    let waited = counted(r#"idem_queue_results_total{via="outbox"}"#);
    assert_eq!(direct + waited, 3, "{scraped}");
    assert!(
        direct >= 1,
        "the first delivery's result went at once: {scraped}"
    );
    assert_eq!(
        counted("idem_outbox_published_total"),
        waited + 1,
        "{scraped}"
    );
    let rows = i64::try_from(waited + 1).unwrap();
    assert_eq!(
        env.db.count("outbox").await,
        rows,
        "the event's row and the waiting results'"
    );
}

/// A `reply_to` queue that holds one message, already there, and refuses any
/// more (`x-overflow: reject-publish`): the broker nacks what is published to
/// it until the filler is taken away.
async fn full_queue(env: &QueueEnv, name: &str) -> String {
    let mut limits = FieldTable::default();
    limits.insert("x-max-length".into(), AMQPValue::LongInt(1));
    limits.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    env.amqp
        .channel
        .queue_declare(name.into(), QueueDeclareOptions::durable(), limits)
        .await
        .expect("a queue of one message that refuses any more");
    let confirm = env
        .amqp
        .channel
        .basic_publish(
            "".into(),
            name.into(),
            BasicPublishOptions::default(),
            b"filler",
            BasicProperties::default(),
        )
        .await
        .expect("publish the filler")
        .await
        .expect("the filler's confirm");
    assert!(confirm.is_ack(), "the queue takes its one message");
    name.to_owned()
}

/// A result the broker will not take (its `reply_to` queue is full and
/// rejects publishes) is not lost: the command is acked once the result is in
/// the outbox instead, and the relay publishes it once the queue takes it.
#[tokio::test]
async fn a_result_the_broker_refuses_waits_in_the_outbox_until_the_broker_takes_it() {
    let env = QueueEnv::start(Faults::default()).await;
    let full = &full_queue(&env, "test.full").await;
    let metrics = format!("127.0.0.1:{}", crate::helpers::free_port());
    let _consumer = env.consumer(&["--metrics-listen", &metrics]).await;

    let key = new_key();
    env.amqp
        .publish(&Cmd::new(&key, "loja", &body(3, 700)).reply_to(full))
        .await;
    let lines = [
        r#"idem_queue_commands_total{result="captured"} 1"#,
        r#"idem_queue_results_total{via="outbox"} 1"#,
        "idem_outbox_pending 1",
    ];
    wait_for_metrics(&metrics, &lines).await;
    assert_eq!(
        env.amqp.ready(COMMANDS_QUEUE).await,
        0,
        "the command is acked"
    );
    assert_eq!(env.sim.ledger().await.captures.len(), 1);

    // The queue takes a message again (its filler taken away, the queue
    // itself never gone: a result published while no queue has the name
    // is dropped by the broker, as docs/queue.md says): the relay's next
    // pass delivers it.
    env.amqp
        .channel
        .queue_purge(full.as_str().into(), QueuePurgeOptions::default())
        .await
        .expect("take the filler away");
    let got = env.amqp.take(full, 1, WITHIN).await;
    assert_eq!(got[0].status(), 201);
    assert_eq!(
        got[0].header_str("idempotency-key").as_deref(),
        Some(key.as_str())
    );
    wait_for_metrics(&metrics, &["idem_outbox_pending 0"]).await;
}

#[tokio::test]
async fn the_same_key_over_http_and_over_the_queue_is_one_charge() {
    let env = QueueEnv::start(Faults::default()).await;
    let app = TestApp::start(&env.db, &env.sim).await;
    let secret = env.db.merchant("balcao").await;
    let client = Client::new(&app.url, &secret);
    let results = env.results("balcao").await;
    let _consumer = env.consumer(&[]).await;

    let key = new_key();
    let first = client.charge(&key, &body(7, 9_900)).await;
    assert_eq!(first.status, 201);
    env.amqp
        .publish(&Cmd::new(&key, "balcao", &body(7, 9_900)))
        .await;
    // The same key with another amount: the API's 422, as a result.
    env.amqp
        .publish(&Cmd::new(&key, "balcao", &body(7, 1)))
        .await;

    let got = env.amqp.take(&results, 2, WITHIN).await;
    let replay = got.iter().find(|r| r.status() == 201).expect("the replay");
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body, "the HTTP answer, byte for byte");
    let mismatch = got.iter().find(|r| r.status() == 422).expect("the 422");
    assert_eq!(
        mismatch.json()["type"],
        "urn:idem:problem:idempotency-key-reused"
    );
    assert_eq!(
        mismatch.json()["charge_id"],
        serde_json::from_slice::<serde_json::Value>(&first.body).unwrap()["id"],
        "names the key's charge"
    );
    assert_eq!(
        mismatch
            .properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str()),
        Some("application/problem+json")
    );
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    assert_eq!(env.db.count("charges").await, 1);
}

#[tokio::test]
async fn poison_messages_are_dead_lettered_with_their_reason_and_the_next_command_goes_through() {
    let env = QueueEnv::start(Faults::default()).await;
    let results = env.results("loja").await;
    let _consumer = env.consumer(&[]).await;

    let good = body(1, 100);
    let negative = body(1, -5);
    let trailing = format!("{good}{good}");
    let poison: [(Cmd, &str); 6] = [
        (Cmd::new("k-json", "loja", "{not json"), "invalid-body"),
        (Cmd::new("k-trailing", "loja", &trailing), "invalid-body"),
        (Cmd::new("k-body", "loja", &negative), "invalid-body"),
        (
            Cmd {
                key: None,
                ..Cmd::new("", "loja", &good)
            },
            "missing-key",
        ),
        (
            Cmd {
                tenant: None,
                ..Cmd::new("k-tenant", "", &good)
            },
            "missing-tenant",
        ),
        (Cmd::new("k-who", "nobody", &good), "unknown-tenant"),
    ];
    for (cmd, _) in &poison {
        env.amqp.publish(cmd).await;
    }
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), AMQPValue::LongString("loja".into()));
    env.amqp
        .publish_raw(
            BasicProperties::default()
                .with_message_id("k-type".into())
                .with_content_type("text/plain".into())
                .with_headers(headers),
            good.as_bytes(),
        )
        .await;
    let key = new_key();
    env.amqp.publish(&Cmd::new(&key, "loja", &good)).await;

    let result = env.amqp.take(&results, 1, WITHIN).await.remove(0);
    assert_eq!(result.status(), 201);
    assert_eq!(result.header_str("idempotency-key"), Some(key));

    let dead = env.amqp.take(DEAD_LETTER_QUEUE, 7, WITHIN).await;
    let mut codes: Vec<String> = dead
        .iter()
        .map(|d| d.header_str(REASON_CODE_HEADER).expect("reason code"))
        .collect();
    codes.sort();
    let mut expected: Vec<&str> = poison.iter().map(|(_, code)| *code).collect();
    expected.push("unsupported-content-type");
    expected.sort();
    assert_eq!(codes, expected);
    assert!(dead
        .iter()
        .all(|d| !d.header_str("x-idem-reason").unwrap_or_default().is_empty()));
    let bad_body = dead
        .iter()
        .find(|d| d.body == negative.as_bytes())
        .expect("the invalid body, kept as sent");
    assert!(bad_body
        .header_str("x-idem-reason")
        .unwrap()
        .contains("amount_cents"));
    let trailing_dead = dead
        .iter()
        .find(|d| d.body == trailing.as_bytes())
        .expect("the body with trailing bytes, dead-lettered as sent");
    assert!(trailing_dead
        .header_str("x-idem-reason")
        .unwrap()
        .contains("trailing"));
    assert_eq!(
        env.db.count("idempotency_keys").await,
        1,
        "poison stores nothing"
    );
    assert_eq!(env.amqp.ready(idem::queue::COMMANDS_QUEUE).await, 0);
}

/// A merchant disabled while its consumer runs: the consumer's merchant cache
/// follows the deployment's merchants version, so the next command is
/// dead-lettered as `unknown-tenant` and claims nothing; once the merchant is
/// enabled again, the same command published again goes through.
#[tokio::test]
async fn a_disabled_tenants_commands_are_dead_lettered_until_it_is_enabled_again() {
    let env = QueueEnv::start(Faults::default()).await;
    let results = env.results("loja").await;
    let _consumer = env.consumer(&[]).await;
    let tenant = async |args: &[&str]| {
        let mut all = vec!["tenant"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--actor", "ana"]);
        let (status, _, stderr) = run_idem(&env.db, &all).await;
        assert!(status.success(), "idem {all:?}: {stderr}");
        // The consumer reads the merchants version every second.
        tokio::time::sleep(Duration::from_secs(3)).await;
    };

    // The consumer has the merchant in its cache.
    env.amqp
        .publish(&Cmd::new(&new_key(), "loja", &body(1, 100)))
        .await;
    assert_eq!(env.amqp.take(&results, 1, WITHIN).await[0].status(), 201);

    tenant(&["disable", "loja", "--reason", "contract ended"]).await;
    let key = new_key();
    let command = body(2, 200);
    env.amqp.publish(&Cmd::new(&key, "loja", &command)).await;
    let dead = env.amqp.take(DEAD_LETTER_QUEUE, 1, WITHIN).await;
    assert_eq!(
        dead[0].header_str(REASON_CODE_HEADER).as_deref(),
        Some("unknown-tenant")
    );
    assert_eq!(dead[0].body, command.as_bytes(), "kept as sent");
    assert_eq!(env.db.count("charges").await, 1, "nothing claimed for it");

    tenant(&["enable", "loja"]).await;
    env.amqp.publish(&Cmd::new(&key, "loja", &command)).await;
    let result = env.amqp.take(&results, 1, WITHIN).await.remove(0);
    assert_eq!(result.status(), 201);
    assert!(!result.replayed());
    assert_eq!(env.sim.ledger().await.captures.len(), 2);
}

#[tokio::test]
async fn an_unknown_outcome_is_acked_and_its_result_goes_out_when_the_reconciler_settles_it() {
    // The acquirer captures, then the answer is lost: the outcome is unknown.
    let env = QueueEnv::start(failing(idem_lab::sim::Fault::ErrorAfter)).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let mut consumer = env.consumer(&QUICK_RECOVERY).await;

    let key = new_key();
    env.amqp
        .publish(&Cmd::new(&key, "loja", &body(3, 3_000)).reply_to(&replies))
        .await;
    // Let the first attempt fail; then the acquirer answers again.
    wait_for(|| async { env.db.count("outbox").await >= 1 }).await;
    env.sim.set_faults(Faults::default()).await;

    let result = env.amqp.take(&replies, 1, WITHIN).await.remove(0);
    assert_eq!(result.status(), 201);
    assert!(!result.replayed(), "the first answer to this delivery");
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    // Acked, not parked: once the consumer is gone, nothing comes back.
    consumer.kill_9();
    assert_eq!(env.amqp.ready(idem::queue::COMMANDS_QUEUE).await, 0);
}

#[tokio::test]
async fn kill_9_between_claim_and_ack_loses_nothing_and_charges_once() {
    // The acquirer is slow, so the consumer is killed with the charge claimed
    // and the capture on its way.
    let env = QueueEnv::start(crate::helpers::latency(1_500)).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let args = [
        "--reconcile-interval",
        "200ms",
        "--acquirer-timeout",
        "3s",
        "--lease",
        "4s",
    ];
    let mut first = env.consumer(&args).await;

    let key = new_key();
    env.amqp
        .publish(&Cmd::new(&key, "loja", &body(9, 4_500)).reply_to(&replies))
        .await;
    wait_for(|| async { env.db.count("idempotency_keys").await == 1 }).await;
    first.kill_9();

    // The broker delivers the command again, to the consumer that takes over.
    let _second = env.consumer(&args).await;
    let results = env.amqp.take_at_least(&replies, 1, WITHIN).await;
    assert!(results.iter().all(|r| r.status() == 201));
    let ledger = env.sim.ledger().await;
    assert_eq!(ledger.captures.len(), 1, "{ledger:?}");
    assert_eq!(env.db.count("charges").await, 1);
    let status: (String,) = sqlx::query_as("select status from charges")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(status.0, "captured");
}

#[tokio::test]
async fn sigterm_finishes_the_command_in_hand_publishes_its_result_and_exits_cleanly() {
    let env = QueueEnv::start(crate::helpers::latency(1_000)).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let mut consumer = env.consumer(&[]).await;

    env.amqp
        .publish(&Cmd::new(&new_key(), "loja", &body(5, 500)).reply_to(&replies))
        .await;
    wait_for(|| async { env.db.count("idempotency_keys").await == 1 }).await;
    let exit = tokio::task::spawn_blocking(move || consumer.terminate())
        .await
        .expect("join");
    assert!(exit.success(), "a clean exit: {exit:?}");

    // Nothing else runs now: the result went out before the process exited.
    let result = env
        .amqp
        .take(&replies, 1, Duration::from_secs(2))
        .await
        .remove(0);
    assert_eq!(result.status(), 201);
    assert!(!result.replayed());
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    assert_eq!(
        env.amqp.ready(idem::queue::COMMANDS_QUEUE).await,
        0,
        "acked"
    );
}

#[tokio::test]
async fn two_consumers_share_the_queue_and_every_outcome_has_one_event_published() {
    let env = QueueEnv::start(Faults::default()).await;
    let results = env.results("loja").await;
    let events = env.events().await;
    let _a = env.consumer(&[]).await;
    let _b = ConsumeProcess::start(&env.db, &env.sim, &env.broker, &[], &[], 2).await;
    let app = TestApp::start(&env.db, &env.sim).await;
    let client = Client::new(&app.url, &env.db.merchant("web").await);

    for order in 1..=20 {
        env.amqp
            .publish(&Cmd::new(&new_key(), "loja", &body(order, 1_000)))
            .await;
    }
    let captured = env.amqp.take(&results, 20, WITHIN).await;
    assert!(captured.iter().all(|r| r.status() == 201));
    // Declines too, and charges over HTTP: events come from every outcome.
    env.sim
        .set_faults(Faults {
            decline_rate: 1.0,
            ..Faults::default()
        })
        .await;
    for order in 21..=25 {
        env.amqp
            .publish(&Cmd::new(&new_key(), "loja", &body(order, 1_000)))
            .await;
    }
    for order in 26..=30 {
        client.charge(&new_key(), &body(order, 1_000)).await;
    }

    let declined = env.amqp.take(&results, 5, WITHIN).await;
    assert!(declined.iter().all(|r| r.status() == 402));
    let events = env.amqp.take_at_least(&events, 30, WITHIN).await;
    let mut by_charge: HashMap<String, HashSet<String>> = HashMap::new();
    for e in &events {
        let charge = e.json()["charge"]["id"].as_str().unwrap().to_owned();
        by_charge.entry(charge).or_default().insert(e.message_id());
    }
    assert_eq!(by_charge.len(), 30, "an event for every charge");
    assert!(
        by_charge.values().all(|ids| ids.len() == 1),
        "one event id per outcome"
    );
    let types: HashSet<_> = events.iter().map(|e| e.json()["type"].clone()).collect();
    assert_eq!(types.len(), 2, "captured and declined: {types:?}");
    let unpublished: (i64,) =
        sqlx::query_as("select count(*) from outbox where published_at is null")
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(unpublished.0, 0);
    assert_eq!(env.sim.ledger().await.captures.len(), 20);
}

#[tokio::test]
async fn the_consumer_and_the_relay_recover_from_a_broker_restart() {
    let (broker, _alone) = TestBroker::exclusive().await;
    let env = QueueEnv::on(broker, Faults::default()).await;
    let results = env.results("loja").await;
    let events = env.events().await;
    let _consumer = env.consumer(&[]).await;
    let app = TestApp::start(&env.db, &env.sim).await;
    let client = Client::new(&app.url, &env.db.merchant("web").await);

    env.amqp
        .publish(&Cmd::new(&new_key(), "loja", &body(1, 100)))
        .await;
    env.amqp.take(&results, 1, WITHIN).await;
    env.amqp.take(&events, 1, WITHIN).await;

    env.broker.restart(Duration::from_secs(1)).await;
    // While the relay reconnects, a charge over HTTP writes its event.
    assert_eq!(client.charge(&new_key(), &body(2, 200)).await.status, 201);

    let amqp = Amqp::connect(&env.broker).await;
    amqp.wait_for_consumers(1).await;
    amqp.publish(&Cmd::new(&new_key(), "loja", &body(3, 300)))
        .await;
    let after = amqp.take(&results, 1, WITHIN).await;
    assert_eq!(after[0].status(), 201);
    let events = amqp.take(&events, 2, WITHIN).await;
    let orders: HashSet<_> = events
        .iter()
        .map(|e| e.json()["charge"]["order_id"].as_i64().unwrap())
        .collect();
    assert_eq!(orders, HashSet::from([2, 3]));
}

/// A consumer with its metrics on a port of its own; returns it and the address.
async fn consumer_with_metrics(
    env: &QueueEnv,
    extra: &[&str],
    environment: &[(&str, &str)],
) -> (ConsumeProcess, String) {
    let metrics = format!("127.0.0.1:{}", crate::helpers::free_port());
    let args = [&["--metrics-listen", metrics.as_str()][..], extra].concat();
    let consumer =
        ConsumeProcess::start(&env.db, &env.sim, &env.broker, &args, environment, 1).await;
    (consumer, metrics)
}

/// The consumer's metrics, as Prometheus text.
async fn scrape(metrics: &str) -> String {
    reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .expect("scrape the consumer")
        .text()
        .await
        .expect("metrics text")
}

/// Scrapes until every one of `lines` is in the consumer's metrics; fails
/// showing the last scrape's `idem_` lines otherwise.
async fn wait_for_metrics(metrics: &str, lines: &[&str]) {
    let started = std::time::Instant::now();
    loop {
        let scraped = scrape(metrics).await;
        if lines.iter().all(|l| scraped.contains(l)) {
            return;
        }
        if started.elapsed() > WITHIN {
            let ours: Vec<&str> = scraped.lines().filter(|l| l.starts_with("idem_")).collect();
            panic!("not in the metrics within {WITHIN:?}: {lines:#?}\nlast scrape: {ours:#?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The value of `idem_queue_commands_total{result="..."}` (0 when not yet counted).
async fn commands_counted(metrics: &str, result: &str) -> u64 {
    let scraped = scrape(metrics).await;
    let prefix = format!("idem_queue_commands_total{{result=\"{result}\"}} ");
    scraped
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// A command's properties with extra headers beside `tenant`.
fn command_properties(key: &str, tenant: &str, extra: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), AMQPValue::LongString(tenant.into()));
    for (name, value) in extra {
        headers.insert((*name).into(), value.clone());
    }
    BasicProperties::default()
        .with_message_id(key.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

#[tokio::test]
async fn text_the_database_cannot_store_is_dead_lettered_at_once_and_never_loops() {
    let env = QueueEnv::start(Faults::default()).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let (_consumer, metrics) = consumer_with_metrics(&env, &[], &[]).await;

    // A NUL byte in each text that would reach the database.
    let order = body(1, 100);
    let (nul_correlation, nul_reply_to, nul_tenant) = (new_key(), new_key(), new_key());
    let mut cmd = Cmd::new(&nul_correlation, "loja", &order).reply_to(&replies);
    cmd.correlation_id = Some("pedido\0-1");
    env.amqp.publish(&cmd).await;
    env.amqp
        .publish(&Cmd::new(&nul_reply_to, "loja", &order).reply_to("test.replies\0"))
        .await;
    env.amqp
        .publish(&Cmd::new(&nul_tenant, "lo\0ja", &order))
        .await;
    // Behind them, a good command goes through.
    let good = new_key();
    env.amqp
        .publish(&Cmd::new(&good, "loja", &order).reply_to(&replies))
        .await;

    let result = env.amqp.take(&replies, 1, WITHIN).await.remove(0);
    assert_eq!(result.status(), 201);
    assert_eq!(result.header_str("idempotency-key"), Some(good));
    let dead = env.amqp.take(DEAD_LETTER_QUEUE, 3, WITHIN).await;
    let code_of = |key: &str| {
        let d = dead
            .iter()
            .find(|d| d.message_id() == key)
            .unwrap_or_else(|| panic!("{key} dead-lettered: {dead:#?}"));
        assert!(
            d.header_str(REASON_HEADER)
                .unwrap_or_default()
                .contains("control characters"),
            "{d:#?}"
        );
        d.header_str(REASON_CODE_HEADER).expect("a reason code")
    };
    assert_eq!(code_of(&nul_correlation), "malformed-correlation-id");
    assert_eq!(code_of(&nul_reply_to), "malformed-reply-to");
    assert_eq!(code_of(&nul_tenant), "malformed-tenant");

    // Once each: no delivery went back to the queue, nothing is left there,
    // and only the good command charged. (A dead letter is counted after its
    // copy is confirmed and the delivery acked, so it can be read before.)
    let dead_lettered = r#"idem_queue_commands_total{result="dead_lettered"} 3"#;
    wait_for_metrics(&metrics, &[dead_lettered]).await;
    assert_eq!(commands_counted(&metrics, "requeued").await, 0);
    assert_eq!(env.amqp.ready(COMMANDS_QUEUE).await, 0);
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    assert_eq!(env.db.count("idempotency_keys").await, 1);
}

#[tokio::test]
async fn a_command_the_store_refuses_after_its_capture_is_dead_lettered_naming_its_charge() {
    let env = QueueEnv::start(Faults::default()).await;
    let events = env.events().await;
    let (_consumer, metrics) = consumer_with_metrics(&env, &[], &[]).await;
    // What the parse cannot foresee: here, the database refuses every result
    // row, after the engine has captured and stored the outcome; and the
    // broker refuses the result (its `reply_to` is full), so the consumer
    // must write that row.
    let full = full_queue(&env, "test.full").await;
    match env.db.backend {
        Backend::Postgres | Backend::MariaDb => {
            env.db
                .exec("alter table outbox add constraint test_no_results check (kind <> 'result')")
                .await
        }
        Backend::Sqlite => {
            env.db
                .exec(
                    "create trigger test_no_results before insert on outbox
                      when new.kind = 'result'
                     begin select raise(abort, 'test: no results'); end",
                )
                .await
        }
    }

    let key = new_key();
    env.amqp
        .publish(&Cmd::new(&key, "loja", &body(4, 400)).reply_to(&full))
        .await;

    let dead = env.amqp.take(DEAD_LETTER_QUEUE, 1, WITHIN).await.remove(0);
    assert_eq!(dead.message_id(), key);
    assert_eq!(
        dead.header_str(REASON_CODE_HEADER).as_deref(),
        Some("store-refused")
    );
    assert!(dead
        .header_str(REASON_HEADER)
        .unwrap_or_default()
        .contains("the database refused this command"));
    // The charge it made is named, and is in the database, captured once.
    let charge_id = dead.header_str(CHARGE_ID_HEADER).expect("the charge's id");
    let (status,): (String,) = sqlx::query_as("select status from charges where id = $1")
        .bind(&charge_id)
        .fetch_one(&env.db.pool)
        .await
        .expect("the named charge is stored");
    assert_eq!(status, "captured");
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    let event = env.amqp.take(&events, 1, WITHIN).await.remove(0);
    assert_eq!(event.json()["charge"]["id"], charge_id.as_str());
    assert_eq!(
        commands_counted(&metrics, "requeued").await,
        0,
        "not retried"
    );
    assert_eq!(env.amqp.ready(COMMANDS_QUEUE).await, 0);
}

/// The engine itself fails after its claim made the charge: the database
/// refuses to settle it (a trigger the test adds). The dead letter still names
/// the charge, which stays `processing` with its reference, for the
/// reconciler or a person: nothing is lost.
#[tokio::test]
async fn a_command_whose_finalize_is_refused_is_dead_lettered_naming_its_charge() {
    let env = QueueEnv::start(Faults::default()).await;
    let (_consumer, _metrics) = consumer_with_metrics(&env, &[], &[]).await;
    env.db
        .refuse(
            "test_no_settling",
            "before update of status on charges",
            None,
        )
        .await;
    let key = new_key();
    env.amqp
        .publish(&Cmd::new(&key, "loja", &body(5, 500)))
        .await;

    let dead = env.amqp.take(DEAD_LETTER_QUEUE, 1, WITHIN).await.remove(0);
    assert_eq!(dead.message_id(), key);
    assert_eq!(
        dead.header_str(REASON_CODE_HEADER).as_deref(),
        Some("store-refused")
    );
    let charge_id = dead.header_str(CHARGE_ID_HEADER).expect("the charge's id");
    let (status,): (String,) = sqlx::query_as("select status from charges where id = $1")
        .bind(&charge_id)
        .fetch_one(&env.db.pool)
        .await
        .expect("the named charge is stored");
    assert_eq!(status, "processing", "kept for the reconciler");
}

/// Takes the database away from a consumer: on PostgreSQL by cutting the TCP
/// proxy it connects through; on SQLite by holding the file's write lock from
/// another connection, so its writes wait out the busy timeout and fail.
enum Outage {
    Postgres(DbProxy),
    Sqlite(sqlx::Transaction<'static, sqlx::Any>),
}

impl Outage {
    /// The environment that points a consumer at what the outage will cut.
    async fn proxy(db: &TestDb) -> Option<DbProxy> {
        match db.backend {
            Backend::Postgres | Backend::MariaDb => Some(DbProxy::start(db).await),
            Backend::Sqlite => None,
        }
    }

    async fn begin(db: &TestDb, proxy: Option<DbProxy>) -> Self {
        match proxy {
            Some(proxy) => {
                proxy.cut();
                Self::Postgres(proxy)
            }
            None => {
                let mut tx = db.pool.begin().await.expect("begin");
                sqlx::query("update merchants set name = name")
                    .execute(&mut *tx)
                    .await
                    .expect("take the write lock");
                Self::Sqlite(tx)
            }
        }
    }

    /// Ends the outage; returns the proxy, which the consumer still goes through.
    async fn end(self) -> Option<DbProxy> {
        match self {
            Self::Postgres(proxy) => {
                proxy.restore();
                Some(proxy)
            }
            Self::Sqlite(tx) => {
                tx.rollback().await.expect("release the write lock");
                None
            }
        }
    }
}

#[tokio::test]
async fn a_database_outage_sends_commands_back_until_it_ends_and_dead_letters_past_the_bound() {
    let env = QueueEnv::start(Faults::default()).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let proxy = Outage::proxy(&env.db).await;
    let environment: Vec<(&str, &str)> = match &proxy {
        Some(p) => vec![("DATABASE_URL", p.url.as_str())],
        None => vec![],
    };
    let args = ["--no-workers"];
    let (_consumer, metrics) = consumer_with_metrics(&env, &args, &environment).await;
    let outage = Outage::begin(&env.db, proxy).await;

    let key = new_key();
    env.amqp
        .publish(&Cmd::new(&key, "loja", &body(8, 800)).reply_to(&replies))
        .await;
    // A command that has used up all its attempts but one.
    let spent = new_key();
    let last = i64::from(idem::queue::consumer::MAX_ATTEMPTS - 1);
    env.amqp
        .publish_raw(
            command_properties(
                &spent,
                "loja",
                &[(ATTEMPTS_HEADER, AMQPValue::LongLongInt(last))],
            ),
            body(9, 900).as_bytes(),
        )
        .await;

    let dead = env.amqp.take(DEAD_LETTER_QUEUE, 1, WITHIN).await.remove(0);
    assert_eq!(dead.message_id(), spent);
    assert_eq!(
        dead.header_str(REASON_CODE_HEADER).as_deref(),
        Some("retries-exhausted")
    );
    let reason = dead.header_str(REASON_HEADER).unwrap_or_default();
    assert!(
        reason.contains(&format!("{} attempts", last + 1)) && reason.contains("unavailable"),
        "{reason}"
    );
    // The other one goes back to the queue, again and again, while the outage lasts.
    let requeues = if env.db.backend == Backend::Sqlite {
        1
    } else {
        2
    };
    wait_for(|| async { commands_counted(&metrics, "requeued").await >= requeues }).await;
    let _proxy = outage.end().await;

    // The command may be in the middle of any pause when the outage ends: up to
    // the cap (30 s) if the outage outlasted four attempts, as it can on a
    // loaded machine (a 20 s wait failed twice here). It comes after that pause.
    let after_one_pause = Duration::from_secs(30) + WITHIN;
    let result = env.amqp.take(&replies, 1, after_one_pause).await.remove(0);
    assert_eq!(result.status(), 201);
    assert_eq!(result.header_str("idempotency-key"), Some(key));
    assert!(!result.replayed());
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    assert_eq!(
        env.amqp.ready(DEAD_LETTER_QUEUE).await,
        0,
        "no other dead letter"
    );
    assert_eq!(env.amqp.ready(COMMANDS_QUEUE).await, 0);
    wait_for(|| async { commands_counted(&metrics, "dead_lettered").await >= 1 }).await;
    assert_eq!(commands_counted(&metrics, "dead_lettered").await, 1);
}

#[tokio::test]
async fn an_outbox_row_the_broker_cannot_take_is_set_aside_and_the_rows_behind_it_go_out() {
    let env = QueueEnv::start(Faults::default()).await;
    // A merchant stored before names had to be slugs: 90 characters (the
    // schema allows 100), 270 bytes, so its results' routing key is over
    // AMQP's 255 bytes. `idem tenant create` would refuse it now.
    let long = "€".repeat(90);
    let insert = match env.db.backend {
        Backend::Postgres => format!(
            "insert into merchants (name) values ('{long}')"
        ),
        Backend::Sqlite => format!(
            "insert into merchants (name, secret_hash, created_at) values ('{long}', randomblob(32), 0)"
        ),
        Backend::MariaDb => format!(
            "insert into merchants (name, secret_hash, created_at) values ('{long}', random_bytes(32), 0)"
        ),
    };
    env.db.exec(&insert).await;
    let results = env.results("loja").await;
    let events = env.events().await;
    let metrics = format!("127.0.0.1:{}", crate::helpers::free_port());
    let _consumer = env.consumer(&["--metrics-listen", &metrics]).await;

    // The long name's result comes first in the outbox, the others behind it.
    let stuck = new_key();
    env.amqp
        .publish(&Cmd::new(&stuck, &long, &body(1, 100)))
        .await;
    wait_for(|| async { env.db.count("outbox").await >= 2 }).await;
    for order in 2..=3 {
        env.amqp
            .publish(&Cmd::new(&new_key(), "loja", &body(order, 100)))
            .await;
    }

    let got = env.amqp.take(&results, 2, WITHIN).await;
    assert!(got.iter().all(|r| r.status() == 201));
    // Every charge's event goes out, the long-named merchant's too (its
    // routing key is the event type).
    env.amqp.take(&events, 3, WITHIN).await;

    let (kind, key, reason): (String, String, String) = sqlx::query_as(
        "select kind, idempotency_key, set_aside_reason from outbox
          where set_aside_at is not null and published_at is null",
    )
    .fetch_one(&env.db.pool)
    .await
    .expect("one row set aside, unpublished");
    assert_eq!((kind.as_str(), key.as_str()), ("result", stuck.as_str()));
    assert!(
        reason.contains("routing key is 270 bytes") && reason.contains("255"),
        "{reason}"
    );
    // The two results that could go out went at once; the outbox published
    // the three events.
    let lines = [
        "idem_outbox_set_aside_total 1",
        r#"idem_queue_results_total{via="broker"} 2"#,
        r#"idem_queue_results_total{via="outbox"} 1"#,
        "idem_outbox_published_total 3",
        "idem_outbox_pending 0",
    ];
    wait_for_metrics(&metrics, &lines).await;
    assert_eq!(env.sim.ledger().await.captures.len(), 3);
}

async fn wait_for<F, Fut>(mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !done().await {
        assert!(started.elapsed() < WITHIN, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A consumer that dies at each step of the engine (the claim committed; the
/// acquirer's answer in hand but not stored; the finalize on its way): the
/// command comes back, and the consumer that takes over captures once and
/// publishes the result.
#[cfg(feature = "crash-points")]
#[tokio::test]
async fn a_consumer_dying_at_any_step_loses_nothing_and_charges_once() {
    let env = QueueEnv::start(Faults::default()).await;
    let replies = env.amqp.queue("test.replies", None).await;
    let points = ["after-claim", "after-acquirer", "mid-finalize"];
    for (order, point) in (1..).zip(points) {
        let mut doomed = ConsumeProcess::start(
            &env.db,
            &env.sim,
            &env.broker,
            &QUICK_RECOVERY,
            &[("IDEM_CRASH_AT", point)],
            1,
        )
        .await;
        env.amqp
            .publish(&Cmd::new(&new_key(), "loja", &body(order, 100)).reply_to(&replies))
            .await;
        let exit = tokio::task::spawn_blocking(move || doomed.wait_exit())
            .await
            .expect("join");
        assert!(!exit.success(), "{point}: the consumer died ({exit:?})");
    }
    let _survivor = env.consumer(&QUICK_RECOVERY).await;
    let results = env.amqp.take_at_least(&replies, 3, WITHIN).await;
    assert!(results.iter().all(|r| r.status() == 201), "{results:#?}");
    let keys: HashSet<_> = results
        .iter()
        .map(|r| r.header_str("idempotency-key").unwrap())
        .collect();
    assert_eq!(keys.len(), 3, "a result for each command");
    let ledger = env.sim.ledger().await;
    assert_eq!(
        ledger.captures.len(),
        3,
        "one capture per command: {ledger:?}"
    );
    let counts: HashSet<u64> = ledger.counts.iter().map(|c| c.captures).collect();
    assert_eq!(counts, HashSet::from([1]));
    let events: (i64,) = sqlx::query_as("select count(*) from outbox where kind = 'event'")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(events.0, 3, "one event per outcome");
}

/// A refund sent as a command (`type: refund`, header `charge_id`) is the
/// same operation as over HTTP, in the same key space: one key, one refund,
/// whichever way each copy arrives; its refusals are results, not dead letters.
#[tokio::test]
async fn a_refund_command_and_the_same_key_over_http_make_one_refund() {
    let broker = TestBroker::new().await;
    let db = TestDb::new().await;
    let secret = db.merchant("loja").await;
    let sim = TestSim::start(Faults::default()).await;
    let amqp = Amqp::connect(&broker).await;
    let app = TestApp::start(&db, &sim).await;
    let http = Client::new(&app.url, &secret);
    let charge_key = new_key();
    let charge = http.charge(&charge_key, &body(1, 1_000)).await;
    assert_eq!(charge.status, 201);
    let charge_id = charge.json()["id"].as_str().expect("id").to_owned();
    let reference = charge.json()["acquirer_reference"]
        .as_str()
        .expect("reference")
        .to_owned();
    let _consumer = ConsumeProcess::start(&db, &sim, &broker, &[], &[], 1).await;
    let replies = amqp.queue("test.replies", None).await;
    let refund = |key: &str, charge: &str, body: &str| {
        let mut headers = FieldTable::default();
        headers.insert("tenant".into(), AMQPValue::LongString("loja".into()));
        headers.insert("charge_id".into(), AMQPValue::LongString(charge.into()));
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_type("refund".into())
            .with_message_id(key.into())
            .with_reply_to(replies.as_str().into())
            .with_headers(headers);
        (properties, body.to_owned())
    };

    let key = new_key();
    let (p, b) = refund(&key, &charge_id, r#"{"amount_cents": 300}"#);
    amqp.publish_raw(p, b.as_bytes()).await;
    let first = amqp.take_at_least(&replies, 1, WITHIN).await;
    assert_eq!(first[0].status(), 201, "{first:#?}");
    let refund_id = first[0].json()["id"].as_str().expect("id").to_owned();
    assert!(refund_id.starts_with("re_"));
    // The same key over HTTP: the command's refund, replayed.
    let over_http = http
        .refund(&charge_id, &key, r#"{"amount_cents": 300}"#)
        .await;
    assert_eq!(over_http.status, 201);
    assert!(over_http.replayed());
    assert_eq!(over_http.json()["id"], refund_id.as_str());
    // And the other way round.
    let http_key = new_key();
    let made = http
        .refund(&charge_id, &http_key, r#"{"amount_cents": 200}"#)
        .await;
    assert_eq!(made.status, 201);
    let (p, b) = refund(&http_key, &charge_id, r#"{"amount_cents": 200}"#);
    amqp.publish_raw(p, b.as_bytes()).await;
    // A refund above what is left, and a charge's key sent as a refund:
    // results naming why, nothing made.
    let (p, b) = refund(&new_key(), &charge_id, r#"{"amount_cents": 501}"#);
    amqp.publish_raw(p, b.as_bytes()).await;
    let (p, b) = refund(&charge_key, &charge_id, r#"{"amount_cents": 1}"#);
    amqp.publish_raw(p, b.as_bytes()).await;
    let results = amqp.take_at_least(&replies, 3, WITHIN).await;
    let by_key: HashMap<String, &crate::broker::Received> = results
        .iter()
        .map(|r| (r.header_str("idempotency-key").expect("key"), r))
        .collect();
    let replayed = by_key[&http_key];
    assert_eq!(replayed.status(), 201);
    assert_eq!(replayed.json()["id"], made.json()["id"]);
    let exceeds = results
        .iter()
        .find(|r| r.json()["type"] == "urn:idem:problem:refund-exceeds-captured")
        .expect("the refused refund's result");
    assert_eq!(exceeds.status(), 422);
    assert_eq!(exceeds.json()["remaining_cents"], 500);
    let reused = by_key[&charge_key];
    assert_eq!(reused.status(), 422);
    assert_eq!(reused.json()["differing_fields"][0], "operation");
    assert_eq!(reused.json()["charge_id"], charge_id.as_str());
    let ledger = sim.ledger().await;
    let refunds: Vec<_> = ledger
        .refunds
        .iter()
        .filter(|r| r.capture_reference == reference)
        .collect();
    assert_eq!(refunds.len(), 2, "{refunds:?}");
    assert_eq!(db.count("refunds").await, 2);
}

/// An idle relay looks at the outbox at every poll and finds nothing: it
/// gives its connection back to the pool each time. Before, on PostgreSQL, the
/// empty batch was dropped unfinished, which closes the batch's connection
/// (so that the server rolls back), and every poll opened a new one.
#[tokio::test]
async fn an_idle_relay_keeps_its_database_connections() {
    if !idem_testkit::run::runs_on(
        Backend::Postgres,
        "a relay's batch holds a PostgreSQL connection; SQLite's is a lease",
    ) {
        return;
    }
    let env = QueueEnv::start(Faults::default()).await;
    // The tests' consumers poll the outbox every 100 ms.
    let _consume = env.consumer(&[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (since,): (f64,) = sqlx::query_as("select extract(epoch from now())::float8")
        .fetch_one(&env.db.pool)
        .await
        .expect("now");
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (opened,): (i64,) = sqlx::query_as(
            "select count(*) from pg_stat_activity
              where datname = current_database() and application_name = 'idem'
                and extract(epoch from backend_start) > $1",
        )
        .bind(since)
        .fetch_one(&env.db.pool)
        .await
        .expect("connections");
        assert_eq!(
            opened, 0,
            "idem opened a connection while idle (its relay polls every 100 ms)"
        );
    }
}
