//! Merchant webhooks, as values: the events a merchant can hear, an
//! endpoint's signing secret, and the signature of one delivery, in the
//! Standard Webhooks form (standardwebhooks.com).
//!
//! A signature is `v1,` and the base64 of HMAC-SHA256, keyed with the secret's
//! bytes, over `{webhook-id}.{webhook-timestamp}.{body}`. The `webhook-id` is
//! the event's id, the same on every retry of one event, so a receiver can
//! drop a copy; the timestamp is the attempt's, in seconds, so a receiver can
//! refuse an old replay.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chrono::{SecondsFormat, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::Serialize;
use sha2::Sha256;

use super::{Charge, ChargeStatus, MessageId, Refund, Step, StepKind};

/// What a merchant's endpoint can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WebhookEvent {
    /// The acquirer captured the charge.
    Captured,
    /// The acquirer declined it.
    Declined,
    /// The acquirer refused the request itself (`422`): no money moved.
    Failed,
    /// The charge awaits a person: its outcome could not be settled from the
    /// acquirer's answers.
    ReviewRequired,
    /// A person settled a charge that awaited review.
    Resolved,
    /// The acquirer paid a refund back.
    RefundSucceeded,
    /// The acquirer refused a refund for good; its amount is the charge's again.
    RefundFailed,
    /// A refund awaits a person: the acquirer's answers could not settle it.
    RefundReviewRequired,
    /// A person settled a refund that awaited review.
    RefundResolved,
    /// A charge only authorized: its amount is held on the card.
    Authorized,
    /// A capture of an authorized charge, made.
    CaptureSucceeded,
    /// A capture refused for good; its amount is the authorization's again.
    CaptureFailed,
    /// A capture awaits a person.
    CaptureReviewRequired,
    /// A person settled a capture that awaited review.
    CaptureResolved,
    /// A void made: what the authorization held is released.
    VoidSucceeded,
    /// A void refused for good; the authorization is open again.
    VoidFailed,
    /// A void awaits a person.
    VoidReviewRequired,
    /// A person settled a void that awaited review.
    VoidResolved,
}

impl WebhookEvent {
    pub const ALL: [Self; 18] = [
        Self::Captured,
        Self::Declined,
        Self::Failed,
        Self::ReviewRequired,
        Self::Resolved,
        Self::RefundSucceeded,
        Self::RefundFailed,
        Self::RefundReviewRequired,
        Self::RefundResolved,
        Self::Authorized,
        Self::CaptureSucceeded,
        Self::CaptureFailed,
        Self::CaptureReviewRequired,
        Self::CaptureResolved,
        Self::VoidSucceeded,
        Self::VoidFailed,
        Self::VoidReviewRequired,
        Self::VoidResolved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Captured => "charge.captured",
            Self::Declined => "charge.declined",
            Self::Failed => "charge.failed",
            Self::ReviewRequired => "charge.review_required",
            Self::Resolved => "charge.resolved",
            Self::RefundSucceeded => "refund.succeeded",
            Self::RefundFailed => "refund.failed",
            Self::RefundReviewRequired => "refund.review_required",
            Self::RefundResolved => "refund.resolved",
            Self::Authorized => "charge.authorized",
            Self::CaptureSucceeded => "capture.succeeded",
            Self::CaptureFailed => "capture.failed",
            Self::CaptureReviewRequired => "capture.review_required",
            Self::CaptureResolved => "capture.resolved",
            Self::VoidSucceeded => "void.succeeded",
            Self::VoidFailed => "void.failed",
            Self::VoidReviewRequired => "void.review_required",
            Self::VoidResolved => "void.resolved",
        }
    }

    /// The event named `s` (`charge.captured`, ...).
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|e| e.as_str()).collect();
                format!("unknown event {s:?}: use {}", names.join(", "))
            })
    }
}

impl WebhookEvent {
    /// The event a final status produces when the acquirer's answer (or the
    /// reconciler's) decided it; a person's decision is [`Self::Resolved`].
    pub fn of_final(status: ChargeStatus) -> Option<Self> {
        match status {
            ChargeStatus::Captured => Some(Self::Captured),
            ChargeStatus::Declined => Some(Self::Declined),
            ChargeStatus::Failed => Some(Self::Failed),
            ChargeStatus::Authorized => Some(Self::Authorized),
            ChargeStatus::Processing | ChargeStatus::Voided => None,
        }
    }

    /// The events of a step of `kind`: made, refused, awaiting review,
    /// settled by a person.
    pub fn of_step(kind: StepKind) -> [Self; 4] {
        match kind {
            StepKind::Capture => [
                Self::CaptureSucceeded,
                Self::CaptureFailed,
                Self::CaptureReviewRequired,
                Self::CaptureResolved,
            ],
            StepKind::Void => [
                Self::VoidSucceeded,
                Self::VoidFailed,
                Self::VoidReviewRequired,
                Self::VoidResolved,
            ],
        }
    }

    /// The subject's state version the event carries: 1 while it awaits
    /// review, 2 once final. A charge (or a refund) goes from pending to
    /// review (at most once) and to one final state, so a receiver that keeps
    /// the highest version it has seen for it drops an older state arriving late.
    pub fn version(self) -> u8 {
        match self {
            Self::ReviewRequired
            | Self::RefundReviewRequired
            | Self::CaptureReviewRequired
            | Self::VoidReviewRequired => 1,
            Self::Captured
            | Self::Declined
            | Self::Failed
            | Self::Resolved
            | Self::RefundSucceeded
            | Self::RefundFailed
            | Self::RefundResolved
            | Self::Authorized
            | Self::CaptureSucceeded
            | Self::CaptureFailed
            | Self::CaptureResolved
            | Self::VoidSucceeded
            | Self::VoidFailed
            | Self::VoidResolved => 2,
        }
    }
}

/// One event's body, as every attempt of every endpoint receives it.
#[derive(Debug, Serialize)]
pub struct WebhookBody<'a> {
    /// The event's id, also each attempt's `webhook-id`.
    pub id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'static str,
    /// When the outcome was decided (RFC 3339, UTC).
    pub occurred_at: String,
    /// The merchant's name.
    pub merchant: &'a str,
    /// See [`WebhookEvent::version`].
    pub version: u8,
    /// The charge as `GET /v1/charges/{id}` shows it at that moment
    /// (`charge.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge: Option<&'a Charge>,
    /// The refund as `GET /v1/refunds/{id}` shows it at that moment
    /// (`refund.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund: Option<&'a Refund>,
    /// The capture as `GET /v1/captures/{id}` shows it (`capture.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture: Option<&'a Step>,
    /// The void as `GET /v1/voids/{id}` shows it (`void.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub void: Option<&'a Step>,
}

impl<'a> WebhookBody<'a> {
    pub fn new(
        id: &'a MessageId,
        event: WebhookEvent,
        merchant: &'a str,
        charge: &'a Charge,
    ) -> Self {
        Self {
            id: id.as_str(),
            event_type: event.as_str(),
            occurred_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            merchant,
            version: event.version(),
            charge: Some(charge),
            refund: None,
            capture: None,
            void: None,
        }
    }

    /// A `refund.*` event's body.
    pub fn of_refund(
        id: &'a MessageId,
        event: WebhookEvent,
        merchant: &'a str,
        refund: &'a Refund,
    ) -> Self {
        Self {
            id: id.as_str(),
            event_type: event.as_str(),
            occurred_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            merchant,
            version: event.version(),
            charge: None,
            refund: Some(refund),
            capture: None,
            void: None,
        }
    }

    /// A `capture.*` or `void.*` event's body.
    pub fn of_step(
        id: &'a MessageId,
        event: WebhookEvent,
        merchant: &'a str,
        step: &'a Step,
    ) -> Self {
        let kind = step.kind();
        Self {
            id: id.as_str(),
            event_type: event.as_str(),
            occurred_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            merchant,
            version: event.version(),
            charge: None,
            refund: None,
            capture: (kind == StepKind::Capture).then_some(step),
            void: (kind == StepKind::Void).then_some(step),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        super::to_json(self)
    }
}

/// The prefix of a signing secret, as Standard Webhooks writes one.
const SECRET_PREFIX: &str = "whsec_";

/// Random bytes in a new secret (the specification asks for 24 to 64).
const SECRET_BYTES: usize = 32;

/// An endpoint's signing secret, `whsec_` and the base64 of its key. Shown to
/// the merchant once, when it is made; stored as it is, since signing needs it.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret {
    text: String,
    key: Vec<u8>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    pub fn generate() -> Self {
        let mut key = vec![0u8; SECRET_BYTES];
        rand::rng().fill_bytes(&mut key);
        Self {
            text: format!("{SECRET_PREFIX}{}", STANDARD.encode(&key)),
            key,
        }
    }

    /// A secret as stored or shown: `whsec_` and base64 of 24 to 64 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || "not a webhook secret (whsec_ and base64 of 24 to 64 bytes)".to_owned();
        let encoded = text.strip_prefix(SECRET_PREFIX).ok_or_else(bad)?;
        let key = STANDARD.decode(encoded).map_err(|_| bad())?;
        if !(24..=64).contains(&key.len()) {
            return Err(bad());
        }
        Ok(Self {
            text: text.to_owned(),
            key,
        })
    }

    /// The secret as the merchant sees it.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// One signature, `v1,` and base64, of `body` sent as event `id` at
    /// `timestamp` (seconds since the epoch).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            unreachable!("HMAC takes a key of any length")
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header of one attempt: a signature by each secret
/// that signs now (two during a rotation's grace), space-separated.
pub fn signature_header(
    secrets: &[WebhookSecret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specifications_example_signs_the_same() {
        // The example of the Standard Webhooks specification (spec/standard-webhooks.md).
        let secret =
            WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_generated_secret_reads_back_and_signs_alike() {
        let made = WebhookSecret::generate();
        assert!(made.expose().starts_with("whsec_"));
        let read = WebhookSecret::parse(made.expose()).expect("reads back");
        assert_eq!(read.sign("e", 1, b"x"), made.sign("e", 1, b"x"));
        assert_ne!(WebhookSecret::generate(), made);
    }

    #[test]
    fn malformed_secrets_are_refused() {
        for bad in [
            "",
            "whsec_",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!",
            "whsec_AAAA",
        ] {
            assert!(WebhookSecret::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn during_a_rotation_both_secrets_sign() {
        let (old, new) = (WebhookSecret::generate(), WebhookSecret::generate());
        let header = signature_header(&[new.clone(), old.clone()], "evt", 7, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(
            parts,
            [new.sign("evt", 7, b"{}"), old.sign("evt", 7, b"{}")]
        );
    }

    #[test]
    fn events_read_back_by_name() {
        for e in WebhookEvent::ALL {
            assert_eq!(WebhookEvent::parse(e.as_str()), Ok(e));
        }
        assert!(WebhookEvent::parse("charge.refunded").is_err());
    }
}
