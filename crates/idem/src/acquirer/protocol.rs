//! The acquirer's wire format (`../shared/spec/acquirer.md`).

use serde::{Deserialize, Serialize};

/// `POST /v1/captures` body. The same `reference` is the `Idempotency-Key` header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    pub reference: String,
    pub merchant: String,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
}

/// The outcome body of a capture, for both `POST` and `GET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CaptureOutcome {
    /// `201` (POST) or `200` (GET).
    Captured {
        capture_id: String,
        reference: String,
    },
    /// `402` (POST) or `200` (GET).
    Declined { reference: String, reason: String },
}
