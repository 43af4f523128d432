//! Background work beside the API, each a loop that takes a cancellation token:
//!
//! - [`reconciler`]: settles charges left `processing` by a crash, a hang or an
//!   unknown acquirer outcome, when no client retries them;
//! - [`sweeper`]: deletes key records past their time to live.

pub mod reconciler;
pub mod sweeper;

pub use reconciler::{Reconciler, ReconcilerConfig};
pub use sweeper::Sweeper;
