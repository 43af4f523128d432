//! The article's race, reproduced on the real database: "check, then insert"
//! from two connections at once charges twice; insert-first against a unique
//! constraint lets exactly one through.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;

use crate::helpers::*;

const KEY: &str = "5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13";

#[tokio::test]
async fn check_then_act_inserts_twice_without_the_constraint() {
    let db = TestDb::new().await;
    db.exec("create table cobranca (idempotency_key text not null)")
        .await;
    let both_checked = Arc::new(Barrier::new(2));
    let attempts = (0..2)
        .map(|_| {
            let (pool, both_checked) = (db.pool.clone(), both_checked.clone());
            tokio::spawn(async move {
                let (found,): (i64,) =
                    sqlx::query_as("select count(*) from cobranca where idempotency_key = $1")
                        .bind(KEY)
                        .fetch_one(&pool)
                        .await
                        .expect("check");
                // The window: both have checked before either acts.
                both_checked.wait().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                if found == 0 {
                    sqlx::query("insert into cobranca (idempotency_key) values ($1)")
                        .bind(KEY)
                        .execute(&pool)
                        .await
                        .expect("act");
                }
            })
        })
        .collect::<Vec<_>>();
    for a in attempts {
        a.await.expect("join");
    }
    assert_eq!(
        db.count("cobranca").await,
        2,
        "the same intent was recorded (and charged) twice"
    );
}

#[tokio::test]
async fn insert_first_with_the_constraint_lets_one_win() {
    let db = TestDb::new().await;
    db.exec(
        "create table cobranca (idempotency_key text not null,
                                constraint uq_cobranca_idempotency_key unique (idempotency_key))",
    )
    .await;
    let start = Arc::new(Barrier::new(8));
    let attempts = (0..8)
        .map(|_| {
            let (pool, start) = (db.pool.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let won: Option<(String,)> = sqlx::query_as(
                    "insert into cobranca (idempotency_key) values ($1)
                 on conflict (idempotency_key) do nothing returning idempotency_key",
                )
                .bind(KEY)
                .fetch_optional(&pool)
                .await
                .expect("insert first");
                won.is_some()
            })
        })
        .collect::<Vec<_>>();
    let mut winners = 0;
    for a in attempts {
        winners += usize::from(a.await.expect("join"));
    }
    assert_eq!(
        winners, 1,
        "one insert wins, the rest learn at once that they lost"
    );
    assert_eq!(db.count("cobranca").await, 1);
}
