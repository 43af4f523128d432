//! The lab's integration tests: its commands run as real `idem-lab`
//! processes, which start real `idem serve` processes (from the lab's own
//! binary, which carries idem's commands), on real PostgreSQL or, with
//! `IDEM_TEST_STORE=sqlite`, SQLite files of their own.

mod bench;
mod conformance;
mod demo;
mod refunds;
mod sim_on_loopback;
mod two_step;
mod verify;
