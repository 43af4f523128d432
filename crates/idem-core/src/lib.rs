//! idem's core: what a charge is, where it is kept, and the engine that makes
//! it happen exactly once. No HTTP server, no broker, no command line: those
//! are the service's (`idem`), and this crate cannot reach them (Cargo keeps
//! the layer). docs/design.md draws the picture.
//!
//! - [`domain`]: the values a charge is made of, each a type that is always valid;
//! - [`problem`]: problem+json bodies, the contract's errors;
//! - [`acquirer`]: the external processor's protocol and idem's client for it;
//! - [`store`]: PostgreSQL and SQLite, one function per operation, beside the table it owns;
//! - [`idempotency`]: the engine (claim, call, finalize; replay, 409, 422, take-over);
//! - [`metrics`]: the Prometheus metrics idem records;
//! - [`trace`]: W3C trace context in and out, when tracing is on;
//! - [`crash`]: test-only crash points (cargo feature `crash-points`).
#![forbid(unsafe_code)]

pub mod acquirer;
pub mod crash;
pub mod domain;
pub mod idempotency;
pub mod metrics;
pub mod problem;
pub mod store;
pub mod trace;
