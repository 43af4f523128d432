//! What one payment intent sends and what it gets back.
//!
//! [`ChargeRequest`] is the JSON body of `POST /v1/charges` (an authorization
//! sends it with `"capture": false`), [`RefundRequest`] and [`CaptureRequest`]
//! those of a refund and a capture of a charge; each is encoded once per intent
//! so every attempt carries the same bytes. [`ChargeAnswer`] is the final
//! answer with the full history of [`Attempt`]s that led to it.

use std::fmt;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// The body of `POST /v1/charges`, as the contract defines it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChargeRequest {
    /// The merchant's order this charge pays for (a positive integer).
    pub order_id: i64,
    /// Minor units, so no rounding ever happens on the wire (1 ..= 10_000_000_000).
    pub amount_cents: i64,
    /// ISO 4217 alpha-3, upper case. Left out when `None`, and the server reads `BRL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// Free text kept with the charge. Left out when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The body of `POST /v1/charges/{id}/refunds`. Every field is optional:
/// without an amount, the server refunds all the charge has left.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RefundRequest {
    /// Minor units (1 ..= 10_000_000_000). Left out when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
    /// `requested_by_customer`, `duplicate`, `fraudulent` or `other`. Left out when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Free text kept with the refund. Left out when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The body of `POST /v1/charges` for an authorization: the charge's fields
/// and `"capture": false`, in that order.
#[derive(serde::Serialize)]
pub(crate) struct AuthorizationRequest<'a> {
    #[serde(flatten)]
    pub(crate) charge: &'a ChargeRequest,
    pub(crate) capture: bool,
}

/// The body of `POST /v1/charges/{id}/captures`: what to capture of an
/// authorized charge. [`CaptureRequest::default`] is a final capture of all
/// the authorization has left.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CaptureRequest {
    /// Minor units (1 ..= 10_000_000_000). Left out when `None`: the server
    /// captures all the authorization has left when it claims the capture.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
    /// `true` (the default): this capture closes the authorization and
    /// releases what remains; `false` leaves the rest capturable by later
    /// captures. Always sent, so the body says what the caller meant.
    #[serde(rename = "final")]
    pub final_capture: bool,
}

impl Default for CaptureRequest {
    fn default() -> Self {
        Self {
            amount_cents: None,
            final_capture: true,
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The server answered with this status and its whole body was read.
    Status(u16),
    /// No complete answer within the attempt's timeout; the outcome is unknown.
    Timeout,
    /// The connection failed (refused, reset, or the body could not be read);
    /// the text is the error and its causes. The outcome may be unknown.
    Connection(String),
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(status) => write!(f, "status {status}"),
            Self::Timeout => f.write_str("timed out"),
            Self::Connection(error) => write!(f, "connection failed: {error}"),
        }
    }
}

/// One HTTP attempt of an intent.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The base URL the attempt went to, exactly as given to [`crate::Client::new`].
    pub endpoint: String,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// When it was sent: with `elapsed`, where the attempt sits on a timeline.
    pub sent: Instant,
    /// Time from sending to the end of the attempt; the wait before it is not included.
    pub elapsed: Duration,
}

/// The final answer to one intent (a charge, an authorization, a refund, a
/// capture or a void): the status and the exact body, which the caller reads
/// as the contract says (`201` with the charge, refund, capture or void; a
/// problem document otherwise).
#[derive(Debug, Clone)]
pub struct ChargeAnswer {
    /// The idempotency key used for every attempt (unquoted).
    pub key: String,
    /// The final answer's status (`201`, `402`, `422`, `400`, ...).
    pub status: u16,
    /// Its exact body, so a replay can be compared byte for byte.
    pub body: Bytes,
    /// `Idempotent-Replayed: true` was on the final answer: it was stored by an
    /// earlier attempt of this intent, not produced by this one.
    pub replayed: bool,
    /// `Idempotency-TTL` on the final answer: how much longer the server
    /// honours the key (it replays this answer until then). Present on every
    /// stored outcome (`201`, `402`, `502` `acquirer-rejected`, and a step's
    /// `422` `refund-failed`, `capture-failed` or `void-failed`).
    pub idempotency_ttl: Option<Duration>,
    /// Every attempt in order, the final one last.
    pub attempts: Vec<Attempt>,
}
