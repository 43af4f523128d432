//! The engine under unit test: each of its paths (the winner, the loser in
//! flight, the replay, the take-over and its fence, the unknown outcome
//! settled later, the contradiction sent to review, the late retry, the
//! acquirer's final refusals) for a charge, a refund, and a capture and a void
//! of an authorization, in milliseconds and without a server.
//!
//! The engine here is the real one, over a real database (a fresh SQLite
//! file per test, [`idem_testkit::db::TestDb`]); only the acquirer is not:
//! [`fake::FakeAcquirer`] answers each call from the test's script, counts
//! the calls by reference, and holds a call at a gate to play an acquirer
//! that hangs at the worst moment. What the real client makes of the wire is
//! the lab's and the service's suites' to prove, against the simulator.
//!
//! ```sh
//! cargo test -p idem-core --test engine
//! ```

mod charges;
mod fake;
mod refunds;
mod steps;
mod support;
