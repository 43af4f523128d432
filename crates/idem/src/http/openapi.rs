//! The OpenAPI 3.1 document of the API, generated from the handlers'
//! `#[utoipa::path]` annotations and the schemas of the types they send and
//! receive. `GET /openapi.json` serves it, `idem openapi` prints it, and
//! `docs/openapi.json` is a committed copy that a test keeps from going stale.
//!
//! The document is built once and its bytes reused, so every instance and the
//! committed copy answer exactly the same text.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{HeaderBuilder, ObjectBuilder, RefOr, Type};
use utoipa::{Modify, OpenApi};

use super::schemas::REQUEST_ID;
use super::{charges, keys, ops, refunds, steps};
use idem_core::domain::{CaptureRequest, Charge, ChargeRequest, Refund, RefundRequest, Step};
use idem_core::problem::Problem;

/// What the document says of the service as a whole: the promise, the key's
/// retention (`docs/contract/api.md`, "Retention") and where the error kinds are described.
const DESCRIPTION: &str = "\
A payment charge service that charges exactly once, however often the client retries.

Every `POST /v1/charges` carries an `Idempotency-Key`, one per intent. The first \
attempt with a key claims it, calls the acquirer and stores the final outcome \
(captured `201`, declined `402`, rejected `502`); every retry with the same key and \
the same request gets that stored answer again, byte for byte, with \
`Idempotent-Replayed: true`. A retry while the first attempt is still at the \
acquirer gets `409` at once; the same key with a different request gets `422`.

**Retention.** A key and its stored outcome are honoured for the key TTL, counted \
from when the outcome is stored: 24 hours by default, set per deployment with \
`idem serve --key-ttl` (`IDEM_KEY_TTL`). After that the same key with another \
request is a new intent (a new charge), while a late retry of the same request \
gets `410 key-expired` naming the charge it made, and is not charged again. A key \
whose charge is still `processing` never expires, and expiry never deletes a \
charge. `GET /v1/idempotency-keys/{key}` tells a key's state without sending the \
request again.

**Errors** are `application/problem+json` (RFC 9457). Branch on `type`, a stable \
URN per kind of error (`urn:idem:problem:...`), never on `title` or `detail`. \
Every error except `402` and `502` leaves nothing stored, so the same key can be \
sent again with a corrected request.

Keys are scoped to the merchant: the same key from two merchants is two intents, \
and no merchant can see another's charges.";

#[derive(OpenApi)]
#[openapi(
    info(title = "idem", description = DESCRIPTION),
    paths(
        charges::create,
        charges::get,
        refunds::create,
        refunds::list,
        refunds::get,
        steps::capture,
        steps::void,
        steps::list,
        steps::get_capture,
        steps::get_void,
        keys::get,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        openapi_json
    ),
    components(schemas(
        Charge,
        ChargeRequest,
        Refund,
        RefundRequest,
        Step,
        CaptureRequest,
        Problem,
        keys::KeyState
    )),
    modifiers(&Finish),
    tags(
        (name = "charges", description = "Charging, once per Idempotency-Key; every request needs the merchant's bearer secret."),
        (name = "refunds", description = "Money back from a captured charge, once per Idempotency-Key, never more in all than it captured."),
        (name = "two-step", description = "Authorize now (`\"capture\": false`), capture later in one or more parts, or void: each step once per Idempotency-Key, the captures never more in all than the authorization, nothing captured after a void."),
        (name = "operations", description = "Liveness, readiness, metrics and this document; no authentication."),
    )
)]
struct ApiDoc;

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    responses(
        (status = OK, description = "This OpenAPI 3.1 document.", body = Object,
            content_type = "application/json"),
    ),
)]
pub async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
        .into_response()
}

/// The document as pretty JSON with a final newline: what `/openapi.json`
/// serves, `idem openapi` prints and `docs/openapi.json` holds.
pub fn document_json() -> &'static str {
    &DOCUMENT
}

/// Each documented operation as (route template, method in capitals, the
/// statuses it may answer): the label values of its requests' metric.
pub fn answers() -> Vec<(String, String, Vec<u16>)> {
    let doc: Value = serde_json::from_str(document_json()).unwrap_or_default();
    let mut out = Vec::new();
    for (path, operations) in doc["paths"].as_object().into_iter().flatten() {
        for (method, operation) in operations.as_object().into_iter().flatten() {
            let statuses = operation["responses"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(status, _)| status.parse().ok())
                .collect();
            out.push((path.clone(), method.to_uppercase(), statuses));
        }
    }
    out
}

static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    mark_required_headers(&mut doc);
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
});

/// Response headers sent on every response they are documented for. utoipa's
/// header object has no `required` flag, so it is set on the JSON.
const REQUIRED_HEADERS: [&str; 4] = ["Location", "Retry-After", "WWW-Authenticate", REQUEST_ID];

fn mark_required_headers(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    let operations = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let Some(responses) = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for response in responses.values_mut() {
            let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) else {
                continue;
            };
            for (name, header) in headers.iter_mut() {
                if REQUIRED_HEADERS.contains(&name.as_str()) {
                    if let Some(header) = header.as_object_mut() {
                        header.insert("required".to_owned(), Value::Bool(true));
                    }
                }
            }
        }
    }
}

/// What the annotations cannot say per handler: the bearer scheme, and the
/// request id the middleware puts on every response.
struct Finish;

impl Modify for Finish {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = doc.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "The merchant's secret, as `idem merchant create NAME` printed it.",
                        ))
                        .build(),
                ),
            );
        }
        let request_id = HeaderBuilder::new()
            .schema(ObjectBuilder::new().schema_type(Type::String))
            .description(Some(
                "The request's id, also on its log lines: the client's own `X-Request-Id` \
                 if it sent one, else a new one, unique per process and request.",
            ))
            .build();
        for item in doc.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.options,
                &mut item.head,
                &mut item.patch,
                &mut item.trace,
            ];
            for operation in operations.into_iter().flatten() {
                for response in operation.responses.responses.values_mut() {
                    if let RefOr::T(response) = response {
                        response
                            .headers
                            .insert(REQUEST_ID.to_owned(), request_id.clone());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use regex::Regex;

    use super::*;
    use idem_core::domain::IdempotencyKey;
    use idem_core::domain::{AmountCents, ChargeId, Currency, Description, OrderId};
    use idem_core::problem::ProblemKind;

    fn doc() -> Value {
        serde_json::from_str(document_json()).expect("the document is JSON")
    }

    fn component(name: &str) -> Value {
        doc()["components"]["schemas"][name].clone()
    }

    fn pattern(schema: &Value) -> Regex {
        Regex::new(schema["pattern"].as_str().expect("a pattern")).expect("a valid pattern")
    }

    /// The `Idempotency-Key` header's schema, as a predicate.
    fn key_schema() -> impl Fn(&str) -> bool {
        let doc = doc();
        let forms: Vec<Regex> = doc["paths"]["/v1/charges"]["post"]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == "Idempotency-Key")
            .expect("the Idempotency-Key parameter")["schema"]["oneOf"]
            .as_array()
            .expect("two forms")
            .iter()
            .map(pattern)
            .collect();
        assert_eq!(forms.len(), 2);
        move |value| forms.iter().filter(|f| f.is_match(value)).count() == 1
    }

    #[test]
    fn retention_in_the_description_is_the_default_key_ttl() {
        use clap::Parser;
        let cli = crate::cmd::Cli::try_parse_from(["idem", "serve"]).expect("defaults parse");
        let crate::cmd::Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        let hours = args.engine.key_ttl.as_secs() / 3600;
        let said = format!("{hours} hours by default");
        assert!(
            DESCRIPTION.contains(&said),
            "the description must say {said:?}"
        );
    }

    #[test]
    fn integer_limits_are_the_parsers() {
        for (name, parse) in [
            (
                "OrderId",
                (|n| OrderId::parse(n).is_ok()) as fn(i64) -> bool,
            ),
            ("AmountCents", |n| AmountCents::parse(n).is_ok()),
        ] {
            let schema = component(name);
            let min = schema["minimum"].as_i64().expect("minimum");
            let max = schema["maximum"].as_i64().expect("maximum");
            assert!(parse(min) && parse(max), "{name}: the bounds are accepted");
            assert!(!parse(min - 1), "{name}: below the minimum is refused");
            if max < i64::MAX {
                assert!(!parse(max + 1), "{name}: above the maximum is refused");
            }
        }
    }

    #[test]
    fn every_problem_type_and_status_is_in_the_schema() {
        let problem = component("Problem");
        let types = problem["properties"]["type"]["enum"]
            .as_array()
            .expect("type enum");
        let status = &problem["properties"]["status"];
        for kind in ProblemKind::ALL {
            assert!(types.contains(&Value::from(kind.type_uri())), "{kind:?}");
            let s = i64::from(kind.status());
            assert!(status["minimum"].as_i64() <= Some(s) && Some(s) <= status["maximum"].as_i64());
        }
    }

    proptest! {
        #[test]
        fn key_schema_accepts_what_the_parser_accepts(
            value in prop_oneof![
                "[ -~]{0,300}",
                "[!-~]{254,257}",
                "\"[ -~]{0,300}\"",
                r#""[!#-\[\]-~]{254,257}""#,
                r#""([!#-\[\]-~]|\\["\\]){0,260}""#,
            ]
        ) {
            // HTTP strips blanks around a header value before idem sees it.
            prop_assume!(value.trim() == value);
            let accepted = IdempotencyKey::parse(value.as_bytes()).is_ok();
            prop_assert_eq!(accepted, key_schema()(&value), "{:?}", value);
        }

        #[test]
        fn currency_schema_accepts_what_the_parser_accepts(value in "[A-Za-z0-9]{0,5}|\\PC{0,4}") {
            let accepted = Currency::parse(&value).is_ok();
            prop_assert_eq!(accepted, pattern(&component("Currency")).is_match(&value));
        }

        #[test]
        fn description_schema_accepts_what_the_parser_accepts(
            value in prop_oneof![any::<String>(), "[a\\x00-\\x1f\\x7f-\\u{9f}\u{e9}]{490,510}"]
        ) {
            let schema = component("Description");
            let max = schema["maxLength"].as_u64().expect("maxLength") as usize;
            let by_schema = value.chars().count() <= max && pattern(&schema).is_match(&value);
            prop_assert_eq!(Description::parse(value.clone()).is_ok(), by_schema);
        }

        #[test]
        fn charge_id_schema_accepts_what_the_parser_accepts(
            value in "ch_[A-Za-z0-9_-]{22,26}|.{0,30}"
        ) {
            let by_schema = pattern(&component("ChargeId")).is_match(&value);
            prop_assert_eq!(ChargeId::parse(&value).is_some(), by_schema);
        }
    }
}
