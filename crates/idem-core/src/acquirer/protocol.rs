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

/// `POST /v1/refunds` body: money back from the capture made under
/// `capture_reference`. The refund's own `reference` is the `Idempotency-Key`
/// header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    pub reference: String,
    pub capture_reference: String,
    pub merchant: String,
    pub amount_cents: i64,
    pub currency: String,
}

/// The outcome body of a refund, for both `POST` and `GET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum RefundOutcome {
    /// `201` (POST) or `200` (GET), echoing the amount and currency refunded.
    Refunded {
        refund_id: String,
        reference: String,
        #[serde(flatten)]
        echo: Echo,
    },
    /// `422` (POST) or `200` (GET): refused for good, no money moved (more
    /// than the capture has left, a capture the acquirer does not know, or the
    /// reference known with another amount).
    Refused { reference: String, reason: String },
}

/// What a capture or a refund says it moved: the acquirer echoes the order,
/// the amount and the currency. A field it leaves out is not checked (an
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

    /// The echo of a refund of exactly `request` (a refund names no order).
    pub fn of_refund(request: &RefundRequest) -> Self {
        Self {
            order_id: None,
            amount_cents: Some(request.amount_cents),
            currency: Some(request.currency.clone()),
        }
    }

    /// Where the echo contradicts what was `asked`, each as `field X (asked
    /// Y)`; empty when it names nothing else. A field either side leaves out
    /// is not compared.
    pub fn contradictions(&self, asked: &Echo) -> Vec<String> {
        let mut differ = Vec::new();
        let mut check = |field: &str, echoed: Option<String>, asked: Option<String>| {
            if let (Some(echoed), Some(asked)) = (echoed, asked) {
                if echoed != asked {
                    differ.push(format!("{field} {echoed} (asked {asked})"));
                }
            }
        };
        check(
            "order_id",
            self.order_id.map(|v| v.to_string()),
            asked.order_id.map(|v| v.to_string()),
        );
        check(
            "amount_cents",
            self.amount_cents.map(|v| v.to_string()),
            asked.amount_cents.map(|v| v.to_string()),
        );
        check("currency", self.currency.clone(), asked.currency.clone());
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
        let asked = Echo::of(&asked());
        assert!(Echo::of(&self::asked()).contradictions(&asked).is_empty());
        assert!(
            Echo::default().contradictions(&asked).is_empty(),
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
            echo.contradictions(&Echo::of(&asked())),
            ["amount_cents 4500 (asked 4400)", "currency USD (asked EUR)"]
        );
    }

    #[test]
    fn a_refund_echo_is_checked_on_amount_and_currency_only() {
        let refund = RefundRequest {
            reference: "rf".into(),
            capture_reference: "r".into(),
            merchant: "m".into(),
            amount_cents: 1000,
            currency: "EUR".into(),
        };
        let asked = Echo::of_refund(&refund);
        let echoed = Echo {
            order_id: Some(99),
            amount_cents: Some(1000),
            currency: Some("EUR".into()),
        };
        assert!(
            echoed.contradictions(&asked).is_empty(),
            "a refund has no order"
        );
        let more = Echo {
            amount_cents: Some(1001),
            ..echoed
        };
        assert_eq!(
            more.contradictions(&asked),
            ["amount_cents 1001 (asked 1000)"]
        );
        let refused: RefundOutcome = serde_json::from_str(
            r#"{"status":"refused","reference":"rf","reason":"exceeds_capture"}"#,
        )
        .expect("a refusal");
        assert_eq!(
            refused,
            RefundOutcome::Refused {
                reference: "rf".into(),
                reason: "exceeds_capture".into()
            }
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
