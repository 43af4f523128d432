//! Test harness, one module per thing a test starts: a database of its own
//! (`idem_testkit::db`, shared with the store's contract suite), a disk that
//! fills up ([`disk`]), the acquirer simulator ([`sim`]), the engine and the API in
//! process ([`app`], with `Env`, the usual set-up), real `idem` processes
//! ([`process`]), a client ([`http`]), and a proxy that cuts the database's
//! connection ([`proxy`]). Tests take them all with `use crate::helpers::*`.

mod app;
mod disk;
mod http;
mod process;
mod proxy;
mod sim;

pub use app::*;
pub use disk::*;
pub use http::*;
pub use idem_testkit::db::*;
pub use idem_testkit::run::{runs_on, timing_sensitive};
pub use process::*;
pub use proxy::*;
pub use sim::*;
