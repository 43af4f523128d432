//! Retention: the sweeper deletes expired key records and nothing else.

use std::time::Duration;

use idem::sim::{Fault, Faults};
use idem::workers::Sweeper;

use crate::helpers::*;

#[tokio::test]
async fn the_sweeper_deletes_expired_keys_but_no_charge_and_no_unsettled_key() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_millis(200), Duration::from_millis(300)).await;
    for order in 1..=5 {
        assert_eq!(c.charge(&new_key(), &body(order, 100)).await.status, 201);
    }
    sim.set_faults(failing(Fault::ErrorBefore)).await;
    assert_eq!(c.charge(&new_key(), &body(6, 100)).await.status, 503);
    let fresh_config_key = new_key();
    sim.set_faults(Faults::default()).await;

    let sweeper = Sweeper::new(db.store.clone(), Duration::from_secs(60));
    assert_eq!(
        sweeper.sweep().await.expect("sweep"),
        0,
        "nothing expired yet"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.charge(&fresh_config_key, &body(7, 100)).await.status, 201);

    assert_eq!(
        sweeper.sweep().await.expect("sweep"),
        5,
        "the five expired outcomes"
    );
    assert_eq!(db.count("charges").await, 7, "no charge deleted");
    let (left,): (i64,) = sqlx::query_as(
        "select count(*) from idempotency_keys k join charges c on c.id = k.charge_id
          where c.order_id in (6, 7)",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count");
    assert_eq!(left, 2, "the unsettled key and the live one stay");
}
