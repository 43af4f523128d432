//! The answer an idempotency key keeps: what every replay repeats.

use bytes::Bytes;

/// The first outcome of a key: status and the exact body bytes, replayed byte
/// for byte for as long as the key lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Bytes,
}
