//! The deliverer: sends the deliveries the store holds to the merchants'
//! endpoints, signed, and settles each attempt. Runs beside `serve` and
//! `consume` (not with `--no-workers`); any number may run at once, since
//! each leases what it sends (see the store's `webhooks` modules) and settles
//! an attempt only while it is still the delivery's current one.
//!
//! Out is at-least-once: a deliverer that dies after the endpoint answered
//! but before the attempt is settled leaves the delivery leased, and another
//! sends it again when the lease ends, under the same `webhook-id`. A
//! delivery written with an outcome whose process dies before any POST is
//! sent by whichever deliverer looks next: delayed, never lost.
//!
//! An endpoint is a stranger's server: each attempt has a connect and a total
//! timeout, follows no redirect, reads at most [`BODY_CAP`] of the answer, and
//! runs on its own task, at most [`DelivererConfig::per_endpoint`] at once per
//! endpoint, so an endpoint that hangs or drips holds a few places and never
//! delays another merchant's deliveries. Anything but a 2xx within the bound
//! is retried on [`DelivererConfig::schedule`], with jitter; after its last
//! step the delivery is `failed`, until an operator sends it again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::target::{self, AddressPolicy};
use idem_core::acquirer::describe_transport_error;
use idem_core::domain::{signature_header, WebhookSecret};
use idem_core::store::{AttemptOutcome, DueDelivery, Store};

/// What of an endpoint's answer is read: the status is what counts, and the
/// body is kept only for the log.
const BODY_CAP: usize = 4 * 1024;

/// The waits before each retry: about three days from the first attempt to
/// the last (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, 14 h, 14 h, 14 h).
pub const DEFAULT_SCHEDULE: [Duration; 10] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(14 * 3600),
    Duration::from_secs(14 * 3600),
    Duration::from_secs(14 * 3600),
];

/// The deliverer's pace and bounds.
#[derive(Debug, Clone)]
pub struct DelivererConfig {
    pub policy: AddressPolicy,
    /// Between looks for due deliveries.
    pub poll: Duration,
    /// How long connecting to an endpoint may take.
    pub connect_timeout: Duration,
    /// How long one attempt may take in all, the answer's body included.
    pub timeout: Duration,
    /// The wait before each retry; its length is the number of retries.
    pub schedule: Vec<Duration>,
    /// Attempts in flight at once in this process.
    pub concurrency: usize,
    /// Attempts in flight at once per endpoint, across every deliverer.
    pub per_endpoint: i64,
}

impl DelivererConfig {
    /// The defaults, under `policy`.
    pub fn new(policy: AddressPolicy) -> Self {
        Self {
            policy,
            poll: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            schedule: DEFAULT_SCHEDULE.to_vec(),
            concurrency: 32,
            per_endpoint: 4,
        }
    }

    /// How long a taken delivery is this deliverer's: past one attempt's
    /// bound, so that only a deliverer that died loses it.
    fn lease(&self) -> Duration {
        self.connect_timeout + self.timeout + Duration::from_secs(5)
    }

    /// What a failed attempt (the `attempt`-th) leads to: another after the
    /// schedule's wait (less up to a fifth, at random, so that deliveries
    /// that failed together do not come back together), or the end.
    fn after_failure(&self, attempt: i32, status: Option<u16>, error: String) -> AttemptOutcome {
        let step = usize::try_from(attempt.max(1) - 1).unwrap_or(usize::MAX);
        match self.schedule.get(step) {
            Some(wait) => AttemptOutcome::Retry {
                status,
                error,
                after: wait.mul_f64(1.0 - rand::random::<f64>() * 0.2),
            },
            None => AttemptOutcome::Failed { status, error },
        }
    }
}

/// Sends due deliveries until shut down.
pub struct Deliverer {
    store: Store,
    http: reqwest::Client,
    config: DelivererConfig,
}

impl Deliverer {
    pub fn new(store: Store, config: DelivererConfig) -> anyhow::Result<Self> {
        if config.policy == AddressPolicy::AllowPrivate {
            tracing::warn!(
                "webhooks may go to private, loopback and link-local addresses, and over http:// \
                 (--webhook-allow-private)"
            );
        }
        let http = target::client(config.policy, config.connect_timeout, config.timeout)?;
        Ok(Self {
            store,
            http,
            config,
        })
    }

    pub async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let places = Arc::new(Semaphore::new(this.config.concurrency.max(1)));
        let attempts = TaskTracker::new();
        loop {
            let free = places.available_permits();
            if free > 0 {
                let limit = i64::try_from(free).unwrap_or(i64::MAX);
                match this
                    .store
                    .take_webhook_deliveries(limit, this.config.lease(), this.config.per_endpoint)
                    .await
                {
                    Ok(due) => {
                        for delivery in due {
                            let Ok(place) = places.clone().try_acquire_owned() else {
                                break;
                            };
                            let this = this.clone();
                            attempts.spawn(async move {
                                this.deliver(delivery).await;
                                drop(place);
                            });
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not take webhook deliveries"),
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(this.config.poll) => {}
            }
        }
        // Attempts in flight end within their own bound.
        attempts.close();
        attempts.wait().await;
    }

    /// One attempt of one delivery, settled.
    async fn deliver(&self, delivery: DueDelivery) {
        let outcome = self.attempt(&delivery).await;
        let result = match &outcome {
            AttemptOutcome::Delivered { .. } => "delivered",
            AttemptOutcome::Retry { .. } => "retried",
            AttemptOutcome::Failed { .. } => "failed",
        };
        metrics::counter!(idem_core::metrics::WEBHOOK_DELIVERIES, "result" => result).increment(1);
        match &outcome {
            AttemptOutcome::Delivered { status } => tracing::debug!(
                event_id = %delivery.event_id, endpoint = %delivery.endpoint_id, status,
                attempt = delivery.attempt, "webhook delivered"),
            AttemptOutcome::Retry {
                status,
                error,
                after,
            } => tracing::info!(
                event_id = %delivery.event_id, endpoint = %delivery.endpoint_id, ?status,
                %error, attempt = delivery.attempt, retry_in_s = after.as_secs(),
                "webhook not delivered; will retry"),
            AttemptOutcome::Failed { status, error } => tracing::warn!(
                event_id = %delivery.event_id, endpoint = %delivery.endpoint_id, ?status,
                %error, attempt = delivery.attempt,
                "webhook not delivered by the end of its schedule: failed (idem webhooks redeliver)"),
        }
        match self
            .store
            .finish_webhook_delivery(delivery.id, delivery.attempt, &outcome)
            .await
        {
            Ok(true) => {}
            Ok(false) => tracing::warn!(event_id = %delivery.event_id,
                "a webhook attempt outlived its lease; another deliverer has it"),
            Err(e) => tracing::warn!(event_id = %delivery.event_id, error = %e,
                "could not settle a webhook attempt; it is sent again when its lease ends"),
        }
    }

    /// Sends one attempt and says what it came to.
    async fn attempt(&self, delivery: &DueDelivery) -> AttemptOutcome {
        let fail = |status: Option<u16>, error: String| {
            self.config.after_failure(delivery.attempt, status, error)
        };
        let url = match target::parse_url(&delivery.url, self.config.policy) {
            Ok(url) => url,
            Err(e) => return fail(None, e.to_string()),
        };
        let secrets: Result<Vec<WebhookSecret>, String> = std::iter::once(&delivery.secret)
            .chain(delivery.previous_secret.as_ref())
            .map(|s| WebhookSecret::parse(s))
            .collect();
        let secrets = match secrets {
            Ok(secrets) => secrets,
            Err(e) => return fail(None, format!("the endpoint's secret: {e}")),
        };
        let timestamp = chrono::Utc::now().timestamp();
        let signature = signature_header(&secrets, &delivery.event_id, timestamp, &delivery.body);
        let sent = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &delivery.event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(delivery.body.clone())
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => return fail(None, describe_transport_error(&e)),
        };
        let status = response.status();
        // The answer's body, up to the cap, within the attempt's own bound.
        let mut read = 0;
        let body_error = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    if read >= BODY_CAP {
                        break None;
                    }
                }
                Ok(None) => break None,
                Err(e) => break Some(describe_transport_error(&e)),
            }
        };
        match (status.is_success(), body_error) {
            (true, None) => AttemptOutcome::Delivered {
                status: status.as_u16(),
            },
            (true, Some(e)) => fail(Some(status.as_u16()), format!("the answer broke off: {e}")),
            (false, _) => fail(
                Some(status.as_u16()),
                format!("the endpoint answered {status}"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_follow_the_schedule_with_jitter_then_end() {
        let config = DelivererConfig {
            schedule: vec![Duration::from_secs(10), Duration::from_secs(100)],
            ..DelivererConfig::new(AddressPolicy::PublicOnly)
        };
        for (attempt, step) in [(1, 10.0), (2, 100.0)] {
            match config.after_failure(attempt, Some(500), "x".into()) {
                AttemptOutcome::Retry { after, status, .. } => {
                    assert_eq!(status, Some(500));
                    let secs = after.as_secs_f64();
                    assert!(secs <= step && secs >= step * 0.8, "{attempt}: {secs}");
                }
                other => panic!("{attempt}: {other:?}"),
            }
        }
        assert!(matches!(
            config.after_failure(3, None, "x".into()),
            AttemptOutcome::Failed { status: None, .. }
        ));
    }

    #[test]
    fn the_default_schedule_spans_about_three_days() {
        let total: Duration = DEFAULT_SCHEDULE.iter().sum();
        let days = total.as_secs_f64() / 86_400.0;
        assert!((2.5..3.5).contains(&days), "{days}");
    }
}
