//! The clients' conformance suite (`clients/conformance/scenarios.json`, read
//! as `clients/conformance/README.md` says) run with the Rust client,
//! `idem-client`, against `idem-lab conformance-env` as a real process: one
//! `idem serve`, the simulator, a lossy and a refusing endpoint. The Python
//! and TypeScript clients run the same file (`clients/python/check`,
//! `clients/typescript/check`). A client
//! that makes a new key on every retry fails it.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use idem_client::{
    backoff_delay, CaptureRequest, ChargeAnswer, ChargeRequest, Client, ClientError, RefundRequest,
    RetryPolicy,
};
use idem_core::store::Backend;
use idem_testkit::run::{admin_url, test_backend};
use serde::Deserialize;
use serde_json::Value;

const LAB: &str = env!("CARGO_BIN_EXE_idem-lab");
const SUITE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/conformance/scenarios.json"
);

#[derive(Deserialize)]
struct Suite {
    policy: Policy,
    scenarios: Vec<Scenario>,
}

/// The suite's policy, or a scenario's fields over it.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Policy {
    max_attempts: Option<u32>,
    attempt_timeout_ms: Option<u64>,
    deadline_ms: Option<u64>,
    prefer_wait_secs: Option<u64>,
    base_delay_ms: Option<u64>,
    max_delay_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    #[allow(dead_code)]
    about: String,
    faults: Value,
    endpoints: Vec<String>,
    #[serde(default)]
    policy: Policy,
    calls: Vec<Call>,
    captures: BTreeMap<String, usize>,
    /// Refunds in the ledger per order's capture (or authorization).
    #[serde(default)]
    refunds: BTreeMap<String, usize>,
    /// Authorizations in the ledger per order.
    #[serde(default)]
    authorizations: BTreeMap<String, usize>,
    /// Captures of an authorization in the ledger per order.
    #[serde(default)]
    authorization_captures: BTreeMap<String, usize>,
    /// Voids in the ledger per order.
    #[serde(default)]
    voids: BTreeMap<String, usize>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Call {
    id: String,
    /// `charge` (absent), `authorize`, `refund`, `capture` or `void`.
    op: Option<String>,
    /// A refund's call: the earlier call whose charge it refunds.
    refund_of: Option<String>,
    /// A capture's call: the earlier authorize call whose charge it captures.
    capture_of: Option<String>,
    /// A void's call: the earlier authorize call whose charge it voids.
    void_of: Option<String>,
    /// A charge's order (a refund, capture or void has none).
    order: Option<i64>,
    /// A charge's amount; a refund's or a capture's, or absent for all that
    /// is left.
    amount_cents: Option<i64>,
    /// A capture's `final`; absent: the client's default (`true`).
    #[serde(rename = "final")]
    final_capture: Option<bool>,
    key: Option<String>,
    #[serde(default)]
    delay_ms: u64,
    after: Option<String>,
    /// The simulator's faults from this call on (`PUT` before it starts).
    faults: Option<Value>,
    expect: Expect,
}

impl Call {
    /// The earlier call whose charge this one refunds, captures or voids.
    fn of(&self) -> Option<&String> {
        self.refund_of
            .as_ref()
            .or(self.capture_of.as_ref())
            .or(self.void_of.as_ref())
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Expect {
    result: String,
    replayed: Option<bool>,
    min_attempts: Option<usize>,
    max_attempts: Option<usize>,
    same_charge_as: Option<String>,
    same_refund_as: Option<String>,
    same_capture_as: Option<String>,
    same_void_as: Option<String>,
    amount_cents: Option<i64>,
    remaining_cents: Option<i64>,
    ttl_at_most_secs: Option<u64>,
    differing_fields: Option<Vec<String>>,
}

/// What a call asks.
#[derive(Debug, Clone)]
enum What {
    Charge(ChargeRequest),
    Authorize(ChargeRequest),
    Refund(String, RefundRequest),
    Capture(String, CaptureRequest),
    Void(String),
}

impl What {
    /// The charge a refund, capture or void names.
    fn charge_id(&self) -> Option<&str> {
        match self {
            Self::Charge(_) | Self::Authorize(_) => None,
            Self::Refund(id, _) | Self::Capture(id, _) | Self::Void(id) => Some(id),
        }
    }
}

/// What a call came to, reduced as the suite's README says.
#[derive(Debug, Clone, Default)]
struct Outcome {
    result: &'static str,
    charge_id: Option<String>,
    refund_id: Option<String>,
    capture_id: Option<String>,
    void_id: Option<String>,
    amount_cents: Option<i64>,
    remaining_cents: Option<i64>,
    replayed: bool,
    attempts: usize,
    key: String,
    idempotency_ttl: Option<u64>,
    differing_fields: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Ready {
    endpoints: HashMap<String, String>,
    simulator: String,
    secret: String,
}

/// `idem-lab conformance-env` as a child process; stopped by closing its stdin.
struct Env {
    child: Child,
    stdin: Option<ChildStdin>,
    ready: Ready,
}

impl Env {
    fn start() -> Self {
        let mut command = Command::new(LAB);
        command.arg("conformance-env");
        if test_backend() == Backend::Postgres {
            command.args(["--database-url", &admin_url()]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting idem-lab conformance-env");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("reading the environment's first line");
        let ready = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the environment's first line {line:?}: {e}"));
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            ready,
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a call is made: by `idem-client`, or by a client that gets keys wrong.
#[derive(Clone, Copy, Debug)]
enum Flavour {
    IdemClient,
    /// A retry loop over single attempts that makes a new key for every
    /// attempt after the first: what the suite must catch.
    NewKeyPerRetry,
}

/// Every scenario of the suite; for each, the failures (empty when it passed).
async fn run_suite(env: &Env, flavour: Flavour) -> Vec<(String, Vec<String>)> {
    let suite: Suite = serde_json::from_str(&std::fs::read_to_string(SUITE).unwrap()).unwrap();
    let run_base = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
        * 1_000;
    let mut results = Vec::new();
    for scenario in &suite.scenarios {
        let started = Instant::now();
        let failures = run_scenario(env, &suite.policy, scenario, run_base, flavour).await;
        eprintln!(
            "conformance {flavour:?} {:<28} {} in {:.1} s{}",
            scenario.name,
            if failures.is_empty() {
                "passed"
            } else {
                "FAILED"
            },
            started.elapsed().as_secs_f64(),
            failures
                .iter()
                .map(|f| format!("\n    {f}"))
                .collect::<String>()
        );
        results.push((scenario.name.clone(), failures));
    }
    results
}

async fn run_scenario(
    env: &Env,
    suite_policy: &Policy,
    scenario: &Scenario,
    run_base: i64,
    flavour: Flavour,
) -> Vec<String> {
    let http = reqwest::Client::new();
    let faults = format!("{}/_sim/faults", env.ready.simulator);
    let put = |body: &Value| http.put(&faults).json(body).send();
    put(&scenario.faults)
        .await
        .and_then(|r| r.error_for_status())
        .expect("setting the simulator's faults");

    let endpoints: Vec<String> = scenario
        .endpoints
        .iter()
        .map(|name| env.ready.endpoints[name].clone())
        .collect();
    let policy = retry_policy(suite_policy, &scenario.policy);
    let caller = Caller {
        client: Client::new(endpoints.clone(), &env.ready.secret, policy.clone()).unwrap(),
        endpoints,
        secret: env.ready.secret.clone(),
        policy,
        flavour,
    };

    // Each call on its own task; one that waits for another watches its end
    // (and a refund, capture or void, the charge that call made).
    let start = Instant::now();
    let mut ended = HashMap::new();
    let mut tasks = Vec::new();
    for call in &scenario.calls {
        let (tx, rx) = tokio::sync::watch::channel(None::<Option<String>>);
        ended.insert(call.id.clone(), rx);
        // A call waits for its `after` and its `refund_of`, `capture_of` or
        // `void_of` (whose charge it takes); its delay counts from the later
        // end.
        let after = call.after.as_ref().map(|id| ended[id].clone());
        let of = call.of().map(|id| ended[id].clone());
        let key = call
            .key
            .as_ref()
            .map(|k| format!("conf-{run_base}-{}-{k}", scenario.name));
        let op = call.op.clone().unwrap_or_else(|| "charge".into());
        let call_waits = call.after.is_some() || call.of().is_some();
        let charge = ChargeRequest {
            order_id: run_base + call.order.unwrap_or_default(),
            amount_cents: call.amount_cents.unwrap_or_default(),
            currency: Some("BRL".into()),
            description: None,
        };
        let refund_request = RefundRequest {
            amount_cents: call.amount_cents,
            ..RefundRequest::default()
        };
        let capture_request = CaptureRequest {
            amount_cents: call.amount_cents,
            final_capture: call
                .final_capture
                .unwrap_or(CaptureRequest::default().final_capture),
        };
        let call_faults = call
            .faults
            .clone()
            .map(|f| (http.clone(), faults.clone(), f));
        let (caller, delay) = (caller.clone(), Duration::from_millis(call.delay_ms));
        tasks.push(tokio::spawn(async move {
            let mut charge_of_earlier = None;
            if let Some(mut of) = of {
                if let Ok(done) = of.wait_for(Option::is_some).await {
                    charge_of_earlier = done.clone().flatten();
                }
            }
            if let Some(mut after) = after {
                let _ = after.wait_for(Option::is_some).await;
            }
            if call_waits {
                tokio::time::sleep(delay).await;
            } else {
                tokio::time::sleep_until((start + delay).into()).await;
            }
            if let Some((http, url, body)) = call_faults {
                http.put(&url)
                    .json(&body)
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .expect("setting a call's faults");
            }
            let earlier = charge_of_earlier.unwrap_or_default();
            let what = match op.as_str() {
                "charge" => What::Charge(charge),
                "authorize" => What::Authorize(charge),
                "refund" => What::Refund(earlier, refund_request),
                "capture" => What::Capture(earlier, capture_request),
                "void" => What::Void(earlier),
                other => panic!("an op this runner does not know: {other:?}"),
            };
            let outcome = caller.call(key.as_deref(), &what).await;
            let _ = tx.send(Some(outcome.charge_id.clone()));
            outcome
        }));
    }
    let mut outcomes = HashMap::new();
    for (call, task) in scenario.calls.iter().zip(tasks) {
        outcomes.insert(call.id.clone(), task.await.expect("a call's task"));
    }

    let mut failures = Vec::new();
    for call in &scenario.calls {
        let got = &outcomes[&call.id];
        let mut fail = |field: &str, want: String| {
            failures.push(format!(
                "call {}: {field}: expected {want}, got {got:?}",
                call.id
            ));
        };
        let e = &call.expect;
        if got.result != e.result {
            fail("result", e.result.clone());
        }
        if call.key.is_none() && got.key.is_empty() {
            fail("key", "the key the client made".into());
        }
        if e.replayed.is_some_and(|r| r != got.replayed) {
            fail("replayed", format!("{:?}", e.replayed));
        }
        if e.min_attempts.is_some_and(|n| got.attempts < n) {
            fail("attempts", format!("at least {:?}", e.min_attempts));
        }
        if e.max_attempts.is_some_and(|n| got.attempts > n) {
            fail("attempts", format!("at most {:?}", e.max_attempts));
        }
        if let Some(other) = &e.same_charge_as {
            let theirs = &outcomes[other].charge_id;
            if got.charge_id.is_none() || got.charge_id != *theirs {
                fail("charge_id", format!("call {other}'s, {theirs:?}"));
            }
        }
        if let Some(other) = &e.same_refund_as {
            let theirs = &outcomes[other].refund_id;
            if got.refund_id.is_none() || got.refund_id != *theirs {
                fail("refund_id", format!("call {other}'s, {theirs:?}"));
            }
        }
        if let Some(other) = &e.same_capture_as {
            let theirs = &outcomes[other].capture_id;
            if got.capture_id.is_none() || got.capture_id != *theirs {
                fail("capture_id", format!("call {other}'s, {theirs:?}"));
            }
        }
        if let Some(other) = &e.same_void_as {
            let theirs = &outcomes[other].void_id;
            if got.void_id.is_none() || got.void_id != *theirs {
                fail("void_id", format!("call {other}'s, {theirs:?}"));
            }
        }
        if e.amount_cents.is_some() && e.amount_cents != got.amount_cents {
            fail("amount_cents", format!("{:?}", e.amount_cents));
        }
        if e.remaining_cents.is_some() && e.remaining_cents != got.remaining_cents {
            fail("remaining_cents", format!("{:?}", e.remaining_cents));
        }
        if let Some(most) = e.ttl_at_most_secs {
            if got.idempotency_ttl.is_none_or(|ttl| ttl > most) {
                fail("idempotency_ttl", format!("at most {most}"));
            }
        }
        if e.differing_fields.is_some() && e.differing_fields != got.differing_fields {
            fail("differing_fields", format!("{:?}", e.differing_fields));
        }
    }

    let ledger: Value = http
        .get(format!("{}/_sim/ledger", env.ready.simulator))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("reading the ledger")
        .json()
        .await
        .expect("the ledger's JSON");
    for (order, want) in &scenario.captures {
        let order_id = run_base + order.parse::<i64>().expect("an order number");
        let got = ledger["captures"]
            .as_array()
            .expect("captures")
            .iter()
            .filter(|c| c["order_id"] == order_id)
            .count();
        if got != *want {
            failures.push(format!(
                "order {order}: expected {want} capture(s) in the ledger, got {got}"
            ));
        }
    }
    let empty = Vec::new();
    let refunds = ledger["refunds"].as_array().unwrap_or(&empty);
    for (order, want) in &scenario.refunds {
        let order_id = run_base + order.parse::<i64>().expect("an order number");
        // A refund of a two-step charge names its authorization.
        let authorizations = ledger["authorizations"].as_array().unwrap_or(&empty);
        let references: Vec<&Value> = ledger["captures"]
            .as_array()
            .expect("captures")
            .iter()
            .chain(authorizations)
            .filter(|c| c["order_id"] == order_id)
            .map(|c| &c["reference"])
            .collect();
        let got = refunds
            .iter()
            .filter(|r| references.contains(&&r["capture_reference"]))
            .count();
        if got != *want {
            failures.push(format!(
                "order {order}: expected {want} refund(s) in the ledger, got {got}"
            ));
        }
    }
    for (list, what, counts) in [
        ("authorizations", "authorization", &scenario.authorizations),
        (
            "authorization_captures",
            "authorization capture",
            &scenario.authorization_captures,
        ),
        ("voids", "void", &scenario.voids),
    ] {
        let entries = ledger[list].as_array().unwrap_or(&empty);
        for (order, want) in counts {
            let order_id = run_base + order.parse::<i64>().expect("an order number");
            let got = entries.iter().filter(|e| e["order_id"] == order_id).count();
            if got != *want {
                failures.push(format!(
                    "order {order}: expected {want} {what}(s) in the ledger, got {got}"
                ));
            }
        }
    }
    put(&serde_json::json!({}))
        .await
        .and_then(|r| r.error_for_status())
        .expect("resetting the simulator's faults");
    failures
}

fn retry_policy(suite: &Policy, scenario: &Policy) -> RetryPolicy {
    let ms = |s: Option<u64>, d: Option<u64>| {
        Duration::from_millis(s.or(d).expect("the suite's policy has every field"))
    };
    RetryPolicy {
        max_attempts: scenario.max_attempts.or(suite.max_attempts).unwrap(),
        max_elapsed: ms(scenario.deadline_ms, suite.deadline_ms),
        attempt_timeout: ms(scenario.attempt_timeout_ms, suite.attempt_timeout_ms),
        base_delay: ms(scenario.base_delay_ms, suite.base_delay_ms),
        max_delay: ms(scenario.max_delay_ms, suite.max_delay_ms),
        prefer_wait: Duration::from_secs(
            scenario
                .prefer_wait_secs
                .or(suite.prefer_wait_secs)
                .unwrap(),
        ),
    }
}

/// A scenario's client, and what a client that gets keys wrong needs.
#[derive(Clone)]
struct Caller {
    client: Client,
    endpoints: Vec<String>,
    secret: String,
    policy: RetryPolicy,
    flavour: Flavour,
}

impl Caller {
    async fn call(&self, key: Option<&str>, what: &What) -> Outcome {
        match self.flavour {
            Flavour::IdemClient => reduce(
                match key {
                    Some(key) => send(&self.client, key, what).await,
                    None => {
                        let key = uuid::Uuid::new_v4().to_string();
                        send(&self.client, &key, what).await
                    }
                },
                what,
            ),
            Flavour::NewKeyPerRetry => self.new_key_per_retry(key, what).await,
        }
    }

    /// The mistake the suite exists to catch: each retry under a fresh key
    /// (one-attempt calls of `idem-client`, on the same endpoints in turn).
    async fn new_key_per_retry(&self, key: Option<&str>, what: &What) -> Outcome {
        let policy = &self.policy;
        let started = Instant::now();
        let mut attempts = 0;
        let mut retry = 0;
        loop {
            let key = match (retry, key) {
                (0, Some(key)) => key.to_owned(),
                _ => uuid::Uuid::new_v4().to_string(),
            };
            let one = Client::new(
                vec![self.endpoints[retry as usize % self.endpoints.len()].clone()],
                &self.secret,
                RetryPolicy {
                    max_attempts: 1,
                    max_elapsed: policy.max_elapsed.saturating_sub(started.elapsed()),
                    ..policy.clone()
                },
            )
            .unwrap();
            let mut outcome = reduce(send(&one, &key, what).await, what);
            attempts += outcome.attempts;
            outcome.attempts = attempts;
            retry += 1;
            if outcome.result != "gave-up"
                || retry >= policy.max_attempts
                || started.elapsed() >= policy.max_elapsed
            {
                return outcome;
            }
            tokio::time::sleep(backoff_delay(policy, retry - 1, None)).await;
        }
    }
}

/// One call of `what` under `key` by `client`.
async fn send(client: &Client, key: &str, what: &What) -> Result<ChargeAnswer, ClientError> {
    match what {
        What::Charge(request) => client.charge_with_key(key, request).await,
        What::Authorize(request) => client.authorize_with_key(key, request).await,
        What::Refund(charge_id, request) => client.refund_with_key(key, charge_id, request).await,
        What::Capture(charge_id, request) => client.capture_with_key(key, charge_id, request).await,
        What::Void(charge_id) => client.void_with_key(key, charge_id).await,
    }
}

/// What `what`'s answer came to, as the suite's README reduces it.
fn reduce(answer: Result<ChargeAnswer, ClientError>, what: &What) -> Outcome {
    let answer = match answer {
        Ok(answer) => answer,
        Err(ClientError::GaveUp { key, attempts, .. }) => {
            return Outcome {
                result: "gave-up",
                attempts: attempts.len(),
                key,
                ..Outcome::default()
            }
        }
        Err(e) => panic!("the client could not make the call: {e}"),
    };
    let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    let kind = body["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:idem:problem:"))
        .unwrap_or_default();
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let mut outcome = Outcome {
        replayed: answer.replayed,
        attempts: answer.attempts.len(),
        idempotency_ttl: answer.idempotency_ttl.map(|d| d.as_secs()),
        ..Outcome::default()
    };
    // What a refund, capture or void (the answer's body, or the problem's
    // `refund`, `capture`, `void`) says of itself.
    let made = |made: &Value, outcome: &mut Outcome| {
        let id = made["id"].as_str().unwrap_or_default();
        let slot = match id.get(..3) {
            Some("re_") => &mut outcome.refund_id,
            Some("cp_") => &mut outcome.capture_id,
            _ => &mut outcome.void_id,
        };
        *slot = Some(id.to_owned());
        outcome.charge_id = text(&made["charge_id"]);
        outcome.amount_cents = made["amount_cents"].as_i64();
    };
    let step = matches!(what, What::Refund(..) | What::Capture(..) | What::Void(_));
    outcome.result = match (answer.status, kind) {
        (201, _) if step => {
            made(&body, &mut outcome);
            match what {
                What::Refund(..) => "refunded",
                What::Capture(..) => "captured",
                _ => "voided",
            }
        }
        (201, _) => {
            outcome.charge_id = text(&body["id"]);
            match body["status"].as_str() {
                Some("captured") => "captured",
                Some("authorized") => "authorized",
                _ => "rejected",
            }
        }
        (402, "charge-declined") => {
            outcome.charge_id = text(&body["charge"]["id"]);
            "declined"
        }
        (502, "acquirer-rejected") => {
            outcome.charge_id = text(&body["charge"]["id"]);
            "failed"
        }
        (422, "refund-failed") => {
            made(&body["refund"], &mut outcome);
            "refund-failed"
        }
        (422, "capture-failed") => {
            made(&body["capture"], &mut outcome);
            "capture-failed"
        }
        (422, "void-failed") => {
            made(&body["void"], &mut outcome);
            "void-failed"
        }
        (422, "refund-exceeds-captured" | "capture-exceeds-authorization") => {
            outcome.remaining_cents = body["remaining_cents"].as_i64();
            if kind == "refund-exceeds-captured" {
                "refund-exceeds"
            } else {
                "capture-exceeds"
            }
        }
        (422, "charge-not-refundable") => "not-refundable",
        (422, "charge-not-authorized") => "not-authorized",
        (422, "idempotency-key-reused") | (410, "key-expired") => {
            outcome.charge_id = text(&body["charge_id"]);
            outcome.refund_id = text(&body["refund_id"]);
            outcome.capture_id = text(&body["capture_id"]);
            outcome.void_id = text(&body["void_id"]);
            outcome.differing_fields = body["differing_fields"].as_array().map(|fields| {
                fields
                    .iter()
                    .filter_map(|f| f.as_str().map(str::to_owned))
                    .collect()
            });
            if answer.status == 422 {
                "key-reused"
            } else {
                "key-expired"
            }
        }
        _ => "rejected",
    };
    // A refusal of a refund, capture or void names the charge it was of.
    if step && outcome.charge_id.is_none() && outcome.result != "rejected" {
        outcome.charge_id = what.charge_id().map(str::to_owned);
    }
    outcome.key = answer.key;
    outcome
}

#[tokio::test]
async fn the_rust_client_passes_every_scenario() {
    let env = Env::start();
    let results = run_suite(&env, Flavour::IdemClient).await;
    let failed: Vec<_> = results.iter().filter(|(_, f)| !f.is_empty()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    let suite: Suite = serde_json::from_str(&std::fs::read_to_string(SUITE).unwrap()).unwrap();
    assert_eq!(results.len(), suite.scenarios.len(), "every scenario ran");
    assert!(
        results.iter().any(|(name, _)| name.starts_with("refund")),
        "refunds are in the suite"
    );
    let ops: Vec<&str> = suite
        .scenarios
        .iter()
        .flat_map(|s| &s.calls)
        .filter_map(|c| c.op.as_deref())
        .collect();
    for op in ["authorize", "capture", "void"] {
        assert!(ops.contains(&op), "{op} is in the suite");
    }
}

/// The suite can fail: a client that makes a new key on every retry charges
/// (refunds, captures an authorization) twice wherever a retry follows an
/// attempt whose outcome it never learnt.
#[tokio::test]
async fn a_client_that_makes_a_new_key_on_retry_fails_the_suite() {
    let env = Env::start();
    let results = run_suite(&env, Flavour::NewKeyPerRetry).await;
    let failures: HashMap<&str, &Vec<String>> =
        results.iter().map(|(n, f)| (n.as_str(), f)).collect();
    for caught in [
        "unknown-outcome-then-settled",
        "timeout-then-retry",
        "server-goes-away-mid-retry",
    ] {
        let charged_twice = failures[caught].iter().any(|f| {
            f.split_once("expected 1 capture(s) in the ledger, got ")
                .and_then(|(_, got)| got.parse::<usize>().ok())
                .is_some_and(|got| got >= 2)
        });
        assert!(charged_twice, "{caught}: {:?}", failures[caught]);
    }
    // And a refund whose answer was lost is refunded twice.
    let refunded_twice = failures["refund-answer-lost"].iter().any(|f| {
        f.split_once("expected 1 refund(s) in the ledger, got ")
            .and_then(|(_, got)| got.parse::<usize>().ok())
            .is_some_and(|got| got >= 2)
    });
    assert!(
        refunded_twice,
        "refund-answer-lost: {:?}",
        failures["refund-answer-lost"]
    );
    // And a capture of an authorization retried after a timeout, or after
    // its answer was lost, takes from the authorization twice.
    for caught in ["capture-timeout-then-retry", "two-step-answers-lost"] {
        let captured_twice = failures[caught].iter().any(|f| {
            f.split_once("expected 1 authorization capture(s) in the ledger, got ")
                .and_then(|(_, got)| got.parse::<usize>().ok())
                .is_some_and(|got| got >= 2)
        });
        assert!(captured_twice, "{caught}: {:?}", failures[caught]);
    }
    assert!(
        failures["first-try"].is_empty(),
        "{:?}",
        failures["first-try"]
    );
}
