//! `idem tenant`, the real binary: a merchant's name is a slug, since it is
//! also a routing key on the broker (docs/contract/api.md); secrets are rotated and
//! merchants disabled without a restart, on every instance within seconds;
//! every change is in the append-only audit trail.

use std::time::{Duration, Instant};

use crate::helpers::{run_idem, Client, ServeProcess, TestDb, TestSim};
use idem_core::store::Backend;
use idem_lab::sim::Faults;

#[tokio::test]
async fn tenant_create_takes_a_slug_and_refuses_anything_else_naming_the_rule() {
    let db = TestDb::new().await;

    let (status, stdout, stderr) = run_idem(
        &db,
        // `tenant`, the command's older name, still works.
        &["tenant", "create", "loja-centro_2.b", "--actor", "ana"],
    )
    .await;
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.starts_with("sk_") && stdout.lines().count() == 1,
        "the secret alone: {stdout:?}"
    );

    let long = "x".repeat(101);
    for bad in [
        "Loja",
        "loja centro",
        "caf\u{e9}",
        "a/b",
        "a\u{1}b",
        "",
        &long,
    ] {
        let (status, stdout, stderr) =
            run_idem(&db, &["merchant", "create", bad, "--actor", "ana"]).await;
        assert!(!status.success(), "{bad:?} was accepted");
        assert!(stdout.is_empty(), "{bad:?}: no secret printed: {stdout:?}");
        assert!(
            stderr.contains("a merchant name is a slug") && stderr.contains("a-z, 0-9"),
            "{bad:?}: the rule is named: {stderr}"
        );
        assert!(
            stderr.contains(&format!("{bad:?}")),
            "{bad:?}: the refused name is named: {stderr}"
        );
    }
    assert_eq!(db.count("merchants").await, 1, "only the slug was stored");
}

/// Runs `idem merchant ARGS --actor ana`, asserting success; returns stdout.
async fn tenant(db: &TestDb, args: &[&str]) -> String {
    let mut all = vec!["merchant"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--actor", "ana"]);
    let (status, stdout, stderr) = run_idem(db, &all).await;
    assert!(status.success(), "idem {all:?}: {stderr}");
    stdout
}

/// Whether each instance accepts `secret` (a `GET` of an unknown charge is
/// 404 when the secret works, 401 when it does not).
async fn accepted(servers: &[ServeProcess], secret: &str) -> Vec<bool> {
    let mut verdicts = Vec::new();
    for s in servers {
        let answer = Client::new(&s.url, secret).get_charge("ch_none").await;
        assert!(
            matches!(answer.status, 401 | 404),
            "{} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        verdicts.push(answer.status == 404);
    }
    verdicts
}

/// Polls every instance every 20 ms until none accepts `secret`; returns, per
/// instance, how long after `since` it first refused it.
async fn refused_everywhere(
    servers: &[ServeProcess],
    secret: &str,
    since: Instant,
) -> Vec<Duration> {
    let mut refused_after: Vec<Option<Duration>> = vec![None; servers.len()];
    while refused_after.iter().any(Option::is_none) {
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "still accepted after 15 s: {refused_after:?}"
        );
        for (i, ok) in accepted(servers, secret).await.into_iter().enumerate() {
            if !ok && refused_after[i].is_none() {
                refused_after[i] = Some(since.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    refused_after.into_iter().flatten().collect()
}

#[tokio::test]
async fn a_rotated_out_or_disabled_secret_is_refused_by_every_instance_within_five_seconds() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let old = tenant(&db, &["create", "loja"]).await.trim().to_owned();
    let servers = [
        ServeProcess::start(&db, &sim, &[]).await,
        ServeProcess::start(&db, &sim, &[]).await,
        ServeProcess::start(&db, &sim, &[]).await,
    ];
    // Every instance has the secret cached.
    for _ in 0..3 {
        assert_eq!(accepted(&servers, &old).await, [true; 3]);
    }

    // Rotated with no grace: the old secret goes everywhere, the new one works.
    let rotated = Instant::now();
    let new = tenant(&db, &["rotate", "loja"]).await.trim().to_owned();
    let took = rotated.elapsed();
    assert!(new.starts_with("sk_") && new != old, "{new:?}");
    let delays = refused_everywhere(&servers, &old, rotated).await;
    eprintln!("rotation (the command took {took:?}): refused after {delays:?}");
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(5)),
        "refused within 5 s on every instance: {delays:?}"
    );
    assert_eq!(accepted(&servers, &new).await, [true; 3]);

    // Rotated with a grace: both work until it ends, then only the newest.
    let newest = tenant(&db, &["rotate", "loja", "--grace", "3s"])
        .await
        .trim()
        .to_owned();
    let graced = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        accepted(&servers, &new).await,
        [true; 3],
        "within the grace"
    );
    assert_eq!(accepted(&servers, &newest).await, [true; 3]);
    let delays = refused_everywhere(&servers, &new, graced).await;
    eprintln!("grace of 3 s: refused after {delays:?}");
    assert!(
        delays
            .iter()
            .all(|d| *d >= Duration::from_millis(2500) && *d < Duration::from_secs(8)),
        "refused when the grace ends, on every instance: {delays:?}"
    );

    // Disabled: every secret refused everywhere; enabled: accepted again.
    let disabled = Instant::now();
    tenant(&db, &["disable", "loja", "--reason", "secret leaked"]).await;
    let delays = refused_everywhere(&servers, &newest, disabled).await;
    eprintln!("disable: refused after {delays:?}");
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(5)),
        "{delays:?}"
    );
    tenant(&db, &["enable", "loja"]).await;
    let enabled = Instant::now();
    while accepted(&servers, &newest).await != [true; 3] {
        assert!(
            enabled.elapsed() < Duration::from_secs(5),
            "accepted again within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        accepted(&servers, &old).await,
        [false; 3],
        "rotated out stays out"
    );
}

#[tokio::test]
async fn tenant_list_shows_states_and_expiries_never_secrets_and_every_change_is_audited() {
    let db = TestDb::new().await;
    let first = tenant(&db, &["create", "loja"]).await.trim().to_owned();
    tenant(&db, &["create", "outra"]).await;
    let second = tenant(&db, &["rotate", "loja", "--grace", "1h"])
        .await
        .trim()
        .to_owned();
    tenant(&db, &["disable", "outra", "--reason", "contract ended"]).await;

    let (status, list, stderr) = run_idem(&db, &["merchant", "list"]).await;
    assert!(status.success(), "{stderr}");
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines[0], "name\tcreated_at\tstate\tsecrets", "{list}");
    assert_eq!(lines.len(), 3, "{list}");
    assert!(
        lines[1].starts_with("loja\t") && lines[1].contains("\tenabled\t"),
        "{list}"
    );
    assert!(
        lines[1].contains("live until ") && lines[1].matches("(live").count() == 2,
        "the old secret in its grace, the new one live: {list}"
    );
    assert!(
        lines[2].starts_with("outra\t") && lines[2].contains("disabled since "),
        "{list}"
    );
    for secret in [&first, &second] {
        assert!(
            !list.contains(secret.as_str()),
            "a secret was printed: {list}"
        );
    }

    // Unknown merchants and repeated changes say so.
    let (status, stdout, stderr) =
        run_idem(&db, &["merchant", "rotate", "nobody", "--actor", "ana"]).await;
    assert!(!status.success() && stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("no merchant is named \"nobody\""),
        "{stderr}"
    );
    let (status, _, stderr) =
        run_idem(&db, &["merchant", "disable", "outra", "--actor", "ana"]).await;
    assert!(
        status.success() && stderr.contains("already disabled"),
        "{stderr}"
    );

    // The actor defaults to the OS user, and someone must be named.
    let (status, _, stderr) = run_idem(&db, &["merchant", "enable", "outra"]).await;
    assert!(status.success(), "{stderr}");
    let (status, _, stderr) = run_idem(&db, &["merchant", "rotate", "loja", "--actor", " "]).await;
    assert!(!status.success() && stderr.contains("--actor"), "{stderr}");
    let os_user = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let os_user = String::from_utf8(os_user.stdout).unwrap().trim().to_owned();

    let trail = db.store.audit_trail(None, 100).await.unwrap();
    let seen: Vec<(&str, &str, &str, Option<&str>)> = trail
        .iter()
        .rev()
        .map(|a| {
            (
                a.actor.as_str(),
                a.action.as_str(),
                a.subject.as_str(),
                a.reason.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("ana", "tenant.create", "loja", None),
            ("ana", "tenant.create", "outra", None),
            ("ana", "tenant.rotate", "loja", None),
            ("ana", "tenant.disable", "outra", Some("contract ended")),
            (os_user.as_str(), "tenant.enable", "outra", None),
        ]
    );
    assert!(
        trail[2]
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("work until"),
        "{:?}",
        trail[2]
    );

    // Append-only, whatever SQL tries.
    for sql in [
        "update audit_log set actor = 'eve'",
        "delete from audit_log",
    ] {
        let refused = sqlx::query(sql).execute(&db.pool).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("append-only")),
            "{sql}: {refused:?}"
        );
    }
    assert_eq!(db.count("audit_log").await, 5);
}

#[tokio::test]
async fn a_merchant_created_before_secrets_could_rotate_keeps_its_secret_after_the_upgrade() {
    let db = TestDb::unmigrated().await;
    // The schema as it was before merchant_secrets, with a merchant in it.
    let (mut before, insert) = match db.backend {
        Backend::Postgres => (
            sqlx::migrate!("../idem-core/migrations/postgres"),
            "insert into merchants (name, secret_hash) values ('loja', $1)",
        ),
        Backend::Sqlite => (
            sqlx::migrate!("../idem-core/migrations/sqlite"),
            "insert into merchants (name, secret_hash, created_at) values ('loja', $1, 0)",
        ),
        Backend::MariaDb => {
            eprintln!("MariaDB's schema began with merchant_secrets: no such upgrade");
            return;
        }
    };
    let last_before = match db.backend {
        Backend::Postgres => 7,
        Backend::Sqlite => 4,
        Backend::MariaDb => unreachable!("returned above"),
    };
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version <= last_before)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    before.run(&db.pool).await.expect("the older schema");
    let secret = idem_core::domain::MerchantSecret::generate();
    sqlx::query(insert)
        .bind(secret.hash().as_bytes().to_vec())
        .execute(&db.pool)
        .await
        .unwrap();

    db.store.migrate().await.expect("the upgrade");
    let found = db.store.merchant_by_secret(&secret.hash()).await.unwrap();
    assert_eq!(found.map(|m| m.merchant.name).as_deref(), Some("loja"));
    let list = db.store.merchant_listing().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].secrets.len(), 1, "its one secret, live");
    assert!(list[0].secrets[0].expires_at.is_none() && list[0].disabled_at.is_none());
}
