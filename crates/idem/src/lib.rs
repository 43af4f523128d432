//! idem — a payment charge service that charges exactly once.
//!
//! A client that times out and retries is never charged twice, however many
//! instances run and whatever crashes in between. The layout names the parts
//! (docs/design.md draws which way they depend on each other):
//!
//! - [`domain`]: the values a charge is made of, each a type that is always valid;
//! - [`idempotency`]: the engine (claim, call, finalize; replay, 409, 422, take-over);
//! - [`store`]: PostgreSQL and SQLite, one function per operation, beside the table it owns;
//! - [`acquirer`]: the external processor's protocol and idem's client for it;
//! - [`http`]: the API (axum), errors as problem+json;
//! - [`sim`]: the acquirer simulator with fault injection and a ledger;
//! - [`queue`]: charges from RabbitMQ (the idempotent consumer) and the outbox relay;
//! - [`workers`]: background work: the reconciler and the key sweeper;
//! - [`webhooks`]: charge outcomes told to merchants' endpoints, signed and retried;
//! - [`crash`]: test-only crash points (cargo feature `crash-points`);
//! - [`demo`]: `idem demo`, the article's story under three strategies;
//! - [`bench`]: `idem bench`, load figures against pgbench's for the same statements;
//! - [`harness`]: real `idem serve` processes on scratch databases, for demo and bench;
//! - [`metrics`]: the Prometheus metrics idem records;
//! - `app`: the composition root, the only place that starts things: builds the
//!   engine, and starts and stops `serve` and `consume` in order;
//! - [`cmd`]: the `idem` command line, one module per subcommand.
#![forbid(unsafe_code)]

pub mod acquirer;
pub(crate) mod app;
pub(crate) mod bench;
pub mod cmd;
pub(crate) mod crash;
pub(crate) mod demo;
pub mod domain;
pub(crate) mod harness;
pub mod http;
pub mod idempotency;
pub(crate) mod metrics;
pub(crate) mod problem;
pub mod queue;
pub mod sim;
pub mod store;
pub mod webhooks;
pub mod workers;

/// The environment variable that sets the log filter (tracing's `EnvFilter`
/// syntax), for `idem` and for the `idem serve` processes it starts.
pub const LOG_ENV: &str = "IDEM_LOG";
