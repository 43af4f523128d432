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

use std::time::{Duration, Instant};

use tracing::Instrument;

use super::decision::{found, verdict, Found, Verdict};
use super::{InFlightMemo, ReplayCache};
use crate::acquirer::protocol::CaptureRequest;
use crate::acquirer::{AcquirerClient, AcquirerError, Contradiction, Settled, Unknown};
use crate::crash::{self, CrashPoint};
use crate::domain::{
    Charge, ChargeEvent, ChargeId, ChargeRequest, ChargeStatus, EventType, Fingerprint,
    IdempotencyKey, Merchant, MessageId, StoredResponse, WebhookBody, WebhookEvent,
};
use crate::problem::{Problem, ProblemKind};
use crate::store::{
    AuditEntry, Claim, KeyRecord, KeyState, KeyStatus, NewClaim, NewEvent, NewWebhook, Orphan,
    Reschedule, Settlement, Store, StoreError,
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

/// Why a charge awaits review (`idem charges stuck` shows it).
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
    pub(super) status: ChargeStatus,
    pub(super) capture_id: Option<&'a str>,
    pub(super) decline_reason: Option<&'a str>,
    pub(super) audit: Option<&'a AuditEntry<'a>>,
}

/// What the engine decided for one attempt.
#[derive(Debug)]
pub enum Outcome {
    /// A final outcome: fresh from this attempt, or the stored one replayed.
    Completed {
        charge_id: ChargeId,
        response: StoredResponse,
        replayed: bool,
        /// Until when, at least, the key is honoured (on this process's
        /// clock): a replay gets this same answer until then.
        honoured_until: Instant,
    },
    /// Another attempt holds the key; ask again after `retry_after`.
    InFlight {
        charge_id: ChargeId,
        retry_after: Duration,
    },
    /// The key was first used for a different request, which made `charge_id`.
    Mismatch {
        charge_id: ChargeId,
        fields: Vec<&'static str>,
    },
    /// The key expired after storing the outcome of this very request: a late
    /// retry, answered `410` naming the charge; nothing was claimed or charged.
    Expired { charge_id: ChargeId },
    /// The acquirer gave no definite answer; the charge stays `processing` and
    /// the next attempt (or the reconciler) re-drives it with the same reference.
    Unknown {
        charge_id: ChargeId,
        retry_after: Duration,
    },
    /// The charge awaits a person's review (the acquirer captured something
    /// else than asked, or had no outcome by the settle deadline): it stays
    /// `processing`, and no attempt calls the acquirer for it until an
    /// operator settles it (`idem charges resolve`).
    UnderReview {
        charge_id: ChargeId,
        retry_after: Duration,
    },
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

/// The idempotency engine for charges. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(super) store: Store,
    acquirer: AcquirerClient,
    pub(super) config: EngineConfig,
    /// Keys this instance saw held by another attempt, answered from memory.
    in_flight: InFlightMemo,
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

    pub fn new(store: Store, acquirer: AcquirerClient, config: EngineConfig) -> Self {
        Self {
            store,
            acquirer,
            config,
            in_flight: InFlightMemo::default(),
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
    /// drives the charge under the same reference (so, like `submit`, not to
    /// be cancelled once it may have claimed). At `until`, still in flight:
    /// the last `409`.
    pub async fn await_outcome(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        request: &ChargeRequest,
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
            self.in_flight.forget(merchant.id, key);
            outcome = self.submit(merchant, key, request).await?;
        }
        Ok(outcome)
    }

    /// Runs one attempt of one intent to completion.
    ///
    /// Callers should not cancel this future between claim and finalize (the HTTP
    /// layer runs it on its own task): a cancelled attempt is safe, but its key
    /// answers `409` until the lease runs out.
    pub async fn submit(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<Outcome, EngineError> {
        let fingerprint = Fingerprint::of_charge(request);
        if let Some((charge_id, response, until)) =
            self.replays.replay(merchant.id, key, &fingerprint)
        {
            // `until` is the key's own lower bound (the memory ends earlier, by its margin).
            return Ok(Outcome::Completed {
                charge_id,
                response,
                replayed: true,
                honoured_until: until,
            });
        }
        if let Some(held) = self.in_flight.get(merchant.id, key) {
            return Ok(waiting_or_mismatch(
                &held.fingerprint,
                &held.request,
                held.charge_id,
                fingerprint,
                request,
            ));
        }
        let asked = Instant::now();
        let claim = self
            .store
            .claim(&NewClaim {
                merchant_id: merchant.id,
                key,
                fingerprint,
                request,
                lease: self.config.lease,
                key_ttl: self.config.key_ttl,
                traceparent: crate::trace::current_traceparent().as_deref(),
            })
            .instrument(self.db_span("claim"))
            .await?;
        let record = match claim {
            Claim::Won(record) => {
                crash::point(CrashPoint::AfterClaim);
                return self.drive(merchant, key, record, Approach::Capture).await;
            }
            Claim::Lost(record) => record,
            Claim::Expired(charge_id) => return Ok(Outcome::Expired { charge_id }),
        };
        match found(
            &record.fingerprint,
            &record.state,
            record.under_review,
            &fingerprint,
        ) {
            Found::Mismatch => Ok(Outcome::Mismatch {
                charge_id: record.subject.id.clone(),
                fields: record.subject.request().differing_fields(request),
            }),
            Found::TakeOver => {
                match self
                    .store
                    .take_over(merchant.id, key, record.attempt, self.config.lease)
                    .await?
                {
                    Some(taken) => {
                        tracing::info!(charge_id = %taken.subject.id, attempt = taken.attempt,
                            "took over an expired lease; re-driving with the same reference");
                        self.drive(merchant, key, taken, Approach::Capture).await
                    }
                    None => self.current(merchant, key).await,
                }
            }
            Found::InFlight { lease_remaining } => {
                self.in_flight.hold(
                    merchant.id,
                    key,
                    record.fingerprint,
                    record.subject.request(),
                    record.subject.id.clone(),
                    lease_remaining,
                );
                Ok(self.settled_or_waiting(merchant.id, key, record, asked))
            }
            Found::Replay | Found::UnderReview => {
                Ok(self.settled_or_waiting(merchant.id, key, record, asked))
            }
        }
    }

    /// Settles a charge whose attempt died or gave up (the reconciler's job):
    /// takes its record over if `orphan.attempt` still holds it, asks the
    /// acquirer for the reference's outcome, and captures with the same
    /// reference only where the acquirer has none — unless the orphan is past
    /// the settle deadline, where the look is the last and nothing is captured:
    /// without an outcome there, the charge is marked for review
    /// ([`Reconciled::NoOutcome`]). An unknown answer releases the record with
    /// `backoff` (or the acquirer's `Retry-After`, if longer) as the
    /// reconciler's wait. `None`: another attempt took it first.
    pub async fn settle_orphan(
        &self,
        orphan: &Orphan,
        backoff: Duration,
    ) -> Result<Option<Reconciled>, EngineError> {
        let Some(record) = self
            .store
            .take_over(
                orphan.merchant.id,
                &orphan.key,
                orphan.attempt,
                self.config.lease,
            )
            .await?
        else {
            return Ok(None);
        };
        if !orphan.past_deadline {
            let outcome = self
                .drive(
                    &orphan.merchant,
                    &orphan.key,
                    record,
                    Approach::LookupFirst { backoff },
                )
                .await?;
            return Ok(Some(Reconciled::Outcome(outcome)));
        }
        let (merchant, key) = (&orphan.merchant, &orphan.key);
        let started = std::time::Instant::now();
        let result = match self
            .acquirer
            .lookup(&capture_request(merchant, &record.subject))
            .instrument(acquirer_span("GET", &record.subject))
            .await
        {
            Ok(Some(settled)) => settled,
            Ok(None) => {
                // Marked while the lease still holds the record: if marking
                // fails, no pass asks the acquirer again before the lease ends.
                self.store
                    .mark_for_review(
                        &record.subject.id,
                        NO_OUTCOME_AT_DEADLINE,
                        &new_webhook(WebhookEvent::ReviewRequired, merchant, &record.subject),
                    )
                    .await?;
                self.store
                    .release(merchant.id, key, record.attempt, &Reschedule::default())
                    .await?;
                return Ok(Some(Reconciled::NoOutcome));
            }
            Err(e) => Err(e),
        };
        let outcome = self
            .conclude(merchant, key, record, result, started, Some(backoff))
            .await?;
        Ok(Some(Reconciled::Outcome(outcome)))
    }

    /// Learns the acquirer's outcome for a record this attempt holds, then stores it.
    pub(super) async fn drive(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: KeyRecord,
        approach: Approach,
    ) -> Result<Outcome, EngineError> {
        let request = capture_request(merchant, &record.subject);
        let called = std::time::Instant::now();
        let capture = || {
            self.acquirer
                .capture(&request)
                .instrument(acquirer_span("POST", &record.subject))
        };
        let result = match approach {
            Approach::Capture => capture().await,
            Approach::LookupFirst { .. } => match self
                .acquirer
                .lookup(&request)
                .instrument(acquirer_span("GET", &record.subject))
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
                        return self.current(merchant, key).await;
                    }
                    capture().await
                }
                Err(e) => Err(e),
            },
        };
        let backoff = match approach {
            Approach::Capture => None,
            Approach::LookupFirst { backoff } => Some(backoff),
        };
        self.conclude(merchant, key, record, result, called, backoff)
            .await
    }

    /// Stores what the acquirer said for a record this attempt holds: a final
    /// outcome under the fencing token, or, when unknown, the release, with
    /// the reconciler's `backoff` when it is the reconciler asking.
    async fn conclude(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: KeyRecord,
        result: Settled,
        called: std::time::Instant,
        backoff: Option<Duration>,
    ) -> Result<Outcome, EngineError> {
        let charge = &record.subject;
        crash::point(CrashPoint::AfterAcquirer);
        metrics::histogram!(crate::metrics::ACQUIRER_SECONDS)
            .record(called.elapsed().as_secs_f64());
        let label = match &result {
            Ok(_) => "captured",
            Err(AcquirerError::Declined(_)) => "declined",
            Err(AcquirerError::Rejected { .. }) => "rejected",
            Err(AcquirerError::Unknown(_)) => "unknown",
            Err(AcquirerError::Contradicted(_)) => "contradicted",
        };
        metrics::counter!(crate::metrics::ACQUIRER_CALLS, "outcome" => label).increment(1);
        if let Err(AcquirerError::Rejected { status, .. }) = &result {
            tracing::error!(charge_id = %charge.id, status, "acquirer rejected the capture");
        }
        let (status, capture_id, decline_reason) = match verdict(result, backoff) {
            Verdict::Final {
                status,
                capture_id,
                decline_reason,
            } => (status, capture_id, decline_reason),
            Verdict::Unknown {
                unknown,
                reschedule,
                retry_after,
            } => {
                return self
                    .unknown(merchant, key, &record, unknown, &reschedule, retry_after)
                    .await;
            }
            Verdict::Contradicted(contradiction) => {
                return self
                    .contradicted(merchant, key, &record, contradiction)
                    .await;
            }
        };
        self.store_outcome(
            merchant,
            key,
            record,
            Decided {
                status,
                capture_id: capture_id.as_deref(),
                decline_reason: decline_reason.as_deref(),
                audit: None,
            },
        )
        .await
    }

    /// Stores a final outcome for a record this attempt holds, under its
    /// fencing token: the charge settled, the answer every replay repeats,
    /// the charge event, and an operator's audit record if there is one.
    pub(super) async fn store_outcome(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: KeyRecord,
        decided: Decided<'_>,
    ) -> Result<Outcome, EngineError> {
        let Decided {
            status,
            capture_id,
            decline_reason,
            audit,
        } = decided;
        let settled = Charge {
            status,
            decline_reason: decline_reason.map(str::to_owned),
            ..record.subject.clone()
        };
        let response = final_response(&settled);
        let event = EventType::of(status).map(|event_type| {
            let message_id = MessageId::event();
            let body =
                ChargeEvent::new(&message_id, event_type, &merchant.name, &settled).to_bytes();
            NewEvent {
                message_id,
                event_type: event_type.as_str(),
                tenant: &merchant.name,
                body: body.into(),
            }
        });
        // A person's decision is `charge.resolved`; the acquirer's, its outcome.
        let webhook_event = if audit.is_some() {
            Some(WebhookEvent::Resolved)
        } else {
            WebhookEvent::of_final(status)
        };
        let webhook = webhook_event.map(|event| new_webhook(event, merchant, &settled));
        let asked = Instant::now();
        let stored = crash::around_finalize(self.store.finalize(
            merchant.id,
            key,
            &record,
            &Settlement {
                status,
                capture_id,
                decline_reason,
                response: &response,
                event: event.as_ref(),
                webhook: webhook.as_ref(),
                audit,
            },
            self.config.key_ttl,
        ))
        .instrument(self.db_span("finalize"))
        .await?;
        if stored {
            self.in_flight.forget(merchant.id, key);
            self.replays.remember(
                merchant.id,
                key,
                record.fingerprint,
                &settled.id,
                &response,
                asked + self.config.key_ttl,
            );
            // Sent at `asked`, the statement set the expiry `key_ttl` from
            // the database's now, which came after.
            return Ok(Outcome::Completed {
                charge_id: settled.id,
                response,
                replayed: false,
                honoured_until: asked + self.config.key_ttl,
            });
        }
        // Fenced out: our lease ran out and another attempt took over. Its answer
        // (from the same acquirer outcome, by reference) is the one that counts.
        tracing::warn!(charge_id = %settled.id, attempt = record.attempt,
            "lost the lease before finalizing; answering with the current holder's outcome");
        self.current(merchant, key).await
    }

    /// After an unknown answer: logs and counts it by cause, releases the
    /// record with the reconciler's next look scheduled (in one statement, so
    /// no reconciler skips the wait), and tells the caller when to retry.
    async fn unknown(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: &KeyRecord,
        unknown: Unknown,
        reschedule: &Reschedule,
        retry_after: Duration,
    ) -> Result<Outcome, EngineError> {
        tracing::warn!(charge_id = %record.subject.id, cause = %unknown.cause, why = %unknown.why,
            "acquirer outcome unknown");
        metrics::counter!(crate::metrics::ACQUIRER_UNKNOWN, "cause" => unknown.cause).increment(1);
        self.store
            .release(merchant.id, key, record.attempt, reschedule)
            .await?;
        // The next duplicate here must re-drive at once, not hear 409.
        self.in_flight.forget(merchant.id, key);
        Ok(Outcome::Unknown {
            charge_id: record.subject.id.clone(),
            retry_after,
        })
    }

    /// After a capture whose echo contradicts the charge: no retry can fix
    /// it (the acquirer repeats its first outcome for the reference), and it
    /// is not this charge's capture. The charge goes to a person at once:
    /// marked for review while this attempt still holds its record (so no
    /// other attempt calls the acquirer meanwhile), then released; it stays
    /// `processing` until an operator settles it.
    async fn contradicted(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
        record: &KeyRecord,
        contradiction: Contradiction,
    ) -> Result<Outcome, EngineError> {
        let charge = &record.subject;
        let differs = contradiction.differences.join(", ");
        tracing::error!(charge_id = %charge.id, reference = charge.acquirer_reference.as_str(),
            capture_id = %contradiction.capture_id, differs = %differs,
            "the acquirer captured something else than the charge asked; marked for review");
        metrics::counter!(crate::metrics::ACQUIRER_CONTRADICTED).increment(1);
        let reason = format!(
            "the acquirer's capture {} contradicts the charge: {differs}",
            contradiction.capture_id
        );
        let webhook = new_webhook(WebhookEvent::ReviewRequired, merchant, charge);
        self.store
            .mark_for_review(&charge.id, &reason, &webhook)
            .await?;
        self.store
            .release(merchant.id, key, record.attempt, &Reschedule::default())
            .await?;
        self.in_flight.forget(merchant.id, key);
        Ok(Outcome::UnderReview {
            charge_id: charge.id.clone(),
            retry_after: UNDER_REVIEW_RETRY_AFTER,
        })
    }

    /// A record read in a statement sent at `asked`, as an answer: its stored
    /// outcome replayed (and remembered while the key surely lives), `409`,
    /// or, for a charge awaiting review, that.
    fn settled_or_waiting(
        &self,
        merchant_id: i64,
        key: &IdempotencyKey,
        record: KeyRecord,
        asked: Instant,
    ) -> Outcome {
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
                        &record.subject.id,
                        &response,
                        asked + expires_in,
                    );
                }
                Outcome::Completed {
                    charge_id: record.subject.id,
                    response,
                    replayed: true,
                    honoured_until: asked + expires_in,
                }
            }
            KeyState::InFlight { .. } if record.under_review => Outcome::UnderReview {
                charge_id: record.subject.id,
                retry_after: UNDER_REVIEW_RETRY_AFTER,
            },
            KeyState::InFlight { .. } => Outcome::InFlight {
                charge_id: record.subject.id,
                retry_after: IN_FLIGHT_RETRY_AFTER,
            },
        }
    }

    /// The key's record as it is now, without taking anything over.
    pub(super) async fn current(
        &self,
        merchant: &Merchant,
        key: &IdempotencyKey,
    ) -> Result<Outcome, EngineError> {
        let asked = Instant::now();
        match self.store.key_record(merchant.id, key).await? {
            Some(record) => Ok(self.settled_or_waiting(merchant.id, key, record, asked)),
            None => Err(StoreError::Corrupt(format!("key {key} vanished while in use")).into()),
        }
    }
}

impl Outcome {
    /// The outcome's name in metrics: `captured`, `declined`, `failed`,
    /// `replayed`, `in_flight`, `key_reused`, `key_expired`, `unknown`,
    /// `under_review`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Completed { replayed: true, .. } => "replayed",
            Self::Completed { response, .. } => match response.status {
                201 => "captured",
                402 => "declined",
                _ => "failed",
            },
            Self::InFlight { .. } => "in_flight",
            Self::Mismatch { .. } => "key_reused",
            Self::Expired { .. } => "key_expired",
            Self::Unknown { .. } => "unknown",
            Self::UnderReview { .. } => "under_review",
        }
    }
}

/// The span of a call to the acquirer about `charge` (OpenTelemetry's HTTP
/// client conventions; the client records the status): its charge id and
/// reference, never the request's body.
fn acquirer_span(method: &'static str, charge: &Charge) -> tracing::Span {
    crate::span!("acquirer", otel.name = method, otel.kind = "client",
        http.request.method = method, url.template = "/v1/captures",
        charge_id = %charge.id, acquirer.reference = charge.acquirer_reference.as_str(),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty)
}

/// The webhook event `event` of `charge` (as it is after the decision), with
/// an id of its own: every endpoint's every attempt carries it.
pub(super) fn new_webhook(event: WebhookEvent, merchant: &Merchant, charge: &Charge) -> NewWebhook {
    let event_id = MessageId::event();
    let body = WebhookBody::new(&event_id, event, &merchant.name, charge).to_bytes();
    NewWebhook {
        event_id,
        event_type: event.as_str(),
        body: body.into(),
    }
}

/// What the acquirer is asked for a charge: its reference, and the order,
/// amount and currency a capture's echo is checked against.
fn capture_request(merchant: &Merchant, charge: &Charge) -> CaptureRequest {
    CaptureRequest {
        reference: charge.acquirer_reference.as_str().to_owned(),
        merchant: merchant.name.clone(),
        order_id: charge.order_id.get(),
        amount_cents: charge.amount_cents.get(),
        currency: charge.currency.as_str().to_owned(),
    }
}

/// The answer for a key known to be in flight: `409`, or `422` if this
/// request is not the one that holds it.
fn waiting_or_mismatch(
    held_fingerprint: &Fingerprint,
    held_request: &ChargeRequest,
    charge_id: ChargeId,
    fingerprint: Fingerprint,
    request: &ChargeRequest,
) -> Outcome {
    if *held_fingerprint != fingerprint {
        return Outcome::Mismatch {
            charge_id,
            fields: held_request.differing_fields(request),
        };
    }
    Outcome::InFlight {
        charge_id,
        retry_after: IN_FLIGHT_RETRY_AFTER,
    }
}

/// The answer stored for a final outcome: what the API says, and what every
/// replay repeats byte for byte.
pub fn final_response(charge: &Charge) -> StoredResponse {
    let (status, body) = match charge.status {
        ChargeStatus::Captured => (201, crate::domain::to_json(charge)),
        ChargeStatus::Declined => {
            let reason = charge.decline_reason.as_deref().unwrap_or("unspecified");
            let mut p = Problem::new(
                ProblemKind::Declined,
                format!("The acquirer declined the charge: {reason}. Use a new Idempotency-Key for a new attempt."),
            );
            p.charge = Some(charge);
            (p.status, p.to_bytes())
        }
        ChargeStatus::Failed | ChargeStatus::Processing => {
            let mut p = Problem::new(
                ProblemKind::AcquirerRejected,
                "The acquirer rejected the capture request; no money moved.",
            );
            p.charge = Some(charge);
            (p.status, p.to_bytes())
        }
    };
    StoredResponse {
        status,
        body: body.into(),
    }
}
