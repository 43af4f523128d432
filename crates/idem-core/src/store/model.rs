//! What the store takes and gives, in the engine's words: the records of
//! each operation, the same for both backends.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::error::StoreError;
use crate::domain::{AmountCents, Refund, RefundRequest, RefundStatus, SubjectId};
use crate::domain::{Charge, ChargeId, ChargeRequest, ChargeStatus, Merchant, MessageId};
use crate::domain::{Fingerprint, IdempotencyKey, StoredResponse};
use crate::domain::{Step, StepId, StepKind, StepStatus};

/// What a new attempt asks to claim.
pub struct NewClaim<'a> {
    pub merchant_id: i64,
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub request: &'a ChargeRequest,
    /// How long the winner may work before another attempt may take over.
    pub lease: Duration,
    /// How long a completed outcome is honoured.
    pub key_ttl: Duration,
    /// The W3C `traceparent` of the attempt, kept with a charge it makes (tracing on).
    pub traceparent: Option<&'a str>,
}

/// The state of a key record.
#[derive(Debug, Clone)]
pub enum KeyState {
    /// An attempt holds (or held) the lease; no outcome yet.
    InFlight { lease_remaining: Duration },
    /// The first outcome, to replay; honoured for `expires_in` more (by the
    /// database's clock, when the record was read).
    Completed {
        response: StoredResponse,
        expires_in: Duration,
    },
}

/// A key record with its subject (the charge or the refund it made), as
/// some attempt found or made it.
#[derive(Debug, Clone)]
pub struct Record<S> {
    pub subject: S,
    pub fingerprint: Fingerprint,
    pub state: KeyState,
    /// The fencing token the holder of the lease must present to finalize.
    pub attempt: i64,
    /// Completed and past its time to live: the key may start a new intent.
    pub expired: bool,
    /// The subject awaits a person's review: no attempt calls the acquirer
    /// for it until an operator settles it.
    pub under_review: bool,
}

/// A charge's key record.
pub type KeyRecord = Record<Charge>;

/// A refund's key record.
pub type RefundRecord = Record<Refund>;

/// What a new refund attempt asks to claim: its key, and the reservation of
/// its amount against `charge_id`.
pub struct NewRefundClaim<'a> {
    pub merchant_id: i64,
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub charge_id: &'a ChargeId,
    pub request: &'a RefundRequest,
    pub lease: Duration,
    pub key_ttl: Duration,
    pub traceparent: Option<&'a str>,
}

/// The answer to a refund's claim.
#[derive(Debug)]
pub enum RefundClaim {
    /// This attempt inserted the key, reserved the amount against the charge
    /// and made the refund, in one committed transaction: it must call the
    /// acquirer.
    Won(Box<RefundRecord>),
    /// The key was taken: by a refund (here is what it left), or by a charge.
    Lost(Box<Taken>),
    /// Nothing was claimed, reserved or kept: the charge cannot give this back.
    Refused(Refusal),
    /// The key expired after storing the outcome of this very request: a
    /// late retry; nothing was claimed. Here is the refund it made.
    Expired(crate::domain::RefundId),
}

/// A capture's or a void's key record.
pub type StepRecord = Record<Step>;

/// What a new capture or void attempt asks to claim: its key, and the
/// reservation against `charge_id`'s authorization.
pub struct NewStepClaim<'a> {
    pub merchant_id: i64,
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub charge_id: &'a ChargeId,
    pub kind: StepKind,
    /// A capture's amount (`None`: what remains); a void's is always `None`.
    pub amount: Option<AmountCents>,
    /// A capture that closes the authorization (a void always does).
    pub final_capture: bool,
    pub lease: Duration,
    pub key_ttl: Duration,
    pub traceparent: Option<&'a str>,
}

/// The answer to a step's claim, as a refund's ([`RefundClaim`]).
#[derive(Debug)]
pub enum StepClaim {
    Won(Box<StepRecord>),
    Lost(Box<Taken>),
    Refused(Refusal),
    Expired(StepId),
}

/// The final outcome to store for a step.
pub struct StepSettlement<'a> {
    /// `Succeeded` or `Failed`: a failed step gives its reservation back to
    /// the authorization in the same transaction.
    pub status: StepStatus,
    pub acquirer_id: Option<&'a str>,
    pub failure_reason: Option<&'a str>,
    pub response: &'a StoredResponse,
    pub event: Option<&'a NewEvent<'a>>,
    pub webhook: Option<&'a NewWebhook>,
    pub audit: Option<&'a AuditEntry<'a>>,
}

/// Whose a taken key is.
#[derive(Debug)]
pub enum Taken {
    Refund(RefundRecord),
    Charge(KeyRecord),
    Step(StepRecord),
}

impl Taken {
    pub(super) fn expired(&self) -> bool {
        match self {
            Self::Refund(r) => r.expired,
            Self::Charge(r) => r.expired,
            Self::Step(r) => r.expired,
        }
    }

    pub(super) fn fingerprint(&self) -> &Fingerprint {
        match self {
            Self::Refund(r) => &r.fingerprint,
            Self::Charge(r) => &r.fingerprint,
            Self::Step(r) => &r.fingerprint,
        }
    }

    /// A step's claim that found the key taken, as [`Self::into_claim`].
    pub(super) fn into_step_claim(self) -> StepClaim {
        match self {
            Self::Step(r) if r.expired => StepClaim::Expired(r.subject.id),
            taken => StepClaim::Lost(Box::new(taken)),
        }
    }

    /// A refund's claim that found the key taken: its own record expired
    /// (the same request, come late), or lost to the record there.
    pub(super) fn into_claim(self) -> RefundClaim {
        match self {
            Self::Refund(r) if r.expired => RefundClaim::Expired(r.subject.id),
            taken => RefundClaim::Lost(Box::new(taken)),
        }
    }
}

/// Why a refund could not be claimed. Nothing is stored for it, and its key
/// stays free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No charge of this merchant has that id.
    NoSuchCharge,
    /// The charge is not `captured` (still processing, declined, failed), or
    /// awaits a person's review.
    NotRefundable {
        status: ChargeStatus,
        under_review: bool,
    },
    /// More than the charge has left to refund: `remaining` (0 when all of
    /// it is refunded or reserved by refunds still pending).
    Exceeds { remaining: i64 },
    /// A capture or a void of a charge that is not `authorized` (captured
    /// in one step, captured or voided already, declined, still
    /// processing), or that awaits a person's review.
    NotAuthorized {
        status: ChargeStatus,
        under_review: bool,
    },
    /// The authorization is closed by a final capture or a void, still
    /// pending at the acquirer.
    AuthorizationClosed,
    /// A void while captures of the authorization are pending at the
    /// acquirer: it would release what they are taking.
    CapturePending,
    /// More than the authorization has left to capture: `remaining`.
    ExceedsAuthorization { remaining: i64 },
}

impl Refusal {
    /// The refusal a charge's state makes (its status, whether it awaits
    /// review, what it has left), as a refused reservation reads it; `None`:
    /// no such charge.
    pub(super) fn of_charge(charge: Option<(String, bool, i64)>) -> Self {
        match charge {
            None => Self::NoSuchCharge,
            Some((status, under_review, remaining)) => {
                let status = ChargeStatus::parse(&status).unwrap_or(ChargeStatus::Processing);
                // A two-step charge gives back what it captured, while it is
                // still authorized as well.
                let refundable =
                    matches!(status, ChargeStatus::Captured | ChargeStatus::Authorized);
                if !refundable || under_review {
                    Self::NotRefundable {
                        status,
                        under_review,
                    }
                } else {
                    Self::Exceeds {
                        remaining: remaining.max(0),
                    }
                }
            }
        }
    }
}

/// What a refused step's claim found of its charge: status, under review,
/// what remains capturable, closed, captures pending.
pub(super) type AuthorizationState = (String, bool, i64, bool, bool);

impl Refusal {
    /// The refusal a charge's state makes for a step of `kind`, as a refused
    /// reservation reads it; `None`: no such charge.
    pub(super) fn of_authorization(kind: StepKind, charge: Option<AuthorizationState>) -> Self {
        let Some((status, under_review, remaining, closed, capturing)) = charge else {
            return Self::NoSuchCharge;
        };
        let status = ChargeStatus::parse(&status).unwrap_or(ChargeStatus::Processing);
        if status != ChargeStatus::Authorized || under_review {
            Self::NotAuthorized {
                status,
                under_review,
            }
        } else if closed {
            Self::AuthorizationClosed
        } else if kind == StepKind::Void && capturing {
            Self::CapturePending
        } else {
            Self::ExceedsAuthorization {
                remaining: remaining.max(0),
            }
        }
    }
}

/// The final outcome to store for a refund.
pub struct RefundSettlement<'a> {
    /// `Succeeded` or `Failed`: a failed refund gives its amount back to the
    /// charge in the same transaction.
    pub status: RefundStatus,
    pub acquirer_refund_id: Option<&'a str>,
    pub failure_reason: Option<&'a str>,
    pub response: &'a StoredResponse,
    /// The refund event the outcome produces, if any (`refund.succeeded`).
    pub event: Option<&'a NewEvent<'a>>,
    /// The webhook event it produces for the merchant's endpoints.
    pub webhook: Option<&'a NewWebhook>,
    /// An operator's decision, recorded with the outcome.
    pub audit: Option<&'a AuditEntry<'a>>,
}

/// What a key stands for now, as `GET /v1/idempotency-keys/{key}` shows it.
#[derive(Debug, Clone)]
pub enum KeyStatus {
    /// An attempt holds (or held) the lease; no outcome yet.
    InFlight {
        subject: SubjectId,
        lease_remaining: Duration,
    },
    /// The outcome is stored, with this status, until `expires_at`.
    Completed {
        subject: SubjectId,
        status: u16,
        expires_at: DateTime<Utc>,
    },
    /// Past its time to live: from its record not yet swept (`until` unknown),
    /// or from its tombstone, kept `until`.
    Expired {
        subject: SubjectId,
        until: Option<DateTime<Utc>>,
    },
}

/// The answer to an insert-first claim.
#[derive(Debug)]
pub enum Claim {
    /// This attempt inserted the record: it owns the lease and must call the acquirer.
    Won(KeyRecord),
    /// Another attempt got there first; here is what it left.
    Lost(KeyRecord),
    /// The key expired after storing the outcome of this very request (its
    /// record past its time to live, or the tombstone the sweeper left): a late
    /// retry, not a new intent. Nothing was claimed; here is the charge.
    Expired(ChargeId),
    /// The key is another operation's (a refund's): nothing was claimed.
    Other(SubjectId),
}

/// Whose a key's record is, as a claim of another operation finds it.
#[derive(Debug, Clone)]
pub struct KeyOwner {
    pub subject: SubjectId,
    /// Completed and past its time to live: free for a new intent.
    pub expired: bool,
}

impl KeyOwner {
    pub(super) fn new(
        charge_id: Option<String>,
        refund_id: Option<String>,
        step_id: Option<String>,
        expired: bool,
    ) -> Result<Self, StoreError> {
        let subject = SubjectId::from_columns(charge_id, refund_id, step_id)
            .ok_or_else(|| StoreError::Corrupt("a key with no subject".to_owned()))?;
        Ok(Self { subject, expired })
    }
}

/// The final outcome to store for a charge.
pub struct Settlement<'a> {
    pub status: ChargeStatus,
    pub capture_id: Option<&'a str>,
    pub decline_reason: Option<&'a str>,
    pub response: &'a StoredResponse,
    /// The charge event the outcome produces, if any.
    pub event: Option<&'a NewEvent<'a>>,
    /// The webhook event it produces for the merchant's endpoints.
    pub webhook: Option<&'a NewWebhook>,
    /// An operator's decision (`idem charges resolve`): recorded in the audit
    /// trail in the finalize's own transaction, and only if it finalized.
    pub audit: Option<&'a AuditEntry<'a>>,
}

/// What releasing a record after an unknown outcome tells the reconciler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reschedule {
    /// The reconciler leaves the charge alone at least this long from now (its
    /// backoff, or the acquirer's own `Retry-After`); `None` leaves the
    /// charge's schedule as it was. A later schedule already set is kept.
    pub not_before: Option<Duration>,
    /// Counts as one of the reconciler's tries, whose backoff doubles with each.
    pub reconciler_try: bool,
}

/// An in-flight record whose lease is over and that no attempt is working:
/// the reconciler's unit of work.
#[derive(Debug, Clone)]
pub struct Orphan {
    pub merchant: Merchant,
    pub key: IdempotencyKey,
    /// The charge or the refund the record is for.
    pub subject: SubjectId,
    /// The fencing token seen; taking over succeeds only if it is still current.
    pub attempt: i64,
    /// Unknown outcomes the reconciler met so far, for its backoff.
    pub reconcile_attempts: i32,
    /// The `traceparent` of the attempt that claimed it (tracing on then).
    pub traceparent: Option<String>,
    /// Older than the settle deadline: stop trying, mark for review.
    pub past_deadline: bool,
}

/// A charge the reconciler gave up on: past the settle deadline without the
/// acquirer's word. A person decides, with the acquirer's records.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StuckCharge {
    pub id: String,
    pub merchant: String,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
    pub acquirer_reference: String,
    pub created_at: DateTime<Utc>,
    pub review_since: DateTime<Utc>,
    pub review_reason: Option<String>,
}

/// A refund awaiting review: the acquirer's answer contradicted it, or it had
/// none by the settle deadline. It stays `pending`, its amount reserved.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StuckRefund {
    pub id: String,
    pub charge_id: String,
    pub merchant: String,
    pub amount_cents: i64,
    pub currency: String,
    pub acquirer_reference: String,
    pub created_at: DateTime<Utc>,
    pub review_since: DateTime<Utc>,
    pub review_reason: Option<String>,
}

/// One refund, any merchant's, as an operator finds it by id, with its key
/// record while it exists: for `idem refunds` and the console.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct RefundDetail {
    pub id: String,
    pub charge_id: String,
    pub merchant_id: i64,
    pub merchant: String,
    pub amount_cents: i64,
    pub currency: String,
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
    pub acquirer_reference: String,
    pub created_at: DateTime<Utc>,
    pub review_since: Option<DateTime<Utc>>,
    pub review_reason: Option<String>,
    #[serde(skip)]
    pub idempotency_key: String,
    #[sqlx(skip)]
    pub key: Option<KeyDetail>,
}

/// One capture or void, any merchant's, as an operator finds it by id, with
/// its key record while it exists.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct StepDetail {
    pub id: String,
    /// `capture` or `void`.
    pub kind: String,
    pub charge_id: String,
    pub merchant_id: i64,
    pub merchant: String,
    pub amount_cents: i64,
    pub currency: String,
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
    pub acquirer_reference: String,
    pub created_at: DateTime<Utc>,
    pub review_since: Option<DateTime<Utc>>,
    pub review_reason: Option<String>,
    #[serde(skip)]
    pub idempotency_key: String,
    #[sqlx(skip)]
    pub key: Option<KeyDetail>,
}

impl StepDetail {
    pub fn awaiting_review(&self) -> bool {
        self.status == "pending" && self.review_since.is_some()
    }
}

impl RefundDetail {
    pub fn awaiting_review(&self) -> bool {
        self.status == "pending" && self.review_since.is_some()
    }
}

/// What the `/metrics` gauges show about unsettled charges and refunds.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct ProcessingStats {
    pub oldest_processing_seconds: f64,
    /// Charges `processing` with a review mark.
    pub awaiting_review: i64,
    /// Refunds `pending` with a review mark (each one's amount still
    /// reserved against its charge).
    pub refunds_awaiting_review: i64,
    /// Captures and voids `pending` with a review mark (each one's
    /// reservation still held against its authorization).
    pub steps_awaiting_review: i64,
}

/// How many connections a pool holds now, and how many of them are idle.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub size: u32,
    pub idle: usize,
}

/// A charge event to write with the outcome that produces it.
/// Its exchange is always [`EVENTS_EXCHANGE`](crate::domain::EVENTS_EXCHANGE).
pub struct NewEvent<'a> {
    pub message_id: MessageId,
    pub event_type: &'a str,
    pub tenant: &'a str,
    pub body: Bytes,
}

/// A webhook event to write with the decision that produces it: one
/// delivery for each of the merchant's enabled endpoints that hears it.
pub struct NewWebhook {
    /// `evt_...`: the `webhook-id` of every attempt.
    pub event_id: MessageId,
    /// `charge.captured`, ...
    pub event_type: &'static str,
    pub body: Bytes,
}

/// Where a command's result goes, and what it answers.
pub struct NewResult<'a> {
    /// The result's `message_id`: minted by the writer, so that a result it
    /// first tried to publish itself carries the same id from the outbox.
    pub message_id: &'a MessageId,
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub tenant: &'a str,
    pub correlation_id: Option<&'a str>,
    pub key: &'a IdempotencyKey,
    pub replayed: bool,
    pub answer: ResultAnswer<'a>,
    /// The command span's `traceparent` (tracing on), for the result's header.
    pub traceparent: Option<&'a str>,
}

/// A result's status and body: known now, or the key's outcome once stored.
pub enum ResultAnswer<'a> {
    Now(&'a StoredResponse),
    /// The outcome of the key's record for this charge (or refund),
    /// whenever it is stored.
    WhenSettled {
        merchant_id: i64,
        subject: &'a SubjectId,
    },
}

/// What one outbox row publishes.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxMessage {
    pub id: i64,
    pub kind: String,
    pub message_id: String,
    pub exchange: String,
    pub routing_key: String,
    pub tenant: String,
    pub event_type: Option<String>,
    pub correlation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub replayed: Option<bool>,
    /// Results only.
    pub status: Option<i16>,
    pub body: Vec<u8>,
    /// The W3C `traceparent` its charge kept (tracing on), as an AMQP header.
    pub traceparent: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MerchantError {
    #[error("a merchant named {0:?} already exists")]
    NameTaken(String),
    #[error("no merchant is named {0:?}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who does an operator's action and why: the store records it in the audit
/// trail, in the action's own transaction, beside what the action did.
#[derive(Debug, Clone, Copy)]
pub struct Audit<'a> {
    pub actor: &'a str,
    pub reason: Option<&'a str>,
}

/// An action for the audit trail: who and why, what was done, to what.
#[derive(Debug, Clone, Copy)]
pub struct AuditEntry<'a> {
    pub audit: Audit<'a>,
    pub action: &'a str,
    /// The merchant's name or the charge's id.
    pub subject: &'a str,
    pub detail: &'a str,
}

/// One row of the audit trail.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditRecord {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    /// `tenant.create`, `tenant.rotate`, `tenant.disable`, `tenant.enable`,
    /// `charge.retry`, `charge.resolve`.
    pub action: String,
    /// The merchant's name or the charge's id.
    pub subject: String,
    pub reason: Option<String>,
    pub detail: Option<String>,
}

/// A merchant that a secret authenticates, and for how long that secret
/// still works (`None`: until it is rotated out).
#[derive(Debug, Clone)]
pub struct SecretMatch {
    pub merchant: Merchant,
    pub expires_in: Option<Duration>,
}

/// A merchant as `idem merchant list` shows it: never its secrets, only when
/// each was made and until when it works.
#[derive(Debug, Clone)]
pub struct MerchantListing {
    pub merchant: Merchant,
    pub created_at: DateTime<Utc>,
    pub disabled_at: Option<DateTime<Utc>>,
    /// Oldest first.
    pub secrets: Vec<SecretInfo>,
}

#[derive(Debug, Clone)]
pub struct SecretInfo {
    pub id: i64,
    pub created_at: DateTime<Utc>,
    /// `None`: works until rotated out.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a rotation did: the secrets it retired, and until when they work.
#[derive(Debug, Clone)]
pub struct Rotation {
    pub retired: u64,
    /// When the retired secrets stop working (now, without a grace).
    pub retired_until: Option<DateTime<Utc>>,
}

/// Which charges `idem charges list` (and the console) shows, newest first.
#[derive(Debug, Clone, Default)]
pub struct ChargeFilter {
    /// `processing`, `captured`, `declined` or `failed`.
    pub status: Option<ChargeStatus>,
    /// Only those awaiting review (still `processing`, past the settle deadline).
    pub awaiting_review: bool,
    /// Made at or after.
    pub since: Option<DateTime<Utc>>,
    pub order_id: Option<i64>,
    /// Only this merchant's (by name).
    pub merchant: Option<String>,
    /// Only the charge made under this key (with `merchant`, the one).
    pub idempotency_key: Option<String>,
    /// Oldest first instead.
    pub oldest_first: bool,
    pub limit: i64,
}

/// A charge as the operators' lists show it.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct ChargeSummary {
    pub id: String,
    pub merchant: String,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub review_since: Option<DateTime<Utc>>,
    pub review_reason: Option<String>,
}

/// Everything the database knows of one charge, for `idem charges show`.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct ChargeDetail {
    pub id: String,
    pub merchant: String,
    #[serde(skip)]
    pub merchant_id: i64,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
    pub description: Option<String>,
    pub status: String,
    pub acquirer_reference: String,
    pub acquirer_capture_id: Option<String>,
    pub decline_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Unknown answers the reconciler met, and when it looks next.
    pub reconcile_attempts: i32,
    pub next_reconcile_at: Option<DateTime<Utc>>,
    pub review_since: Option<DateTime<Utc>>,
    pub review_reason: Option<String>,
    /// The key it was claimed under (none for charges made before idem kept it).
    pub idempotency_key: Option<String>,
}

/// A charge's key record, while it exists (the sweeper removes it after the
/// key's time to live).
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct KeyDetail {
    pub idempotency_key: String,
    /// `in_flight` or `completed`.
    pub state: String,
    /// The fencing token: how many attempts have held the record.
    pub attempt: i64,
    /// An in-flight record's lease: no other attempt may work on it before then.
    pub locked_until: Option<DateTime<Utc>>,
    /// The stored answer's status, once completed.
    pub response_status: Option<i16>,
    pub expires_at: DateTime<Utc>,
}

/// A charge with its key record, for `idem charges show` and the console.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChargeRecord {
    pub charge: ChargeDetail,
    pub key: Option<KeyDetail>,
}

impl ChargeDetail {
    pub fn awaiting_review(&self) -> bool {
        self.status == "processing" && self.review_since.is_some()
    }
}

/// A webhook endpoint to add for a merchant.
pub struct NewEndpoint<'a> {
    /// `we_...`.
    pub id: &'a str,
    /// The merchant's name.
    pub merchant: &'a str,
    pub url: &'a str,
    /// The events it hears (`charge.captured`, ...); `None`: every event.
    pub events: Option<&'a [&'a str]>,
    /// `whsec_...`.
    pub secret: &'a str,
}

/// A webhook endpoint as `idem webhooks list` shows it: never its secret.
#[derive(Debug, Clone)]
pub struct EndpointInfo {
    pub id: String,
    pub merchant: String,
    pub url: String,
    /// `None`: every event.
    pub events: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
    pub disabled_at: Option<DateTime<Utc>>,
    /// While a rotation's grace lasts, when the previous secret stops signing.
    pub previous_secret_until: Option<DateTime<Utc>>,
}

/// A change to one webhook endpoint, each audited in its own transaction.
#[derive(Debug, Clone, Copy)]
pub enum EndpointChange<'a> {
    /// Gone, with its deliveries.
    Remove,
    /// Nothing more is written for it; pending deliveries wait.
    Disable,
    Enable,
    /// A new signing secret; the current one signs too for `grace` more
    /// (a rotation during an earlier grace ends that one).
    RotateSecret {
        secret: &'a str,
        grace: Duration,
    },
}

impl EndpointChange<'_> {
    /// The change's action in the audit trail.
    pub fn action(&self) -> &'static str {
        match self {
            Self::Remove => "webhook.remove",
            Self::Disable => "webhook.disable",
            Self::Enable => "webhook.enable",
            Self::RotateSecret { .. } => "webhook.rotate-secret",
        }
    }
}

/// A webhook delivery a deliverer took: held by it for the lease, and
/// settled by [`crate::store::Store::finish_webhook_delivery`] under `attempt`.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub id: i64,
    /// The attempt this is (1 for the first): the fencing token of its finish.
    pub attempt: i32,
    pub event_id: String,
    pub event_type: String,
    pub body: Bytes,
    pub endpoint_id: String,
    pub url: String,
    pub secret: String,
    /// During a rotation's grace, the secret before, which signs too.
    pub previous_secret: Option<String>,
}

/// What an attempt came to.
#[derive(Debug, Clone)]
pub enum AttemptOutcome {
    /// The endpoint answered 2xx with this status: done.
    Delivered { status: u16 },
    /// Any other answer (its status, if there was one), to be tried again
    /// after `after`.
    Retry {
        status: Option<u16>,
        error: String,
        after: Duration,
    },
    /// The last attempt of the schedule failed: given up, shown, and sent
    /// again only by an operator (`idem webhooks redeliver`).
    Failed { status: Option<u16>, error: String },
}

/// One delivery as an operator sees it (`idem webhooks deliveries`, the console).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryInfo {
    pub event_id: String,
    pub endpoint_id: String,
    pub event_type: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: i32,
    pub last_status: Option<i16>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub next_attempt_at: DateTime<Utc>,
}

impl AttemptOutcome {
    /// The outcome as a finish binds it: the new state, the status, the
    /// error, and the wait before the next attempt in ms.
    pub(super) fn columns(&self) -> (&'static str, Option<i16>, Option<&str>, Option<i64>) {
        let status = |s: &Option<u16>| s.and_then(|s| i16::try_from(s).ok());
        match self {
            Self::Delivered { status: s } => ("delivered", i16::try_from(*s).ok(), None, None),
            Self::Retry {
                status: s,
                error,
                after,
            } => (
                "pending",
                status(s),
                Some(error),
                Some(super::shared::millis(*after)),
            ),
            Self::Failed { status: s, error } => ("failed", status(s), Some(error), None),
        }
    }
}
