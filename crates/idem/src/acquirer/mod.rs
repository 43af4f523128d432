//! The acquirer: its wire protocol (shared with the simulator) and idem's client.
//!
//! The client's one rule: an answer that is not a clear `201` or `402` is not a
//! decline. Timeouts, 5xx, dropped connections and unreadable bodies are
//! [`AcquirerError::Unknown`]: money may have moved, and only another call with
//! the same reference can settle it.

mod client;
pub mod protocol;

pub use client::{AcquirerClient, AcquirerError, Captured, Declined, Settled};
