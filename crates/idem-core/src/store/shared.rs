//! What the store's parts share below the facade, so that none of them
//! imports it: the bounds on an operation's time and a batch's size, the
//! conversions they need, and a condition both backends write in their SQL.

use std::time::Duration;

use super::error::StoreError;

/// The longest one PostgreSQL operation takes, from taking a connection to
/// the answer, whatever the database and the network between do. A database
/// that answers nothing at all (a partition that drops packets and sends no
/// reset, a host frozen mid-way) makes the operation
/// [`StoreError::Unavailable`] at this deadline, and the request answers `503`
/// with `Retry-After`. As after any lost connection, a write it sent may or
/// may not have committed: a claim that did is in flight (a retry gets `409`
/// until its lease ends, then takes it over), a finalize that did is
/// replayed. PostgreSQL's own `statement_timeout` (2 s) ends a slow statement
/// before this; this is for the answer that never comes.
pub const STORE_DEADLINE: Duration = Duration::from_secs(5);

/// The longest a request waits on one store operation: a batched one waits
/// for the batch ahead of it (refused as late past [`ACQUIRE_TIMEOUT`]), then
/// its own batch runs within [`STORE_DEADLINE`].
pub const STORE_BOUND: Duration = Duration::from_secs(8);
const _: () =
    assert!(ACQUIRE_TIMEOUT.as_secs() + STORE_DEADLINE.as_secs() <= STORE_BOUND.as_secs());

/// How long a request waits for a pooled connection before answering 503:
/// long enough to ride out a burst, short enough that a client retries on a
/// healthy instance instead of hanging on a sick one.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Batches of claims (and of finalizes) at the database at once, per store:
/// while one is there, the next requests queue up to go together. One of
/// each: at 32 clients on PostgreSQL, 1 gave 3,094–3,170 new charges/s (8.7
/// claims per batch), 2 gave 2,718–2,814 (5.1), 4 gave 2,007–2,113 (3.1):
/// fewer, larger batches cost the database less per request (docs/benchmarks.md).
pub(super) const BATCHES_AT_ONCE: usize = 1;

/// Requests per batch at most: a batch's statement (and, on SQLite, its write
/// transaction) stays short, so the requests behind it do not wait long.
pub(super) const BATCH_CAP: usize = 64;

/// Both stores' condition on an expired authorization `c`: no void of its
/// expiry key (`idem-expiry:` and its id) was refused. A refused one is
/// final for its key: a person decides (the charge keeps its status), and no
/// pass asks again.
pub(super) const NO_REFUSED_EXPIRY_VOID: &str = const_format::concatcp!(
    "not exists (select 1 from authorization_steps s
                  where s.charge_id = c.id and s.kind = 'void' and s.status = 'failed'
                    and s.idempotency_key = '",
    crate::domain::EXPIRY_KEY_PREFIX,
    "' || c.id)"
);

/// Milliseconds as `i64` for interval arithmetic in SQL.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The error of an operation that had no answer within [`STORE_DEADLINE`].
pub(super) fn past_deadline() -> StoreError {
    StoreError::Unavailable(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the database gave no answer within {} s",
            STORE_DEADLINE.as_secs()
        ),
    )))
}
