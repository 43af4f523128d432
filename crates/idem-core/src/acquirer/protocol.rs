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

/// `POST /v1/authorizations` body: hold `amount_cents` on the card for the
/// order, to be captured later, in parts or at once
/// ([`AuthorizationCaptureRequest`]), or released ([`VoidRequest`]). The
/// same `reference` is the `Idempotency-Key` header. The fields are a
/// capture's: an authorization is a capture whose money has not moved yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationRequest {
    pub reference: String,
    pub merchant: String,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
}

/// The outcome body of an authorization, for both `POST` and `GET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum AuthorizationOutcome {
    /// `201` (POST) or `200` (GET): the amount is held, echoing the order,
    /// the amount and the currency.
    Authorized {
        authorization_id: String,
        reference: String,
        #[serde(flatten)]
        echo: Echo,
    },
    /// `402` (POST) or `200` (GET): the card's issuer said no.
    Declined { reference: String, reason: String },
    /// `422` (POST) or `200` (GET): refused for good, nothing held (an
    /// amount that is not positive).
    Refused { reference: String, reason: String },
}

/// `POST /v1/captures` body for a capture of an authorization: it names the
/// authorization by its reference, where a one-step capture
/// ([`CaptureRequest`]) names an order. Captures of both kinds share one
/// path and one space of references, so a refund's `capture_reference` and
/// a lookup of a capture need not know which kind it was.
///
/// `amount_cents` is always given (idem has reserved it before the call, so
/// it is never "whatever remains" to be worked out at the acquirer), and
/// `final` is always given: a forgotten field must not release money.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationCaptureRequest {
    pub reference: String,
    pub authorization_reference: String,
    pub merchant: String,
    pub amount_cents: i64,
    pub currency: String,
    /// `final` on the wire: this capture closes the authorization and
    /// releases what remains; `false` leaves the rest capturable.
    #[serde(rename = "final")]
    pub final_capture: bool,
}

/// The outcome body of a capture of an authorization, for both `POST` and
/// `GET` (`GET /v1/captures/{reference}`, as a one-step capture's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum AuthorizationCaptureOutcome {
    /// `201` (POST) or `200` (GET), echoing the authorization, the amount,
    /// the currency and `final`.
    Captured {
        capture_id: String,
        reference: String,
        /// What a final capture released of the authorization (0 when it
        /// took all that remained, or when the capture is not final); absent
        /// when the acquirer does not say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        released_cents: Option<i64>,
        #[serde(flatten)]
        echo: Echo,
    },
    /// `422` (POST) or `200` (GET): refused for good, no money moved (more
    /// than the authorization has left, an authorization unknown, voided or
    /// closed by a final capture, another currency, an amount that is not
    /// positive).
    Refused { reference: String, reason: String },
}

/// `POST /v1/voids` body: release what the authorization under
/// `authorization_reference` still holds, and close it. The void's own
/// `reference` is the `Idempotency-Key` header. It names no amount: a void
/// releases whatever remains, as Stripe's cancel, Adyen's cancel and
/// Checkout.com's void do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoidRequest {
    pub reference: String,
    pub authorization_reference: String,
    pub merchant: String,
}

/// The outcome body of a void, for both `POST` and `GET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum VoidOutcome {
    /// `201` (POST) or `200` (GET), echoing the authorization voided.
    Voided {
        void_id: String,
        reference: String,
        /// What the void released (what the authorization still held);
        /// absent when the acquirer does not say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        released_cents: Option<i64>,
        #[serde(flatten)]
        echo: Echo,
    },
    /// `422` (POST) or `200` (GET): refused for good, nothing released (an
    /// authorization unknown, already voided, or closed by a final capture).
    Refused { reference: String, reason: String },
}

/// What a call says it did: the acquirer echoes the order, the amount and
/// the currency, and for a capture of an authorization or a void the
/// authorization (and a capture's `final`). A field it leaves out is not
/// checked (an acquirer that echoes nothing is taken at its word on the
/// reference alone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Echo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_reference: Option<String>,
    /// `final` on the wire.
    #[serde(default, rename = "final", skip_serializing_if = "Option::is_none")]
    pub final_capture: Option<bool>,
}

impl Echo {
    /// The echo of a capture of exactly `request`.
    pub fn of(request: &CaptureRequest) -> Self {
        Self {
            order_id: Some(request.order_id),
            amount_cents: Some(request.amount_cents),
            currency: Some(request.currency.clone()),
            ..Self::default()
        }
    }

    /// The echo of a refund of exactly `request` (a refund names no order).
    pub fn of_refund(request: &RefundRequest) -> Self {
        Self {
            amount_cents: Some(request.amount_cents),
            currency: Some(request.currency.clone()),
            ..Self::default()
        }
    }

    /// The echo of an authorization of exactly `request`: a capture's.
    pub fn of_authorization(request: &AuthorizationRequest) -> Self {
        Self {
            order_id: Some(request.order_id),
            amount_cents: Some(request.amount_cents),
            currency: Some(request.currency.clone()),
            ..Self::default()
        }
    }

    /// The echo of a capture of exactly `request` from its authorization
    /// (it names no order: the authorization has it).
    pub fn of_authorization_capture(request: &AuthorizationCaptureRequest) -> Self {
        Self {
            amount_cents: Some(request.amount_cents),
            currency: Some(request.currency.clone()),
            authorization_reference: Some(request.authorization_reference.clone()),
            final_capture: Some(request.final_capture),
            ..Self::default()
        }
    }

    /// The echo of a void of exactly `request`: the authorization it voided.
    pub fn of_void(request: &VoidRequest) -> Self {
        Self {
            authorization_reference: Some(request.authorization_reference.clone()),
            ..Self::default()
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
        check(
            "authorization_reference",
            self.authorization_reference.clone(),
            asked.authorization_reference.clone(),
        );
        check(
            "final",
            self.final_capture.map(|v| v.to_string()),
            asked.final_capture.map(|v| v.to_string()),
        );
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
            ..Echo::default()
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
            ..Echo::default()
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

    #[test]
    fn a_one_step_capture_answers_as_before() {
        let captured = CaptureOutcome::Captured {
            capture_id: "cap_1".into(),
            reference: "r".into(),
            echo: Echo::of(&asked()),
        };
        assert_eq!(
            serde_json::to_string(&captured).expect("json"),
            r#"{"status":"captured","capture_id":"cap_1","reference":"r","order_id":7,"amount_cents":4400,"currency":"EUR"}"#,
            "the two-step fields stay out of a one-step capture's body"
        );
    }

    fn capture_of_authorization() -> AuthorizationCaptureRequest {
        AuthorizationCaptureRequest {
            reference: "c".into(),
            authorization_reference: "a".into(),
            merchant: "m".into(),
            amount_cents: 3000,
            currency: "EUR".into(),
            final_capture: false,
        }
    }

    #[test]
    fn a_capture_of_an_authorization_says_final_on_the_wire_and_must_say_it() {
        let body = serde_json::to_value(capture_of_authorization()).expect("json");
        assert_eq!(body["final"], false);
        assert_eq!(body["authorization_reference"], "a");
        let without: Result<AuthorizationCaptureRequest, _> = serde_json::from_str(
            r#"{"reference":"c","authorization_reference":"a","merchant":"m",
                "amount_cents":3000,"currency":"EUR"}"#,
        );
        assert!(without.is_err(), "final is never taken for granted");
        assert!(
            serde_json::from_value::<CaptureRequest>(body).is_err(),
            "a capture of an authorization is not a one-step capture"
        );
    }

    #[test]
    fn a_capture_of_an_authorization_is_checked_on_its_authorization_and_final_too() {
        let asked = Echo::of_authorization_capture(&capture_of_authorization());
        let outcome: AuthorizationCaptureOutcome = serde_json::from_str(
            r#"{"status":"captured","capture_id":"cap_2","reference":"c","released_cents":0,
                "authorization_reference":"b","amount_cents":3000,"currency":"EUR","final":true}"#,
        )
        .expect("a capture");
        let AuthorizationCaptureOutcome::Captured {
            echo,
            released_cents,
            ..
        } = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(released_cents, Some(0));
        assert_eq!(
            echo.contradictions(&asked),
            [
                "authorization_reference b (asked a)",
                "final true (asked false)"
            ]
        );
        let one_step_echo = Echo {
            order_id: Some(7),
            ..Echo::of_authorization_capture(&capture_of_authorization())
        };
        assert!(
            one_step_echo.contradictions(&asked).is_empty(),
            "an order the request did not name is not compared"
        );
    }

    #[test]
    fn voids_and_authorizations_read_their_refusals() {
        let void: VoidOutcome = serde_json::from_str(
            r#"{"status":"voided","void_id":"void_1","reference":"v","authorization_reference":"a",
                "released_cents":7000}"#,
        )
        .expect("a void");
        assert_eq!(
            void,
            VoidOutcome::Voided {
                void_id: "void_1".into(),
                reference: "v".into(),
                released_cents: Some(7000),
                echo: Echo::of_void(&VoidRequest {
                    reference: "v".into(),
                    authorization_reference: "a".into(),
                    merchant: "m".into(),
                }),
            }
        );
        let refused: AuthorizationOutcome = serde_json::from_str(
            r#"{"status":"refused","reference":"a","reason":"invalid_amount"}"#,
        )
        .expect("a refusal");
        assert!(
            matches!(refused, AuthorizationOutcome::Refused { reason, .. } if reason == "invalid_amount")
        );
    }
}
