//! When to retry, how long to wait, and when to stop.
//!
//! Owns the retry decision for a status, the parsing of `Retry-After`, and
//! [`backoff_delay`]. Invariant: a wait is never shorter than what the server
//! asked for, and never longer than `max_delay` unless the server asked for more.

use std::time::Duration;

use rand::Rng;

/// Default total attempts: with the default delays, the seven waits between
/// eight attempts add up to at most 11.3 s (5.65 s on average), so an intent
/// rides out several seconds of trouble and still ends well inside the budget.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// Default budget for one intent: a payer waiting at a checkout gives up around
/// a minute, so the client stops trying then and leaves the rest to the caller.
pub const DEFAULT_MAX_ELAPSED: Duration = Duration::from_secs(60);

/// Default per-attempt timeout: longer than the server's acquirer timeout plus
/// a database round-trip, so a slow but healthy answer is not cut off.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default backoff base: one round-trip inside a data centre is well under it,
/// so the first retry does not arrive while the first attempt is still settling.
pub const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(100);

/// Default backoff cap: beyond a few seconds a longer wait only burns the budget;
/// the server's `Retry-After` is the way to ask for more.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(5);

/// Default `Prefer: wait`: an in-flight duplicate waits up to this long for
/// the first attempt's outcome (about one slow acquirer call) instead of
/// being answered `409` at once.
pub const DEFAULT_PREFER_WAIT: Duration = Duration::from_secs(5);

/// How hard one intent tries before giving up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first. `0` is read as `1`: an intent is
    /// always tried once while the time budget allows.
    pub max_attempts: u32,
    /// Bound on total time across attempts and waits, so a caller knows when it
    /// will hear back; the last attempt's timeout is shortened to fit it.
    pub max_elapsed: Duration,
    /// Per-attempt HTTP timeout (connect, send and read of the whole body), so a
    /// hung instance costs one attempt, not the whole budget.
    pub attempt_timeout: Duration,
    /// Backoff base: the wait before retry `n` is drawn from `[0, base * 2^n]`.
    pub base_delay: Duration,
    /// Backoff cap, so waits stop growing once retries are far apart anyway.
    pub max_delay: Duration,
    /// What each attempt asks for with `Prefer: wait` (whole seconds; the
    /// server caps it at 10): shortened to leave a second of the attempt's
    /// timeout, and not sent below one second ([`prefer_wait_secs`]).
    pub prefer_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_elapsed: DEFAULT_MAX_ELAPSED,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            base_delay: DEFAULT_BASE_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            prefer_wait: DEFAULT_PREFER_WAIT,
        }
    }
}

/// The wait before retry number `retry` (0-based): exponential backoff with FULL
/// jitter, i.e. uniform in `[0, min(max_delay, base_delay * 2^retry)]`, but never
/// less than the server's `Retry-After` when one was given.
///
/// Full jitter (not "half" or "equal") spreads the retries of many clients that
/// failed together over the whole window, so they do not return in lockstep.
pub fn backoff_delay(policy: &RetryPolicy, retry: u32, retry_after: Option<Duration>) -> Duration {
    let ceiling = backoff_ceiling(policy, retry);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    let jittered = Duration::from_nanos(rand::rng().random_range(0..=nanos));
    match retry_after {
        Some(floor) => jittered.max(floor),
        None => jittered,
    }
}

/// `min(max_delay, base_delay * 2^retry)`, without overflow for any `retry`.
fn backoff_ceiling(policy: &RetryPolicy, retry: u32) -> Duration {
    let grown = 1u32
        .checked_shl(retry)
        .and_then(|factor| policy.base_delay.checked_mul(factor))
        .unwrap_or(Duration::MAX);
    grown.min(policy.max_delay)
}

/// The `Prefer: wait` of an attempt whose timeout is `attempt_timeout`: the
/// policy's wait, but a second short of the timeout so that the server's
/// answer after a full wait still arrives in time; `None` below one second.
pub fn prefer_wait_secs(policy: &RetryPolicy, attempt_timeout: Duration) -> Option<u64> {
    let secs = policy
        .prefer_wait
        .as_secs()
        .min(attempt_timeout.as_secs().saturating_sub(1));
    (secs > 0).then_some(secs)
}

/// The problem `type` of idem's stored `502`: the acquirer refused the
/// charge, which is failed, and the key replays that.
const ACQUIRER_REJECTED: &str = "urn:idem:problem:acquirer-rejected";

/// Whether an answer may turn out differently on a retry.
///
/// `409`: the first attempt is still in flight (`request-in-flight`), or
/// another step of the same authorization is (`authorization-closed`: a final
/// capture or a void is pending at the acquirer; `capture-pending`, to a
/// void: captures are). Nothing is stored under the key for any of them, and
/// what settles the other attempt or step settles the answer: a retry then
/// gets this intent's outcome, or a final refusal (`422`
/// `charge-not-authorized`). So every `409` is retried, with no exception to
/// keep in step with the server. `429`: too many requests now.
/// `503`: the outcome is unknown or the database is down. `504`, and a `502`
/// that is not idem's stored `acquirer-rejected`: a gateway lost the answer,
/// so the outcome is unknown too. Everything else (2xx, `402`, `422`, other
/// 4xx and 5xx) is the server's final word for this key and is returned as is.
pub(crate) fn is_retryable(status: u16, body: &[u8]) -> bool {
    match status {
        409 | 429 | 503 | 504 => true,
        502 => !is_acquirer_rejected(body),
        _ => false,
    }
}

fn is_acquirer_rejected(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Problem<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Problem<'_>>(body)
        .is_ok_and(|p| p.kind.as_deref() == Some(ACQUIRER_REJECTED))
}

/// A header in whole seconds, as the contract sends `Retry-After` and
/// `Idempotency-TTL`. `Retry-After`'s HTTP-date form is not used by the server
/// and is ignored (the backoff still applies).
pub(crate) fn parse_seconds(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Too many digits for u64: far past any budget, so as good as forever.
    Some(
        text.parse::<u64>()
            .map_or(Duration::MAX, Duration::from_secs),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAWS: usize = 2_000;

    fn policy(base_ms: u64, cap_ms: u64) -> RetryPolicy {
        RetryPolicy {
            base_delay: Duration::from_millis(base_ms),
            max_delay: Duration::from_millis(cap_ms),
            ..RetryPolicy::default()
        }
    }

    fn draws(policy: &RetryPolicy, retry: u32, retry_after: Option<Duration>) -> Vec<Duration> {
        (0..DRAWS)
            .map(|_| backoff_delay(policy, retry, retry_after))
            .collect()
    }

    /// Every draw lies in `[0, ceiling]`, and the draws cover the whole window
    /// (some in its bottom quarter, some in its top quarter): a fixed delay or
    /// "equal jitter" (never below half) would fail the spread checks. With 2000
    /// uniform draws, missing a quarter happens with probability (3/4)^2000.
    #[test]
    fn full_jitter_stays_within_and_spans_the_window() {
        let p = policy(10, 100_000);
        for retry in 0..8 {
            let ceiling = Duration::from_millis(10 << retry);
            let ds = draws(&p, retry, None);
            assert!(
                ds.iter().all(|d| *d <= ceiling),
                "retry {retry} over {ceiling:?}"
            );
            assert!(
                ds.iter().any(|d| *d < ceiling / 4),
                "retry {retry}: nothing in the bottom quarter"
            );
            assert!(
                ds.iter().any(|d| *d > ceiling * 3 / 4),
                "retry {retry}: nothing in the top quarter"
            );
        }
    }

    /// The window doubles per retry: retry 5 draws above retry 0's whole window.
    #[test]
    fn window_grows_exponentially() {
        let p = policy(10, 100_000);
        let ds = draws(&p, 5, None);
        assert!(ds.iter().any(|d| *d > Duration::from_millis(10) * 16));
    }

    /// Past the cap the window stops growing; huge retry numbers neither
    /// overflow nor panic.
    #[test]
    fn cap_bounds_every_draw_even_for_huge_retries() {
        let p = policy(100, 5_000);
        for retry in [6, 10, 31, 32, 64, u32::MAX] {
            let ds = draws(&p, retry, None);
            assert!(ds.iter().all(|d| *d <= p.max_delay), "retry {retry}");
            assert!(
                ds.iter().any(|d| *d > p.max_delay * 3 / 4),
                "retry {retry}: the capped window is not used in full"
            );
        }
        let huge = policy(u64::MAX / 2, u64::MAX);
        assert!(backoff_delay(&huge, u32::MAX, None) <= huge.max_delay);
    }

    /// A `Retry-After` above the window is the wait, exactly, even above the cap.
    #[test]
    fn retry_after_is_a_floor_above_the_window() {
        let p = policy(1, 50);
        let floor = Duration::from_secs(2);
        assert!(draws(&p, 3, Some(floor)).iter().all(|d| *d == floor));
    }

    /// A `Retry-After` inside the window lifts the low draws and keeps the rest.
    #[test]
    fn retry_after_inside_the_window_only_lifts_low_draws() {
        let p = policy(100, 100);
        let floor = Duration::from_millis(50);
        let ds = draws(&p, 0, Some(floor));
        assert!(ds.iter().all(|d| *d >= floor && *d <= p.max_delay));
        assert!(ds.contains(&floor));
        assert!(ds.iter().any(|d| *d > Duration::from_millis(75)));
    }

    /// A zero base (or zero cap) means no wait unless the server asks for one.
    #[test]
    fn zero_base_gives_zero_wait() {
        let p = policy(0, 5_000);
        assert!(draws(&p, 4, None).iter().all(Duration::is_zero));
        assert_eq!(
            backoff_delay(&p, 4, Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn retry_after_parses_whole_seconds_only() {
        assert_eq!(parse_seconds(b"0"), Some(Duration::ZERO));
        assert_eq!(parse_seconds(b" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_seconds(b"99999999999999999999999"),
            Some(Duration::MAX)
        );
        for bad in [
            &b""[..],
            b"-1",
            b"1.5",
            b"soon",
            b"Wed, 21 Oct 2015 07:28:00 GMT",
        ] {
            assert_eq!(
                parse_seconds(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn only_unknown_in_flight_or_throttled_answers_are_retried() {
        let gateway = b"<html>502 Bad Gateway</html>";
        for status in [409, 429, 502, 503, 504] {
            assert!(is_retryable(status, gateway), "{status}");
        }
        for status in [200, 201, 400, 401, 402, 404, 410, 413, 415, 422, 500, 501] {
            assert!(!is_retryable(status, gateway), "{status}");
        }
        let rejected = br#"{"type":"urn:idem:problem:acquirer-rejected","status":502}"#;
        assert!(!is_retryable(502, rejected), "idem's stored 502 is final");
        let other = br#"{"type":"urn:idem:problem:internal","status":502}"#;
        assert!(is_retryable(502, other));
    }

    /// The steps of a two-step payment: a `409` that another step's outcome
    /// settles is retried, as are the `503`s that leave a step pending; the
    /// refusals and the acquirer's stored refusals (`422`) are final.
    #[test]
    fn step_conflicts_are_retried_and_step_refusals_are_final() {
        let problem = |kind: &str| format!(r#"{{"type":"urn:idem:problem:{kind}"}}"#);
        for kind in [
            "request-in-flight",
            "authorization-closed",
            "capture-pending",
        ] {
            assert!(is_retryable(409, problem(kind).as_bytes()), "{kind}");
        }
        for kind in ["outcome-unknown", "step-under-review"] {
            assert!(is_retryable(503, problem(kind).as_bytes()), "{kind}");
        }
        for kind in [
            "capture-exceeds-authorization",
            "charge-not-authorized",
            "capture-failed",
            "void-failed",
            "idempotency-key-reused",
        ] {
            assert!(!is_retryable(422, problem(kind).as_bytes()), "{kind}");
        }
    }

    #[test]
    fn the_wait_asked_for_leaves_a_second_of_the_attempt() {
        let p = RetryPolicy::default();
        let secs = |ms| prefer_wait_secs(&p, Duration::from_millis(ms));
        assert_eq!(secs(10_000), Some(5));
        assert_eq!(secs(4_500), Some(3));
        assert_eq!(secs(2_000), Some(1));
        assert_eq!(secs(1_999), None);
        assert_eq!(secs(250), None);
        let never = RetryPolicy {
            prefer_wait: Duration::ZERO,
            ..p
        };
        assert_eq!(prefer_wait_secs(&never, Duration::from_secs(60)), None);
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts, 8);
        assert_eq!(p.max_elapsed, Duration::from_secs(60));
        assert_eq!(p.attempt_timeout, Duration::from_secs(10));
        assert_eq!(p.base_delay, Duration::from_millis(100));
        assert_eq!(p.max_delay, Duration::from_secs(5));
        assert_eq!(p.prefer_wait, Duration::from_secs(5));
    }
}
