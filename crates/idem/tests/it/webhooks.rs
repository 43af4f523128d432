//! `idem webhooks`: a merchant's endpoints, added only where a webhook may go,
//! listed without their secrets, rotated, disabled, enabled and removed, each
//! change audited. The real binary against a real database.

use crate::helpers::{run_idem, TestDb};

async fn webhooks(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["webhooks"];
    all.extend_from_slice(args);
    if !matches!(args.first(), Some(&"list")) {
        all.extend_from_slice(&["--actor", "ana"]);
    }
    let (status, stdout, stderr) = run_idem(db, &all).await;
    (status.success(), stdout, stderr)
}

#[tokio::test]
async fn endpoints_go_only_where_webhooks_may_and_never_show_their_secrets() {
    let db = TestDb::new().await;
    db.merchant("loja").await;

    for (url, why) in [
        ("https://localhost/hook", "not a public address"),
        (
            "https://169.254.169.254/latest/meta-data",
            "not a public address",
        ),
        ("https://[::1]/hook", "not a public address"),
        ("https://10.0.0.7/hook", "not a public address"),
        ("http://8.8.8.8/hook", "must use https://"),
        ("https://user:pw@8.8.8.8/hook", "user name or password"),
    ] {
        let (ok, stdout, stderr) = webhooks(&db, &["add", "loja", url]).await;
        assert!(!ok, "{url} was accepted");
        assert!(stdout.is_empty(), "{url}: {stdout}");
        assert!(stderr.contains(why), "{url}: {stderr}");
    }
    let (ok, _, stderr) = webhooks(&db, &["add", "nobody", "https://8.8.8.8/hook"]).await;
    assert!(!ok);
    assert!(stderr.contains("no merchant is named"), "{stderr}");
    let (ok, _, stderr) = webhooks(
        &db,
        &[
            "add",
            "loja",
            "https://8.8.8.8/hook",
            "--events",
            "charge.refunded",
        ],
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("unknown event"), "{stderr}");
    assert_eq!(
        db.count("webhook_endpoints").await,
        0,
        "nothing refused was stored"
    );

    // A private receiver, allowed by the flag (as an on-premises one would be).
    let (ok, secret, stderr) = webhooks(
        &db,
        &[
            "add",
            "loja",
            "http://127.0.0.1:9/hook",
            "--webhook-allow-private",
            "--events",
            "charge.captured,charge.review_required",
        ],
    )
    .await;
    assert!(ok, "{stderr}");
    let secret = secret.trim_end_matches('\n');
    assert!(
        secret.starts_with("whsec_") && !secret.contains('\n'),
        "the secret alone on stdout: {secret:?}"
    );
    let id = stderr
        .split_whitespace()
        .find(|w| w.starts_with("we_"))
        .unwrap_or_else(|| panic!("no endpoint id in {stderr}"))
        .to_owned();
    // A public one needs no flag.
    let (ok, _, stderr) = webhooks(&db, &["add", "loja", "https://8.8.8.8/hook"]).await;
    assert!(ok, "{stderr}");

    let (ok, list, _) = webhooks(&db, &["list"]).await;
    assert!(ok);
    assert!(!list.contains("whsec_"), "never a secret: {list}");
    let line = list.lines().find(|l| l.starts_with(&id)).expect("listed");
    assert!(
        line.contains(
            "\tloja\thttp://127.0.0.1:9/hook\tcharge.captured,charge.review_required\tenabled\t"
        ),
        "{line}"
    );
    assert!(
        list.lines()
            .any(|l| l.contains("https://8.8.8.8/hook\tall\t")),
        "{list}"
    );

    // Rotation with a grace: both secrets kept, the old one until then.
    let (ok, rotated, stderr) = webhooks(&db, &["rotate-secret", &id, "--grace", "1h"]).await;
    assert!(ok, "{stderr}");
    let rotated = rotated.trim_end_matches('\n');
    assert!(rotated.starts_with("whsec_") && rotated != secret);
    let (now, before): (String, Option<String>) =
        sqlx::query_as("select secret, previous_secret from webhook_endpoints where id = $1")
            .bind(&id)
            .fetch_one(&db.pool)
            .await
            .expect("endpoint");
    assert_eq!((now.as_str(), before.as_deref()), (rotated, Some(secret)));
    let (_, list, _) = webhooks(&db, &["list"]).await;
    assert!(list.contains("old secret signs until"), "{list}");

    let (ok, _, stderr) = webhooks(&db, &["disable", &id]).await;
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = webhooks(&db, &["disable", &id]).await;
    assert!(!ok && stderr.contains("nothing to change"), "{stderr}");
    let (_, list, _) = webhooks(&db, &["list"]).await;
    assert!(list.contains("disabled since"), "{list}");
    let (ok, _, stderr) = webhooks(&db, &["enable", &id]).await;
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = webhooks(&db, &["remove", &id]).await;
    assert!(ok, "{stderr}");
    let (_, list, _) = webhooks(&db, &["list"]).await;
    assert!(!list.contains(&id), "{list}");
    let (ok, _, _) = webhooks(&db, &["remove", &id]).await;
    assert!(!ok, "removed once");

    let actions: Vec<(String,)> = sqlx::query_as(
        "select action from audit_log where subject = $1 and actor = 'ana' order by id",
    )
    .bind(&id)
    .fetch_all(&db.pool)
    .await
    .expect("audit");
    let actions: Vec<&str> = actions.iter().map(|(a,)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "webhook.add",
            "webhook.rotate-secret",
            "webhook.disable",
            "webhook.enable",
            "webhook.remove"
        ]
    );
}
