//! Metrics (Prometheus text at `GET /metrics`): the names idem records, and the
//! process-wide recorder that renders them.
//!
//! Counters and histograms are recorded where things happen (the HTTP layer,
//! the engine, the workers) with the `metrics` macros under the names below;
//! gauges that describe the database (oldest `processing` charge, pool use) are
//! read when scraped.
//!
//! Every counter and histogram whose label values are known ([`KNOWN_SERIES`])
//! exists from start-up at 0, with each of those values: Prometheus's
//! `increase()` and `rate()` see nothing in a series whose first sample is
//! already 1, so a series born at its first event would hide that event from
//! every alert (the first contradicted capture, the first dead letter).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Requests by matched route, method and status.
pub const HTTP_REQUESTS: &str = "idem_http_requests_total";
/// Answers to `POST /v1/charges` by outcome: `captured`, `declined`, `failed`,
/// `replayed`, `in_flight` (409), `key_reused` (422), `key_expired` (410),
/// `unknown` (503), `under_review` (503).
pub const CHARGE_OUTCOMES: &str = "idem_charge_outcomes_total";
/// Answers to `POST /v1/charges/{id}/refunds` by outcome: `succeeded`,
/// `failed` (refused by the acquirer), `refused` (the charge cannot give it:
/// not captured, or more than it has left), `replayed`, `in_flight`,
/// `key_reused`, `key_expired`, `unknown`, `under_review`.
pub const REFUND_OUTCOMES: &str = "idem_refund_outcomes_total";
/// Answers to `POST /v1/charges/{id}/captures` by outcome, as refunds'
/// (`refused`: the authorization cannot give it).
pub const CAPTURE_OUTCOMES: &str = "idem_capture_outcomes_total";
/// Answers to `POST /v1/charges/{id}/void` by outcome, as refunds'.
pub const VOID_OUTCOMES: &str = "idem_void_outcomes_total";
/// Problem answers by their `type`'s last part (`overloaded`: shed at once;
/// `service-unavailable`, `store-unwritable`, `internal`, ...), whatever the route.
pub const HTTP_PROBLEMS: &str = "idem_http_problems_total";
/// Calls to the acquirer by outcome: `captured`, `refunded`, `voided`, `declined`,
/// `rejected`, `unknown`, `contradicted`.
pub const ACQUIRER_CALLS: &str = "idem_acquirer_calls_total";
/// Unknown acquirer outcomes by cause: the acquirer's status code (`409`,
/// `429`, `503`, ...), or `timeout`, `connect`, `transport`, `body`.
pub const ACQUIRER_UNKNOWN: &str = "idem_acquirer_unknown_total";
/// Captures whose echo contradicted the charge (another order, amount or
/// currency): money moved as nobody asked, and the charge awaits a person.
/// Alert on any increase.
pub const ACQUIRER_CONTRADICTED: &str = "idem_acquirer_contradicted_total";
/// Webhook attempts by result: `delivered`, `retried` (any answer but a 2xx
/// in time: tried again later), `failed` (the schedule's end).
pub const WEBHOOK_DELIVERIES: &str = "idem_webhook_deliveries_total";
/// Webhook deliveries neither delivered nor given up (read at scrape).
pub const WEBHOOK_PENDING: &str = "idem_webhook_pending";
/// Age of the oldest of them, seconds (read at scrape).
pub const WEBHOOK_OLDEST_PENDING: &str = "idem_webhook_oldest_pending_seconds";
/// Duration of each acquirer call, seconds.
pub const ACQUIRER_SECONDS: &str = "idem_acquirer_call_seconds";
/// Reconciler results: `settled`, `backed_off`, `marked_for_review`, `skipped`, `error`.
pub const RECONCILER: &str = "idem_reconciler_charges_total";
/// Expired key records deleted by the sweeper.
pub const SWEPT_KEYS: &str = "idem_swept_keys_total";
/// Age of the oldest charge still `processing`, seconds (0 when none).
pub const OLDEST_PROCESSING: &str = "idem_oldest_processing_charge_seconds";
/// Charges awaiting review (past the settle deadline without the acquirer's
/// word, or captured in contradiction with the charge).
pub const AWAITING_REVIEW: &str = "idem_charges_awaiting_review";
/// Refunds awaiting review (the acquirer's answer contradicted them, or it
/// had none by the settle deadline): each stays `pending`, its amount
/// reserved against its charge, until a person settles it (read at scrape).
pub const REFUNDS_AWAITING_REVIEW: &str = "idem_refunds_awaiting_review";
/// Captures and voids awaiting a person's review, their reservations held.
pub const STEPS_AWAITING_REVIEW: &str = "idem_steps_awaiting_review";
/// Queue commands by result: an engine outcome (as in [`CHARGE_OUTCOMES`]),
/// `dead_lettered` (malformed, refused by the store, or out of attempts), or
/// `requeued` (a transient database error: sent back for another attempt).
pub const QUEUE_COMMANDS: &str = "idem_queue_commands_total";
/// Queue commands' results made durable, by how: `broker` (a final answer
/// published at once and confirmed) or `outbox` (a row the relay publishes:
/// a result waiting for its outcome, or one the broker did not confirm).
pub const QUEUE_RESULTS: &str = "idem_queue_results_total";
/// Outbox messages (events and results) the broker confirmed.
pub const OUTBOX_PUBLISHED: &str = "idem_outbox_published_total";
/// Outbox messages the relay set aside because they can never be published
/// (an AMQP short string over 255 bytes, such as a long routing key).
pub const OUTBOX_SET_ASIDE: &str = "idem_outbox_set_aside_total";
/// Outbox messages not yet published (results waiting for an outcome
/// included, those set aside not).
pub const OUTBOX_PENDING: &str = "idem_outbox_pending";
/// Age of the oldest unpublished outbox message, seconds (0 when none).
pub const OUTBOX_OLDEST: &str = "idem_outbox_oldest_pending_seconds";
/// Database pool connections by state: `idle`, `in_use`.
pub const POOL_CONNECTIONS: &str = "idem_db_pool_connections";
/// Requests per batch the store sent to the database, by `op` (`claim`,
/// `finalize`, `result`): 1 at low load; it grows as requests wait for each other.
pub const STORE_BATCH_ROWS: &str = "idem_store_batch_rows";
/// Replays looked up in the instance's memory of completed outcomes, by
/// `result`: `hit` (answered from memory) or `miss` (asked the database).
pub const REPLAY_CACHE: &str = "idem_replay_cache_total";

/// The recorder, installed once per process (also when a test runs several
/// servers in one process).
pub fn handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(h) => {
                describe();
                register_known_series();
                Some(h)
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics recorder not installed");
                None
            }
        })
        .as_ref()
}

/// The outcomes of an operation on a charge (a refund, a capture, a void).
const OPERATION_OUTCOMES: &[&str] = &[
    "succeeded",
    "failed",
    "refused",
    "replayed",
    "in_flight",
    "key_reused",
    "key_expired",
    "unknown",
    "under_review",
];

/// The label values each counter and histogram can take, where they are
/// known (name, label, values; an empty label for a metric without one).
/// Registered at 0 when the recorder is installed. The HTTP layer adds its
/// routes' and problems' series itself ([`register`]); causes named by the
/// acquirer's status code are born at their first event.
pub const KNOWN_SERIES: &[(&str, &str, &[&str])] = &[
    (CHARGE_OUTCOMES, "outcome", ENGINE_OUTCOMES),
    (REFUND_OUTCOMES, "outcome", OPERATION_OUTCOMES),
    (CAPTURE_OUTCOMES, "outcome", OPERATION_OUTCOMES),
    (VOID_OUTCOMES, "outcome", OPERATION_OUTCOMES),
    (
        ACQUIRER_CALLS,
        "outcome",
        &[
            "captured",
            "refunded",
            "voided",
            "declined",
            "rejected",
            "unknown",
            "contradicted",
        ],
    ),
    (
        ACQUIRER_UNKNOWN,
        "cause",
        &["timeout", "connect", "transport", "body"],
    ),
    (ACQUIRER_CONTRADICTED, "", &[]),
    (ACQUIRER_SECONDS, "", &[]),
    (
        WEBHOOK_DELIVERIES,
        "result",
        &["delivered", "retried", "failed"],
    ),
    (
        RECONCILER,
        "result",
        &[
            "settled",
            "backed_off",
            "marked_for_review",
            "skipped",
            "error",
        ],
    ),
    (SWEPT_KEYS, "", &[]),
    (QUEUE_COMMANDS, "result", ENGINE_OUTCOMES),
    (QUEUE_COMMANDS, "result", &["dead_lettered", "requeued"]),
    (QUEUE_RESULTS, "via", &["broker", "outbox"]),
    (OUTBOX_PUBLISHED, "", &[]),
    (OUTBOX_SET_ASIDE, "", &[]),
    (
        STORE_BATCH_ROWS,
        "op",
        &[
            "claim",
            "finalize",
            "result",
            "refund_claim",
            "refund_finalize",
        ],
    ),
    (REPLAY_CACHE, "result", &["hit", "miss"]),
];

/// The engine's outcomes as metrics name them (`Outcome::label`), for an
/// answer over HTTP and a queue command alike.
const ENGINE_OUTCOMES: &[&str] = &[
    "captured",
    "declined",
    "failed",
    "replayed",
    "in_flight",
    "key_reused",
    "key_expired",
    "unknown",
    "under_review",
];

/// Makes the series `name{labels}` exist at 0 (a counter, or a histogram if
/// `name` is one of [`HISTOGRAMS`]), with nothing counted.
pub fn register(name: &'static str, labels: &[(&'static str, String)]) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect();
    if HISTOGRAMS.contains(&name) {
        let _ = metrics::histogram!(name, labels);
    } else {
        metrics::counter!(name, labels).increment(0);
    }
}

/// The metrics recorded as histograms (rendered as summaries).
const HISTOGRAMS: &[&str] = &[ACQUIRER_SECONDS, STORE_BATCH_ROWS];

fn register_known_series() {
    for (name, label, values) in KNOWN_SERIES {
        if values.is_empty() {
            register(name, &[]);
        }
        for value in *values {
            register(name, &[(*label, (*value).to_owned())]);
        }
    }
}

fn describe() {
    metrics::describe_counter!(HTTP_REQUESTS, "HTTP requests by route, method and status");
    metrics::describe_counter!(HTTP_PROBLEMS, "problem+json answers by type");
    metrics::describe_counter!(CHARGE_OUTCOMES, "POST /v1/charges answers by outcome");
    metrics::describe_counter!(
        REFUND_OUTCOMES,
        "POST /v1/charges/{id}/refunds answers by outcome"
    );
    metrics::describe_counter!(
        CAPTURE_OUTCOMES,
        "POST /v1/charges/{id}/captures answers by outcome"
    );
    metrics::describe_counter!(
        VOID_OUTCOMES,
        "POST /v1/charges/{id}/void answers by outcome"
    );
    metrics::describe_counter!(ACQUIRER_CALLS, "acquirer calls by outcome");
    metrics::describe_counter!(
        ACQUIRER_UNKNOWN,
        "unknown acquirer outcomes, by the acquirer's status or the transport failure"
    );
    metrics::describe_counter!(WEBHOOK_DELIVERIES, "webhook attempts by result");
    metrics::describe_gauge!(
        WEBHOOK_PENDING,
        "webhook deliveries not yet delivered nor failed"
    );
    metrics::describe_gauge!(
        WEBHOOK_OLDEST_PENDING,
        "age of the oldest webhook delivery not yet delivered nor failed"
    );
    metrics::describe_counter!(
        ACQUIRER_CONTRADICTED,
        "captures whose echo named another order, amount or currency than the charge's"
    );
    metrics::describe_histogram!(
        ACQUIRER_SECONDS,
        metrics::Unit::Seconds,
        "acquirer call duration"
    );
    metrics::describe_counter!(RECONCILER, "charges handled by the reconciler, by result");
    metrics::describe_counter!(SWEPT_KEYS, "expired idempotency keys deleted");
    metrics::describe_gauge!(
        OLDEST_PROCESSING,
        metrics::Unit::Seconds,
        "age of the oldest processing charge"
    );
    metrics::describe_gauge!(AWAITING_REVIEW, "charges awaiting a person's review");
    metrics::describe_gauge!(
        REFUNDS_AWAITING_REVIEW,
        "refunds awaiting a person's review, their amounts reserved"
    );
    metrics::describe_gauge!(
        STEPS_AWAITING_REVIEW,
        "captures and voids awaiting a person's review, their reservations held"
    );
    metrics::describe_counter!(QUEUE_COMMANDS, "queue commands handled, by result");
    metrics::describe_counter!(
        QUEUE_RESULTS,
        "queue commands' results made durable, by how (broker or outbox)"
    );
    metrics::describe_counter!(OUTBOX_PUBLISHED, "outbox messages confirmed by the broker");
    metrics::describe_counter!(
        OUTBOX_SET_ASIDE,
        "outbox messages set aside, never to be published"
    );
    metrics::describe_gauge!(OUTBOX_PENDING, "outbox messages not yet published");
    metrics::describe_gauge!(
        OUTBOX_OLDEST,
        metrics::Unit::Seconds,
        "age of the oldest unpublished outbox message"
    );
    metrics::describe_gauge!(POOL_CONNECTIONS, "database pool connections by state");
    metrics::describe_histogram!(
        STORE_BATCH_ROWS,
        "requests per batch sent to the database, by operation"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each known series is in the first scrape, before anything happened.
    #[test]
    fn every_known_series_is_exported_from_the_start() {
        let rendered = handle().expect("the recorder").render();
        let mut expected: Vec<String> = Vec::new();
        for (name, label, values) in KNOWN_SERIES {
            let name = if HISTOGRAMS.contains(name) {
                format!("{name}_count")
            } else {
                (*name).to_owned()
            };
            if values.is_empty() {
                expected.push(format!("{name} "));
            }
            expected.extend(values.iter().map(|v| format!("{name}{{{label}=\"{v}\"}} ")));
        }
        for series in expected {
            assert!(
                rendered.lines().any(|line| line.starts_with(&series)),
                "{series}is not exported:\n{rendered}"
            );
        }
    }
}
