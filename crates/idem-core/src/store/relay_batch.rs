//! A relay's batch of outbox rows, held until it is finished: each backend
//! holds it its own way ([`BatchHold`]: a row-locking transaction on
//! PostgreSQL, a lease on SQLite), and the relay sees only this.

use std::future::Future;
use std::pin::Pin;

use super::error::StoreError;
use super::model::OutboxMessage;

/// A batch taken by one relay: its rows are skipped by other relays until
/// [`OutboxBatch::finish`], or, if the relay dies first, until its hold ends
/// on its own (a transaction rolled back, a lease run out).
pub struct OutboxBatch {
    pub(super) hold: Box<dyn BatchHold>,
    pub messages: Vec<OutboxMessage>,
}

/// How a backend holds a batch, and finishes it: marks the rows `published`,
/// sets aside those in `set_aside` (id, reason), and lets go of every row it
/// took, in one write.
pub(super) trait BatchHold: Send {
    fn finish<'a>(
        self: Box<Self>,
        published: &'a [i64],
        set_aside: &'a [(i64, String)],
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;
}

impl OutboxBatch {
    /// Marks the rows `published` (those the broker confirmed), sets aside
    /// the rows in `set_aside` (id, reason: rows that can never be published),
    /// and releases the whole batch: rows left out (refused, or never sent
    /// because the broker went away) are free for the next batch at once.
    pub async fn finish(
        self,
        published: &[i64],
        set_aside: &[(i64, String)],
    ) -> Result<(), StoreError> {
        self.hold.finish(published, set_aside).await
    }
}
