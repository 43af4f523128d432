//! Integration tests: real PostgreSQL or, with `IDEM_TEST_STORE=sqlite`, real
//! SQLite (a fresh database per test, either way), the real
//! acquirer simulator over loopback, and real `idem serve` processes where
//! processes matter (several instances, kill -9).

mod broker;
mod helpers;

mod acquirer;
mod alerts;
mod api;
mod batch;
mod concurrency;
mod console;
mod crash;
mod events;
mod faults;
mod ha;
mod hostile;
mod keys;
mod openapi;
mod operators;
mod outcomes;
mod queue;
mod race;
mod recovery;
mod refunds_api;
mod retention;
mod rolling;
mod store;
mod tenant;
mod tls;
mod traces;
mod two_step;
mod wait;
mod webhooks;
