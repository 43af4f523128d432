//! The store's contract: its operations, one trait per concern (a table, or
//! what one reader needs), each implemented by every backend beside the
//! statements it runs (`postgres/<concern>.rs`, `sqlite/<concern>.rs`), and
//! [`Base`], what the facade builds its own rules on (opening and closing,
//! the raw claim and finalize). A backend is a [`StoreBackend`]: all of them.
//!
//! [`store_ops!`] declares each concern's trait and gives [`Store`] a method
//! per operation that hands it to the backend the store was opened on: a new
//! operation is one line here and an implementation per backend, and the
//! compiler holds every backend to it. The backend is chosen once, by the
//! URL, when the store is opened (`Store::connect_lazy`); nothing else matches
//! on it. The traits are `async_trait`s, so a backend is a trait object: each
//! call boxes its future (one allocation, beside a database round trip).

use std::time::Duration;

use super::batch::Batched;
use super::error::StoreError;
use super::model::*;
use super::params::FinalizeValues;
use super::relay_batch::OutboxBatch;
use super::Store;
use crate::domain::{AcquirerReference, Charge, ChargeId, IdempotencyKey, Merchant, Refund};
use crate::domain::{RefundId, SecretHash, Step, StepId};

/// A future that need not be `Send`.
pub(super) type LocalFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

/// What the facade builds on, below its own rules (a late retry's answer,
/// packing a finalize's values): opening and closing, and the claim and the
/// finalize as each backend runs them.
#[async_trait::async_trait]
pub(super) trait Base {
    /// The database's name in OpenTelemetry's conventions (`db.system.name`).
    fn system_name(&self) -> &'static str;
    /// Not `Send`: sqlx's migrator on a PostgreSQL connection cannot promise
    /// it (its `Acquire` for `&mut PgConnection` is not general enough), and
    /// no one migrates from a spawned task.
    fn migrate(&self) -> LocalFuture<'_, Result<(), sqlx::migrate::MigrateError>>;
    async fn ping(&self) -> Result<(), StoreError>;
    /// Whether the database can write, as far as the last writes found.
    async fn writable(&self) -> Result<(), StoreError>;
    fn pool_stats(&self) -> PoolStats;
    async fn close(&self);
    /// Insert first, in a batch with the claims made at the same time.
    async fn claim(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError>;
    /// `claims` as one batch; a row the batch could not settle is `Alone`.
    async fn batch_claims(&self, claims: &[NewClaim<'_>]) -> Vec<Batched<Claim>>;
    /// Insert first, on the one-row path.
    async fn claim_alone(&self, new: &NewClaim<'_>) -> Result<Claim, StoreError>;
    /// The charge that holds an intent's acquirer reference.
    async fn charge_by_reference(
        &self,
        merchant_id: i64,
        reference: &AcquirerReference,
    ) -> Result<Option<ChargeId>, StoreError>;
    async fn finalize(&self, values: &FinalizeValues<'_>) -> Result<bool, StoreError>;
}

/// A backend: every part of the contract, shareable across tasks. (The
/// public [`super::Backend`] names which one a URL asks for.)
pub(super) trait StoreBackend:
    Base
    + Refunds
    + Steps
    + Keys
    + Charges
    + Merchants
    + Webhooks
    + Outbox
    + AuditTrail
    + Console
    + Send
    + Sync
{
}

impl<T> StoreBackend for T where
    T: Base
        + Refunds
        + Steps
        + Keys
        + Charges
        + Merchants
        + Webhooks
        + Outbox
        + AuditTrail
        + Console
        + Send
        + Sync
{
}

/// Declares each concern's trait (crate-internal: the backends implement it)
/// and, for every operation, a public method of [`Store`] with the same name,
/// signature and documentation that runs it on the store's backend.
macro_rules! store_ops {
    ($(
        $(#[$concern_doc:meta])*
        trait $concern:ident {
            $(
                $(#[$doc:meta])*
                fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
            )*
        }
    )*) => {
        $(
            $(#[$concern_doc])*
            #[async_trait::async_trait]
            pub(super) trait $concern {
                $(
                    $(#[$doc])*
                    async fn $name(&self $(, $arg: $ty)*) -> $ret;
                )*
            }

            impl Store {
                $(
                    $(#[$doc])*
                    pub async fn $name(&self $(, $arg: $ty)*) -> $ret {
                        $concern::$name(self.backend(), $($arg),*).await
                    }
                )*
            }
        )*
    };
}

store_ops! {
    /// Refunds: their claims (the key, the reservation against the charge and
    /// the refund, in one transaction), their outcomes, and reading them.
    trait Refunds {
        /// Claims a refund's key and, in the same committed transaction,
        /// reserves its amount against the charge with a guarded update (the
        /// charge captured, not under review, and the amount within what it
        /// has left) and makes the refund. A refusal leaves nothing behind.
        fn claim_refund(&self, claim: &NewRefundClaim<'_>) -> Result<RefundClaim, StoreError>;
        /// The record under a key, with its refund; `None` when the key is
        /// unknown or another operation's.
        fn refund_record(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
        ) -> Result<Option<RefundRecord>, StoreError>;
        /// Stores a refund's final outcome, fenced by `record.attempt` as a
        /// charge's is; a failed refund gives its amount back to the charge in
        /// the same transaction. `false`: this attempt no longer holds the key.
        fn finalize_refund(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            record: &RefundRecord,
            settlement: &RefundSettlement<'_>,
            key_ttl: Duration,
        ) -> Result<bool, StoreError>;
        /// Takes over a refund's in-flight record whose lease has run out, as
        /// [`Store::take_over`] does a charge's.
        fn take_over_refund(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            lease: Duration,
        ) -> Result<Option<RefundRecord>, StoreError>;
        /// Ends the lease of the attempt that holds a refund's record after an
        /// unknown outcome, scheduling the reconciler on the refund in the same
        /// write, as [`Store::release`] does for a charge.
        fn release_refund(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            reschedule: &Reschedule,
        ) -> Result<(), StoreError>;
        /// Stops the reconciler and every retry trying this refund; it stays
        /// `pending` (its amount reserved) until an operator settles it. With
        /// the mark, in its transaction, `webhook`'s deliveries (once).
        fn mark_refund_for_review(
            &self,
            merchant_id: i64,
            id: &RefundId,
            reason: &str,
            webhook: &NewWebhook,
        ) -> Result<(), StoreError>;
        /// Refunds awaiting review, oldest first.
        fn stuck_refunds(&self) -> Result<Vec<StuckRefund>, StoreError>;
        /// One refund, any merchant's, with its key record: for operators.
        fn refund_detail(&self, id: &str) -> Result<Option<RefundDetail>, StoreError>;
        /// A merchant's refund by id.
        fn refund(&self, merchant_id: i64, id: &RefundId) -> Result<Option<Refund>, StoreError>;
        /// A merchant's charge's refunds, oldest first.
        fn refunds_of(
            &self,
            merchant_id: i64,
            charge_id: &ChargeId,
        ) -> Result<Vec<Refund>, StoreError>;
    }

    /// The steps of a two-step charge (captures and voids), as refunds are:
    /// the claim reserves against the authorization with a guarded update of
    /// the charge's row, committed before the acquirer is called.
    trait Steps {
        /// Claims a step's key and, in the same committed transaction,
        /// reserves it against the authorization (a capture's amount within
        /// what remains, nothing closed; a void: no capture pending) and
        /// makes the step. A refusal leaves nothing behind.
        fn claim_step(&self, claim: &NewStepClaim<'_>) -> Result<StepClaim, StoreError>;
        /// The record under a key, with its step; `None` when the key is
        /// unknown or another operation's.
        fn step_record(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
        ) -> Result<Option<StepRecord>, StoreError>;
        /// Stores a step's final outcome, fenced by `record.attempt`, and
        /// settles the charge in the same transaction (a capture made adds to
        /// what it captured; a void made closes it; a failed step gives its
        /// reservation back). `false`: this attempt no longer holds the key.
        fn finalize_step(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            record: &StepRecord,
            settlement: &StepSettlement<'_>,
            key_ttl: Duration,
        ) -> Result<bool, StoreError>;
        /// Takes over a step's in-flight record whose lease has run out.
        fn take_over_step(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            lease: Duration,
        ) -> Result<Option<StepRecord>, StoreError>;
        /// Ends the lease of the attempt holding a step's record after an
        /// unknown outcome, scheduling the reconciler on the step.
        fn release_step(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            reschedule: &Reschedule,
        ) -> Result<(), StoreError>;
        /// Sets a step aside for a person; it stays `pending`, its
        /// reservation held. With the mark, `webhook`'s deliveries (once).
        fn mark_step_for_review(
            &self,
            merchant_id: i64,
            id: &StepId,
            reason: &str,
            webhook: &NewWebhook,
        ) -> Result<(), StoreError>;
        /// One step, any merchant's, with its key record: for operators.
        fn step_detail(&self, id: &str) -> Result<Option<StepDetail>, StoreError>;
        /// A merchant's step by id.
        fn step(&self, merchant_id: i64, id: &StepId) -> Result<Option<Step>, StoreError>;
        /// A merchant's charge's captures and voids, oldest first.
        fn steps_of(&self, merchant_id: i64, charge_id: &ChargeId) -> Result<Vec<Step>, StoreError>;
    }

    /// The idempotency keys: records, leases, outcomes, orphans, expiry.
    trait Keys {
        /// The record under a key, with its charge.
        fn key_record(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
        ) -> Result<Option<KeyRecord>, StoreError>;
        /// What a key stands for now: its record, or its tombstone; `None` when
        /// the merchant has neither.
        fn key_status(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
        ) -> Result<Option<KeyStatus>, StoreError>;
        /// Takes over an in-flight record whose lease has run out (its holder crashed
        /// or hung), bumping the fencing token. Only the attempt that saw `attempt`
        /// can win; `None` means someone else moved first.
        fn take_over(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            lease: Duration,
        ) -> Result<Option<KeyRecord>, StoreError>;
        /// Extends the lease of the attempt that holds it, before a second call to
        /// the acquirer in one attempt (the reconciler's lookup, then capture), so
        /// that no take-over can start a POST of the same reference meanwhile.
        /// `false`: the attempt no longer holds the record.
        fn renew(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            lease: Duration,
        ) -> Result<bool, StoreError>;
        /// Up to `limit` orphans due for the reconciler, oldest lease first. Reading
        /// them takes nothing: each is then taken with the fenced [`Store::take_over`],
        /// so several reconcilers and servers never work one charge at once.
        fn orphans(
            &self,
            limit: i64,
            settle_deadline: Duration,
        ) -> Result<Vec<Orphan>, StoreError>;
        /// Deletes up to `limit` expired, completed key records, each leaving a
        /// tombstone (merchant, key, fingerprint, charge) that lives `tombstone_ttl`
        /// past the key's expiry; returns how many. Small bounded batches, so no
        /// long lock (PostgreSQL also skips rows a request is reclaiming). Charges
        /// are never deleted, and an in-flight record never expires.
        fn sweep_expired_keys(
            &self,
            limit: i64,
            tombstone_ttl: Duration,
        ) -> Result<u64, StoreError>;
        /// Deletes up to `limit` tombstones past their time; returns how many.
        fn sweep_tombstones(&self, limit: i64) -> Result<u64, StoreError>;
        /// Ends the lease early after an unknown outcome, so the next retry
        /// re-drives at once instead of waiting it out, and tells the reconciler
        /// when to look again, in one transaction: no reconciler can find the
        /// record free before its wait is written. A no-op for a fenced-out holder.
        fn release(
            &self,
            merchant_id: i64,
            key: &IdempotencyKey,
            attempt: i64,
            reschedule: &Reschedule,
        ) -> Result<(), StoreError>;
    }

    /// Charges: what each is now, and the operators' views of them.
    trait Charges {
        /// Authorizations older than `ttl` that nothing closed and no capture
        /// is pending on, oldest first, at most `limit`: what expiry voids.
        fn expired_authorizations(
            &self,
            ttl: Duration,
            limit: i64,
        ) -> Result<Vec<(Merchant, ChargeId)>, StoreError>;
        /// Charges as `filter` picks them, newest first.
        fn charges(&self, filter: &ChargeFilter) -> Result<Vec<ChargeSummary>, StoreError>;
        /// One charge, any merchant's, with its key record: for operators.
        fn charge_record(&self, id: &str) -> Result<Option<ChargeRecord>, StoreError>;
        /// A merchant's charge as it is now; `None` when absent or another merchant's.
        fn charge(
            &self,
            merchant_id: i64,
            id: &ChargeId,
        ) -> Result<Option<Charge>, StoreError>;
        /// Charges awaiting review, oldest first.
        fn stuck_charges(&self) -> Result<Vec<StuckCharge>, StoreError>;
        /// What the `/metrics` gauges show about unsettled charges and refunds.
        fn processing_stats(&self) -> Result<ProcessingStats, StoreError>;
        /// Stops the reconciler trying this charge; it stays `processing`, because
        /// only the acquirer's word may make it captured or failed. With the
        /// mark, in its transaction, `webhook`'s deliveries (once: a charge
        /// already marked is left as it is).
        fn mark_for_review(
            &self,
            id: &ChargeId,
            reason: &str,
            webhook: &NewWebhook,
        ) -> Result<(), StoreError>;
    }

    /// Merchants and their secrets.
    trait Merchants {
        /// Adds a merchant with its first secret.
        fn create_merchant(
            &self,
            name: &str,
            secret_hash: &SecretHash,
            audit: &Audit<'_>,
        ) -> Result<Merchant, MerchantError>;
        /// The enabled merchant a live secret authenticates, and how long the
        /// secret has left.
        fn merchant_by_secret(
            &self,
            secret_hash: &SecretHash,
        ) -> Result<Option<SecretMatch>, StoreError>;
        /// The merchant a queue command names in its `tenant` header.
        fn merchant_by_name(&self, name: &str) -> Result<Option<Merchant>, StoreError>;
        /// Moves whenever a secret is rotated or a merchant disabled or enabled:
        /// an instance that sees it move forgets the merchants it cached.
        fn merchants_version(&self) -> Result<i64, StoreError>;
        /// Every merchant, by name, with its secrets' dates (never the secrets).
        fn merchant_listing(&self) -> Result<Vec<MerchantListing>, StoreError>;
        /// Gives the merchant `name` a new secret; its live ones work `grace`
        /// more (none: refused at once).
        fn rotate_secret(
            &self,
            name: &str,
            secret_hash: &SecretHash,
            grace: Duration,
            audit: &Audit<'_>,
        ) -> Result<Rotation, MerchantError>;
        /// Disables (every secret refused) or enables the merchant `name`;
        /// `false` when it already was so (nothing changed, nothing recorded).
        fn set_merchant_disabled(
            &self,
            name: &str,
            disabled: bool,
            audit: &Audit<'_>,
        ) -> Result<bool, MerchantError>;
    }

    /// Merchants' webhook endpoints and the deliveries to them.
    trait Webhooks {
        /// Adds a webhook endpoint for the merchant `new.merchant` (an unknown
        /// name is [`MerchantError::Unknown`]), audited.
        fn add_webhook_endpoint(
            &self,
            new: &NewEndpoint<'_>,
            audit: &Audit<'_>,
        ) -> Result<(), MerchantError>;
        /// Every webhook endpoint, by merchant: never a secret.
        fn webhook_endpoints(&self) -> Result<Vec<EndpointInfo>, StoreError>;
        /// Changes the endpoint `id`, audited; `false` when there is no such
        /// endpoint (or nothing to change: enabling an enabled one).
        fn change_webhook_endpoint(
            &self,
            id: &str,
            change: EndpointChange<'_>,
            audit: &Audit<'_>,
        ) -> Result<bool, StoreError>;
        /// Leases up to `limit` due webhook deliveries for `lease`, at most
        /// `per_endpoint` in flight per endpoint across every deliverer; each
        /// counts as an attempt.
        fn take_webhook_deliveries(
            &self,
            limit: i64,
            lease: Duration,
            per_endpoint: i64,
        ) -> Result<Vec<DueDelivery>, StoreError>;
        /// Settles one attempt; `false` when it was not the delivery's current
        /// attempt any more (its lease ran out and another deliverer took it).
        fn finish_webhook_delivery(
            &self,
            id: i64,
            attempt: i32,
            outcome: &AttemptOutcome,
        ) -> Result<bool, StoreError>;
        /// Sends the event's delivered or failed deliveries again, from the
        /// schedule's start; how many. Audited.
        fn redeliver_webhook(
            &self,
            event_id: &str,
            audit: &Audit<'_>,
        ) -> Result<u64, StoreError>;
        /// The latest `limit` deliveries, newest first.
        fn webhook_deliveries(&self, limit: i64) -> Result<Vec<DeliveryInfo>, StoreError>;
        /// The deliveries of the events about a charge and its refunds, oldest
        /// first (those written by this release: the delivery names its charge).
        fn charge_deliveries(
            &self,
            charge_id: &str,
            limit: i64,
        ) -> Result<Vec<DeliveryInfo>, StoreError>;
        /// Deliveries not yet delivered nor given up, and the oldest's age in seconds.
        fn webhook_backlog(&self) -> Result<(i64, f64), StoreError>;
    }

    /// The outbox: results of queue commands, and whether events are written.
    trait Outbox {
        /// Takes up to `limit` messages ready to publish, oldest first, skipping
        /// rows another relay holds. A waiting result is ready once its key's
        /// outcome is stored, and takes that outcome's status and body.
        fn outbox_batch(&self, limit: i64) -> Result<OutboxBatch, StoreError>;
        /// Writes the result of one delivery of a queue command.
        fn enqueue_result(&self, new: &NewResult<'_>) -> Result<(), StoreError>;
        /// Deletes up to `limit` messages published longer than `retention` ago.
        fn prune_outbox(&self, retention: Duration, limit: i64) -> Result<u64, StoreError>;
        /// Whether finalizes write charge events to the outbox: one setting for the
        /// whole deployment, kept in the database so that every instance agrees.
        fn events_enabled(&self) -> Result<bool, StoreError>;
        /// Turns charge events on or off for the whole deployment; `true` if that
        /// changed the setting. A relay turns them on when it starts.
        fn set_events_enabled(&self, enabled: bool) -> Result<bool, StoreError>;
        /// Messages not yet published, and the age of the oldest, in seconds; rows
        /// set aside are not waiting to be published, and are not counted.
        fn outbox_backlog(&self) -> Result<(i64, f64), StoreError>;
    }

    /// The audit trail.
    trait AuditTrail {
        /// Appends `entry` to the audit trail on its own (an action whose own
        /// writes are the engine's, such as `idem charges retry`, or the
        /// reconciler's looks).
        fn record_audit(&self, entry: &AuditEntry<'_>) -> Result<(), StoreError>;
        /// The audit trail, newest first: of `subject` (a merchant's name or a
        /// charge's id), or of everything.
        fn audit_trail(
            &self,
            subject: Option<&str>,
            limit: i64,
        ) -> Result<Vec<AuditRecord>, StoreError>;
    }

    /// What the operator console alone reads and writes.
    trait Console {
        /// Adds a console token named `name` (the actor its actions are audited as).
        fn create_admin_token(
            &self,
            name: &str,
            token_hash: &SecretHash,
            by: &Audit<'_>,
        ) -> Result<(), StoreError>;
        /// The name of the console token that hashes to `token_hash`, if any.
        fn admin_token_name(
            &self,
            token_hash: &SecretHash,
        ) -> Result<Option<String>, StoreError>;
        /// Charges made within `window`, counted by status.
        fn outcome_counts(&self, window: Duration) -> Result<Vec<(String, i64)>, StoreError>;
    }
}
