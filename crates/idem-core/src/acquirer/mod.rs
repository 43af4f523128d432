//! The acquirer: its wire protocol (shared with the simulator) and idem's client.
//!
//! The client's one rule: only the acquirer's word is final — `201` captured
//! and `402` declined, each with a body for this reference, and `422`. Every
//! other answer (any other status, a timeout, a reset, an unreadable body) is
//! [`AcquirerError::Unknown`]: money may have moved, and only another call with
//! the same reference can settle it. A `201` whose echo names another order,
//! amount or currency is final but not this charge's capture
//! ([`AcquirerError::Contradicted`]): it goes to a person.
//!
//! Refunds keep the same rule (`201` refunded, `422` refused, everything else
//! unknown), with one more step: a `422` is believed only once a lookup of
//! the refund's reference does not find it paid.
//!
//! Two-step payments keep it too. An authorization answers as a one-step
//! capture (`201` authorized, `402` declined, `422` refused). A capture of an
//! authorization and a void answer as a refund (`201` made, `422` refused,
//! the refusal looked up before it is believed), since a retry of either can
//! find the authorization used up or closed by its own first attempt.

mod client;
pub mod protocol;

pub use client::describe as describe_transport_error;
pub use client::{
    AcquirerClient, AcquirerError, AuthorizationCaptureSettled, AuthorizationCaptured,
    AuthorizationSettled, Authorized, Captured, Contradiction, Declined, RefundSettled, Refunded,
    Settled, Unknown, VoidSettled, Voided,
};
