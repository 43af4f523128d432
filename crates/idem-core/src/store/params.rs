//! The parameters of the two statements on every charge's path, the claim and
//! the finalize, named and in their `$N` order, in one place: both backends
//! bind them from here (SQLite's claim runs three statements on one set of
//! values), and `idem-lab bench --vs-pgbench` writes its pgbench script from the
//! same list, so the order exists once.

use sqlx::{Arguments, Encode, Type};

use super::model::{AuditEntry, NewClaim, NewEvent, NewWebhook};
use crate::domain::{AcquirerReference, ChargeId, EVENTS_EXCHANGE};

/// One parameter's value, in the few types these statements bind.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Int(i64),
    OptInt(Option<i64>),
    SmallInt(i16),
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
    OptBytes(Option<&'a [u8]>),
}

impl From<i64> for Param<'_> {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<&i64> for Param<'_> {
    fn from(v: &i64) -> Self {
        Self::Int(*v)
    }
}

impl From<i32> for Param<'_> {
    fn from(v: i32) -> Self {
        Self::Int(i64::from(v))
    }
}

impl From<Option<i32>> for Param<'_> {
    fn from(v: Option<i32>) -> Self {
        Self::OptInt(v.map(i64::from))
    }
}

impl From<i16> for Param<'_> {
    fn from(v: i16) -> Self {
        Self::SmallInt(v)
    }
}

impl From<Option<i16>> for Param<'_> {
    fn from(v: Option<i16>) -> Self {
        Self::OptInt(v.map(i64::from))
    }
}

impl From<Option<i64>> for Param<'_> {
    fn from(v: Option<i64>) -> Self {
        Self::OptInt(v)
    }
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(v: &'a str) -> Self {
        Self::Text(v)
    }
}

impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Self::OptText(v)
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(v: &'a String) -> Self {
        Self::Text(v)
    }
}

impl From<bool> for Param<'_> {
    fn from(v: bool) -> Self {
        Self::Int(i64::from(v))
    }
}

impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(v: &'a [u8]) -> Self {
        Self::Bytes(v)
    }
}

impl<'a> From<Option<&'a [u8]>> for Param<'a> {
    fn from(v: Option<&'a [u8]>) -> Self {
        Self::OptBytes(v)
    }
}

/// A statement's parameters: `$1` is the first, each with its name.
pub type Params<'a, const N: usize> = [(&'static str, Param<'a>); N];

/// The statement arguments of `params`, for either backend.
pub(super) fn arguments<'a, A, const N: usize>(params: &Params<'a, N>) -> Result<A, sqlx::Error>
where
    A: Arguments<'a>,
    i64: Encode<'a, A::Database> + Type<A::Database>,
    Option<i64>: Encode<'a, A::Database> + Type<A::Database>,
    i16: Encode<'a, A::Database> + Type<A::Database>,
    &'a str: Encode<'a, A::Database> + Type<A::Database>,
    Option<&'a str>: Encode<'a, A::Database> + Type<A::Database>,
    &'a [u8]: Encode<'a, A::Database> + Type<A::Database>,
    Option<&'a [u8]>: Encode<'a, A::Database> + Type<A::Database>,
{
    let mut args = A::default();
    for (_, param) in params {
        match *param {
            Param::Int(v) => args.add(v),
            Param::OptInt(v) => args.add(v),
            Param::SmallInt(v) => args.add(v),
            Param::Text(v) => args.add(v),
            Param::OptText(v) => args.add(v),
            Param::Bytes(v) => args.add(v),
            Param::OptBytes(v) => args.add(v),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok(args)
}

/// A claim, owned: what a batch carries to its worker.
#[derive(Debug, Clone)]
pub struct ClaimRow {
    merchant_id: i64,
    key: crate::domain::IdempotencyKey,
    fingerprint: crate::domain::Fingerprint,
    request: crate::domain::ChargeRequest,
    lease: std::time::Duration,
    key_ttl: std::time::Duration,
    traceparent: Option<String>,
}

impl ClaimRow {
    pub(super) fn new(new: &NewClaim<'_>) -> Self {
        Self {
            merchant_id: new.merchant_id,
            key: new.key.clone(),
            fingerprint: new.fingerprint,
            request: new.request.clone(),
            lease: new.lease,
            key_ttl: new.key_ttl,
            traceparent: new.traceparent.map(str::to_owned),
        }
    }

    pub(super) fn claim(&self) -> NewClaim<'_> {
        NewClaim {
            merchant_id: self.merchant_id,
            key: &self.key,
            fingerprint: self.fingerprint,
            request: &self.request,
            lease: self.lease,
            key_ttl: self.key_ttl,
            traceparent: self.traceparent.as_deref(),
        }
    }
}

/// The values a claim binds, made once so that every statement of one claim
/// (SQLite runs several) names the same new charge.
#[derive(Debug, Default)]
pub struct ClaimValues {
    merchant_id: i64,
    key: String,
    fingerprint: Vec<u8>,
    charge_id: String,
    lease_ms: i64,
    key_ttl_ms: i64,
    order_id: i64,
    amount_cents: i64,
    currency: String,
    description: Option<String>,
    reference: String,
    traceparent: Option<String>,
    /// `manual` for a charge only authorized; `None`: captured in one step.
    capture_method: Option<&'static str>,
}

impl ClaimValues {
    /// A claim's values: a fresh charge id, and the intent's own reference.
    pub(super) fn new(new: &NewClaim<'_>) -> Self {
        Self {
            merchant_id: new.merchant_id,
            key: new.key.as_str().to_owned(),
            fingerprint: new.fingerprint.as_bytes().to_vec(),
            charge_id: ChargeId::generate().as_str().to_owned(),
            lease_ms: super::shared::millis(new.lease),
            key_ttl_ms: super::shared::millis(new.key_ttl),
            order_id: new.request.order_id.get(),
            amount_cents: new.request.amount_cents.get(),
            currency: new.request.currency.as_str().to_owned(),
            description: new
                .request
                .description
                .as_ref()
                .map(|d| d.as_str().to_owned()),
            reference: AcquirerReference::for_intent(new.merchant_id, new.key, &new.fingerprint)
                .as_str()
                .to_owned(),
            traceparent: new.traceparent.map(str::to_owned),
            capture_method: (!new.request.capture).then_some("manual"),
        }
    }

    pub(super) fn merchant_id(&self) -> i64 {
        self.merchant_id
    }

    pub(super) fn key(&self) -> &str {
        &self.key
    }

    pub(super) fn fingerprint(&self) -> &[u8] {
        &self.fingerprint
    }

    /// `$1..$13`: the key record's columns, then the new charge's. A statement
    /// that uses fewer of them ignores the rest (SQLite's).
    pub fn params(&self) -> Params<'_, 13> {
        [
            ("merchant_id", Param::Int(self.merchant_id)),
            ("key", Param::Text(&self.key)),
            ("fingerprint", Param::Bytes(&self.fingerprint)),
            ("charge_id", Param::Text(&self.charge_id)),
            ("lease_ms", Param::Int(self.lease_ms)),
            ("key_ttl_ms", Param::Int(self.key_ttl_ms)),
            ("order_id", Param::Int(self.order_id)),
            ("amount_cents", Param::Int(self.amount_cents)),
            ("currency", Param::Text(&self.currency)),
            ("description", Param::OptText(self.description.as_deref())),
            ("reference", Param::Text(&self.reference)),
            ("traceparent", Param::OptText(self.traceparent.as_deref())),
            ("capture_method", Param::OptText(self.capture_method)),
        ]
    }
}

/// What a finalize writes, as both backends bind it.
#[derive(Default)]
pub struct FinalizeValues<'a> {
    pub(super) merchant_id: i64,
    pub(super) key: &'a str,
    pub(super) charge_id: &'a str,
    pub(super) attempt: i64,
    pub(super) status: i16,
    pub(super) body: &'a [u8],
    pub(super) key_ttl_ms: i64,
    pub(super) charge_status: &'a str,
    pub(super) capture_id: Option<&'a str>,
    pub(super) decline_reason: Option<&'a str>,
    pub(super) event: Option<EventValues<'a>>,
    pub(super) webhook: Option<WebhookValues<'a>>,
    /// Not a parameter of the statement: recorded beside it (see [`Settlement`]).
    pub(super) audit: Option<&'a AuditEntry<'a>>,
}

/// The charge event a finalize writes to the outbox.
#[derive(Debug, Clone, Copy)]
pub struct EventValues<'a> {
    pub(super) message_id: &'a str,
    /// Also its routing key.
    pub(super) event_type: &'a str,
    pub(super) tenant: &'a str,
    pub(super) body: &'a [u8],
}

/// The webhook event a finalize writes a delivery of, for each of the
/// merchant's enabled endpoints that hears it.
#[derive(Debug, Clone, Copy)]
pub struct WebhookValues<'a> {
    pub(super) event_id: &'a str,
    pub(super) event_type: &'a str,
    pub(super) body: &'a [u8],
}

impl<'a> From<&'a NewWebhook> for WebhookValues<'a> {
    fn from(w: &'a NewWebhook) -> Self {
        Self {
            event_id: w.event_id.as_str(),
            event_type: w.event_type,
            body: w.body.as_ref(),
        }
    }
}

impl<'a> From<&'a NewEvent<'a>> for EventValues<'a> {
    fn from(e: &'a NewEvent<'a>) -> Self {
        Self {
            message_id: e.message_id.as_str(),
            event_type: e.event_type,
            tenant: e.tenant,
            body: e.body.as_ref(),
        }
    }
}

/// A finalize's values, owned: what a batch carries to its worker. Never an
/// operator's (those are recorded with their audit entry, alone).
#[derive(Debug)]
pub struct FinalizeRow {
    merchant_id: i64,
    key: String,
    charge_id: String,
    attempt: i64,
    status: i16,
    body: Vec<u8>,
    key_ttl_ms: i64,
    charge_status: String,
    capture_id: Option<String>,
    decline_reason: Option<String>,
    /// Message id, type, tenant, body.
    event: Option<(String, String, String, Vec<u8>)>,
    /// Event id, type, body.
    webhook: Option<(String, String, Vec<u8>)>,
}

impl FinalizeRow {
    pub(super) fn new(v: &FinalizeValues<'_>) -> Self {
        Self {
            merchant_id: v.merchant_id,
            key: v.key.to_owned(),
            charge_id: v.charge_id.to_owned(),
            attempt: v.attempt,
            status: v.status,
            body: v.body.to_vec(),
            key_ttl_ms: v.key_ttl_ms,
            charge_status: v.charge_status.to_owned(),
            capture_id: v.capture_id.map(str::to_owned),
            decline_reason: v.decline_reason.map(str::to_owned),
            event: v.event.map(|e| {
                (
                    e.message_id.to_owned(),
                    e.event_type.to_owned(),
                    e.tenant.to_owned(),
                    e.body.to_vec(),
                )
            }),
            webhook: v.webhook.map(|w| {
                (
                    w.event_id.to_owned(),
                    w.event_type.to_owned(),
                    w.body.to_vec(),
                )
            }),
        }
    }

    pub(super) fn values(&self) -> FinalizeValues<'_> {
        FinalizeValues {
            merchant_id: self.merchant_id,
            key: &self.key,
            charge_id: &self.charge_id,
            attempt: self.attempt,
            status: self.status,
            body: &self.body,
            key_ttl_ms: self.key_ttl_ms,
            charge_status: &self.charge_status,
            capture_id: self.capture_id.as_deref(),
            decline_reason: self.decline_reason.as_deref(),
            event: self
                .event
                .as_ref()
                .map(|(id, kind, tenant, body)| EventValues {
                    message_id: id,
                    event_type: kind,
                    tenant,
                    body,
                }),
            webhook: self.webhook.as_ref().map(|(id, kind, body)| WebhookValues {
                event_id: id,
                event_type: kind,
                body,
            }),
            audit: None,
        }
    }
}

impl FinalizeValues<'_> {
    /// `$1..$18`: the record (fenced by `attempt`) and its stored response,
    /// the charge's settlement, the charge event (`event_id` null: none), then
    /// the webhook event (`webhook_event_id` null: none).
    pub fn params(&self) -> Params<'_, 18> {
        let (event, webhook) = (self.event, self.webhook);
        [
            ("merchant_id", Param::Int(self.merchant_id)),
            ("key", Param::Text(self.key)),
            ("charge_id", Param::Text(self.charge_id)),
            ("attempt", Param::Int(self.attempt)),
            ("response_status", Param::SmallInt(self.status)),
            ("response_body", Param::Bytes(self.body)),
            ("key_ttl_ms", Param::Int(self.key_ttl_ms)),
            ("charge_status", Param::Text(self.charge_status)),
            ("capture_id", Param::OptText(self.capture_id)),
            ("decline_reason", Param::OptText(self.decline_reason)),
            ("event_id", Param::OptText(event.map(|e| e.message_id))),
            (
                "event_exchange",
                Param::OptText(event.map(|_| EVENTS_EXCHANGE)),
            ),
            ("event_type", Param::OptText(event.map(|e| e.event_type))),
            ("event_tenant", Param::OptText(event.map(|e| e.tenant))),
            ("event_body", Param::OptBytes(event.map(|e| e.body))),
            (
                "webhook_event_id",
                Param::OptText(webhook.map(|w| w.event_id)),
            ),
            (
                "webhook_event_type",
                Param::OptText(webhook.map(|w| w.event_type)),
            ),
            ("webhook_body", Param::OptBytes(webhook.map(|w| w.body))),
        ]
    }
}

/// The names of a claim's parameters, `$1` first.
pub fn claim_param_names() -> [&'static str; 13] {
    ClaimValues::default().params().map(|(name, _)| name)
}

/// The names of a finalize's parameters, `$1` first.
pub fn finalize_param_names() -> [&'static str; 18] {
    FinalizeValues::default().params().map(|(name, _)| name)
}
