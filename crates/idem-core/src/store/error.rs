//! The store's errors: weather (try again later) or an answer that will not
//! change, told apart by each backend's own codes.

/// Errors in the store's words.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Weather: the same operation may well work if tried again later. The
    /// database cannot be reached (I/O, TLS, the pool timed out or closed), or
    /// it said so itself: see [`is_pg_transient`] and [`is_sqlite_busy`].
    /// The API answers 503; the queue consumer retries, a bounded number of times.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// Weather of another kind: the database answers, but cannot take a
    /// write now (its disk is full, it is read-only, its file system failed
    /// under it): see [`is_pg_unwritable`] and [`is_sqlite_unwritable`]. The
    /// API answers 503 (`store-unwritable`) and readiness is red until a
    /// write succeeds again; the queue consumer retries, as for `Unavailable`.
    #[error("the database cannot take writes now: {0}")]
    Unwritable(#[source] sqlx::Error),
    /// Anything else the database refused (a constraint, text it cannot store
    /// such as a NUL byte): trying again gives the same answer. A bug or bad
    /// data, not weather.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// A row that the schema's checks should have made impossible.
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    /// The database URL names no backend idem has.
    #[error("unsupported database URL (use postgres://..., mysql://... or sqlite://path): {0}")]
    UnsupportedUrl(String),
}

/// Whether `e` says a charge with this acquirer reference already exists: the
/// same request under the same key made a charge before (the reference is the
/// intent's own, and charges are never deleted), however long ago its key and
/// tombstone went. PostgreSQL names the constraint; SQLite, the column;
/// MariaDB, the key, in its message.
pub(super) fn is_reference_taken(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.is_unique_violation()
        && (db.constraint() == Some("charges_acquirer_reference_key")
            || db.message().contains("charges.acquirer_reference")
            || db.message().contains("'charges_acquirer_reference_key'"))
}

impl StoreError {
    /// Whether trying the same operation again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Unwritable(_))
    }

    /// The same error for another request of the batch that met it: the same
    /// class, its cause in words (a database error cannot be cloned).
    pub(super) fn for_batch_member(&self) -> Self {
        let copy = |cause: &sqlx::Error| match cause {
            sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
            other => {
                sqlx::Error::Protocol(format!("the batch this request was in failed: {other}"))
            }
        };
        match self {
            Self::Unavailable(cause) => Self::Unavailable(copy(cause)),
            Self::Unwritable(cause) => Self::Unwritable(copy(cause)),
            Self::Database(cause) => Self::Database(copy(cause)),
            Self::Corrupt(what) => Self::Corrupt(what.clone()),
            Self::UnsupportedUrl(url) => Self::UnsupportedUrl(url.clone()),
        }
    }

    /// The class of the error, for logs and metrics: `unavailable`,
    /// `unwritable`, `database`, `corrupt` or `config`.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Unwritable(_) => "unwritable",
            Self::Database(_) => "database",
            Self::Corrupt(_) => "corrupt",
            Self::UnsupportedUrl(_) => "config",
        }
    }
}

/// PostgreSQL's SQLSTATEs that mean "try again": the server is going away,
/// starting or overloaded, the statement ran past `statement_timeout`, or
/// the transaction lost a race it can win next time. Class 08 (connection
/// exception), class 53 (insufficient resources: too many connections, out of
/// memory; its `53100` disk_full is [`is_pg_unwritable`]'s, checked first), `40001`
/// serialization_failure, `40P01` deadlock_detected, `40003`
/// statement_completion_unknown, `55P03` lock_not_available, `57014`
/// query_canceled, `57P01` admin_shutdown, `57P02` crash_shutdown, `57P03`
/// cannot_connect_now, and `25006` read_only_sql_transaction (a connection
/// left on a primary that became a standby; it is closed on the error, and the
/// next one finds the new primary). Everything else (`22021`, the NUL byte in
/// text, among them) is an answer that will not change.
fn is_pg_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "40001" | "40P01" | "40003" | "55P03" | "57014" | "57P01" | "57P02" | "57P03" | "25006"
        )
}

/// PostgreSQL's SQLSTATEs that mean "I answer, but cannot write now":
/// `53100` disk_full and `58030` io_error. `25006` (read-only transaction) is
/// not among them: it is a connection left on a former primary, which the
/// next connection leaves behind (a failover, [`is_pg_transient`]).
fn is_pg_unwritable(code: &str) -> bool {
    matches!(code, "53100" | "58030")
}

/// SQLite's primary result codes for "the file cannot be written now":
/// `SQLITE_READONLY` (8), `SQLITE_IOERR` (10) and `SQLITE_FULL` (13).
fn is_sqlite_unwritable(code: &str) -> bool {
    code.parse::<i32>()
        .is_ok_and(|c| matches!(c & 0xff, 8 | 10 | 13))
}

/// SQLite's primary result codes for "another connection holds the lock":
/// `SQLITE_BUSY` (5) and `SQLITE_LOCKED` (6); extended codes keep them in the low byte.
fn is_sqlite_busy(code: &str) -> bool {
    code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

/// MariaDB's error numbers for "I answer, but cannot write now": `1021`
/// disk full, `1114` a table full, `1030` the storage engine's own error (the
/// way an errno such as 28, no space left on the device, reaches a client;
/// broad, but any such error means the engine did not write).
fn is_mariadb_unwritable(number: u16) -> bool {
    matches!(number, 1021 | 1114 | 1030)
}

/// MariaDB's error numbers that mean "try again": `1213` a deadlock's victim,
/// `1205` a lock waited on too long, `1969` a statement past
/// `max_statement_time`, `1040` too many connections, `1053` the server
/// shutting down, `1927` the connection killed, `1317` a statement killed,
/// and `1290`/`1836`/`1792` read-only (a connection left on a server that
/// became a replica: as PostgreSQL's `25006`, the next connection finds the
/// new primary).
fn is_mariadb_transient(number: u16) -> bool {
    matches!(
        number,
        1213 | 1205 | 1969 | 1040 | 1053 | 1927 | 1317 | 1290 | 1836 | 1792
    )
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Protocol(_) => Self::Unavailable(e),
            sqlx::Error::Database(db) => {
                let code = db.code();
                let code = code.as_deref().unwrap_or_default();
                let sqlite = db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some();
                let pg = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some();
                let mariadb = db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .map(|e| e.number());
                if (sqlite && is_sqlite_unwritable(code))
                    || (pg && is_pg_unwritable(code))
                    || mariadb.is_some_and(is_mariadb_unwritable)
                {
                    Self::Unwritable(e)
                } else if (sqlite && is_sqlite_busy(code))
                    || (pg && is_pg_transient(code))
                    || mariadb.is_some_and(is_mariadb_transient)
                {
                    Self::Unavailable(e)
                } else {
                    Self::Database(e)
                }
            }
            _ => Self::Database(e),
        }
    }
}
