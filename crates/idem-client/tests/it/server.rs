//! A scripted stand-in for the idem server: a real HTTP server on 127.0.0.1:0
//! that answers every request (`POST /v1/charges`, a refund, a capture, a
//! void: any path) from a list of steps and records every request it
//! receives, so a test can check what went over the wire.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Step {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    /// How long to sit on the request before answering (a hang, when long).
    delay: Duration,
}

impl Step {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: format!(r#"{{"answer":{status}}}"#),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = body.into();
        self
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// What one request carried.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: Method,
    pub path: String,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    pub content_type: Option<String>,
    pub prefer: Option<String>,
    pub body: Bytes,
}

#[derive(Default)]
struct Script {
    /// Steps still to play; the last one repeats forever.
    steps: Mutex<VecDeque<Step>>,
    received: Mutex<Vec<Received>>,
}

/// A running scripted server; it stops when the test's runtime ends.
pub struct Scripted {
    pub base: String,
    script: Arc<Script>,
}

impl Scripted {
    /// Starts a server playing `steps` in order, repeating the last one.
    pub async fn start(steps: Vec<Step>) -> Self {
        assert!(!steps.is_empty(), "a script needs at least one step");
        let script = Arc::new(Script {
            steps: Mutex::new(steps.into()),
            received: Mutex::default(),
        });
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            base: format!("http://{addr}"),
            script,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.script.received.lock().unwrap().clone()
    }
}

async fn answer(
    State(script): State<Arc<Script>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    script.received.lock().unwrap().push(Received {
        method,
        path: uri.path().to_owned(),
        idempotency_key: text("idempotency-key"),
        authorization: text("authorization"),
        content_type: text("content-type"),
        prefer: text("prefer"),
        body,
    });
    let step = {
        let mut steps = script.steps.lock().unwrap();
        if steps.len() > 1 {
            steps.pop_front().unwrap()
        } else {
            steps[0].clone()
        }
    };
    tokio::time::sleep(step.delay).await;
    let mut response = (StatusCode::from_u16(step.status).unwrap(), step.body).into_response();
    for (name, value) in step.headers {
        response.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

/// A base URL on which nothing listens: connecting to it is refused.
pub fn closed_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}
