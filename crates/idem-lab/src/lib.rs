//! idem's lab: what shows and measures idem, and what its tests start. None of
//! it ships in the `idem` binary operators deploy.
//!
//! - [`sim`]: the acquirer simulator with fault injection and a ledger;
//! - [`harness`]: real `idem serve` processes on scratch databases, for demo and bench;
//! - [`timeline`], [`progress`]: an intent drawn in time, and a progress line, for demo and verify;
//! - [`demo`]: `idem-lab demo`, the article's story under three strategies;
//! - [`verify`]: `idem-lab verify`, the promise checked against any deployment;
//! - [`bench`]: `idem-lab bench`, load figures against pgbench's for the same statements;
//! - [`cmd`]: the `idem-lab` command line: the lab's subcommands beside all of `idem`'s.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cmd;
pub mod demo;
pub mod harness;
pub mod progress;
pub mod sim;
pub mod timeline;
pub mod verify;
