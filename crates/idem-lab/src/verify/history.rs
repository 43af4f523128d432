//! What a verify run did and saw, recorded as it happened: every intent, every
//! request with its answer, every fault. The invariants are judged on this and
//! the ledger alone; `--history FILE` writes it as JSON lines.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How an intent is sent during the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// One client that gives up after `--client-timeout` and retries with the
    /// same key on the next URL.
    Retried,
    /// `--duplicates` clients at once, one key, each starting on another URL.
    Burst,
}

/// One charge, one refund of a charge, or one step of a two-step charge (a
/// capture of its authorization, or its void), the run meant to make once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub index: usize,
    pub kind: Kind,
    pub key: String,
    /// The charge's order id; a refund's or a step's is the order of the
    /// charge it acts on, which is how its captures, and their refunds, or
    /// its authorization, and its captures and voids, are found in the
    /// ledger.
    pub order_id: i64,
    /// What it charges (or authorizes), refunds, or captures; 0 for a void,
    /// which names no amount.
    pub amount_cents: i64,
    /// The body every request of this intent sends, byte for byte.
    pub body: String,
    /// For a refund intent, the index of the charge intent it refunds; `None`
    /// for a charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_of: Option<usize>,
    /// A charge sent with `"capture": false`: an authorization, which its
    /// step intents capture and void.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub authorize: bool,
    /// For a capture intent, the index of the authorization intent it
    /// captures from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_of: Option<usize>,
    /// For a void intent, the index of the authorization intent it voids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub void_of: Option<usize>,
}

impl Intent {
    pub fn is_refund(&self) -> bool {
        self.refund_of.is_some()
    }

    pub fn is_capture(&self) -> bool {
        self.capture_of.is_some()
    }

    pub fn is_void(&self) -> bool {
        self.void_of.is_some()
    }

    /// A capture or a void of an authorization.
    pub fn is_step(&self) -> bool {
        self.is_capture() || self.is_void()
    }

    /// A charge, one-step or an authorization: sent to `POST /v1/charges`.
    pub fn is_charge(&self) -> bool {
        !self.is_refund() && !self.is_step()
    }

    /// The authorization intent a step acts on.
    pub fn step_of(&self) -> Option<usize> {
        self.capture_of.or(self.void_of)
    }

    /// The charge intent a refund or a step acts on.
    pub fn parent(&self) -> Option<usize> {
        self.refund_of.or_else(|| self.step_of())
    }

    /// A capture that closes its authorization (its body's `final`).
    pub fn is_final_capture(&self) -> bool {
        self.is_capture()
            && serde_json::from_str::<serde_json::Value>(&self.body)
                .ok()
                .and_then(|b| b.get("final")?.as_bool())
                .unwrap_or(true)
    }

    /// What the intent is, in a word: `charge`, `authorization`, `refund`,
    /// `capture` or `void`.
    pub fn noun(&self) -> &'static str {
        if self.is_refund() {
            "refund"
        } else if self.is_capture() {
            "capture"
        } else if self.is_void() {
            "void"
        } else if self.authorize {
            "authorization"
        } else {
            "charge"
        }
    }

    /// Whether `answer` is the intent's final outcome, what the contract
    /// stores and replays: for a charge a capture or an authorization
    /// (`201`), a decline (`402`) or the acquirer's refusal (`502`
    /// `acquirer-rejected`); for a refund, a capture or a void the money
    /// moved (`201`) or the acquirer's refusal (`422` `refund-failed`,
    /// `capture-failed`, `void-failed`).
    pub fn is_final(&self, answer: &Request) -> bool {
        let kind = || answer.problem_type();
        let refused = if self.is_refund() {
            REFUND_FAILED
        } else if self.is_capture() {
            CAPTURE_FAILED
        } else {
            VOID_FAILED
        };
        match (self.is_charge(), answer.status) {
            (false, Some(201)) | (true, Some(201 | 402)) => true,
            (true, Some(502)) => kind().as_deref() == Some(ACQUIRER_REJECTED),
            (false, Some(422)) => kind().as_deref() == Some(refused),
            _ => false,
        }
    }

    /// Whether `answer` ends the intent: its final outcome, or the
    /// database's refusal, nothing stored and the key left free, that no
    /// retry can change: for a refund, more than the charge has left (`422
    /// refund-exceeds-captured`), while its other refunds hold it; for a
    /// capture, more than the authorization has left (`422
    /// capture-exceeds-authorization`); for a capture or a void, an
    /// authorization already closed (`422 charge-not-authorized`).
    pub fn is_settled_by(&self, answer: &Request) -> bool {
        self.is_final(answer)
            || (self.is_refund() && answer.is_past_capture())
            || (self.is_capture() && answer.is_past_authorization())
            || (self.is_step() && answer.is_not_authorized())
    }
}

/// What a request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    /// A charge intent's charge during the workload (a burst's copies included).
    Charge,
    /// A refund intent's refund during the workload (a burst's copies included).
    Refund,
    /// A capture intent's capture during the workload (a burst's copies included).
    Capture,
    /// A void intent's void during the workload (a burst's copies included).
    Void,
    /// The intent's request after the workload, until it settles.
    Settle,
    /// The intent's request once more after it settled, on another URL.
    LateReplay,
    /// The intent's key with another amount: must be `422`.
    Reuse,
    /// `GET /v1/idempotency-keys/{key}`.
    KeyRead,
}

impl Purpose {
    /// Sends the intent's own request (not the reuse, not a key read).
    pub fn sends_the_intent(self) -> bool {
        matches!(
            self,
            Self::Charge
                | Self::Refund
                | Self::Capture
                | Self::Void
                | Self::Settle
                | Self::LateReplay
        )
    }
}

/// One request and how it ended, on the run's clock (ms since it began).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub intent: usize,
    pub purpose: Purpose,
    /// Which of a burst's clients sent it (0 otherwise).
    pub copy: usize,
    /// Its place among that client's attempts, from 0.
    pub attempt: usize,
    /// Which `--url` it went to, from 0.
    pub instance: usize,
    pub sent_ms: f64,
    pub received_ms: f64,
    /// `None` when no answer came: see `error`.
    pub status: Option<u16>,
    /// `timeout` (no answer within `--client-timeout`) or the connection's error.
    pub error: Option<String>,
    /// The answer's body as sent, hex SHA-256.
    pub body_sha256: Option<String>,
    /// The body as text (invalid UTF-8 replaced), for the report.
    pub body: Option<String>,
    /// Every response header, names in lower case.
    pub headers: BTreeMap<String, String>,
}

impl Request {
    pub fn latency_ms(&self) -> f64 {
        self.received_ms - self.sent_ms
    }

    /// The problem's `type` of an error answer, if it has one.
    pub fn problem_type(&self) -> Option<String> {
        self.json_str("type")
    }

    /// A refund refused by idem's database for more than the charge has
    /// left (`422 refund-exceeds-captured`).
    pub fn is_past_capture(&self) -> bool {
        self.status == Some(422) && self.problem_type().as_deref() == Some(EXCEEDS_CAPTURED)
    }

    /// A capture refused by idem's database for more than the authorization
    /// has left (`422 capture-exceeds-authorization`).
    pub fn is_past_authorization(&self) -> bool {
        self.status == Some(422) && self.problem_type().as_deref() == Some(EXCEEDS_AUTHORIZATION)
    }

    /// A capture or a void of a charge that is no open authorization (`422
    /// charge-not-authorized`): closed by a final capture or a void.
    pub fn is_not_authorized(&self) -> bool {
        self.status == Some(422) && self.problem_type().as_deref() == Some(NOT_AUTHORIZED)
    }

    /// A string field of the answer's JSON body (`id`, `acquirer_reference`).
    pub fn json_str(&self, field: &str) -> Option<String> {
        self.json(field)?.as_str().map(str::to_owned)
    }

    /// A field of the answer's JSON body.
    pub fn json(&self, field: &str) -> Option<serde_json::Value> {
        let mut body: serde_json::Value = serde_json::from_str(self.body.as_deref()?).ok()?;
        Some(body.get_mut(field)?.take())
    }

    /// What the answer was, in a word: its status, `timeout`, or `failed`.
    pub fn outcome(&self) -> String {
        match (self.status, &self.error) {
            (Some(s), _) => s.to_string(),
            (None, Some(e)) if e == TIMEOUT => TIMEOUT.to_owned(),
            (None, _) => "failed".to_owned(),
        }
    }
}

/// The `error` of a request that had no answer within `--client-timeout`.
pub const TIMEOUT: &str = "timeout";

/// The problem type of the contract's one final `502`.
pub const ACQUIRER_REJECTED: &str = "urn:idem:problem:acquirer-rejected";
/// ... and of its one final `422`: the acquirer refused a refund for good.
pub const REFUND_FAILED: &str = "urn:idem:problem:refund-failed";
/// The `422` of a refund for more than the charge has left: not stored.
pub const EXCEEDS_CAPTURED: &str = "urn:idem:problem:refund-exceeds-captured";
/// The stored `422` of a capture the acquirer refused for good.
pub const CAPTURE_FAILED: &str = "urn:idem:problem:capture-failed";
/// The stored `422` of a void the acquirer refused for good.
pub const VOID_FAILED: &str = "urn:idem:problem:void-failed";
/// The `422` of a capture for more than the authorization has left: not stored.
pub const EXCEEDS_AUTHORIZATION: &str = "urn:idem:problem:capture-exceeds-authorization";
/// The `422` of a step of a charge that is no open authorization: not stored.
pub const NOT_AUTHORIZED: &str = "urn:idem:problem:charge-not-authorized";

/// Hex SHA-256 of an answer's body.
pub fn digest(body: &[u8]) -> String {
    Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One run of `--fault-cmd`, or one step of the simulator's script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at_ms: u64,
    /// `fault-cmd` or `simulator`.
    pub source: String,
    /// The simulator's settings set, or how the command ended.
    pub what: String,
    pub ok: bool,
}

/// Everything recorded, in the order it happened within each list.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub run: String,
    pub intents: Vec<Intent>,
    pub requests: Vec<Request>,
    pub faults: Vec<Fault>,
}

/// One line of `--history`: `{"event": "intent" | "request" | "fault", ...}`.
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
enum Line<'a> {
    Run { run: &'a str },
    Intent(&'a Intent),
    Request(&'a Request),
    Fault(&'a Fault),
}

impl History {
    /// The refund intents of the charge intent `charge`.
    pub fn refunds_of(&self, charge: usize) -> impl Iterator<Item = &Intent> {
        self.intents
            .iter()
            .filter(move |i| i.refund_of == Some(charge))
    }

    /// The step intents (captures and voids) of the authorization intent
    /// `authorization`.
    pub fn steps_of(&self, authorization: usize) -> impl Iterator<Item = &Intent> {
        self.intents
            .iter()
            .filter(move |i| i.step_of() == Some(authorization))
    }

    /// The intent's requests, in the order they were sent.
    pub fn of(&self, intent: usize) -> Vec<&Request> {
        let mut mine: Vec<&Request> = self
            .requests
            .iter()
            .filter(|r| r.intent == intent)
            .collect();
        mine.sort_by(|a, b| a.sent_ms.total_cmp(&b.sent_ms));
        mine
    }

    /// Writes the history as JSON lines: the run, the intents, the requests
    /// in the order they were sent, the faults.
    pub fn write_jsonl(&self, path: &Path) -> anyhow::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut requests: Vec<&Request> = self.requests.iter().collect();
        requests.sort_by(|a, b| a.sent_ms.total_cmp(&b.sent_ms));
        let lines = std::iter::once(Line::Run { run: &self.run })
            .chain(self.intents.iter().map(Line::Intent))
            .chain(requests.into_iter().map(Line::Request))
            .chain(self.faults.iter().map(Line::Fault));
        for line in lines {
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }
}
