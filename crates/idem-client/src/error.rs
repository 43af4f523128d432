//! The client's one error type, in the words of a caller deciding what to do next.
//!
//! A final answer from the server (`201`, `402`, `422`, `400`, ...) is never an
//! error here: it is a [`crate::ChargeAnswer`]. An error means either the client
//! could not be set up or no final answer was obtained in the retry budget.

use crate::answer::Attempt;

/// Why no [`crate::ChargeAnswer`] could be returned.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// [`crate::Client::new`] was given an empty list of base URLs.
    #[error("no endpoints given")]
    NoEndpoints,
    /// The client or a request could not be built: a base URL that is not
    /// `http://`, a secret or key that cannot be an HTTP header value, or a
    /// request body that could not be encoded. Retrying cannot fix it.
    #[error("building the HTTP client: {0}")]
    Build(String),
    /// Retries exhausted (attempts or time) without a final answer.
    ///
    /// The charge (or the refund, authorization, capture or void) may still
    /// have happened (a timeout or a `503` leaves the outcome unknown). Retry
    /// later with the same `key` and request through
    /// [`crate::Client::charge_with_key`] (or `refund_with_key`,
    /// `authorize_with_key`, `capture_with_key`, `void_with_key`) to learn it
    /// without doing it twice.
    #[error("gave up on key {key} after {} attempts: {last}", attempts.len())]
    GaveUp {
        /// The idempotency key every attempt carried: the handle to finish this intent.
        key: String,
        /// Every attempt in order; empty only when the time budget was zero.
        attempts: Vec<Attempt>,
        /// The last attempt's outcome and why no further attempt was made.
        last: String,
    },
}
