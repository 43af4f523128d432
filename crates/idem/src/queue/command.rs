//! What a delivery on `idem.charges` must carry, checked before anything is
//! claimed: a message refused here stores nothing and goes to the dead-letter
//! queue with its reason.
//!
//! Text that goes into the database (the tenant, `reply_to`, `correlation_id`)
//! has no control characters: PostgreSQL refuses a NUL byte in text, and no
//! queue name, merchant or correlation id needs one. Refusing them here says
//! why at once; what this cannot foresee, the consumer's error classification
//! still dead-letters (see `consumer`).

use lapin::types::AMQPValue;
use lapin::BasicProperties;

use idem_core::domain::IdempotencyKey;
use idem_core::domain::{
    parse_void_body, CaptureIntent, CaptureRequest, ChargeId, ChargeRequest, RefundIntent,
    RefundRequest, VoidIntent,
};
use idem_core::problem;

/// The header naming the merchant; publishers on the broker are trusted.
pub const TENANT_HEADER: &str = "tenant";

/// The header naming the charge a `refund`, `capture` or `void` command acts on.
pub const CHARGE_ID_HEADER: &str = "charge_id";

/// What a command asks, by its AMQP `type` property: `charge` (or none),
/// `refund`, `capture` or `void`.
#[derive(Debug)]
pub enum Request {
    Charge(ChargeRequest),
    Refund(RefundIntent),
    Capture(CaptureIntent),
    Void(VoidIntent),
}

/// A well-formed command, not yet tied to a merchant.
#[derive(Debug)]
pub struct Command {
    pub key: IdempotencyKey,
    pub tenant: String,
    pub request: Request,
    pub reply_to: Option<String>,
    pub correlation_id: Option<String>,
}

/// Why a message is dead-lettered: a stable code and a sentence, and the
/// charge it had already made, if any (so it can be found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: &'static str,
    pub reason: String,
    pub charge_id: Option<String>,
}

impl Rejection {
    pub fn new(code: &'static str, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            charge_id: None,
        }
    }

    /// The charge this command made before it was refused.
    pub fn with_charge(self, charge_id: Option<&str>) -> Self {
        Self {
            charge_id: charge_id.map(str::to_owned),
            ..self
        }
    }
}

/// Whether `text` is free of control characters (NUL among them).
fn printable(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// Parses one delivery's properties and body.
pub fn parse(properties: &BasicProperties, body: &[u8]) -> Result<Command, Rejection> {
    let key = match properties.message_id() {
        None => {
            return Err(Rejection::new(
                "missing-key",
                "message_id (the idempotency key) is required",
            ))
        }
        Some(id) => IdempotencyKey::from_unquoted(id.as_str())
            .map_err(|e| Rejection::new("malformed-key", format!("message_id: {e}")))?,
    };
    let tenant = tenant(properties)?;
    if let Some(ct) = properties.content_type() {
        if !problem::is_json(ct.as_str()) {
            return Err(Rejection::new(
                "unsupported-content-type",
                format!(
                    "content_type {:?}: commands are application/json",
                    ct.as_str()
                ),
            ));
        }
    }
    let reply_to = properties
        .reply_to()
        .as_ref()
        .map(|r| r.as_str().to_owned())
        .filter(|r| !r.is_empty());
    if reply_to.as_deref().is_some_and(|r| !printable(r)) {
        return Err(Rejection::new(
            "malformed-reply-to",
            "reply_to (the queue for the result) must have no control characters",
        ));
    }
    let correlation_id = properties
        .correlation_id()
        .as_ref()
        .map(|c| c.as_str().to_owned());
    if correlation_id.as_deref().is_some_and(|c| !printable(c)) {
        return Err(Rejection::new(
            "malformed-correlation-id",
            "correlation_id must have no control characters",
        ));
    }
    let invalid =
        |e: idem_core::domain::FieldError| Rejection::new("invalid-body", format!("body: {e}"));
    let request = match properties.kind().as_ref().map(|t| t.as_str()) {
        None | Some("charge") => Request::Charge(ChargeRequest::from_json(body).map_err(invalid)?),
        Some("refund") => Request::Refund(RefundIntent {
            charge_id: charge_id(properties)?,
            request: RefundRequest::from_json(body).map_err(invalid)?,
        }),
        Some("capture") => Request::Capture(CaptureIntent {
            charge_id: charge_id(properties)?,
            request: CaptureRequest::from_json(body).map_err(invalid)?,
        }),
        Some("void") => {
            let charge_id = charge_id(properties)?;
            parse_void_body(body).map_err(invalid)?;
            Request::Void(VoidIntent { charge_id })
        }
        Some(other) => {
            return Err(Rejection::new(
                "unknown-type",
                format!(
                    "type {other:?}: a command is a `charge` (or has no type), a `refund`, a \
                     `capture` or a `void`"
                ),
            ))
        }
    };
    Ok(Command {
        key,
        tenant,
        request,
        reply_to,
        correlation_id,
    })
}

/// The charge a refund command names in its `charge_id` header.
fn charge_id(properties: &BasicProperties) -> Result<ChargeId, Rejection> {
    let value = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(CHARGE_ID_HEADER));
    let text =
        match value {
            None => return Err(Rejection::new(
                "missing-charge-id",
                "a refund, a capture or a void needs the header `charge_id` (the charge it acts \
                 on)",
            )),
            Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).ok(),
            Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
            Some(_) => None,
        };
    text.as_deref().and_then(ChargeId::parse).ok_or_else(|| {
        Rejection::new(
            "malformed-charge-id",
            "the header `charge_id` must be a charge's id (ch_ and 24 letters and digits)",
        )
    })
}

fn tenant(properties: &BasicProperties) -> Result<String, Rejection> {
    let value = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(TENANT_HEADER));
    let name = match value {
        None => {
            return Err(Rejection::new(
                "missing-tenant",
                "the header `tenant` (the merchant's name) is required",
            ))
        }
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
        Some(_) => None,
    };
    match name {
        Some(n) if !n.is_empty() && printable(&n) => Ok(n),
        _ => Err(Rejection::new(
            "malformed-tenant",
            "the header `tenant` must be a non-empty UTF-8 string without control characters",
        )),
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldTable;

    use super::*;

    const BODY: &[u8] = br#"{"order_id": 1, "amount_cents": 25000}"#;

    fn props(key: Option<&str>, tenant: Option<AMQPValue>) -> BasicProperties {
        let mut p = BasicProperties::default().with_content_type(problem::JSON.into());
        if let Some(k) = key {
            p = p.with_message_id(k.into());
        }
        if let Some(t) = tenant {
            let mut h = FieldTable::default();
            h.insert(TENANT_HEADER.into(), t);
            p = p.with_headers(h);
        }
        p
    }

    fn tenant(name: &str) -> Option<AMQPValue> {
        Some(AMQPValue::LongString(name.into()))
    }

    #[test]
    fn a_complete_command_parses() {
        let p = props(Some("k-1"), tenant("acme"))
            .with_reply_to("replies".into())
            .with_correlation_id("c-9".into());
        let c = parse(&p, BODY).unwrap();
        assert_eq!(c.key.as_str(), "k-1");
        assert_eq!(c.tenant, "acme");
        let Request::Charge(request) = &c.request else {
            panic!("a command without a type is a charge")
        };
        assert_eq!(request.amount_cents.get(), 25000);
        assert_eq!(c.reply_to.as_deref(), Some("replies"));
        assert_eq!(c.correlation_id.as_deref(), Some("c-9"));
    }

    /// A refund command: `type: refund`, the charge in its header.
    fn refund_props(charge_id: Option<&str>) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(TENANT_HEADER.into(), AMQPValue::LongString("acme".into()));
        if let Some(id) = charge_id {
            h.insert(CHARGE_ID_HEADER.into(), AMQPValue::LongString(id.into()));
        }
        BasicProperties::default()
            .with_message_id("r-1".into())
            .with_type("refund".into())
            .with_headers(h)
    }

    #[test]
    fn a_refund_command_names_its_charge_and_an_unknown_type_is_refused() {
        let charge = ChargeId::generate();
        let c = parse(
            &refund_props(Some(charge.as_str())),
            br#"{"amount_cents": 5}"#,
        )
        .expect("a refund command");
        let Request::Refund(intent) = &c.request else {
            panic!("a refund")
        };
        assert_eq!(intent.charge_id, charge);
        assert_eq!(intent.request.amount_cents.map(|a| a.get()), Some(5));
        let code = |p: &BasicProperties, body: &[u8]| parse(p, body).expect_err("refused").code;
        assert_eq!(code(&refund_props(None), b"{}"), "missing-charge-id");
        assert_eq!(
            code(&refund_props(Some("ch_nope")), b"{}"),
            "malformed-charge-id"
        );
        assert_eq!(
            code(
                &refund_props(Some(charge.as_str())),
                br#"{"amount_cents": 0}"#
            ),
            "invalid-body"
        );
        let void = refund_props(Some(charge.as_str())).with_type("void".into());
        assert!(matches!(
            parse(&void, b"{}").map(|c| c.request),
            Ok(Request::Void(_))
        ));
        assert_eq!(code(&void, br#"{"amount_cents": 1}"#), "invalid-body");
        let capture = refund_props(Some(charge.as_str())).with_type("capture".into());
        assert!(matches!(
            parse(&capture, br#"{"amount_cents": 10, "final": false}"#).map(|c| c.request),
            Ok(Request::Capture(_))
        ));
        assert_eq!(code(&capture, br#"{"final": 1}"#), "invalid-body");
        let other = refund_props(Some(charge.as_str())).with_type("authorize".into());
        assert_eq!(code(&other, b"{}"), "unknown-type");
    }

    #[test]
    fn each_missing_or_bad_part_has_its_own_code() {
        let cases: [(BasicProperties, &[u8], &str); 7] = [
            (props(None, tenant("acme")), BODY, "missing-key"),
            (props(Some(""), tenant("acme")), BODY, "malformed-key"),
            (props(Some("k"), None), BODY, "missing-tenant"),
            (
                props(Some("k"), Some(AMQPValue::LongLongInt(7))),
                BODY,
                "malformed-tenant",
            ),
            (
                props(Some("k"), tenant("acme")),
                b"{not json",
                "invalid-body",
            ),
            (
                props(Some("k"), tenant("acme")),
                br#"{"order_id": 1, "amount_cents": -5}"#,
                "invalid-body",
            ),
            (
                props(Some("k"), tenant("acme")).with_content_type("text/plain".into()),
                BODY,
                "unsupported-content-type",
            ),
        ];
        for (p, body, code) in cases {
            let rejection = parse(&p, body).unwrap_err();
            assert_eq!(rejection.code, code, "{rejection:?}");
            assert!(!rejection.reason.is_empty());
        }
    }

    #[test]
    fn control_characters_in_stored_text_are_refused_with_their_own_code() {
        let ok = || props(Some("k"), tenant("acme"));
        let cases: [(BasicProperties, &str); 5] = [
            (props(Some("k"), tenant("ac\0me")), "malformed-tenant"),
            (props(Some("k"), tenant("acme\n")), "malformed-tenant"),
            (ok().with_reply_to("re\0plies".into()), "malformed-reply-to"),
            (
                ok().with_correlation_id("c\0-9".into()),
                "malformed-correlation-id",
            ),
            (
                ok().with_correlation_id("c\u{7f}".into()),
                "malformed-correlation-id",
            ),
        ];
        for (p, code) in cases {
            let rejection = parse(&p, BODY).unwrap_err();
            assert_eq!(rejection.code, code, "{rejection:?}");
            assert!(rejection.reason.contains("control characters"));
        }
        // Anything printable is taken as written, Unicode included.
        let c = parse(&ok().with_correlation_id("pedido nº 7".into()), BODY).unwrap();
        assert_eq!(c.correlation_id.as_deref(), Some("pedido nº 7"));
    }

    #[test]
    fn the_message_id_is_the_key_exactly_as_written() {
        // No header quoting on AMQP: quotes are part of the key.
        let c = parse(&props(Some(r#""k""#), tenant("acme")), BODY).unwrap();
        assert_eq!(c.key.as_str(), r#""k""#);
    }

    #[test]
    fn the_body_error_names_the_field() {
        let p = props(Some("k"), tenant("acme"));
        let r = parse(&p, br#"{"order_id": 1, "amount_cents": -5}"#).unwrap_err();
        assert!(r.reason.contains("amount_cents"), "{}", r.reason);
    }
}
