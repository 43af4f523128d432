//! Merchants and their secrets, the console's tokens and the audit trail:
//! what authenticates whom, what a rotation or a disable changes at once, and
//! that each operator's change is recorded with it (a no-op is not).

use std::time::Duration;

use idem_core::domain::MerchantSecret;
use idem_core::store::{Audit, AuditEntry, MerchantError};
use idem_testkit::db::*;

crate::on_every_backend!(
    a_secret_authenticates_its_merchant_until_rotated_out_or_disabled,
    every_change_to_a_merchant_is_in_the_audit_trail_and_a_no_op_is_not,
    console_tokens_and_audit_entries_are_kept_as_given,
);

const BY: Audit<'static> = Audit {
    actor: "ops",
    reason: Some("contract"),
};

async fn a_secret_authenticates_its_merchant_until_rotated_out_or_disabled(db: TestDb) {
    let store = &db.store;
    let (s1, s2, s3) = (
        MerchantSecret::generate(),
        MerchantSecret::generate(),
        MerchantSecret::generate(),
    );
    let made = store
        .create_merchant("loja", &s1.hash(), &BY)
        .await
        .expect("create");
    assert!(matches!(
        store.create_merchant("loja", &s2.hash(), &BY).await,
        Err(MerchantError::NameTaken(name)) if name == "loja"
    ));
    let found = store
        .merchant_by_secret(&s1.hash())
        .await
        .expect("read")
        .expect("the secret is live");
    assert_eq!((found.merchant.id, found.expires_in), (made.id, None));
    assert_eq!(
        store
            .merchant_by_name("loja")
            .await
            .expect("read")
            .map(|m| m.id),
        Some(made.id)
    );
    assert!(store
        .merchant_by_name("nope")
        .await
        .expect("read")
        .is_none());
    assert!(store
        .merchant_by_secret(&s2.hash())
        .await
        .expect("read")
        .is_none());

    let before = store.merchants_version().await.expect("version");
    let rotation = store
        .rotate_secret("loja", &s2.hash(), Duration::from_secs(60), &BY)
        .await
        .expect("rotate");
    assert_eq!(rotation.retired, 1);
    assert!(rotation.retired_until.is_some());
    let old = store
        .merchant_by_secret(&s1.hash())
        .await
        .expect("read")
        .expect("the old secret works out its grace");
    assert!(old
        .expires_in
        .is_some_and(|left| left <= Duration::from_secs(60)));
    assert!(store
        .merchant_by_secret(&s2.hash())
        .await
        .expect("read")
        .is_some_and(|m| m.expires_in.is_none()));
    let rotated = store.merchants_version().await.expect("version");
    assert_ne!(rotated, before, "a rotation moves the version caches watch");

    store
        .rotate_secret("loja", &s3.hash(), Duration::ZERO, &BY)
        .await
        .expect("rotate");
    for retired in [&s1, &s2] {
        assert!(
            store
                .merchant_by_secret(&retired.hash())
                .await
                .expect("read")
                .is_none(),
            "no grace: refused at once"
        );
    }
    assert!(matches!(
        store.rotate_secret("nope", &s3.hash(), Duration::ZERO, &BY).await,
        Err(MerchantError::Unknown(name)) if name == "nope"
    ));

    let live = store.merchants_version().await.expect("version");
    assert!(store
        .set_merchant_disabled("loja", true, &BY)
        .await
        .expect("disable"));
    assert!(store
        .merchant_by_secret(&s3.hash())
        .await
        .expect("read")
        .is_none());
    assert_ne!(store.merchants_version().await.expect("version"), live);
    assert!(store
        .set_merchant_disabled("loja", false, &BY)
        .await
        .expect("enable"));
    assert!(store
        .merchant_by_secret(&s3.hash())
        .await
        .expect("read")
        .is_some());

    let listing = store.merchant_listing().await.expect("list");
    assert_eq!(listing.len(), 1);
    assert_eq!(listing[0].merchant.name, "loja");
    assert_eq!(
        listing[0].secrets.len(),
        3,
        "never a secret, only its dates"
    );
    assert!(listing[0].disabled_at.is_none());
}

async fn every_change_to_a_merchant_is_in_the_audit_trail_and_a_no_op_is_not(db: TestDb) {
    let store = &db.store;
    let secret = MerchantSecret::generate();
    store
        .create_merchant("loja", &secret.hash(), &BY)
        .await
        .expect("create");
    store
        .rotate_secret(
            "loja",
            &MerchantSecret::generate().hash(),
            Duration::ZERO,
            &BY,
        )
        .await
        .expect("rotate");
    assert!(store
        .set_merchant_disabled("loja", true, &BY)
        .await
        .expect("disable"));
    assert!(
        !store
            .set_merchant_disabled("loja", true, &BY)
            .await
            .expect("disable again"),
        "already disabled: nothing changed"
    );
    assert!(store
        .set_merchant_disabled("loja", false, &BY)
        .await
        .expect("enable"));
    store
        .create_merchant("other", &MerchantSecret::generate().hash(), &BY)
        .await
        .expect("create");

    let trail = store.audit_trail(Some("loja"), 10).await.expect("trail");
    let actions: Vec<&str> = trail.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "tenant.enable",
            "tenant.disable",
            "tenant.rotate",
            "tenant.create"
        ],
        "newest first, the no-op left out"
    );
    assert!(trail
        .iter()
        .all(|r| r.actor == "ops" && r.reason.as_deref() == Some("contract")));
    assert_eq!(store.audit_trail(None, 10).await.expect("trail").len(), 5);
    assert_eq!(store.audit_trail(None, 2).await.expect("trail").len(), 2);
}

async fn console_tokens_and_audit_entries_are_kept_as_given(db: TestDb) {
    let store = &db.store;
    let token = MerchantSecret::generate();
    store
        .create_admin_token("ana", &token.hash(), &BY)
        .await
        .expect("token");
    assert_eq!(
        store.admin_token_name(&token.hash()).await.expect("read"),
        Some("ana".to_owned())
    );
    assert!(store
        .admin_token_name(&MerchantSecret::generate().hash())
        .await
        .expect("read")
        .is_none());

    store
        .record_audit(&AuditEntry {
            audit: Audit {
                actor: "ana",
                reason: Some("the acquirer says captured"),
            },
            action: "charge.resolve",
            subject: "ch_contract",
            detail: "captured",
        })
        .await
        .expect("record");
    let trail = store
        .audit_trail(Some("ch_contract"), 10)
        .await
        .expect("trail");
    assert_eq!(trail.len(), 1);
    let entry = &trail[0];
    assert_eq!(
        (
            entry.actor.as_str(),
            entry.action.as_str(),
            entry.reason.as_deref(),
            entry.detail.as_deref()
        ),
        (
            "ana",
            "charge.resolve",
            Some("the acquirer says captured"),
            Some("captured")
        )
    );
}
