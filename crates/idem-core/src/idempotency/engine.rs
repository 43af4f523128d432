//! The engine: one intent in, at most one capture out, whatever arrives when.
//!
//! ```text
//! claim (insert first, committed) ──won──► acquirer ──► finalize (fenced) ──► answer
//!   │ lost
//!   ├─ other fingerprint ──────────────► Mismatch (422)
//!   ├─ outcome stored ─────────────────► replay, byte for byte
//!   ├─ in flight, lease alive ─────────► InFlight (409), at once
//!   ├─ in flight, awaiting review ─────► UnderReview (503): a person decides
//!   └─ in flight, lease over ─► take over (attempt + 1) ──► acquirer, same reference ...
//! ```
//! No transaction is open while the acquirer is called. The acquirer deduplicates
//! by reference, so a re-drive after a crash, timeout or take-over moves no money
//! twice; the fencing token means only the current holder stores an outcome.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::decision::{found, verdict, Found, Verdict};
use super::operation::{ClaimArgs, Claimed, Final, Finalize, Operation, Said};
use super::{InFlightMemo, ReplayCache};
use crate::acquirer::{Acquirer, AcquirerError, Contradiction, Unknown};
use crate::crash::{self, CrashPoint};
use crate::domain::{
    CaptureIntent, ChargeRequest, IdempotencyKey, Merchant, RefundIntent, StepKind, StoredResponse,
    SubjectId, VoidIntent,
};
use crate::store::{
    AuditEntry, KeyState, KeyStatus, Orphan, Record, Refusal, Reschedule, Store, StoreError,
};

/// A duplicate that waits for a key in flight (`Prefer: wait`) looks at the
/// key again after this long, then twice as long each time, up to
/// [`WAIT_POLL_MAX`]: an outcome that comes soon is answered within tens of
/// milliseconds, and a long wait costs a read every fifth of a second.
const WAIT_POLL_FIRST: Duration = Duration::from_millis(20);
const WAIT_POLL_MAX: Duration = Duration::from_millis(200);

/// What a duplicate of an in-flight key is told to wait: about one acquirer
/// call, after which the first attempt has usually stored its outcome. Not
/// the lease's remaining time: that is how long a *dead* holder keeps the key
/// (30 s by default), while a live one answers within a second or two.
const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a subject awaits review (`idem charges stuck` shows it).
const NO_OUTCOME_AT_DEADLINE: &str =
    "the acquirer had no outcome for the reference at the settle deadline";

/// What a client of a charge awaiting review is told to wait: a person
/// settles it, in minutes or hours; asking every second changes nothing.
const UNDER_REVIEW_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How an attempt that holds a record learns the acquirer's outcome.
#[derive(Debug, Clone, Copy)]
pub(super) enum Approach {
    /// POST the capture: a live attempt, the client wants the charge.
    Capture,
    /// The reconciler: look the reference up, and POST only where the
    /// acquirer has no outcome. An unknown answer waits `backoff` (or the
    /// acquirer's `Retry-After`, if longer) before the reconciler looks again.
    LookupFirst { backoff: Duration },
}

/// A final outcome to store: the acquirer's, or an operator's decision.
pub(super) struct Decided<'a> {
    pub(super) outcome: Final,
    pub(super) audit: Option<&'a AuditEntry<'a>>,
}

/// What the engine decided for one attempt. `subject` is the charge or the
/// refund the key made.
#[derive(Debug)]
pub enum Outcome {
    /// A final outcome: fresh from this attempt, or the stored one replayed.
    Completed {
        subject: SubjectId,
        response: StoredResponse,
        replayed: bool,
        /// Until when, at least, the key is honoured (on this process's
        /// clock): a replay gets this same answer until then.
        honoured_until: Instant,
    },
    /// Another attempt holds the key; ask again after `retry_after`.
    InFlight {
        subject: SubjectId,
        retry_after: Duration,
    },
    /// The key was first used for a different request (or another
    /// operation), which made `subject`.
    Mismatch {
        subject: SubjectId,
        fields: Vec<&'static str>,
    },
    /// The key expired after storing the outcome of this very request: a late
    /// retry, answered `410` naming the subject; nothing was claimed or moved.
    Expired { subject: SubjectId },
    /// The acquirer gave no definite answer; the subject stays pending and
    /// the next attempt (or the reconciler) re-drives it with the same reference.
    Unknown {
        subject: SubjectId,
        retry_after: Duration,
    },
    /// The subject awaits a person's review (the acquirer did something else
    /// than asked, or had no outcome by the settle deadline): it stays
    /// pending, and no attempt calls the acquirer for it until an operator
    /// settles it.
    UnderReview {
        subject: SubjectId,
        retry_after: Duration,
    },
    /// A refund the charge cannot give: nothing was claimed or reserved,
    /// and the key stays free.
    Refused(Refusal),
}

/// What the reconciler's turn at an orphan came to.
#[derive(Debug)]
pub enum Reconciled {
    /// What a live attempt would have come to (final, unknown, or another's).
    Outcome(Outcome),
    /// The last look past the settle deadline: the acquirer has no outcome
    /// for the reference. The charge stays `processing`, marked for review.
    NoOutcome,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How long claims live.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// How long a claim's holder may work before another attempt may take over.
    /// Must exceed the acquirer timeout, or live attempts get taken over.
    pub lease: Duration,
    /// How long a completed outcome is honoured after it is stored.
    pub key_ttl: Duration,
    /// Bytes of completed outcomes each instance keeps to answer replays
    /// from memory (0: none; every replay reads the database).
    pub replay_cache_bytes: u64,
}

/// The idempotency engine for every operation (charges, refunds). Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(super) store: Store,
    /// The HTTP client in service; a scripted one in the engine's tests.
    pub(super) acquirer: Arc<dyn Acquirer>,
    pub(super) config: EngineConfig,
    /// Keys this instance saw held by another attempt, answered from memory.
    pub(super) charges_in_flight: InFlightMemo<ChargeRequest>,
    pub(super) refunds_in_flight: InFlightMemo<RefundIntent>,
    pub(super) captures_in_flight: InFlightMemo<CaptureIntent>,
    pub(super) voids_in_flight: InFlightMemo<VoidIntent>,
    /// Completed outcomes this instance read or stored, answered from memory.
    replays: ReplayCache,
}

impl Engine {
    /// The span of one of the store's steps on a charge's path
    /// (OpenTelemetry's database conventions).
    fn db_span(&self, operation: &'static str) -> tracing::Span {
        crate::span!(
            "db",
            otel.name = operation,
            otel.kind = "client",
            db.system.name = self.store.system_name(),
            db.operation.name = operation
        )
    }

    /// An engine over `store` that calls `acquirer` ([`crate::acquirer::AcquirerClient`]
    /// in service).
    pub fn new(store: Store, acquirer: impl Acquirer + 'static, config: EngineConfig) -> Self {
        Self {
            store,
            acquirer: Arc::new(acquirer),
            config,
            charges_in_flight: InFlightMemo::default(),
            refunds_in_flight: InFlightMemo::default(),
            captures_in_flight: InFlightMemo::default(),
            voids_in_flight: InFlightMemo::default(),
            replays: ReplayCache::new(config.replay_cache_bytes),
        }
    }

    /// A request whose key was found in flight (`in_flight`, from
    /// [`Engine::submit`]), waited on until another attempt's outcome is
    /// stored or `until` passes (`Prefer: wait`). Between looks nothing is
    /// held: no connection, no lock, no lease. Each look reads the key's
    /// state; once no live attempt holds it (its outcome is stored, here or on
    /// another instance, or its holder released it or died), the request is
    /// submitted again past the in-flight memo and answered as any retry would
    /// be: the stored outcome replayed, or, when there is none, this request
    /// drives the operation under the same reference (so, like `submit`, not
    /// to be cancelled once it may have claimed). At `until`, still in flight:
    /// the last `409`.
    pub async fn await_outcome<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        request: &O,
        in_flight: Outcome,
        until: Instant,
    ) -> Result<Outcome, EngineError> {
        let mut outcome = in_flight;
        let mut poll = WAIT_POLL_FIRST;
        while matches!(outcome, Outcome::InFlight { .. }) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(poll.min(left)).await;
            poll = (poll * 2).min(WAIT_POLL_MAX);
            if let Some(KeyStatus::InFlight {
                lease_remaining, ..
            }) = self.store.key_status(merchant.id, key).await?
            {
                if !lease_remaining.is_zero() {
                    continue;
                }
            }
            O::memo(self).forget(merchant.id, key);
            outcome = self.submit(merchant, key, request).await?;
        }
        Ok(outcome)
    }

    /// Runs one attempt of one intent (a charge, a refund) to completion.
    ///
    /// Callers should not cancel this future between claim and finalize (the HTTP
    /// layer runs it on its own task): a cancelled attempt is safe, but its key
    /// answers `409` until the lease runs out.
    pub async fn submit<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        request: &O,
    ) -> Result<Outcome, EngineError> {
        let fingerprint = request.fingerprint();
        if let Some((subject, response, until)) =
            self.replays.replay(merchant.id, key, &fingerprint)
        {
            // `until` is the key's own lower bound (the memory ends earlier, by its margin).
            return Ok(Outcome::Completed {
                subject,
                response,
                replayed: true,
                honoured_until: until,
            });
        }
        if let Some(held) = O::memo(self).get(merchant.id, key) {
            if held.fingerprint != fingerprint {
                return Ok(Outcome::Mismatch {
                    subject: held.subject,
                    fields: request.differing_fields(&held.request),
                });
            }
            return Ok(Outcome::InFlight {
                subject: held.subject,
                retry_after: IN_FLIGHT_RETRY_AFTER,
            });
        }
        let asked = Instant::now();
        let claim = request
            .claim(
                &self.store,
                ClaimArgs {
                    merchant_id: merchant.id,
                    key,
                    fingerprint,
                    lease: self.config.lease,
                    key_ttl: self.config.key_ttl,
                    traceparent: crate::trace::current_traceparent().as_deref(),
                },
            )
            .instrument(self.db_span("claim"))
            .await?;
        let record = match claim {
            Claimed::Won(record) => {
                crash::point(CrashPoint::AfterClaim);
                return self
                    .drive::<O>(merchant, key, record, Approach::Capture)
                    .await;
            }
            Claimed::Lost(record) => record,
            Claimed::Expired(subject) => return Ok(Outcome::Expired { subject }),
            Claimed::Other(subject) => {
                return Ok(Outcome::Mismatch {
                    subject,
                    fields: vec!["operation"],
                })
            }
            Claimed::Refused(refusal) => return Ok(Outcome::Refused(refusal)),
        };
        match found(
            &record.fingerprint,
            &record.state,
            record.under_review,
            &fingerprint,
        ) {
            Found::Mismatch => Ok(Outcome::Mismatch {
                subject: O::id(&record.subject),
                fields: request.differing_fields(&O::request_of(&record.subject)),
            }),
            Found::TakeOver => {
                match O::take_over(
                    &self.store,
                    merchant.id,
                    key,
                    record.attempt,
                    self.config.lease,
                )
                .await?
                {
                    Some(taken) => {
                        tracing::info!(subject = %O::id(&taken.subject), attempt = taken.attempt,
                            "took over an expired lease; re-driving with the same reference");
                        self.drive::<O>(merchant, key, taken, Approach::Capture)
                            .await
                    }
                    None => self.current::<O>(merchant, key).await,
                }
            }
            Found::InFlight { lease_remaining } => {
                O::memo(self).hold(
                    merchant.id,
                    key,
                    record.fingerprint,
                    O::request_of(&record.subject),
                    O::id(&record.subject),
                    lease_remaining,
                );
                Ok(self.settled_or_waiting::<O>(merchant.id, key, record, asked))
            }
            Found::Replay | Found::UnderReview => {
                Ok(self.settled_or_waiting::<O>(merchant.id, key, record, asked))
            }
        }
    }

    /// Settles a charge or a refund whose attempt died or gave up (the
    /// reconciler's job): takes its record over if `orphan.attempt` still
    /// holds it, asks the acquirer for the reference's outcome, and calls it
    /// with the same reference only where the acquirer has none — unless the
    /// orphan is past the settle deadline, where the look is the last and
    /// nothing is sent: without an outcome there, the subject is marked for
    /// review ([`Reconciled::NoOutcome`]). An unknown answer releases the
    /// record with `backoff` (or the acquirer's `Retry-After`, if longer) as
    /// the reconciler's wait. `None`: another attempt took it first.
    pub async fn settle_orphan(
        &self,
        orphan: &Orphan,
        backoff: Duration,
    ) -> Result<Option<Reconciled>, EngineError> {
        match &orphan.subject {
            SubjectId::Charge(_) => self.settle::<ChargeRequest>(orphan, backoff).await,
            SubjectId::Refund(_) => self.settle::<RefundIntent>(orphan, backoff).await,
            SubjectId::Step(id) => match id.kind() {
                StepKind::Capture => self.settle::<CaptureIntent>(orphan, backoff).await,
                StepKind::Void => self.settle::<VoidIntent>(orphan, backoff).await,
            },
        }
    }

    async fn settle<O: Operation>(
        &self,
        orphan: &Orphan,
        backoff: Duration,
    ) -> Result<Option<Reconciled>, EngineError> {
        let (merchant, key) = (&orphan.merchant, &orphan.key);
        let Some(record) = O::take_over(
            &self.store,
            merchant.id,
            key,
            orphan.attempt,
            self.config.lease,
        )
        .await?
        else {
            return Ok(None);
        };
        if !orphan.past_deadline {
            let outcome = self
                .drive::<O>(merchant, key, record, Approach::LookupFirst { backoff })
                .await?;
            return Ok(Some(Reconciled::Outcome(outcome)));
        }
        let started = std::time::Instant::now();
        let result = match O::look_up(self.acquirer.as_ref(), merchant, &record.subject)
            .instrument(acquirer_span::<O>("GET", &record.subject))
            .await
        {
            Ok(Some(settled)) => settled,
            Ok(None) => {
                // Marked while the lease still holds the record: if marking
                // fails, no pass asks the acquirer again before the lease ends.
                O::mark_for_review(
                    &self.store,
                    merchant,
                    &record.subject,
                    NO_OUTCOME_AT_DEADLINE,
                )
                .await?;
                O::release(
                    &self.store,
                    merchant.id,
                    key,
                    record.attempt,
                    &Reschedule::default(),
                )
                .await?;
                return Ok(Some(Reconciled::NoOutcome));
            }
            Err(e) => Err(e),
        };
        let outcome = self
            .conclude::<O>(merchant, key, record, result, started, Some(backoff))
            .await?;
        Ok(Some(Reconciled::Outcome(outcome)))
    }

    /// Learns the acquirer's outcome for a record this attempt holds, then stores it.
    pub(super) async fn drive<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: Record<O::Subject>,
        approach: Approach,
    ) -> Result<Outcome, EngineError> {
        let called = std::time::Instant::now();
        let call = || {
            O::call(self.acquirer.as_ref(), merchant, &record.subject)
                .instrument(acquirer_span::<O>("POST", &record.subject))
        };
        let result = match approach {
            Approach::Capture => call().await,
            Approach::LookupFirst { .. } => {
                match O::look_up(self.acquirer.as_ref(), merchant, &record.subject)
                    .instrument(acquirer_span::<O>("GET", &record.subject))
                    .await
                {
                    Ok(Some(settled)) => settled,
                    Ok(None) => {
                        // The lookup took part of the lease: renew it, so no
                        // take-over can POST this reference while this POST runs.
                        if !self
                            .store
                            .renew(merchant.id, key, record.attempt, self.config.lease)
                            .await?
                        {
                            return self.current::<O>(merchant, key).await;
                        }
                        call().await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let backoff = match approach {
            Approach::Capture => None,
            Approach::LookupFirst { backoff } => Some(backoff),
        };
        self.conclude::<O>(merchant, key, record, result, called, backoff)
            .await
    }

    /// Stores what the acquirer said for a record this attempt holds: a final
    /// outcome under the fencing token, or, when unknown, the release, with
    /// the reconciler's `backoff` when it is the reconciler asking.
    async fn conclude<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: Record<O::Subject>,
        result: Said,
        called: std::time::Instant,
        backoff: Option<Duration>,
    ) -> Result<Outcome, EngineError> {
        crash::point(CrashPoint::AfterAcquirer);
        metrics::histogram!(crate::metrics::ACQUIRER_SECONDS)
            .record(called.elapsed().as_secs_f64());
        let label = match (&result, O::id(&record.subject)) {
            (Ok(_), SubjectId::Charge(_)) => "captured",
            (Ok(_), SubjectId::Refund(_)) => "refunded",
            (Ok(_), SubjectId::Step(id)) => match id.kind() {
                StepKind::Capture => "captured",
                StepKind::Void => "voided",
            },
            (Err(AcquirerError::Declined(_)), _) => "declined",
            (Err(AcquirerError::Rejected { .. }), _) => "rejected",
            (Err(AcquirerError::Unknown(_)), _) => "unknown",
            (Err(AcquirerError::Contradicted(_)), _) => "contradicted",
        };
        metrics::counter!(crate::metrics::ACQUIRER_CALLS, "outcome" => label).increment(1);
        if let Err(AcquirerError::Rejected { status, reason }) = &result {
            tracing::error!(subject = %O::id(&record.subject), status, reason,
                "the acquirer refused the request for good");
        }
        match verdict(result, backoff) {
            Verdict::Final(outcome) => {
                self.store_outcome::<O>(
                    merchant,
                    key,
                    record,
                    Decided {
                        outcome,
                        audit: None,
                    },
                )
                .await
            }
            Verdict::Unknown {
                unknown,
                reschedule,
                retry_after,
            } => {
                self.unknown::<O>(merchant, key, &record, unknown, &reschedule, retry_after)
                    .await
            }
            Verdict::Contradicted(contradiction) => {
                self.contradicted::<O>(merchant, key, &record, contradiction)
                    .await
            }
        }
    }

    /// Stores a final outcome for a record this attempt holds, under its
    /// fencing token: the subject settled, the answer every replay repeats,
    /// what the outcome announces, and an operator's audit record if there is one.
    pub(super) async fn store_outcome<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: Record<O::Subject>,
        decided: Decided<'_>,
    ) -> Result<Outcome, EngineError> {
        let settled = O::settled(&record.subject, &decided.outcome);
        let response = O::response(&settled);
        let asked = Instant::now();
        let stored = O::finalize(
            &self.store,
            Finalize {
                merchant,
                key,
                record: &record,
                settled: &settled,
                outcome: &decided.outcome,
                response: &response,
                audit: decided.audit,
                key_ttl: self.config.key_ttl,
            },
        )
        .instrument(self.db_span("finalize"))
        .await?;
        let subject = O::id(&settled);
        if stored {
            O::memo(self).forget(merchant.id, key);
            self.replays.remember(
                merchant.id,
                key,
                record.fingerprint,
                &subject,
                &response,
                asked + self.config.key_ttl,
            );
            // Sent at `asked`, the statement set the expiry `key_ttl` from
            // the database's now, which came after.
            return Ok(Outcome::Completed {
                subject,
                response,
                replayed: false,
                honoured_until: asked + self.config.key_ttl,
            });
        }
        // Fenced out: our lease ran out and another attempt took over. Its answer
        // (from the same acquirer outcome, by reference) is the one that counts.
        tracing::warn!(%subject, attempt = record.attempt,
            "lost the lease before finalizing; answering with the current holder's outcome");
        self.current::<O>(merchant, key).await
    }

    /// After an unknown answer: logs and counts it by cause, releases the
    /// record with the reconciler's next look scheduled (in one statement, so
    /// no reconciler skips the wait), and tells the caller when to retry.
    async fn unknown<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: &Record<O::Subject>,
        unknown: Unknown,
        reschedule: &Reschedule,
        retry_after: Duration,
    ) -> Result<Outcome, EngineError> {
        let subject = O::id(&record.subject);
        tracing::warn!(%subject, cause = %unknown.cause, why = %unknown.why,
            "acquirer outcome unknown");
        metrics::counter!(crate::metrics::ACQUIRER_UNKNOWN, "cause" => unknown.cause).increment(1);
        O::release(&self.store, merchant.id, key, record.attempt, reschedule).await?;
        // The next duplicate here must re-drive at once, not hear 409.
        O::memo(self).forget(merchant.id, key);
        Ok(Outcome::Unknown {
            subject,
            retry_after,
        })
    }

    /// After an answer whose echo contradicts the request: no retry can fix
    /// it (the acquirer repeats its first outcome for the reference), and it
    /// is not what was asked. The subject goes to a person at once: marked
    /// for review while this attempt still holds its record (so no other
    /// attempt calls the acquirer meanwhile), then released; it stays pending
    /// until an operator settles it.
    async fn contradicted<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: &Record<O::Subject>,
        contradiction: Contradiction,
    ) -> Result<Outcome, EngineError> {
        let subject = O::id(&record.subject);
        let differs = contradiction.differences.join(", ");
        tracing::error!(%subject, reference = O::reference(&record.subject).as_str(),
            acquirer_id = %contradiction.capture_id, differs = %differs,
            "the acquirer did something else than asked; marked for review");
        metrics::counter!(crate::metrics::ACQUIRER_CONTRADICTED).increment(1);
        let reason = format!(
            "the acquirer's {} {} contradicts the {}: {differs}",
            match &subject {
                SubjectId::Charge(_) => "capture",
                SubjectId::Refund(_) => "refund",
                SubjectId::Step(id) => id.kind().as_str(),
            },
            contradiction.capture_id,
            subject.kind(),
        );
        O::mark_for_review(&self.store, merchant, &record.subject, &reason).await?;
        O::release(
            &self.store,
            merchant.id,
            key,
            record.attempt,
            &Reschedule::default(),
        )
        .await?;
        O::memo(self).forget(merchant.id, key);
        Ok(Outcome::UnderReview {
            subject,
            retry_after: UNDER_REVIEW_RETRY_AFTER,
        })
    }

    /// A record read in a statement sent at `asked`, as an answer: its stored
    /// outcome replayed (and remembered while the key surely lives), `409`,
    /// or, for a subject awaiting review, that.
    fn settled_or_waiting<O: Operation>(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: Record<O::Subject>,
        asked: Instant,
    ) -> Outcome {
        let subject = O::id(&record.subject);
        match record.state {
            KeyState::Completed {
                response,
                expires_in,
            } => {
                if !record.expired {
                    self.replays.remember(
                        merchant_id,
                        key,
                        record.fingerprint,
                        &subject,
                        &response,
                        asked + expires_in,
                    );
                }
                Outcome::Completed {
                    subject,
                    response,
                    replayed: true,
                    honoured_until: asked + expires_in,
                }
            }
            KeyState::InFlight { .. } if record.under_review => Outcome::UnderReview {
                subject,
                retry_after: UNDER_REVIEW_RETRY_AFTER,
            },
            KeyState::InFlight { .. } => Outcome::InFlight {
                subject,
                retry_after: IN_FLIGHT_RETRY_AFTER,
            },
        }
    }

    /// The key's record as it is now, without taking anything over.
    pub(super) async fn current<O: Operation>(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
    ) -> Result<Outcome, EngineError> {
        let asked = Instant::now();
        match O::record(&self.store, merchant.id, key).await? {
            Some(record) => Ok(self.settled_or_waiting::<O>(merchant.id, key, record, asked)),
            None => Err(StoreError::Corrupt(format!("key {key} vanished while in use")).into()),
        }
    }
}

impl Outcome {
    /// The outcome's name in metrics. A charge's: `captured`, `declined`,
    /// `failed`, `replayed`, `in_flight`, `key_reused`, `key_expired`,
    /// `unknown`, `under_review`; a refund's the same, but `succeeded` for
    /// `captured`, and `refused` for a refund its charge cannot give.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Completed { replayed: true, .. } => "replayed",
            Self::Completed {
                response,
                subject: SubjectId::Charge(_),
                ..
            } => match response.status {
                201 => "captured",
                402 => "declined",
                _ => "failed",
            },
            Self::Completed { response, .. } => match response.status {
                201 => "succeeded",
                _ => "failed",
            },
            Self::InFlight { .. } => "in_flight",
            Self::Mismatch { .. } => "key_reused",
            Self::Expired { .. } => "key_expired",
            Self::Unknown { .. } => "unknown",
            Self::UnderReview { .. } => "under_review",
            Self::Refused(_) => "refused",
        }
    }

    /// The charge or the refund the outcome is about; `None` for a refund
    /// refused before anything was made.
    pub fn subject(&self) -> Option<&SubjectId> {
        match self {
            Self::Completed { subject, .. }
            | Self::InFlight { subject, .. }
            | Self::Mismatch { subject, .. }
            | Self::Expired { subject }
            | Self::Unknown { subject, .. }
            | Self::UnderReview { subject, .. } => Some(subject),
            Self::Refused(_) => None,
        }
    }
}

/// The span of a call to the acquirer about `subject` (OpenTelemetry's HTTP
/// client conventions; the client records the status): its id and
/// reference, never the request's body.
fn acquirer_span<O: Operation>(method: &'static str, subject: &O::Subject) -> tracing::Span {
    let id = O::id(subject);
    let (charge_id, refund_id, step_id) = match &id {
        SubjectId::Charge(c) => (Some(c.as_str()), None, None),
        SubjectId::Refund(r) => (None, Some(r.as_str()), None),
        SubjectId::Step(s) => (None, None, Some(s.as_str())),
    };
    crate::span!(
        "acquirer",
        otel.name = method,
        otel.kind = "client",
        http.request.method = method,
        url.template = O::ACQUIRER_PATH,
        charge_id = charge_id,
        refund_id = refund_id,
        step_id = step_id,
        acquirer.reference = O::reference(subject).as_str(),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty
    )
}
