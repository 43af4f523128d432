//! The reconciler: who decides whether a charge that has been `processing` for
//! ten minutes went through? The acquirer, asked with the charge's own reference.
//!
//! Each pass lists in-flight records whose lease is over and takes each with the
//! same fenced take-over a client retry uses, so reconcilers and servers never
//! work one charge at once. It looks the reference up at the acquirer, captures
//! with the same reference only where the acquirer has no outcome (the acquirer
//! deduplicates, so this cannot charge twice; the lease is renewed between the
//! look and the POST, so no take-over can POST the same reference meanwhile),
//! and stores the outcome exactly as a live request would, so a late retry gets
//! the replay. An unknown answer backs off per charge (exponentially, or longer
//! if the acquirer's `Retry-After` says so), written in the same statement that
//! releases the record. Past the settle deadline it looks once more, without
//! capturing: an outcome found is stored; none at the acquirer marks the charge
//! for review, still `processing`. It never calls a charge captured or failed
//! without the acquirer's word, and one charge's failure never stops a pass.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use idem_core::domain::{
    ChargeId, IdempotencyKey, Merchant, StepKind, SubjectId, VoidIntent, EXPIRY_KEY_PREFIX,
};
use idem_core::idempotency::{Engine, Outcome, Reconciled};
use idem_core::store::{Audit, AuditEntry, Orphan, Store, StoreError};

/// The reconciler's name in the audit trail.
pub const RECONCILER_ACTOR: &str = "reconciler";

/// Orphans taken per pass: enough to drain a crash's backlog quickly, few
/// enough that one pass stays short.
const BATCH: i64 = 100;

#[derive(Debug, Clone, Copy)]
pub struct ReconcilerConfig {
    /// Pause between passes.
    pub interval: Duration,
    /// Past this age a charge is marked for review instead of retried.
    pub settle_deadline: Duration,
    /// First backoff after an unknown answer; it doubles each time.
    pub backoff_base: Duration,
    /// The longest backoff.
    pub backoff_cap: Duration,
    /// An authorization not captured within this is voided (`--authorization-ttl`).
    pub authorization_ttl: Duration,
}

/// How long an authorization waits for its capture, by default: the card
/// networks' usual hold (Checkout.com voids after 7 days).
pub const DEFAULT_AUTHORIZATION_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

impl ReconcilerConfig {
    pub fn new(interval: Duration, settle_deadline: Duration) -> Self {
        Self {
            interval,
            settle_deadline,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(300),
            authorization_ttl: DEFAULT_AUTHORIZATION_TTL,
        }
    }

    /// With authorizations voided after `ttl` instead of the default.
    pub fn with_authorization_ttl(self, ttl: Duration) -> Self {
        Self {
            authorization_ttl: ttl,
            ..self
        }
    }

    /// Exponential with "equal jitter": half the step fixed, half random, so
    /// retries spread out but never collapse to zero.
    pub fn backoff(&self, unknowns_so_far: i32) -> Duration {
        let exp = self
            .backoff_base
            .saturating_mul(2u32.saturating_pow(unknowns_so_far.clamp(0, 30).unsigned_abs()))
            .min(self.backoff_cap);
        let half = exp / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Final outcomes stored.
    pub settled: u32,
    /// Unknown again; scheduled for later.
    pub backed_off: u32,
    /// Past the deadline; marked for review.
    pub marked_for_review: u32,
    /// Taken by another attempt first.
    pub skipped: u32,
    pub errors: u32,
    /// Authorizations past `--authorization-ttl` voided (or whose void was
    /// begun: an unknown outcome is the reconciler's next).
    pub expired: u32,
}

impl PassReport {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

pub struct Reconciler {
    /// Settles each orphan the way a retry would.
    engine: Engine,
    /// Finds the orphans; records what the reconciler saw.
    store: Store,
    config: ReconcilerConfig,
}

impl Reconciler {
    pub fn new(engine: Engine, store: Store, config: ReconcilerConfig) -> Self {
        Self {
            engine,
            store,
            config,
        }
    }

    /// Passes until `shutdown`; a failed pass (database down) is logged and retried.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.pass().await {
                Ok(report) if !report.is_empty() => tracing::info!(?report, "reconciler pass"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reconciler pass failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.config.interval) => {}
            }
        }
    }

    /// One pass over the orphans due now.
    pub async fn pass(&self) -> Result<PassReport, StoreError> {
        let report = self.pass_uncounted().await?;
        let counts = [
            ("settled", report.settled),
            ("backed_off", report.backed_off),
            ("marked_for_review", report.marked_for_review),
            ("skipped", report.skipped),
            ("error", report.errors),
            ("expired", report.expired),
        ];
        for (result, n) in counts {
            if n > 0 {
                metrics::counter!(idem_core::metrics::RECONCILER, "result" => result)
                    .increment(u64::from(n));
            }
        }
        Ok(report)
    }

    async fn pass_uncounted(&self) -> Result<PassReport, StoreError> {
        let mut report = PassReport::default();
        for orphan in self
            .store
            .orphans(BATCH, self.config.settle_deadline)
            .await?
        {
            let span = tracing::info_span!("reconcile", subject = %orphan.subject,
                idempotency_key = %orphan.key, past_deadline = orphan.past_deadline);
            // A trace of its own per charge or refund, linked to the request that began it.
            if let Some(traceparent) = &orphan.traceparent {
                idem_core::trace::link_to(&span, traceparent);
            }
            self.settle(&orphan, &mut report).instrument(span).await;
        }
        for (merchant, charge_id) in self
            .store
            .expired_authorizations(self.config.authorization_ttl, BATCH)
            .await?
        {
            let span = tracing::info_span!("expire", charge_id = %charge_id);
            self.expire(&merchant, charge_id, &mut report)
                .instrument(span)
                .await;
        }
        Ok(report)
    }

    /// Voids an authorization past its time, as a merchant's void would, under
    /// a key that is the charge's own: two instances' reconcilers racing on it
    /// claim one key, so one void is made (the other replays it, or finds it
    /// in flight), and an unknown outcome is settled later like any void's.
    async fn expire(&self, merchant: &Merchant, charge_id: ChargeId, report: &mut PassReport) {
        let key = match IdempotencyKey::from_unquoted(&format!("{EXPIRY_KEY_PREFIX}{charge_id}")) {
            Ok(key) => key,
            Err(e) => {
                tracing::error!(error = %e, "no expiry key for the charge");
                report.errors += 1;
                return;
            }
        };
        match self
            .engine
            .submit(merchant, &key, &VoidIntent { charge_id })
            .await
        {
            Ok(Outcome::Completed { response, .. }) if response.status == 201 => {
                tracing::info!("authorization past its time voided");
                report.expired += 1;
            }
            // Another instance's void in flight, or one whose outcome is
            // unknown (the reconciler's next): the next pass looks again.
            Ok(outcome @ (Outcome::InFlight { .. } | Outcome::Unknown { .. })) => {
                tracing::debug!(
                    outcome = outcome.label(),
                    "void of an expired authorization pending"
                );
                report.skipped += 1;
            }
            // Refused by the acquirer, or the key taken by another request:
            // nothing voided; said once per pass, not counted as expired.
            Ok(outcome) => {
                tracing::warn!(
                    outcome = outcome.label(),
                    "authorization past its time: not voided"
                );
                report.errors += 1;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not void an authorization past its time");
                report.errors += 1;
            }
        }
    }

    /// One orphan; whatever goes wrong with it is counted and logged, and the
    /// pass goes on to the next.
    async fn settle(&self, orphan: &Orphan, report: &mut PassReport) {
        let backoff = self.config.backoff(orphan.reconcile_attempts);
        let history = match self.engine.settle_orphan(orphan, backoff).await {
            Ok(Some(Reconciled::Outcome(Outcome::Completed { response, .. }))) => {
                tracing::info!("settled");
                report.settled += 1;
                format!("the acquirer's outcome stored (answer {})", response.status)
            }
            // Released with the next look already scheduled, in one statement.
            Ok(Some(Reconciled::Outcome(Outcome::Unknown { retry_after, .. }))) => {
                report.backed_off += 1;
                format!(
                    "outcome unknown; next look in {} s or later",
                    backoff.max(retry_after).as_secs()
                )
            }
            Ok(Some(Reconciled::Outcome(Outcome::UnderReview { .. }))) => {
                report.marked_for_review += 1;
                format!(
                    "the acquirer's answer contradicts the {}: marked for review",
                    orphan.subject.kind()
                )
            }
            Ok(Some(Reconciled::NoOutcome)) => {
                tracing::warn!(
                    "no outcome at the acquirer within the settle deadline; marked for review"
                );
                report.marked_for_review += 1;
                "no outcome at the acquirer by the settle deadline: marked for review".to_owned()
            }
            Ok(_) => {
                report.skipped += 1;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not settle");
                report.errors += 1;
                return;
            }
        };
        // The subject's history, for `idem charges show`; losing a line of
        // it never undoes what was stored.
        let entry = AuditEntry {
            audit: Audit {
                actor: RECONCILER_ACTOR,
                reason: None,
            },
            action: match &orphan.subject {
                SubjectId::Charge(_) => "charge.reconcile",
                SubjectId::Refund(_) => "refund.reconcile",
                SubjectId::Step(id) => match id.kind() {
                    StepKind::Capture => "capture.reconcile",
                    StepKind::Void => "void.reconcile",
                },
            },
            subject: orphan.subject.as_str(),
            detail: &history,
        };
        if let Err(e) = self.store.record_audit(&entry).await {
            tracing::warn!(error = %e, "could not record the reconciler's look in the audit trail");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let c = ReconcilerConfig::new(Duration::from_secs(1), Duration::from_secs(60));
        for n in 0..12 {
            let step = Duration::from_secs(1 << n).min(c.backoff_cap);
            let d = c.backoff(n);
            assert!(
                d >= step / 2 && d <= step,
                "attempt {n}: {d:?} not in [{:?}, {step:?}]",
                step / 2
            );
        }
        assert!(c.backoff(i32::MAX) <= c.backoff_cap);
    }
}
