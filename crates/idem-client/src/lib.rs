//! `idem-client`: a client for the idem charge API that does retries right.
//!
//! One call to [`Client::charge`] is one payment intent: it picks one
//! idempotency key and sends the same key with the same bytes on every attempt,
//! so however often it retries, the server charges at most once. It retries only
//! what may succeed on a retry (timeouts, lost connections, `409`, `429`, `503`,
//! `504`, a gateway's `502`), waits with full-jitter exponential backoff that
//! never undercuts the server's `Retry-After`, asks an in-flight duplicate to
//! wait for the first attempt's outcome (`Prefer: wait`), spreads attempts over
//! the given instances, and never runs past its time budget. [`Client::refund`]
//! is one refund intent under the same discipline (its own key, made once), and
//! so are the steps of a two-step payment: [`Client::authorize`] (a charge
//! with `"capture": false`), [`Client::capture`] (part or all of what it
//! holds, [`CaptureRequest`]) and [`Client::void`] (release the rest). A `409`
//! that another step of the same authorization settles (`authorization-closed`,
//! `capture-pending`) is retried like an in-flight one; a refusal (`422`) is
//! the final answer. It behaves as the
//! Python and TypeScript clients do (`clients/README.md`), and all three pass one
//! conformance suite (`clients/conformance/`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem_client::ClientError> {
//! use idem_client::{ChargeRequest, Client, RetryPolicy};
//!
//! let client = Client::new(
//!     vec!["http://127.0.0.1:8080".into(), "http://127.0.0.1:8081".into()],
//!     "sk_test_secret",
//!     RetryPolicy::default(),
//! )?;
//! let request = ChargeRequest {
//!     order_id: 123,
//!     amount_cents: 25_000,
//!     currency: Some("BRL".into()),
//!     description: None,
//! };
//! let answer = client.charge(&request).await?;
//! println!("{} after {} attempts", answer.status, answer.attempts.len());
//! # Ok(())
//! # }
//! ```
//!
//! Two steps: authorize at checkout, capture in parts as the order ships, void
//! the rest. Each call is its own intent with its own key (store the keys of
//! real intents beside the order first, and use the `_with_key` calls).
//!
//! ```no_run
//! # async fn demo(client: idem_client::Client, request: idem_client::ChargeRequest)
//! # -> Result<(), idem_client::ClientError> {
//! use idem_client::CaptureRequest;
//!
//! let authorized = client.authorize(&request).await?; // 201: status "authorized"
//! let charge: serde_json::Value = serde_json::from_slice(&authorized.body).unwrap();
//! let id = charge["id"].as_str().unwrap();
//! let part = CaptureRequest {
//!     amount_cents: Some(10_000),
//!     final_capture: false,
//! };
//! client.capture(id, &part).await?; // 201: the capture, cp_...
//! client.void(id).await?; // 201: the void, vd_..., releasing the rest
//! # Ok(())
//! # }
//! ```
//!
//! Modules: [`policy`] (how long to wait and when to stop), [`answer`] (what one
//! intent sends and gets back), [`client`] (the attempt loop), [`error`].
#![forbid(unsafe_code)]

pub mod answer;
pub mod client;
pub mod error;
pub mod policy;

pub use answer::{
    Attempt, AttemptOutcome, CaptureRequest, ChargeAnswer, ChargeRequest, RefundRequest,
};
pub use client::{error_chain, Client};
pub use error::ClientError;
pub use policy::{backoff_delay, prefer_wait_secs, RetryPolicy};
