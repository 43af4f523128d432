//! The `audit_log` table on MariaDB: as in `postgres/audit.rs` (triggers
//! refuse updates and deletes).

use const_format::concatcp;
use sqlx::mysql::MySqlConnection;

use super::sql::{params, query, query_as};
use super::{MariaDbStore, NOW};
use crate::store::error::StoreError;
use crate::store::model::{AuditEntry, AuditRecord};
use crate::store::ops::AuditTrail;

const RECORD_SQL: &str = concatcp!(
    "insert into audit_log (at, actor, action, subject, reason, detail) values (",
    NOW,
    ", $1, $2, $3, $4, $5)"
);

/// Appends `entry`, in the caller's transaction.
pub(super) async fn record(
    db: &mut MySqlConnection,
    entry: &AuditEntry<'_>,
) -> Result<(), StoreError> {
    query(
        RECORD_SQL,
        params![
            entry.audit.actor,
            entry.action,
            entry.subject,
            entry.audit.reason,
            entry.detail
        ],
    )?
    .execute(db)
    .await?;
    Ok(())
}

type Row = (
    i64,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

#[async_trait::async_trait]
impl AuditTrail for MariaDbStore {
    async fn record_audit(&self, entry: &AuditEntry<'_>) -> Result<(), StoreError> {
        self.write(async |tx| record(tx, entry).await).await
    }

    async fn audit_trail(
        &self,
        subject: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let rows: Vec<Row> = self
            .read(async |db| {
                Ok(query_as(
                    "select id, at, actor, action, subject, reason, detail from audit_log
                      where $1 is null or subject = $1
                      order by id desc limit $2",
                    params![subject, limit],
                )?
                .fetch_all(db)
                .await?)
            })
            .await?;
        rows.into_iter()
            .map(|(id, at, actor, action, subject, reason, detail)| {
                Ok(AuditRecord {
                    id,
                    at: super::from_millis(at)?,
                    actor,
                    action,
                    subject,
                    reason,
                    detail,
                })
            })
            .collect()
    }
}
