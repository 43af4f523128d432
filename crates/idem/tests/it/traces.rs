//! Traces over OTLP: real `idem serve` and `idem consume` processes export to
//! `scripts/otlp-receiver`, which decodes each export with the OpenTelemetry
//! project's own protobuf definitions (PyPI's `opentelemetry-proto`); the
//! acquirer simulator records the `traceparent` each capture carried, and the
//! broker the one on each message.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::queue::EVENTS_EXCHANGE;
use idem_lab::sim::{Fault, Faults};
use serde::Deserialize;

use crate::broker::{Amqp, Cmd, ConsumeProcess, TestBroker};
use crate::helpers::*;

/// The client's trace: trace id and its own span id.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn client_traceparent() -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-01")
}

/// One span as the receiver wrote it.
#[derive(Debug, Clone, Deserialize)]
struct Span {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: String,
    status: String,
    attributes: serde_json::Map<String, serde_json::Value>,
    links: Vec<Link>,
    service: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Link {
    trace_id: String,
    span_id: String,
}

impl Span {
    fn attr(&self, name: &str) -> &serde_json::Value {
        self.attributes
            .get(name)
            .unwrap_or(&serde_json::Value::Null)
    }
}

/// `scripts/otlp-receiver`, in the virtualenv `scripts/ensure-otel-venv` makes.
struct Receiver {
    child: Child,
    out: PathBuf,
    endpoint: String,
}

impl Receiver {
    fn start() -> Self {
        let python = python_from("ensure-otel-venv");
        let out = std::env::temp_dir().join(format!("idem-spans-{}.jsonl", new_key()));
        let mut child = Command::new(python)
            .arg(scripts().join("otlp-receiver"))
            .arg("--out")
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OTLP receiver");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("the receiver's endpoint line");
        let line: serde_json::Value = serde_json::from_str(&first).expect("JSON");
        Self {
            child,
            out,
            endpoint: line["endpoint"].as_str().expect("endpoint").to_owned(),
        }
    }

    /// What an idem process needs to export here, at once.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_SERVICE_NAME", "idem-under-test".to_owned()),
            // Export every 100 ms rather than every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    fn spans(&self) -> Vec<Span> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a span"))
            .collect()
    }

    /// The spans received once `done` holds for them (within 20 s).
    async fn spans_when(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no {what} within 20 s; received: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

/// A real `idem serve` that exports to its own receiver, with a merchant and
/// a client for it.
struct Traced {
    receiver: Receiver,
    _db: TestDb,
    sim: TestSim,
    secret: String,
    client: Client,
    _app: ServeProcess,
}

impl Traced {
    async fn start(faults: Faults, extra: &[&str]) -> Self {
        let receiver = Receiver::start();
        let db = TestDb::new().await;
        let sim = TestSim::start(faults).await;
        let secret = db.merchant("loja").await;
        let env = receiver.env();
        let app = ServeProcess::start_env(&db, &sim, extra, &env_refs(&env)).await;
        let client = Client::new(&app.url, &secret);
        Self {
            receiver,
            _db: db,
            sim,
            secret,
            client,
            _app: app,
        }
    }
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// A new charge whose request carries the client's `traceparent`.
async fn charge_in_trace(client: &Client, order: i64, amount_cents: i64) -> Answer {
    let traceparent = client_traceparent();
    client
        .charge_with(
            &new_key(),
            &body(order, amount_cents),
            &[("traceparent", &traceparent)],
        )
        .await
}

/// The `traceparent` the simulator's only capture carried.
async fn traceparent_at_the_acquirer(sim: &TestSim) -> String {
    let ledger = sim.ledger().await;
    assert_eq!(ledger.captures.len(), 1, "one capture: {ledger:?}");
    ledger.captures[0]
        .traceparent
        .clone()
        .expect("the capture carried a traceparent")
}

/// The trace id in a `traceparent` header value.
fn trace_of(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).expect("a traceparent")
}

#[tokio::test]
async fn a_charge_with_a_traceparent_is_one_trace_through_the_acquirer_to_its_event() {
    let broker = TestBroker::new().await;
    let amqp = Amqp::connect(&broker).await;
    let events = amqp
        .queue("test.events", Some((EVENTS_EXCHANGE, "#")))
        .await;
    let t = Traced::start(
        Faults::default(),
        &["--amqp-url", &broker.url, "--outbox-poll", "100ms"],
    )
    .await;
    let (receiver, sim, secret, client) = (&t.receiver, &t.sim, &t.secret, &t.client);

    let answer = charge_in_trace(client, 250, 25_000).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let charge_id = answer.json()["id"].as_str().expect("id").to_owned();

    let spans = receiver
        .spans_when("server span", |s| !named(s, "POST /v1/charges").is_empty())
        .await;
    let server = named(&spans, "POST /v1/charges")[0];
    assert_eq!(server.trace_id, TRACE, "the client's trace goes on");
    assert_eq!(
        server.parent_span_id, CLIENT_SPAN,
        "a child of the client's span"
    );
    assert_eq!(server.kind, "SERVER");
    assert_eq!(server.service.as_deref(), Some("idem-under-test"));
    assert_eq!(server.attr("http.request.method"), "POST");
    assert_eq!(server.attr("http.route"), "/v1/charges");
    assert_eq!(server.attr("http.response.status_code"), 201);
    assert_eq!(server.attr("charge_id"), charge_id.as_str());

    // The charge's steps, children of the request's span.
    let children = |name: &str| -> Vec<&Span> {
        named(&spans, name)
            .into_iter()
            .filter(|s| s.trace_id == TRACE && s.parent_span_id == server.span_id)
            .collect()
    };
    let claim = children("claim");
    assert_eq!(claim.len(), 1, "one claim: {spans:#?}");
    assert_eq!(claim[0].kind, "CLIENT");
    assert_eq!(claim[0].attr("db.operation.name"), "claim");
    assert!(
        ["postgresql", "sqlite"].contains(&claim[0].attr("db.system.name").as_str().unwrap_or("")),
        "{claim:?}"
    );
    let finalize = children("finalize");
    assert_eq!(finalize.len(), 1, "one finalize: {spans:#?}");
    let acquirer = children("POST");
    assert_eq!(acquirer.len(), 1, "one call to the acquirer: {spans:#?}");
    let acquirer = acquirer[0];
    assert_eq!(acquirer.kind, "CLIENT");
    assert_eq!(acquirer.attr("charge_id"), charge_id.as_str());
    assert_eq!(acquirer.attr("http.response.status_code"), 201);
    let reference = acquirer
        .attr("acquirer.reference")
        .as_str()
        .expect("reference");
    assert!(reference.starts_with("ref_"), "{reference}");
    for span in spans.iter().filter(|s| s.trace_id == TRACE) {
        for (name, value) in &span.attributes {
            let text = value.to_string();
            assert!(
                !text.contains(secret.as_str()) && !text.contains("25000"),
                "no secret and no body in a span: {name} = {text}"
            );
        }
    }

    // The acquirer saw the trace, as the child of the acquirer call's span.
    let sent = traceparent_at_the_acquirer(sim).await;
    assert_eq!(sent, format!("00-{TRACE}-{}-01", acquirer.span_id));

    // The charge's event carries the trace on RabbitMQ.
    let event = amqp.take(&events, 1, Duration::from_secs(10)).await;
    let carried = event[0]
        .header_str("traceparent")
        .expect("a traceparent header");
    assert_eq!(trace_of(&carried), TRACE, "{carried}");
}

/// A refund is traced as a charge is: the request's span, its claim, the
/// acquirer's call (naming the refund, at `/v1/refunds`) whose context the
/// acquirer receives, its finalize; and its event carries the trace.
#[tokio::test]
async fn a_refund_with_a_traceparent_is_one_trace_through_the_acquirer_to_its_event() {
    let broker = TestBroker::new().await;
    let amqp = Amqp::connect(&broker).await;
    let events = amqp
        .queue("test.refund-events", Some((EVENTS_EXCHANGE, "refund.#")))
        .await;
    let t = Traced::start(
        Faults::default(),
        &["--amqp-url", &broker.url, "--outbox-poll", "100ms"],
    )
    .await;
    let (receiver, sim, client) = (&t.receiver, &t.sim, &t.client);
    let charge = client.charge(&new_key(), &body(7, 5_000)).await;
    assert_eq!(charge.status, 201, "{charge:?}");
    let charge_id = charge.json()["id"].as_str().expect("id").to_owned();

    let traceparent = client_traceparent();
    let answer = client
        .refund_with(
            &charge_id,
            &new_key(),
            r#"{"amount_cents": 1200}"#,
            &[("traceparent", &traceparent)],
        )
        .await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let refund_id = answer.json()["id"].as_str().expect("id").to_owned();

    let route = "POST /v1/charges/{id}/refunds";
    let spans = receiver
        .spans_when("the refund's server span", |s| !named(s, route).is_empty())
        .await;
    let server = named(&spans, route)[0];
    assert_eq!(
        (server.trace_id.as_str(), server.parent_span_id.as_str()),
        (TRACE, CLIENT_SPAN),
        "the client's trace goes on"
    );
    assert_eq!(server.attr("http.response.status_code"), 201);
    let children = |name: &str| -> Vec<&Span> {
        named(&spans, name)
            .into_iter()
            .filter(|s| s.trace_id == TRACE && s.parent_span_id == server.span_id)
            .collect()
    };
    assert_eq!(children("claim").len(), 1, "one claim: {spans:#?}");
    assert_eq!(children("finalize").len(), 1, "one finalize: {spans:#?}");
    let acquirer = children("POST");
    assert_eq!(acquirer.len(), 1, "one call to the acquirer: {spans:#?}");
    let acquirer = acquirer[0];
    assert_eq!(acquirer.attr("refund_id"), refund_id.as_str());
    assert_eq!(acquirer.attr("url.template"), "/v1/refunds");
    assert_eq!(acquirer.attr("http.response.status_code"), 201);

    // The acquirer saw the trace, as the child of the call's span.
    let ledger = sim.ledger().await;
    assert_eq!(ledger.refunds.len(), 1, "{ledger:?}");
    assert_eq!(
        ledger.refunds[0].traceparent.as_deref(),
        Some(format!("00-{TRACE}-{}-01", acquirer.span_id).as_str())
    );
    // The refund's event carries it on RabbitMQ.
    let event = amqp.take(&events, 1, Duration::from_secs(10)).await;
    let carried = event[0]
        .header_str("traceparent")
        .expect("a traceparent header");
    assert_eq!(trace_of(&carried), TRACE, "{carried}");
}

#[tokio::test]
async fn a_charge_the_reconciler_settles_after_a_503_links_back_to_the_request() {
    let t = Traced::start(
        Faults {
            fault: Fault::Status(503),
            fault_count: Some(1),
            ..Faults::default()
        },
        &["--reconcile-interval", "200ms"],
    )
    .await;
    let (receiver, sim, client) = (&t.receiver, &t.sim, &t.client);

    let answer = charge_in_trace(client, 7, 1_000).await;
    assert_eq!(answer.status, 503, "the acquirer's 503: unknown, for now");

    let spans = receiver
        .spans_when("a reconcile span and its capture", |s| {
            s.iter().any(|r| {
                r.name == "reconcile"
                    && s.iter()
                        .any(|c| c.name == "POST" && c.parent_span_id == r.span_id)
            })
        })
        .await;
    let server = named(&spans, "POST /v1/charges")[0];
    assert_eq!(server.trace_id, TRACE);
    assert_eq!(server.attr("http.response.status_code"), 503);
    assert_eq!(server.status, "ERROR");
    let reconcile = named(&spans, "reconcile")
        .into_iter()
        .find(|r| !r.links.is_empty())
        .expect("a reconcile span with a link");
    assert_ne!(reconcile.trace_id, TRACE, "a trace of its own");
    assert_eq!(reconcile.links.len(), 1, "{reconcile:?}");
    assert_eq!(
        reconcile.links[0].trace_id, TRACE,
        "linked to the request's trace"
    );
    assert_eq!(
        reconcile.links[0].span_id, server.span_id,
        "linked to the request's own span"
    );

    // Its capture is in the reconciler's trace, at the acquirer too.
    let sent = traceparent_at_the_acquirer(sim).await;
    assert_eq!(trace_of(&sent), reconcile.trace_id);
}

#[tokio::test]
async fn a_queue_command_is_processed_in_its_trace_and_its_result_carries_it() {
    let receiver = Receiver::start();
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let broker = TestBroker::new().await;
    db.merchant("loja").await;
    let amqp = Amqp::connect(&broker).await;
    let replies = amqp.queue("test.replies", None).await;
    let env = receiver.env();
    let _consumer = ConsumeProcess::start(&db, &sim, &broker, &[], &env_refs(&env), 1).await;

    let key = new_key();
    let order = body(9, 900);
    let cmd = Cmd::new(&key, "loja", &order).reply_to(&replies);
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        "tenant".into(),
        lapin::types::AMQPValue::LongString("loja".into()),
    );
    headers.insert(
        "traceparent".into(),
        lapin::types::AMQPValue::LongString(client_traceparent().into()),
    );
    let properties = lapin::BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_message_id(key.as_str().into())
        .with_reply_to(replies.as_str().into())
        .with_headers(headers);
    amqp.publish_raw(properties, cmd.body.as_bytes()).await;

    let result = amqp.take(&replies, 1, Duration::from_secs(10)).await;
    assert_eq!(result[0].status(), 201);
    let carried = result[0]
        .header_str("traceparent")
        .expect("a traceparent header");
    assert_eq!(trace_of(&carried), TRACE, "{carried}");

    let spans = receiver
        .spans_when("the command's span", |s| {
            s.iter().any(|c| c.kind == "CONSUMER")
        })
        .await;
    let command = spans
        .iter()
        .find(|s| s.kind == "CONSUMER")
        .expect("consumer span");
    assert_eq!(command.name, "process idem.charges");
    assert_eq!(command.trace_id, TRACE);
    assert_eq!(command.parent_span_id, CLIENT_SPAN);
    assert_eq!(command.attr("messaging.system"), "rabbitmq");
    assert_eq!(command.attr("messaging.message.id"), key.as_str());
    assert_eq!(
        carried,
        format!("00-{TRACE}-{}-01", command.span_id),
        "the result is the command span's child"
    );
    let sent = traceparent_at_the_acquirer(&sim).await;
    assert_eq!(trace_of(&sent), TRACE);
}

#[tokio::test]
async fn a_malformed_traceparent_starts_a_trace_of_its_own() {
    let t = Traced::start(Faults::default(), &[]).await;
    let (receiver, sim, client) = (&t.receiver, &t.sim, &t.client);
    // Version ff is forbidden, a zero trace id is invalid, and the last is junk.
    let bad = [
        format!("ff-{TRACE}-{CLIENT_SPAN}-01"),
        format!("00-{}-{CLIENT_SPAN}-01", "0".repeat(32)),
        "00-not-a-trace-01".to_owned(),
    ];
    for (order, traceparent) in (1..).zip(&bad) {
        let answer = client
            .charge_with(
                &new_key(),
                &body(order, 100),
                &[("traceparent", traceparent)],
            )
            .await;
        assert_eq!(answer.status, 201, "a bad traceparent changes no answer");
    }
    let spans = receiver
        .spans_when("three server spans", |s| {
            named(s, "POST /v1/charges").len() == bad.len()
        })
        .await;
    for server in named(&spans, "POST /v1/charges") {
        assert_eq!(server.parent_span_id, "", "a root: {server:?}");
        assert_ne!(server.trace_id, TRACE);
    }
    let ledger = sim.ledger().await;
    for capture in &ledger.captures {
        let sent = capture.traceparent.as_deref().expect("idem's own trace");
        assert!(sent.starts_with("00-") && !sent.contains(TRACE), "{sent}");
    }
}

#[tokio::test]
async fn a_trace_the_client_did_not_sample_is_followed_and_still_travels() {
    let t = Traced::start(Faults::default(), &[]).await;
    let (receiver, sim, client) = (&t.receiver, &t.sim, &t.client);
    let unsampled = format!("00-{TRACE}-{CLIENT_SPAN}-00");
    let answer = client
        .charge_with(&new_key(), &body(5, 500), &[("traceparent", &unsampled)])
        .await;
    assert_eq!(answer.status, 201);
    // A sampled request after it: once its spans are in, the first one's
    // would have been too.
    charge_in_trace(client, 6, 600).await;
    let spans = receiver
        .spans_when("the sampled request's spans", |s| {
            named(s, "finalize").len() == 1
        })
        .await;
    assert_eq!(
        named(&spans, "POST /v1/charges").len(),
        1,
        "only the sampled request: {spans:#?}"
    );
    let ledger = sim.ledger().await;
    let first = ledger.captures[0].traceparent.as_deref().expect("sent on");
    assert_eq!(trace_of(first), TRACE, "the trace travels");
    assert!(
        first.ends_with("-00"),
        "unsampled, as the client said: {first}"
    );
}

#[tokio::test]
async fn with_tracing_off_no_trace_context_leaves_or_is_kept() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let app = ServeProcess::start(&db, &sim, &[]).await;
    let client = Client::new(&app.url, &secret);
    let answer = charge_in_trace(&client, 3, 300).await;
    assert_eq!(answer.status, 201);
    let ledger = sim.ledger().await;
    assert_eq!(ledger.captures[0].traceparent, None, "nothing sent on");
    assert_eq!(
        db.count("charges where traceparent is not null").await,
        0,
        "nothing kept"
    );
}
