//! idem — a payment charge service that charges exactly once.
//!
//! A client that times out and retries is never charged twice, however many
//! instances run and whatever crashes in between. This crate is the service
//! operators deploy: the edges around the core (`idem-core`: the charge's
//! values, the store, the acquirer client, the engine). docs/design.md draws
//! which way the parts depend on each other.
//!
//! - [`http`]: the API (axum), errors as problem+json, the operator console;
//! - [`queue`]: charges from RabbitMQ (the idempotent consumer) and the outbox relay;
//! - [`workers`]: background work: the reconciler and the key sweeper;
//! - [`webhooks`]: charge outcomes told to merchants' endpoints, signed and retried;
//! - `app`: the composition root, the only place that starts things: builds the
//!   engine, and starts and stops `serve` and `consume` in order;
//! - [`cmd`]: the `idem` command line, one module per subcommand.
//!
//! The lab (the acquirer simulator, the demo, the bench) is `idem-lab`, a
//! crate and a binary of its own: none of it ships in this one.
#![forbid(unsafe_code)]

pub(crate) mod app;
pub mod cmd;
pub mod http;
pub mod queue;
pub mod webhooks;
pub mod workers;

/// The environment variable that sets the log filter (tracing's `EnvFilter`
/// syntax), for `idem` and for the `idem serve` processes the lab starts.
pub const LOG_ENV: &str = "IDEM_LOG";
