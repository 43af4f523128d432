//! The idempotency engine: how one intent, however often it arrives and on
//! whichever instance, leads to at most one capture and one stored answer.
//!
//! The values it works with are the domain's: the [`IdempotencyKey`] (the
//! header, parsed), the request's [`Fingerprint`] and the [`StoredResponse`].
//!
//! - [`Engine`] runs the article's order: claim (insert first, commit), call the
//!   acquirer outside any transaction, finalize under a fencing token; the loser
//!   of a claim replays, refuses (422), waits (409) or takes over an expired lease.
//! - `decision.rs`: what the loser of a claim does with the record it found,
//!   as a pure function.
//! - [`InFlightMemo`] answers repeated duplicates of an in-flight key from memory.
//! - [`ReplayCache`] answers replays of a completed key from memory, until the
//!   key's expiry on the database's clock.
//! - [`Operation`] (`operation.rs`): what differs between the operations the
//!   engine runs, a charge (`charge.rs`), a refund of one (`refund.rs`), and
//!   a capture or a void of an authorized charge (`step.rs`):
//!   their requests, their store calls, the acquirer's call, the answers.
//! - `operator.rs`: an operator's retry and resolve of one charge, through the
//!   same take-over and finalize.

mod charge;
mod decision;
mod engine;
mod memo;
mod operation;
mod operator;
mod refund;
mod replays;
mod step;

#[cfg(doc)]
use crate::domain::{Fingerprint, IdempotencyKey, StoredResponse};
pub use engine::{Engine, EngineConfig, EngineError, Outcome, Reconciled};
pub use memo::InFlightMemo;
pub use operation::{Final, Operable, Operation};
pub use operator::{AcquirerWord, OperatorError, Resolution};
pub use refund::{refusal_kind, refusal_response};
pub use replays::ReplayCache;
