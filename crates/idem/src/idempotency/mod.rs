//! The idempotency engine: how one intent, however often it arrives and on
//! whichever instance, leads to at most one capture and one stored answer.
//!
//! - [`IdempotencyKey`] parses the `Idempotency-Key` header (both forms).
//! - [`Fingerprint`] identifies "the same request" independent of JSON layout.
//! - [`Engine`] runs the article's order: claim (insert first, commit), call the
//!   acquirer outside any transaction, finalize under a fencing token; the loser
//!   of a claim replays, refuses (422), waits (409) or takes over an expired lease.
//! - [`InFlightMemo`] answers repeated duplicates of an in-flight key from memory.

mod engine;
mod fingerprint;
mod key;
mod memo;

pub use engine::{
    final_response, Engine, EngineConfig, EngineError, Outcome, Reconciled, StoredResponse,
};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError};
pub use memo::{InFlightMemo, MEMO_FOR};
