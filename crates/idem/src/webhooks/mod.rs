//! Merchant webhooks: each charge outcome told to the merchant's own HTTPS
//! endpoints, signed (Standard Webhooks) and retried until delivered.
//!
//! - [`target`]: where a webhook may go (the URL and address rules, and the
//!   client that keeps to them at every connection);
//! - [`deliver`]: the deliverer, which sends what the store holds, signed,
//!   and retries on a schedule of about three days.
//!
//! The endpoints and the deliveries live in the store (`webhook_endpoints`,
//! `webhook_deliveries`); the signature and the events are the domain's
//! ([`idem_core::domain::WebhookSecret`], [`idem_core::domain::WebhookEvent`]).

pub mod deliver;
pub mod target;

pub use deliver::{Deliverer, DelivererConfig};
