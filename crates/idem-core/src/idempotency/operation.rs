//! What the engine runs under an idempotency key: an [`Operation`], a charge
//! or a refund of one. The engine's order is the same for every operation
//! (claim, committed; the acquirer called outside any transaction; the
//! outcome finalized under the fencing token); what differs is written once
//! per operation here: what its request is, how the store claims, reads,
//! takes over, releases and settles its record, what the acquirer is asked,
//! and what the final answer says.

use std::future::Future;

use crate::acquirer::{Acquirer, AcquirerError};
use crate::domain::{
    AcquirerReference, Fingerprint, IdempotencyKey, Merchant, StoredResponse, SubjectId,
};
use crate::store::{AuditEntry, KeyDetail, Record, Refusal, Reschedule, Store, StoreError};

use super::memo::InFlightMemo;
use super::Engine;

/// What the acquirer said for good about one call: the id it gave what it
/// did, or why not. (`Err` is not its word: unknown or contradicted.)
pub type Said = Result<String, AcquirerError>;

/// A final outcome, the acquirer's or a person's, in terms every operation
/// shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    /// The money moved as asked: the acquirer's id for it (none when a
    /// person decided, from the acquirer's records).
    Done { acquirer_id: Option<String> },
    /// The acquirer declined (a card's answer).
    Declined { reason: String },
    /// The acquirer refused the request for good; no money moved.
    Refused { reason: Option<String> },
}

/// What an attempt's claim came to, for any operation.
#[derive(Debug)]
pub enum Claimed<S> {
    /// This attempt holds the new record: it must call the acquirer.
    Won(Record<S>),
    /// Another attempt's record: replay, wait, refuse or take over.
    Lost(Record<S>),
    /// The key expired after storing this very request's outcome.
    Expired(SubjectId),
    /// The key is another operation's (a charge's key sent to a refund, or
    /// the other way round).
    Other(SubjectId),
    /// Nothing was claimed: the operation's target refused it (a refund of
    /// a charge that cannot give that back).
    Refused(Refusal),
}

/// The values of a claim every operation needs.
pub struct ClaimArgs<'a> {
    pub merchant_id: i64,
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub lease: std::time::Duration,
    pub key_ttl: std::time::Duration,
    pub traceparent: Option<&'a str>,
}

/// A final outcome as one operation stores it: with its subject as it is
/// after the outcome, and the answer every replay repeats.
pub struct Finalize<'a, S> {
    pub merchant: &'a Merchant,
    pub key: &'a IdempotencyKey,
    pub record: &'a Record<S>,
    pub settled: &'a S,
    pub outcome: &'a Final,
    pub response: &'a StoredResponse,
    /// An operator's decision, recorded with the outcome.
    pub audit: Option<&'a AuditEntry<'a>>,
    pub key_ttl: std::time::Duration,
}

/// One kind of request the engine runs exactly once per key. Implemented by
/// the request type itself, so that `engine.submit(merchant, key, &request)`
/// picks the operation.
pub trait Operation: Clone + Send + Sync + Sized + 'static {
    /// What the record is about: the charge or the refund it made.
    type Subject: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// The path of the acquirer's resource (for spans): `/v1/captures`.
    const ACQUIRER_PATH: &'static str;
    /// What operators call the subject: `charge`, `refund` (`idem charges`,
    /// `idem refunds`, the audit trail's `charge.resolve`).
    const KIND: &'static str;

    fn fingerprint(&self) -> Fingerprint;
    /// The request that made `subject`, as near as the subject tells it.
    fn request_of(subject: &Self::Subject) -> Self;
    /// The fields in which `self` differs from `held`.
    fn differing_fields(&self, held: &Self) -> Vec<&'static str>;
    fn id(subject: &Self::Subject) -> SubjectId;
    /// The reference the acquirer knows the subject by.
    fn reference(subject: &Self::Subject) -> &AcquirerReference;
    /// This instance's memory of keys held in flight by this operation.
    fn memo(engine: &Engine) -> &InFlightMemo<Self>;

    fn claim(
        &self,
        store: &Store,
        args: ClaimArgs<'_>,
    ) -> impl Future<Output = Result<Claimed<Self::Subject>, StoreError>> + Send;
    fn record(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<Record<Self::Subject>>, StoreError>> + Send;
    fn take_over(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<Option<Record<Self::Subject>>, StoreError>> + Send;
    fn release(
        store: &Store,
        merchant_id: i64,
        key: &IdempotencyKey,
        attempt: i64,
        reschedule: &Reschedule,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Sets the subject aside for a person (and tells the merchant).
    fn mark_for_review(
        store: &Store,
        merchant: &Merchant,
        subject: &Self::Subject,
        reason: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Stores a final outcome under the fencing token; `false`: fenced out.
    fn finalize(
        store: &Store,
        f: Finalize<'_, Self::Subject>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// POSTs the subject to the acquirer under its reference.
    fn call(
        acquirer: &dyn Acquirer,
        merchant: &Merchant,
        subject: &Self::Subject,
    ) -> impl Future<Output = Said> + Send;
    /// Asks the acquirer what it did under the subject's reference.
    fn look_up(
        acquirer: &dyn Acquirer,
        merchant: &Merchant,
        subject: &Self::Subject,
    ) -> impl Future<Output = Result<Option<Said>, AcquirerError>> + Send;

    /// The subject `id`, any merchant's, as an operator finds it.
    fn operable(
        store: &Store,
        id: &str,
    ) -> impl Future<Output = Result<Option<Operable>, StoreError>> + Send;
    /// The subject's status, as its API names it.
    fn status(subject: &Self::Subject) -> &'static str;

    /// The subject as the final outcome leaves it.
    fn settled(subject: &Self::Subject, outcome: &Final) -> Self::Subject;
    /// The answer stored for a final outcome, replayed byte for byte.
    fn response(settled: &Self::Subject) -> StoredResponse;
}

/// A charge or a refund as an operator finds it by id, any merchant's.
#[derive(Debug, Clone)]
pub struct Operable {
    pub merchant: Merchant,
    /// Its status word (`processing`, `pending`, `captured`, ...).
    pub status: String,
    /// Not final yet: the acquirer's word, or a person's, is still awaited.
    pub pending: bool,
    /// Pending and set aside for a person.
    pub awaiting_review: bool,
    /// Its key record, while it exists.
    pub key: Option<KeyDetail>,
}
