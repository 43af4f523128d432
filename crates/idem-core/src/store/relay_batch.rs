//! A relay's batch of outbox rows, held until it is finished: by a row-locking
//! transaction on PostgreSQL, by a lease on SQLite. The one place above the
//! backends that knows both holds.

use super::error::StoreError;
use super::model::OutboxMessage;
use super::postgres::PgBatch;
use super::sqlite::SqliteStore;

/// A batch taken by one relay: its rows are skipped by other relays until
/// [`OutboxBatch::finish`], or, if the relay dies first, until its transaction
/// ends (PostgreSQL) or its lease runs out (SQLite).
pub struct OutboxBatch {
    pub(super) hold: BatchHold,
    pub messages: Vec<OutboxMessage>,
}

pub(super) enum BatchHold {
    Postgres(PgBatch),
    /// The batch is leased; finishing it is a write like any other.
    Sqlite(SqliteStore),
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
        match self.hold {
            BatchHold::Postgres(batch) => {
                let (ids, reasons): (Vec<i64>, Vec<&str>) = set_aside
                    .iter()
                    .map(|(id, reason)| (*id, reason.as_str()))
                    .unzip();
                batch.finish(published, &ids, &reasons).await
            }
            BatchHold::Sqlite(store) => {
                let taken: Vec<i64> = self.messages.iter().map(|m| m.id).collect();
                store.finish_batch(&taken, published, set_aside).await
            }
        }
    }
}
