//! The `audit_log` table on PostgreSQL: what operators did. Rows are only
//! ever added (a trigger refuses updates and deletes).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::PgStore;
use crate::store::error::StoreError;
use crate::store::model::{AuditEntry, AuditRecord};
use crate::store::ops::AuditTrail;

/// Appends `entry`, in the caller's transaction.
pub(super) async fn record(
    db: &mut PgConnection,
    entry: &AuditEntry<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into audit_log (actor, action, subject, reason, detail) values ($1, $2, $3, $4, $5)",
    )
    .bind(entry.audit.actor)
    .bind(entry.action)
    .bind(entry.subject)
    .bind(entry.audit.reason)
    .bind(entry.detail)
    .execute(db)
    .await?;
    Ok(())
}

type Row = (
    i64,
    DateTime<Utc>,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

#[async_trait::async_trait]
impl AuditTrail for PgStore {
    async fn record_audit(&self, entry: &AuditEntry<'_>) -> Result<(), StoreError> {
        self.on_conn(async |db| record(db, entry).await).await
    }

    async fn audit_trail(
        &self,
        subject: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let rows: Vec<Row> = self
            .on_conn(async |db| {
                sqlx::query_as(
                    "select id, at, actor, action, subject, reason, detail from audit_log
                      where $1::text is null or subject = $1
                      order by id desc limit $2",
                )
                .bind(subject)
                .bind(limit)
                .fetch_all(db)
                .await
            })
            .await?;
        Ok(rows.into_iter().map(into_record).collect())
    }
}

fn into_record((id, at, actor, action, subject, reason, detail): Row) -> AuditRecord {
    AuditRecord {
        id,
        at,
        actor,
        action,
        subject,
        reason,
        detail,
    }
}
