//! The acquirer's wire format (`docs/contract/acquirer.md`).

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
    /// `201` (POST) or `200` (GET), echoing what was captured.
    Captured {
        capture_id: String,
        reference: String,
        #[serde(flatten)]
        echo: Echo,
    },
    /// `402` (POST) or `200` (GET).
    Declined { reference: String, reason: String },
}

/// What a capture says it moved: the acquirer echoes the order, the amount
/// and the currency it captured. A field it leaves out is not checked (an
/// acquirer that echoes nothing is taken at its word on the reference alone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Echo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

impl Echo {
    /// The echo of a capture of exactly `request`.
    pub fn of(request: &CaptureRequest) -> Self {
        Self {
            order_id: Some(request.order_id),
            amount_cents: Some(request.amount_cents),
            currency: Some(request.currency.clone()),
        }
    }

    /// Where the echo contradicts `request`, each as `field X (asked Y)`;
    /// empty when it names nothing else than what was asked.
    pub fn contradictions(&self, request: &CaptureRequest) -> Vec<String> {
        let mut differ = Vec::new();
        let mut check = |field: &str, echoed: Option<String>, asked: String| {
            if let Some(echoed) = echoed.filter(|e| *e != asked) {
                differ.push(format!("{field} {echoed} (asked {asked})"));
            }
        };
        check(
            "order_id",
            self.order_id.map(|v| v.to_string()),
            request.order_id.to_string(),
        );
        check(
            "amount_cents",
            self.amount_cents.map(|v| v.to_string()),
            request.amount_cents.to_string(),
        );
        check("currency", self.currency.clone(), request.currency.clone());
        differ
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> CaptureRequest {
        CaptureRequest {
            reference: "r".into(),
            merchant: "m".into(),
            order_id: 7,
            amount_cents: 4400,
            currency: "EUR".into(),
        }
    }

    #[test]
    fn an_echo_of_the_request_contradicts_nothing() {
        assert!(Echo::of(&asked()).contradictions(&asked()).is_empty());
        assert!(
            Echo::default().contradictions(&asked()).is_empty(),
            "nothing echoed"
        );
    }

    #[test]
    fn each_field_that_differs_is_named_with_both_values() {
        let echo = Echo {
            order_id: Some(7),
            amount_cents: Some(4500),
            currency: Some("USD".into()),
        };
        assert_eq!(
            echo.contradictions(&asked()),
            ["amount_cents 4500 (asked 4400)", "currency USD (asked EUR)"]
        );
    }

    #[test]
    fn a_captured_body_reads_with_and_without_its_echo() {
        let full: CaptureOutcome = serde_json::from_str(
            r#"{"status":"captured","capture_id":"cap_1","reference":"r",
                "order_id":7,"amount_cents":4400,"currency":"EUR"}"#,
        )
        .expect("with the echo");
        assert_eq!(
            full,
            CaptureOutcome::Captured {
                capture_id: "cap_1".into(),
                reference: "r".into(),
                echo: Echo::of(&asked()),
            }
        );
        let bare: CaptureOutcome =
            serde_json::from_str(r#"{"status":"captured","capture_id":"cap_1","reference":"r"}"#)
                .expect("without it");
        assert!(matches!(bare, CaptureOutcome::Captured { echo, .. } if echo == Echo::default()));
    }
}
