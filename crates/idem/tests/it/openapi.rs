//! The OpenAPI document: the committed copy is what the code generates, and
//! `GET /openapi.json` and `idem openapi` answer exactly that.

use std::path::PathBuf;

use idem_lab::sim::Faults;

use crate::helpers::Env;

const REGENERATE: &str = "cargo run -q -p idem -- openapi > docs/openapi.json";

fn committed() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; create it with `{REGENERATE}`", path.display()))
}

/// The first line where two texts differ, to say where a stale copy went wrong.
fn first_difference(a: &str, b: &str) -> String {
    let mut lines = a.lines().zip(b.lines()).enumerate();
    match lines.find(|(_, (x, y))| x != y) {
        Some((i, (x, y))) => format!("line {}: committed {x:?}, generated {y:?}", i + 1),
        None => format!(
            "committed has {} lines, generated {}",
            a.lines().count(),
            b.lines().count()
        ),
    }
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let committed = committed();
    let generated = idem::http::openapi_json();
    assert!(
        committed == generated,
        "docs/openapi.json is stale ({}). Regenerate it with `{REGENERATE}` and commit it.",
        first_difference(&committed, generated)
    );
}

#[test]
fn the_document_is_openapi_3_1_with_every_route_of_the_contract() {
    let doc: serde_json::Value = serde_json::from_str(idem::http::openapi_json()).expect("JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let routes = [
        ("/v1/charges", "post"),
        ("/v1/charges/{id}", "get"),
        // Issue 39 extends it with refunds.
        ("/v1/charges/{id}/refunds", "post"),
        ("/v1/charges/{id}/refunds", "get"),
        ("/v1/refunds/{id}", "get"),
        // Issue 41 extends it with the steps of a two-step payment.
        ("/v1/charges/{id}/captures", "post"),
        ("/v1/charges/{id}/captures", "get"),
        ("/v1/charges/{id}/void", "post"),
        ("/v1/captures/{id}", "get"),
        ("/v1/voids/{id}", "get"),
        // Issue 13 (part 4) extends the contract with this one.
        ("/v1/idempotency-keys/{key}", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
    ];
    for (path, method) in routes {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is documented"
        );
    }
    let paths = doc["paths"].as_object().expect("paths");
    let documented: usize = paths
        .values()
        .map(|p| p.as_object().map_or(0, |o| o.len()))
        .sum();
    assert_eq!(documented, routes.len(), "no route beyond the contract's");
}

#[tokio::test]
async fn a_running_server_serves_it() {
    let env = Env::start(Faults::default()).await;
    let answer = env
        .client
        .send(
            env.client
                .raw()
                .get(format!("{}/openapi.json", env.app.url)),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(
        std::str::from_utf8(&answer.body).expect("UTF-8"),
        committed(),
        "GET /openapi.json answers the committed document"
    );
}

#[tokio::test]
async fn idem_openapi_prints_it() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("openapi")
        .env("IDEM_LOG", "warn")
        .output()
        .await
        .expect("run idem openapi");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).expect("UTF-8"), committed());
}
