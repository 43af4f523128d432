//! What idem's test suites (the service's and the lab's) start and share,
//! one module per thing started:
//!
//! - [`run`]: the test run's settings: the PostgreSQL server, the store under
//!   test, and the turns that timing-sensitive tests take;
//! - [`db`]: a database of a test's own, on either backend;
//! - [`broker`]: a virtual host of a test's own on the real RabbitMQ.
//!
//! A test that cannot reach what it needs fails and says so: it never passes
//! without it.
#![forbid(unsafe_code)]

pub mod broker;
pub mod db;
pub mod run;
