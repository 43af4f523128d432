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
//!
//! The engine sees the acquirer only through [`Acquirer`], the ten calls it
//! makes; [`AcquirerClient`] is the one implementation that speaks HTTP, and a
//! test may put a scripted one in its place (`crates/idem-core/tests/engine/`).

mod client;
pub mod protocol;

use protocol::{
    AuthorizationCaptureRequest, AuthorizationRequest, CaptureRequest, RefundRequest, VoidRequest,
};

pub use client::describe as describe_transport_error;
pub use client::{
    AcquirerClient, AcquirerError, AuthorizationCaptureSettled, AuthorizationCaptured,
    AuthorizationSettled, Authorized, Captured, Contradiction, Declined, RefundSettled, Refunded,
    Settled, Unknown, VoidSettled, Voided,
};

/// The acquirer as the engine calls it: a POST and a lookup per kind of
/// request, each under the request's reference. What an implementation
/// promises is the client's rule above: `Ok` and the errors other than
/// [`AcquirerError::Unknown`] are the acquirer's final word for the reference
/// (and a lookup's `Ok(None)` only that it has none *yet*); anything it cannot
/// vouch for is `Unknown`.
#[async_trait::async_trait]
pub trait Acquirer: Send + Sync {
    /// Captures a one-step charge.
    async fn capture(&self, request: &CaptureRequest) -> Settled;
    /// The outcome of a one-step charge's capture, if the acquirer has one.
    async fn lookup(&self, request: &CaptureRequest) -> Result<Option<Settled>, AcquirerError>;
    /// Pays a refund back from a capture.
    async fn refund(&self, request: &RefundRequest) -> RefundSettled;
    /// The outcome of a refund, if the acquirer has one.
    async fn lookup_refund(
        &self,
        request: &RefundRequest,
    ) -> Result<Option<RefundSettled>, AcquirerError>;
    /// Authorizes a two-step charge.
    async fn authorize(&self, request: &AuthorizationRequest) -> AuthorizationSettled;
    /// The outcome of an authorization, if the acquirer has one.
    async fn lookup_authorization(
        &self,
        request: &AuthorizationRequest,
    ) -> Result<Option<AuthorizationSettled>, AcquirerError>;
    /// Captures part or all of an authorization.
    async fn capture_authorization(
        &self,
        request: &AuthorizationCaptureRequest,
    ) -> AuthorizationCaptureSettled;
    /// The outcome of a capture of an authorization, if the acquirer has one.
    async fn lookup_authorization_capture(
        &self,
        request: &AuthorizationCaptureRequest,
    ) -> Result<Option<AuthorizationCaptureSettled>, AcquirerError>;
    /// Voids what an authorization still holds.
    async fn void(&self, request: &VoidRequest) -> VoidSettled;
    /// The outcome of a void, if the acquirer has one.
    async fn lookup_void(
        &self,
        request: &VoidRequest,
    ) -> Result<Option<VoidSettled>, AcquirerError>;
}
