//! How each backend ends a write stuck behind another's lock: not a contract
//! (the mechanisms differ: SQLite's busy timeout, PostgreSQL's
//! `statement_timeout`), so each runs on its own backend only. What every
//! backend must do is idem-core's contract suite (`crates/idem-core/tests/contract`).

use std::time::Duration;

use idem_core::domain::{ChargeRequest, IdempotencyKey};
use idem_core::store::{Backend, StoreError};

use crate::helpers::*;

/// Another process holds the SQLite file's write lock and does not let go:
/// every writer of this process gives up after one busy timeout (5 s) with a
/// 503-class error, instead of the ones queued behind the first waiting one
/// busy timeout after another.
#[tokio::test]
async fn writers_stuck_behind_another_process_give_up_together() {
    if !runs_on(
        Backend::Sqlite,
        "it holds SQLite's one write lock; PostgreSQL has row locks and no write turn",
    ) {
        return;
    }
    use sqlx::Connection;
    let db = TestDb::new().await;
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let mut other_process = sqlx::SqliteConnection::connect(&db.url)
        .await
        .expect("connect");
    sqlx::query("begin immediate")
        .execute(&mut other_process)
        .await
        .expect("take the write lock");

    let started = std::time::Instant::now();
    let claims = (1..=3).map(|order| {
        let store = db.store.clone();
        tokio::spawn(async move {
            let key = IdempotencyKey::parse(format!("stuck-{order}").as_bytes()).expect("key");
            let request = ChargeRequest::from_json(body(order, 100).as_bytes()).expect("request");
            let claim = new_claim(
                merchant_id,
                &key,
                &request,
                Duration::from_secs(5),
                Duration::from_secs(60),
            );
            let outcome = store.claim(&claim).await;
            (outcome.map(|_| ()), started.elapsed())
        })
    });
    for claim in futures_util::future::join_all(claims).await {
        let (outcome, took) = claim.expect("claim task");
        assert!(
            matches!(outcome, Err(StoreError::Unavailable(_))),
            "a writer behind a stuck lock gets a retryable error, got {outcome:?}"
        );
        assert!(
            took < Duration::from_secs(8),
            "every writer gives up after about one busy timeout, this one after {took:?}"
        );
    }

    sqlx::query("rollback")
        .execute(&mut other_process)
        .await
        .expect("let go");
    assert_eq!(db.count("charges").await, 0, "nothing was half-stored");
}

#[tokio::test]
async fn a_statement_stuck_behind_a_lock_ends_at_the_statement_timeout_as_unavailable() {
    if !runs_on(
        Backend::Postgres,
        "statement_timeout is PostgreSQL's; SQLite has its busy timeout",
    ) {
        return;
    }
    let db = TestDb::new().await;
    // Another session holds a lock every outbox statement waits for.
    let mut tx = db.pool.begin().await.expect("begin");
    sqlx::query("lock table outbox in access exclusive mode")
        .execute(&mut *tx)
        .await
        .expect("lock the outbox");

    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(10), db.store.outbox_backlog())
        .await
        .expect("the statement ends by itself, not when the lock is released");
    let waited = started.elapsed();
    match answer {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("statement timeout"), "{e}")
        }
        other => panic!("a transient error (57014), not {other:?}"),
    }
    assert!(
        (Duration::from_millis(1_900)..Duration::from_secs(4)).contains(&waited),
        "ended after {waited:?}"
    );
    tx.rollback().await.expect("rollback");
    // The store works on, and migrating (no timeout for it) still works.
    db.store.outbox_backlog().await.expect("works again");
    db.store.migrate().await.expect("migrate again");
}
