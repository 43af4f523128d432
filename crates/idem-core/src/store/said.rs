//! What each operator's change writes in the audit trail, its action and its
//! words, in one place for both backends: a backend writes the entry in the
//! transaction of the change it records, and says nothing of its own.

use chrono::{DateTime, Utc};

use super::model::{Audit, AuditEntry};

/// An action and its words, before it is given its actor and subject.
pub(super) struct Said {
    action: &'static str,
    detail: String,
}

impl Said {
    fn new(action: &'static str, detail: impl Into<String>) -> Self {
        Self {
            action,
            detail: detail.into(),
        }
    }

    /// The entry: `audit`'s actor and reason did this to `subject`.
    pub(super) fn entry<'a>(&'a self, audit: &Audit<'a>, subject: &'a str) -> AuditEntry<'a> {
        AuditEntry {
            audit: *audit,
            action: self.action,
            subject,
            detail: &self.detail,
        }
    }
}

// A merchant's actions keep the `tenant.` prefix they were first recorded
// with: the audit trail is read by people and tools that search it by action.

pub(super) fn merchant_created() -> Said {
    Said::new("tenant.create", "created with one secret")
}

/// A new secret; `retired` older ones live until `until`, if any were live.
pub(super) fn secret_rotated(retired: u64, until: Option<DateTime<Utc>>) -> Said {
    Said::new(
        "tenant.rotate",
        match until {
            Some(at) => format!(
                "new secret; {retired} older secret(s) work until {}",
                at.to_rfc3339()
            ),
            None => "new secret; no older secret was live".to_owned(),
        },
    )
}

pub(super) fn merchant_disabled(disabled: bool) -> Said {
    if disabled {
        Said::new("tenant.disable", "every secret refused")
    } else {
        Said::new("tenant.enable", "live secrets accepted again")
    }
}

pub(super) fn admin_token_made() -> Said {
    Said::new("admin.token", "a console token made")
}

pub(super) fn webhook_added(url: &str, merchant: &str) -> Said {
    Said::new("webhook.add", format!("{url} for {merchant}"))
}

/// A change to an endpoint (`action`, the change's own: see
/// [`super::model::EndpointChange::action`]).
pub(super) fn webhook_changed(action: &'static str) -> Said {
    Said::new(action, "")
}

pub(super) fn webhook_redelivered(deliveries: u64) -> Said {
    Said::new(
        "webhook.redeliver",
        format!("{deliveries} deliveries sent again"),
    )
}
