//! Natural batching changes no answer. A batch of random claims (duplicate
//! keys, mismatched bodies, keys already in every state: none, in flight,
//! completed, expired) gets, claim by claim, the answers the same claims get
//! one by one on the one-row path, in the same order; and leaves the same rows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_core::domain::{ChargeRequest, ChargeStatus, Fingerprint, IdempotencyKey, StoredResponse};
use idem_core::store::{Backend, Claim, KeyRecord, KeyState, Settlement, Store};
use proptest::prelude::*;
use sqlx::Connection;

use crate::helpers::*;

/// Keys a case draws from: few, so that claims meet.
const KEYS: usize = 5;

/// Longer than any case runs: nothing in flight is taken over.
const LEASE: Duration = Duration::from_secs(30);

/// What a key holds before the batch.
#[derive(Debug, Clone, Copy)]
enum Before {
    Nothing,
    InFlight,
    Completed,
    /// Completed, and past its time to live.
    Expired,
}

#[derive(Debug, Clone)]
struct Case {
    before: Vec<Before>,
    /// Each claim: its key, and which of two bodies it sends.
    claims: Vec<(usize, bool)>,
}

fn cases() -> impl Strategy<Value = Case> {
    let before = prop_oneof![
        Just(Before::Nothing),
        Just(Before::InFlight),
        Just(Before::Completed),
        Just(Before::Expired),
    ];
    (
        prop::collection::vec(before, KEYS),
        prop::collection::vec((0..KEYS, any::<bool>()), 1..24),
    )
        .prop_map(|(before, claims)| Case { before, claims })
}

/// Whose charge a record holds: a key's before the batch, or the claim (by
/// its place) that won it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Before(usize),
    Claim(usize),
    Unknown,
}

/// A claim's answer with the charge ids (fresh on every run) named by owner.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Won,
    Lost {
        owner: Owner,
        same_body: bool,
        completed: Option<(u16, Bytes)>,
        expired: bool,
    },
    Expired(Owner),
    Failed(String),
}

fn key(k: usize) -> IdempotencyKey {
    IdempotencyKey::parse(format!("prop-{k}").as_bytes()).expect("key")
}

fn request(k: usize, other_body: bool) -> ChargeRequest {
    let amount = if other_body { 999 } else { 100 };
    ChargeRequest::from_json(body(i64::try_from(k).expect("small") + 1, amount).as_bytes())
        .expect("request")
}

/// A capture storing `response`, with no event, webhook or audit entry.
fn captured(response: &StoredResponse) -> Settlement<'_> {
    Settlement {
        status: ChargeStatus::Captured,
        capture_id: Some("cap"),
        decline_reason: None,
        response,
        event: None,
        webhook: None,
        audit: None,
    }
}

/// Puts each key in its state before the batch, with the first body; returns
/// the charge each holds.
async fn prepare(store: &Store, merchant_id: i64, before: &[Before]) -> HashMap<String, Owner> {
    let mut owners = HashMap::new();
    for (k, state) in before.iter().enumerate() {
        if matches!(state, Before::Nothing) {
            continue;
        }
        let (key, request) = (key(k), request(k, false));
        let ttl = match state {
            Before::Expired => Duration::ZERO,
            _ => Duration::from_secs(600),
        };
        let Claim::Won(record) = store
            .claim_alone(&new_claim(merchant_id, &key, &request, LEASE, ttl))
            .await
            .expect("claim")
        else {
            panic!("a fresh key is won");
        };
        owners.insert(record.subject.id.as_str().to_owned(), Owner::Before(k));
        if matches!(state, Before::InFlight) {
            continue;
        }
        let response = StoredResponse {
            status: 201,
            body: Bytes::from(format!("done-{k}")),
        };
        let settlement = captured(&response);
        assert!(store
            .finalize(merchant_id, &key, &record, &settlement, ttl)
            .await
            .expect("finalize"));
    }
    owners
}

fn seen(
    answer: Result<Claim, idem_core::store::StoreError>,
    place: usize,
    sent: &Fingerprint,
    owners: &mut HashMap<String, Owner>,
) -> Seen {
    let owner = |id: &str, owners: &HashMap<String, Owner>| {
        owners.get(id).copied().unwrap_or(Owner::Unknown)
    };
    match answer {
        Ok(Claim::Won(record)) => {
            owners.insert(record.subject.id.as_str().to_owned(), Owner::Claim(place));
            Seen::Won
        }
        Ok(Claim::Lost(KeyRecord {
            subject: charge,
            fingerprint,
            state,
            expired,
            ..
        })) => Seen::Lost {
            owner: owner(charge.id.as_str(), owners),
            same_body: fingerprint == *sent,
            completed: match state {
                KeyState::Completed { response: r, .. } => Some((r.status, r.body)),
                KeyState::InFlight { .. } => None,
            },
            expired,
        },
        Ok(Claim::Expired(id)) => Seen::Expired(owner(id.as_str(), owners)),
        Ok(Claim::Other(subject)) => Seen::Failed(format!("a charge key held by {subject}")),
        Err(e) => Seen::Failed(e.to_string()),
    }
}

/// Runs the claims of `case` for a merchant of its own, batched or one by one.
async fn run(db: &TestDb, name: &str, case: &Case, batched: bool) -> (Vec<Seen>, i64, i64) {
    db.merchant(name).await;
    let merchant_id = db.merchant_id(name).await;
    let mut owners = prepare(&db.store, merchant_id, &case.before).await;
    let keys: Vec<_> = case.claims.iter().map(|(k, _)| key(*k)).collect();
    let requests: Vec<_> = case.claims.iter().map(|(k, o)| request(*k, *o)).collect();
    let claims: Vec<_> = keys
        .iter()
        .zip(&requests)
        .map(|(key, request)| new_claim(merchant_id, key, request, LEASE, Duration::from_secs(600)))
        .collect();
    let answers = if batched {
        db.store.claim_batch(&claims).await
    } else {
        let mut answers = Vec::new();
        for c in &claims {
            answers.push(db.store.claim_alone(c).await);
        }
        answers
    };
    let seen = answers
        .into_iter()
        .zip(&claims)
        .enumerate()
        .map(|(place, (answer, c))| seen(answer, place, &c.fingerprint, &mut owners))
        .collect();
    let count = async |table: &str| -> i64 {
        let (n,): (i64,) = sqlx::query_as(&format!(
            "select count(*) from {table} where merchant_id = $1"
        ))
        .bind(merchant_id)
        .fetch_one(&db.pool)
        .await
        .expect("count");
        n
    };
    (
        seen,
        count("idempotency_keys").await,
        count("charges").await,
    )
}

#[test]
fn a_batch_of_claims_answers_each_as_the_same_claims_one_by_one() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let db = runtime.block_on(TestDb::new());
    let cases_run = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(case in cases())| {
        let n = cases_run.fetch_add(1, Ordering::Relaxed);
        let (batched, alone) = runtime.block_on(async {
            let batched = run(&db, &format!("batched-{n}"), &case, true).await;
            let alone = run(&db, &format!("alone-{n}"), &case, false).await;
            (batched, alone)
        });
        prop_assert_eq!(&batched, &alone, "batched vs one by one, for {:?}", case);
        prop_assert!(batched.0.iter().all(|s| !matches!(s, Seen::Failed(_))), "{:?}", batched.0);
    });
}

/// Waits until no store's connection is open to `conn`'s database: each one
/// that closed has reported its counters to `pg_stat_user_tables` by then.
async fn stores_gone(conn: &mut sqlx::PgConnection) {
    for _ in 0..200 {
        let (open,): (i64,) = sqlx::query_as(
            "select count(*) from pg_stat_activity
              where datname = current_database() and application_name = 'idem'",
        )
        .fetch_one(&mut *conn)
        .await
        .expect("pg_stat_activity");
        if open == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a store's connections stayed open for 10 s after it closed");
}

/// Sequential scans of the two tables every charge writes, as reported.
async fn table_scans(conn: &mut sqlx::PgConnection) -> i64 {
    let (scans,): (i64,) = sqlx::query_as(
        "select coalesce(sum(seq_scan), 0)::bigint from pg_stat_user_tables
          where relname in ('idempotency_keys', 'charges')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("pg_stat_user_tables");
    scans
}

/// The batch statements' plans are made once per connection and kept, so a
/// plan made on a fresh deployment's empty tables is the plan they run when
/// the tables are large: a scan of a table there would read all of it for
/// every batch. On a database that starts empty, batches of claims and
/// finalizes read `idempotency_keys` and `charges` by index only.
#[tokio::test]
async fn batches_read_by_primary_key_with_plans_made_on_empty_tables() {
    if !runs_on(
        Backend::Postgres,
        "plans and their kept plans are PostgreSQL's",
    ) {
        return;
    }
    let db = TestDb::new().await;
    db.merchant("plans").await;
    let merchant_id = db.merchant_id("plans").await;
    // The migration scanned the tables it indexed; its connection reports that
    // when it closes.
    db.store.close().await;
    let mut watcher = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    stores_gone(&mut watcher).await;
    let before = table_scans(&mut watcher).await;

    let store = Store::connect(&db.url, 5).await.expect("connect");
    let ttl = Duration::from_secs(600);
    for round in 0..4_usize {
        let keys: Vec<_> = (0..32).map(|k| key(round * 100 + k)).collect();
        let requests: Vec<_> = (0..32).map(|k| request(round * 100 + k, false)).collect();
        let claims: Vec<_> = keys
            .iter()
            .zip(&requests)
            .map(|(key, request)| new_claim(merchant_id, key, request, LEASE, ttl))
            .collect();
        let records: Vec<_> = store
            .claim_batch(&claims)
            .await
            .into_iter()
            .map(|claim| match claim.expect("claim") {
                Claim::Won(record) => record,
                other => panic!("a fresh key is won: {other:?}"),
            })
            .collect();
        let response = StoredResponse {
            status: 201,
            body: Bytes::from_static(b"done"),
        };
        let settlement = captured(&response);
        // All at once: they wait for the finalize worker together, and go
        // as batches.
        let settled = futures_util::future::join_all(
            keys.iter()
                .zip(&records)
                .map(|(key, record)| store.finalize(merchant_id, key, record, &settlement, ttl)),
        )
        .await;
        assert!(settled.into_iter().all(|s| s.expect("finalize")));
    }
    store.close().await;
    stores_gone(&mut watcher).await;
    let (completed,): (i64,) =
        sqlx::query_as("select count(*) from idempotency_keys where state = 'completed'")
            .fetch_one(&mut watcher)
            .await
            .expect("count");
    assert_eq!(completed, 128);
    assert_eq!(
        table_scans(&mut watcher).await - before,
        0,
        "a batch statement scanned idempotency_keys or charges"
    );
}

/// On SQLite, a row whose parent changes under it is found through an index
/// on its reference, or by reading the whole child table: when a parent is
/// inserted after its children (the key record's deferred reference to its
/// charge: every claim) or deleted (a webhook endpoint's deliveries). Every
/// reference leads an index, except those to `merchants`, which are inserted
/// before anything refers to them and never deleted.
#[tokio::test]
async fn every_reference_sqlite_settles_has_an_index() {
    if !runs_on(
        Backend::Sqlite,
        "SQLite's reference checks read from the parent's side",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let tables: Vec<(String,)> = sqlx::query_as(
        "select name from sqlite_master
          where type = 'table' and name not like 'sqlite_%' and name not like '_sqlx%'",
    )
    .fetch_all(&db.pool)
    .await
    .expect("tables");
    let mut unindexed = Vec::new();
    for (table,) in tables {
        let references: Vec<(String, String)> =
            sqlx::query_as("select \"from\", \"table\" from pragma_foreign_key_list($1)")
                .bind(&table)
                .fetch_all(&db.pool)
                .await
                .expect("foreign keys");
        for (column, parent) in references {
            let (leading,): (i64,) = sqlx::query_as(
                "select count(*) from pragma_index_list($1) l
                  where (select name from pragma_index_info(l.name) where seqno = 0) = $2",
            )
            .bind(&table)
            .bind(&column)
            .fetch_one(&db.pool)
            .await
            .expect("indexes");
            if leading == 0 && parent != "merchants" {
                unindexed.push(format!("{table}.{column} -> {parent}"));
            }
        }
    }
    assert!(
        unindexed.is_empty(),
        "references without an index: {unindexed:?}"
    );
}
