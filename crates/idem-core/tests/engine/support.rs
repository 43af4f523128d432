//! What the engine's tests share: an engine over a fresh SQLite database with
//! the scripted acquirer, a second instance of it over the same database,
//! the requests a test sends, and reads of what the engine left behind.

use std::time::Duration;

use idem_core::domain::{
    ChargeId, ChargeRequest, IdempotencyKey, Merchant, StoredResponse, SubjectId,
};
use idem_core::idempotency::{Engine, EngineConfig, Outcome};
use idem_core::store::Backend;
use idem_testkit::db::{body, new_key, TestDb};

use crate::fake::{Call, FakeAcquirer, Says};

/// A lease longer than any test: a lease ends only when a test ends it
/// ([`Harness::end_leases`]), never because the machine was slow.
pub const LEASE: Duration = Duration::from_secs(30);

/// How long a stored answer is honoured, longer than any test.
pub const KEY_TTL: Duration = Duration::from_secs(3600);

/// What a client is told to wait on a key in flight (the engine's constant).
pub const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The engine as the service runs it (a replay cache on), with the lease
/// and TTL above.
pub const CONFIG: EngineConfig = EngineConfig {
    lease: LEASE,
    key_ttl: KEY_TTL,
    replay_cache_bytes: 1 << 20,
};

/// One engine on a database of its own (SQLite: the engine's paths are the
/// same on every backend, and the store's contract proves the backends
/// alike), a merchant, and the scripted acquirer the engine calls.
pub struct Harness {
    pub db: TestDb,
    pub acquirer: FakeAcquirer,
    pub engine: Engine,
    pub merchant: Merchant,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with(CONFIG).await
    }

    pub async fn with(config: EngineConfig) -> Self {
        let db = TestDb::on(Backend::Sqlite).await;
        // As with a broker configured: every final outcome writes its event
        // to the outbox in the finalize's transaction, which a test can read.
        db.store.set_events_enabled(true).await.expect("events on");
        db.merchant("loja").await;
        let merchant = Merchant {
            id: db.merchant_id("loja").await,
            name: "loja".to_owned(),
        };
        let acquirer = FakeAcquirer::new();
        let engine = Engine::new(db.store.clone(), acquirer.clone(), config);
        Self {
            db,
            acquirer,
            engine,
            merchant,
        }
    }

    /// Another instance of the service: the same database and acquirer,
    /// memory of its own (no in-flight memo, no replay cache shared).
    pub fn another_instance(&self) -> Engine {
        Engine::new(self.db.store.clone(), self.acquirer.clone(), CONFIG)
    }

    /// Ends every in-flight lease now, as the clock would once it ran out
    /// (the holder died or hangs), without sleeping on a short one.
    pub async fn end_leases(&self) {
        self.db
            .exec(&format!(
                "update idempotency_keys set locked_until = {} - 1000 where state = 'in_flight'",
                self.db.now()
            ))
            .await;
    }

    /// The reference the acquirer knows a charge by.
    pub async fn reference_of(&self, id: &ChargeId) -> String {
        self.charge(id).await.acquirer_reference.as_str().to_owned()
    }

    pub async fn charge(&self, id: &ChargeId) -> idem_core::domain::Charge {
        self.db
            .store
            .charge(self.merchant.id, id)
            .await
            .expect("read the charge")
            .expect("the charge exists")
    }

    /// A one-step charge captured (`cap_1`) under a fresh key: what a refund
    /// is taken from.
    pub async fn captured_charge(&self, amount_cents: i64) -> ChargeId {
        self.acquirer.script(Call::Capture, [Says::Done("cap_1")]);
        let outcome = self
            .engine
            .submit(&self.merchant, &fresh_key(), &charge(1, amount_cents))
            .await
            .expect("charge");
        let (subject, response, _) = completed(outcome);
        assert_eq!(response.status, 201, "{}", text(&response));
        charge_id(subject)
    }

    /// A two-step charge authorized (`auth_1`) under a fresh key: what a
    /// capture or a void works on.
    pub async fn authorized_charge(&self, amount_cents: i64) -> ChargeId {
        self.acquirer
            .script(Call::Authorize, [Says::Done("auth_1")]);
        let outcome = self
            .engine
            .submit(
                &self.merchant,
                &fresh_key(),
                &authorization(1, amount_cents),
            )
            .await
            .expect("authorization");
        let (subject, response, _) = completed(outcome);
        assert_eq!(response.status, 201, "{}", text(&response));
        charge_id(subject)
    }

    /// The fencing token of the record under `key` (a charge's, a refund's
    /// or a step's), and whether its outcome is stored.
    pub async fn attempt(&self, key: &IdempotencyKey) -> (i64, bool) {
        let (attempt, state): (i64, String) = sqlx::query_as(
            "select attempt, state from idempotency_keys
              where merchant_id = $1 and idempotency_key = $2",
        )
        .bind(self.merchant.id)
        .bind(key.as_str())
        .fetch_one(&self.db.pool)
        .await
        .expect("the key's record");
        (attempt, state == "completed")
    }

    /// The events the finalizes wrote to the outbox, oldest first.
    pub async fn events(&self) -> Vec<String> {
        let rows: Vec<(String,)> =
            sqlx::query_as("select event_type from outbox where kind = 'event' order by id")
                .fetch_all(&self.db.pool)
                .await
                .expect("the outbox");
        rows.into_iter().map(|(event,)| event).collect()
    }

    /// Asserts every scripted answer was asked for: an answer left over is
    /// a call the test expected and the engine never made.
    pub fn all_answers_used(&self) {
        assert_eq!(self.acquirer.unused(), vec![], "scripted, never called");
    }
}

/// A fresh key, as a client makes one per intent.
pub fn fresh_key() -> IdempotencyKey {
    IdempotencyKey::parse(new_key().as_bytes()).expect("key")
}

/// A one-step charge request.
pub fn charge(order_id: i64, amount_cents: i64) -> ChargeRequest {
    ChargeRequest::from_json(body(order_id, amount_cents).as_bytes()).expect("request")
}

/// A two-step charge request (`"capture": false`).
pub fn authorization(order_id: i64, amount_cents: i64) -> ChargeRequest {
    let json =
        format!(r#"{{"order_id": {order_id}, "amount_cents": {amount_cents}, "capture": false}}"#);
    ChargeRequest::from_json(json.as_bytes()).expect("request")
}

/// A final outcome's subject, answer and whether it was a replay; any other
/// outcome fails the test.
pub fn completed(outcome: Outcome) -> (SubjectId, StoredResponse, bool) {
    match outcome {
        Outcome::Completed {
            subject,
            response,
            replayed,
            ..
        } => (subject, response, replayed),
        other => panic!("expected a final outcome, got {other:?}"),
    }
}

pub fn charge_id(subject: SubjectId) -> ChargeId {
    match subject {
        SubjectId::Charge(id) => id,
        other => panic!("expected a charge, got {other}"),
    }
}

/// An answer's body, as text for messages and `contains`.
pub fn text(response: &StoredResponse) -> String {
    String::from_utf8_lossy(&response.body).into_owned()
}

/// An answer's body as JSON.
pub fn json(response: &StoredResponse) -> serde_json::Value {
    serde_json::from_slice(&response.body).expect("a JSON body")
}
