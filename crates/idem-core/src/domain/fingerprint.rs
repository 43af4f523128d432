//! The request fingerprint: what "the same request" means for a reused key.
//!
//! Same merchant (the key's scope), same method and path, and the same *parsed*
//! body: the hash covers the canonical serialization of [`ChargeRequest`], so
//! field order, whitespace and an omitted default currency never change it.

use sha2::{Digest, Sha256};

use super::refund::RefundOfCharge;
use super::step::StepOfCharge;
use super::{CaptureRequest, ChargeId, ChargeRequest, RefundRequest};

/// SHA-256 of the operation and its canonical parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The operation is part of the hash, so that one key sent to two
    /// operations is two requests (a `422`), never one confused with the other.
    const CHARGE: &'static [u8] = b"POST /v1/charges\n";
    /// A refund's: its charge is in the canonical body ([`RefundOfCharge`]).
    const REFUND: &'static [u8] = b"POST /v1/charges/{id}/refunds\n";
    /// A capture's and a void's, as a refund's.
    const CAPTURE: &'static [u8] = b"POST /v1/charges/{id}/captures\n";
    const VOID: &'static [u8] = b"POST /v1/charges/{id}/void\n";

    pub fn of_charge(request: &ChargeRequest) -> Self {
        Self::of(Self::CHARGE, &crate::domain::to_json(request))
    }

    /// A refund of `charge_id`: the same body for another charge is another request.
    pub fn of_refund(charge_id: &ChargeId, request: &RefundRequest) -> Self {
        Self::of(
            Self::REFUND,
            &crate::domain::to_json(&RefundOfCharge::new(charge_id, request)),
        )
    }

    /// A capture of `charge_id`.
    pub fn of_capture(charge_id: &ChargeId, request: &CaptureRequest) -> Self {
        let body = StepOfCharge {
            charge_id: charge_id.as_str(),
            capture: Some(request),
        };
        Self::of(Self::CAPTURE, &crate::domain::to_json(&body))
    }

    /// A void of `charge_id`'s authorization.
    pub fn of_void(charge_id: &ChargeId) -> Self {
        let body = StepOfCharge {
            charge_id: charge_id.as_str(),
            capture: None,
        };
        Self::of(Self::VOID, &crate::domain::to_json(&body))
    }

    fn of(operation: &[u8], canonical: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(operation);
        hasher.update(canonical);
        Self(hasher.finalize().into())
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(body: &str) -> Fingerprint {
        Fingerprint::of_charge(&ChargeRequest::from_json(body.as_bytes()).unwrap())
    }

    #[test]
    fn a_refund_is_another_request_than_a_charge_and_than_a_refund_of_another_charge() {
        let refund = RefundRequest::from_json(b"{}").expect("refund");
        let (a, b) = (ChargeId::generate(), ChargeId::generate());
        assert_eq!(
            Fingerprint::of_refund(&a, &refund),
            Fingerprint::of_refund(&a, &refund)
        );
        assert_ne!(
            Fingerprint::of_refund(&a, &refund),
            Fingerprint::of_refund(&b, &refund)
        );
        let some = RefundRequest::from_json(br#"{"amount_cents": 100}"#).expect("refund");
        assert_ne!(
            Fingerprint::of_refund(&a, &refund),
            Fingerprint::of_refund(&a, &some)
        );
        assert_ne!(
            Fingerprint::of_refund(&a, &some),
            fp(r#"{"order_id":123,"amount_cents":100}"#)
        );
    }

    #[test]
    fn layout_and_default_currency_do_not_matter() {
        let a = fp(r#"{"order_id":123,"amount_cents":25000}"#);
        let b = fp(r#"{ "amount_cents" : 25000,
                        "currency": "BRL", "order_id": 123 }"#);
        assert_eq!(a, b);
    }

    #[test]
    fn any_field_change_does() {
        let base = fp(r#"{"order_id":123,"amount_cents":25000}"#);
        for other in [
            r#"{"order_id":124,"amount_cents":25000}"#,
            r#"{"order_id":123,"amount_cents":25001}"#,
            r#"{"order_id":123,"amount_cents":25000,"currency":"USD"}"#,
            r#"{"order_id":123,"amount_cents":25000,"description":"x"}"#,
        ] {
            assert_ne!(base, fp(other), "{other}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn render(fields: &[(&str, String)], order: &[usize], space: &str) -> String {
        let parts: Vec<String> = order
            .iter()
            .map(|&i| {
                format!(
                    "{space}\"{}\"{space}:{space}{}{space}",
                    fields[i].0, fields[i].1
                )
            })
            .collect();
        format!("{{{}}}", parts.join(","))
    }

    proptest! {
        #[test]
        fn field_order_and_whitespace_never_change_it(
            order_id in 1i64..=i64::MAX,
            amount in 1i64..=10_000_000_000,
            currency in "[A-Z]{3}",
            description in proptest::option::of("[a-zA-Z0-9 ]{0,40}"),
            order in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
            space in "[ \t\n]{0,3}",
        ) {
            let fields = vec![
                ("order_id", order_id.to_string()),
                ("amount_cents", amount.to_string()),
                ("currency", format!("\"{currency}\"")),
                ("description", description.as_ref().map_or("null".to_owned(), |d| format!("\"{d}\""))),
            ];
            let plain = render(&fields, &[0, 1, 2, 3], "");
            let shuffled = render(&fields, &order, &space);
            let a = ChargeRequest::from_json(plain.as_bytes()).unwrap();
            let b = ChargeRequest::from_json(shuffled.as_bytes()).unwrap();
            prop_assert_eq!(Fingerprint::of_charge(&a), Fingerprint::of_charge(&b));
        }

        #[test]
        fn any_change_of_a_field_changes_it(
            order_id in 1i64..i64::MAX,
            amount in 1i64..10_000_000_000,
            which in 0usize..4,
        ) {
            let base = format!(r#"{{"order_id":{order_id},"amount_cents":{amount}}}"#);
            let changed = match which {
                0 => format!(r#"{{"order_id":{},"amount_cents":{amount}}}"#, order_id + 1),
                1 => format!(r#"{{"order_id":{order_id},"amount_cents":{}}}"#, amount + 1),
                2 => format!(r#"{{"order_id":{order_id},"amount_cents":{amount},"currency":"USD"}}"#),
                _ => format!(r#"{{"order_id":{order_id},"amount_cents":{amount},"description":""}}"#),
            };
            let a = ChargeRequest::from_json(base.as_bytes()).unwrap();
            let b = ChargeRequest::from_json(changed.as_bytes()).unwrap();
            prop_assert_ne!(Fingerprint::of_charge(&a), Fingerprint::of_charge(&b));
        }
    }
}
