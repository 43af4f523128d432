//! The outbox: a relay's batch is held (row locks on PostgreSQL, a lease on
//! SQLite) and, dropped unfinished, gives back its rows and its connection.

use std::time::Duration;

use bytes::Bytes;
use idem_core::domain::{IdempotencyKey, MessageId, StoredResponse};
use idem_core::store::{Backend, NewResult, ResultAnswer, Store};
use idem_testkit::db::*;

crate::on_every_backend!(a_batch_dropped_unfinished_frees_its_rows_and_its_connection);

/// A relay that dies holding a batch (its task dropped before it finishes)
/// must not leave the batch's connection, with its open transaction and row
/// locks, in the pool: on PostgreSQL the connection is closed, the server
/// rolls back, and another relay takes the rows at once. On SQLite the batch
/// is a lease instead, and the rows wait for it to run out.
async fn a_batch_dropped_unfinished_frees_its_rows_and_its_connection(db: TestDb) {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let key = IdempotencyKey::parse(b"dropped-batch").expect("key");
    let answer = StoredResponse {
        status: 201,
        body: Bytes::from_static(b"{}"),
    };
    db.store
        .enqueue_result(&NewResult {
            message_id: &MessageId::result(),
            exchange: "idem.results",
            routing_key: "nowhere",
            tenant: "loja",
            correlation_id: None,
            key: &key,
            replayed: false,
            answer: ResultAnswer::Now(&answer),
            traceparent: Some(TRACEPARENT),
        })
        .await
        .expect("enqueue");

    // One connection only: if the dropped batch kept it, nothing else could run.
    let relay = Store::connect(&db.url, 1).await.expect("connect");
    let batch = relay.outbox_batch(10).await.expect("batch");
    assert_eq!(batch.messages.len(), 1);
    assert_eq!(
        batch.messages[0].traceparent.as_deref(),
        Some(TRACEPARENT),
        "a result keeps its command's trace context"
    );
    drop(batch);
    relay
        .ping()
        .await
        .expect("the pool's only connection slot is free again");

    let other = Store::connect(&db.url, 1).await.expect("connect");
    match db.backend {
        Backend::Postgres => {
            // The server notices the closed socket and rolls back on its own time.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let batch = other.outbox_batch(10).await.expect("batch");
                if batch.messages.len() == 1 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the dropped batch's row locks were never released"
                );
                batch.finish(&[], &[]).await.expect("finish");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // A lease, committed: it holds the row until it runs out.
        Backend::Sqlite | Backend::MariaDb => {
            let batch = other.outbox_batch(10).await.expect("batch");
            assert!(batch.messages.is_empty(), "the lease still holds the row");
        }
    }
}
