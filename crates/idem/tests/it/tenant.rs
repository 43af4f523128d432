//! `idem tenant create`, the real binary: a merchant's name is a slug, since
//! it is also a routing key on the broker (spec/api.md).

use crate::helpers::{run_idem, TestDb};

#[tokio::test]
async fn tenant_create_takes_a_slug_and_refuses_anything_else_naming_the_rule() {
    let db = TestDb::new().await;

    let (status, stdout, stderr) = run_idem(&db, &["tenant", "create", "loja-centro_2.b"]).await;
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
        let (status, stdout, stderr) = run_idem(&db, &["tenant", "create", bad]).await;
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
