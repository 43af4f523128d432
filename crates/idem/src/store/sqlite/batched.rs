//! Claims and finalizes in batches ([`crate::store::batch`]): the requests
//! waiting together share one write transaction, so one commit (one fsync,
//! with `synchronous = full`) makes all of them durable. Each row runs the
//! statements it runs alone, inside a savepoint: a row that fails is rolled
//! back alone and goes again on its own after the batch, and the rest commit.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::keys::{claim_in, finalize_in};
use super::WriteTurns;
use crate::store::batch::{self, Batched};
use crate::store::model::Claim;
use crate::store::params::{ClaimRow, ClaimValues, FinalizeRow};
use crate::store::StoreError;

/// Runs `rows`, each with `op` in a savepoint of one write transaction.
async fn in_one_write<R, T>(
    pool: &SqlitePool,
    turns: &WriteTurns,
    rows: &[R],
    op: impl AsyncFn(&mut SqliteConnection, &R) -> Result<T, StoreError>,
) -> Vec<Batched<T>> {
    let written = super::write(pool, turns, async |tx| {
        let mut answers = Vec::with_capacity(rows.len());
        for row in rows {
            // A transaction inside a transaction is a savepoint.
            let mut savepoint = sqlx::Connection::begin(&mut *tx).await?;
            match op(&mut savepoint, row).await {
                Ok(answer) => {
                    savepoint.commit().await?;
                    answers.push(Batched::Done(Ok(answer)));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a row of a batch failed; it goes alone");
                    savepoint.rollback().await?;
                    answers.push(Batched::Alone);
                }
            }
        }
        Ok(answers)
    })
    .await;
    written.unwrap_or_else(|e| {
        tracing::debug!(error = %e, rows = rows.len(), "a batch failed; each row goes alone");
        batch::failed(rows.len(), &e)
    })
}

pub(super) async fn claims(
    pool: &SqlitePool,
    turns: &WriteTurns,
    rows: Vec<ClaimRow>,
) -> Vec<Batched<Claim>> {
    in_one_write(pool, turns, &rows, async |tx, row| {
        claim_in(tx, &ClaimValues::new(&row.claim())).await
    })
    .await
}

pub(super) async fn finalizes(
    pool: &SqlitePool,
    turns: &WriteTurns,
    rows: Vec<FinalizeRow>,
) -> Vec<Batched<bool>> {
    in_one_write(pool, turns, &rows, async |tx, row| {
        finalize_in(tx, &row.values()).await
    })
    .await
}
