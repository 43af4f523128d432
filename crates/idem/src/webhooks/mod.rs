//! Merchant webhooks: each charge outcome told to the merchant's own HTTPS
//! endpoints, signed (Standard Webhooks) and retried until delivered.
//!
//! - [`target`]: where a webhook may go (the URL and address rules, and the
//!   client that keeps to them at every connection).
//!
//! The endpoints and the deliveries live in the store (`webhook_endpoints`,
//! `webhook_deliveries`); the signature and the events are the domain's
//! ([`crate::domain::WebhookSecret`], [`crate::domain::WebhookEvent`]).

pub mod target;
