//! The attempt loop: one intent, one key, one body, as many attempts as the
//! policy allows.
//!
//! Owns sending one attempt and classifying how it ended. Invariants: every
//! attempt of an intent carries the same `Idempotency-Key` and byte-identical
//! body; attempt `i` goes to `endpoints[i % len]`; no wait and no attempt runs
//! past `max_elapsed`; only `409`, `429`, `503`, `504`, a `502` that is not
//! idem's stored `acquirer-rejected`, timeouts and connection failures are
//! retried. Every operation (a charge, an authorization, a refund, a capture,
//! a void) runs this one loop; they differ only in their path and body.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use crate::answer::{
    Attempt, AttemptOutcome, AuthorizationRequest, CaptureRequest, ChargeAnswer, ChargeRequest,
    RefundRequest,
};
use crate::error::ClientError;
use crate::policy::{backoff_delay, is_retryable, parse_seconds, prefer_wait_secs, RetryPolicy};

/// Where charges are created, relative to an endpoint's base URL.
const CHARGES_PATH: &str = "/v1/charges";

/// The request header naming the intent (IETF draft and Stripe spell it so).
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The answer header the server sets when it replays a stored outcome.
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The answer header saying how many more seconds a stored outcome's key is honoured.
const IDEMPOTENCY_TTL: HeaderName = HeaderName::from_static("idempotency-ttl");

/// RFC 7240's request header, for `wait=N`.
const PREFER: HeaderName = HeaderName::from_static("prefer");

/// A charge client bound to a set of instances and one merchant's secret.
///
/// Cheap to clone: clones share one connection pool.
#[derive(Clone)]
pub struct Client {
    /// Shared so a clone per task costs one reference count, not a new pool.
    inner: Arc<Inner>,
}

struct Inner {
    /// One pool for all endpoints; redirects are off (see [`Client::new`]).
    http: reqwest::Client,
    /// Never empty: [`Client::new`] refuses an empty list, so `i % len` is sound.
    endpoints: Vec<Endpoint>,
    /// `Bearer <secret>`, built once and marked sensitive so it never shows in
    /// a `Debug` of the request.
    authorization: HeaderValue,
    policy: RetryPolicy,
}

struct Endpoint {
    /// The base URL as the caller gave it, reported in [`Attempt::endpoint`].
    base: String,
    /// `base` + [`CHARGES_PATH`], parsed once (and checked).
    charges: reqwest::Url,
}

/// A complete answer from the server to one attempt.
struct Reply {
    status: u16,
    body: Bytes,
    replayed: bool,
    retry_after: Option<Duration>,
    idempotency_ttl: Option<Duration>,
}

impl Client {
    /// `endpoints`: base URLs of instances, e.g. "http://127.0.0.1:8080"; attempt i goes to
    /// endpoints[i % len] (so a retry lands on another instance, as behind a load balancer).
    ///
    /// Only `http://` URLs are accepted (the crate is built without TLS).
    /// Redirects are not followed: a redirected `POST` would lose its body or
    /// its credentials, so a `3xx` is returned as the final answer instead.
    pub fn new(
        endpoints: Vec<String>,
        secret: impl Into<String>,
        policy: RetryPolicy,
    ) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let endpoints = endpoints
            .into_iter()
            .map(Endpoint::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let mut authorization = HeaderValue::try_from(format!("Bearer {}", secret.into()))
            .map_err(|_| ClientError::Build("the secret is not a valid header value".into()))?;
        authorization.set_sensitive(true);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError::Build(error_chain(&e)))?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                endpoints,
                authorization,
                policy,
            }),
        })
    }

    /// One intent: a fresh random key (UUID v4), reused on every attempt.
    pub async fn charge(&self, request: &ChargeRequest) -> Result<ChargeAnswer, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        self.charge_with_key(&key, request).await
    }

    /// One intent under a caller-chosen key (same retry behaviour).
    ///
    /// Use it to finish an intent that ended in [`ClientError::GaveUp`]: the same
    /// key and request return the stored outcome instead of charging again.
    /// The key is sent as a quoted Structured Field string (`"` and `\` escaped);
    /// the server judges it (1..=255 visible ASCII) and answers `400` if it is
    /// not a valid key. A key that no such string can hold (control or
    /// non-ASCII characters) is [`ClientError::Build`], with no attempt made.
    pub async fn charge_with_key(
        &self,
        key: &str,
        request: &ChargeRequest,
    ) -> Result<ChargeAnswer, ClientError> {
        // Encoded once: every attempt must carry the very same bytes.
        let body = serde_json::to_vec(request)
            .map(Bytes::from)
            .map_err(|e| ClientError::Build(format!("encoding the charge request: {e}")))?;
        self.intent(key, CHARGES_PATH, body).await
    }

    /// One refund intent of the charge `charge_id`: a fresh random key,
    /// reused on every attempt, as for a charge.
    pub async fn refund(
        &self,
        charge_id: &str,
        request: &RefundRequest,
    ) -> Result<ChargeAnswer, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        self.refund_with_key(&key, charge_id, request).await
    }

    /// One refund intent under a caller-chosen key (same retry behaviour; the
    /// same key and request finish a refund that ended in
    /// [`ClientError::GaveUp`] without refunding twice).
    pub async fn refund_with_key(
        &self,
        key: &str,
        charge_id: &str,
        request: &RefundRequest,
    ) -> Result<ChargeAnswer, ClientError> {
        let path = charge_path(charge_id, "refunds")?;
        let body = serde_json::to_vec(request)
            .map(Bytes::from)
            .map_err(|e| ClientError::Build(format!("encoding the refund request: {e}")))?;
        self.intent(key, &path, body).await
    }

    /// One authorization intent (the first step of a two-step payment):
    /// `POST /v1/charges` with the charge's fields and `"capture": false`,
    /// under a fresh random key reused on every attempt, as for a charge. Its
    /// `201` is the charge with `status: authorized`; capture it with
    /// [`Client::capture`] or release it with [`Client::void`].
    pub async fn authorize(&self, request: &ChargeRequest) -> Result<ChargeAnswer, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        self.authorize_with_key(&key, request).await
    }

    /// One authorization intent under a caller-chosen key (same retry
    /// behaviour; the same key and request finish an authorization that
    /// ended in [`ClientError::GaveUp`] without authorizing twice).
    pub async fn authorize_with_key(
        &self,
        key: &str,
        request: &ChargeRequest,
    ) -> Result<ChargeAnswer, ClientError> {
        let authorization = AuthorizationRequest {
            charge: request,
            capture: false,
        };
        let body = serde_json::to_vec(&authorization)
            .map(Bytes::from)
            .map_err(|e| ClientError::Build(format!("encoding the authorization: {e}")))?;
        self.intent(key, CHARGES_PATH, body).await
    }

    /// One capture intent of the authorized charge `charge_id`: a fresh
    /// random key, reused on every attempt, as for a charge.
    ///
    /// Every `409` is retried as a charge's is: `request-in-flight` (this
    /// key's first attempt is at the acquirer), and `authorization-closed`
    /// (a final capture or a void of the charge is pending at the acquirer;
    /// nothing is stored under this key, and once that step settles a retry
    /// gets its final answer: this capture, or `422` `charge-not-authorized`).
    /// The refusals (`422` `capture-exceeds-authorization`,
    /// `charge-not-authorized`) and the acquirer's `422` `capture-failed`
    /// (stored) are final answers, returned after one attempt.
    pub async fn capture(
        &self,
        charge_id: &str,
        request: &CaptureRequest,
    ) -> Result<ChargeAnswer, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        self.capture_with_key(&key, charge_id, request).await
    }

    /// One capture intent under a caller-chosen key (same retry behaviour;
    /// the same key and request finish a capture that ended in
    /// [`ClientError::GaveUp`] without capturing twice).
    pub async fn capture_with_key(
        &self,
        key: &str,
        charge_id: &str,
        request: &CaptureRequest,
    ) -> Result<ChargeAnswer, ClientError> {
        let path = charge_path(charge_id, "captures")?;
        let body = serde_json::to_vec(request)
            .map(Bytes::from)
            .map_err(|e| ClientError::Build(format!("encoding the capture request: {e}")))?;
        self.intent(key, &path, body).await
    }

    /// One void intent of the authorized charge `charge_id` (it releases
    /// what the authorization still holds; the body is `{}`): a fresh random
    /// key, reused on every attempt, as for a charge. A `409`
    /// `capture-pending` (captures of the charge are pending at the acquirer)
    /// and `authorization-closed` are retried as a capture's are: nothing is
    /// stored under the key, and once the other step settles a retry gets
    /// this void, or its final refusal.
    pub async fn void(&self, charge_id: &str) -> Result<ChargeAnswer, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        self.void_with_key(&key, charge_id).await
    }

    /// One void intent under a caller-chosen key (same retry behaviour; the
    /// same key finishes a void that ended in [`ClientError::GaveUp`] without
    /// voiding twice).
    pub async fn void_with_key(
        &self,
        key: &str,
        charge_id: &str,
    ) -> Result<ChargeAnswer, ClientError> {
        let path = charge_path(charge_id, "void")?;
        self.intent(key, &path, Bytes::from_static(b"{}")).await
    }

    /// The attempt loop of one intent: `body` POSTed to `path` of each
    /// endpoint in turn under `key`, until a final answer or the policy's end.
    async fn intent(
        &self,
        key: &str,
        path: &str,
        body: Bytes,
    ) -> Result<ChargeAnswer, ClientError> {
        let key_header = quoted_key(key)?;
        let urls = self
            .inner
            .endpoints
            .iter()
            .map(|e| e.url(path))
            .collect::<Result<Vec<_>, _>>()?;
        let policy = &self.inner.policy;
        let started = Instant::now();
        let max_attempts = policy.max_attempts.max(1);
        let mut attempts = Vec::new();
        let mut retry_after = None;

        for number in 0..max_attempts {
            if number > 0 {
                let wait = backoff_delay(policy, number - 1, retry_after);
                let remaining = policy.max_elapsed.saturating_sub(started.elapsed());
                if wait >= remaining {
                    let reason = format!(
                        "the next wait ({wait:?}) would pass max_elapsed ({:?})",
                        policy.max_elapsed
                    );
                    return Err(give_up(key, attempts, &reason));
                }
                tokio::time::sleep(wait).await;
            }
            let remaining = policy.max_elapsed.saturating_sub(started.elapsed());
            if remaining.is_zero() {
                let reason = format!("max_elapsed ({:?}) spent", policy.max_elapsed);
                return Err(give_up(key, attempts, &reason));
            }

            let place = number as usize % self.inner.endpoints.len();
            let endpoint = &self.inner.endpoints[place];
            let sent = Instant::now();
            let timeout = policy.attempt_timeout.min(remaining);
            let wait = prefer_wait_secs(policy, timeout);
            let result = self
                .attempt(&urls[place], &key_header, &body, timeout, wait)
                .await;
            attempts.push(Attempt {
                endpoint: endpoint.base.clone(),
                outcome: match &result {
                    Ok(reply) => AttemptOutcome::Status(reply.status),
                    Err(outcome) => outcome.clone(),
                },
                sent,
                elapsed: sent.elapsed(),
            });
            match result {
                Ok(reply) if !is_retryable(reply.status, &reply.body) => {
                    return Ok(ChargeAnswer {
                        key: key.to_owned(),
                        status: reply.status,
                        body: reply.body,
                        replayed: reply.replayed,
                        idempotency_ttl: reply.idempotency_ttl,
                        attempts,
                    });
                }
                Ok(reply) => retry_after = reply.retry_after,
                Err(_) => retry_after = None,
            }
        }
        let reason = format!("max_attempts ({max_attempts}) reached");
        Err(give_up(key, attempts, &reason))
    }

    /// Sends one attempt (asking to wait `wait` seconds for an in-flight
    /// duplicate's outcome) and reads the whole answer, all within `timeout`.
    async fn attempt(
        &self,
        url: &reqwest::Url,
        key: &HeaderValue,
        body: &Bytes,
        timeout: Duration,
        wait: Option<u64>,
    ) -> Result<Reply, AttemptOutcome> {
        let exchange = async {
            let mut request = self
                .inner
                .http
                .post(url.clone())
                .header(AUTHORIZATION, self.inner.authorization.clone())
                .header(IDEMPOTENCY_KEY, key.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Some(secs) = wait {
                request = request.header(PREFER, format!("wait={secs}"));
            }
            let response = request.body(body.clone()).send().await?;
            let status = response.status().as_u16();
            let headers = response.headers();
            let replayed = headers
                .get(IDEMPOTENT_REPLAYED)
                .is_some_and(|value| value.as_bytes().trim_ascii().eq_ignore_ascii_case(b"true"));
            let retry_after = headers
                .get(RETRY_AFTER)
                .and_then(|value| parse_seconds(value.as_bytes()));
            let idempotency_ttl = headers
                .get(IDEMPOTENCY_TTL)
                .and_then(|value| parse_seconds(value.as_bytes()));
            // A body cut off half way is a lost answer, not a final one.
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>(Reply {
                status,
                body,
                replayed,
                retry_after,
                idempotency_ttl,
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(error)) if error.is_timeout() => Err(AttemptOutcome::Timeout),
            Ok(Err(error)) => Err(AttemptOutcome::Connection(error_chain(&error))),
            Err(_elapsed) => Err(AttemptOutcome::Timeout),
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<&str> = self
            .inner
            .endpoints
            .iter()
            .map(|e| e.base.as_str())
            .collect();
        f.debug_struct("Client")
            .field("endpoints", &endpoints)
            .field("secret", &"<redacted>")
            .field("policy", &self.inner.policy)
            .finish()
    }
}

impl Endpoint {
    fn parse(base: String) -> Result<Self, ClientError> {
        let bad = |why: &str| ClientError::Build(format!("endpoint {base:?}: {why}"));
        let charges = reqwest::Url::parse(&format!("{}{CHARGES_PATH}", base.trim_end_matches('/')))
            .map_err(|e| bad(&e.to_string()))?;
        if charges.scheme() != "http" {
            return Err(bad("only http:// is supported (built without TLS)"));
        }
        if charges.query().is_some() || charges.fragment().is_some() {
            return Err(bad("a base URL takes no query or fragment"));
        }
        Ok(Self { base, charges })
    }

    /// The URL of `path` (one of the API's, starting at `/v1`) on this endpoint.
    fn url(&self, path: &str) -> Result<reqwest::Url, ClientError> {
        let mut url = self.charges.clone();
        url.set_path(&format!(
            "{}{path}",
            self.charges
                .path()
                .strip_suffix(CHARGES_PATH)
                .unwrap_or_default()
        ));
        Ok(url)
    }
}

/// `/v1/charges/{charge_id}/{operation}`, for an id of idem's shape (`ch_`
/// and letters and digits): anything else could name another route, and is
/// refused before any attempt.
fn charge_path(charge_id: &str, operation: &str) -> Result<String, ClientError> {
    if charge_id.is_empty()
        || !charge_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(ClientError::Build(format!(
            "{charge_id:?} is not a charge id (ch_ and letters and digits)"
        )));
    }
    Ok(format!("{CHARGES_PATH}/{charge_id}/{operation}"))
}

/// The key as an RFC 8941 string: `"` + key with `"` and `\` escaped + `"`.
/// Such a string holds only printable ASCII (0x20..=0x7E); anything else is refused.
fn quoted_key(key: &str) -> Result<HeaderValue, ClientError> {
    if !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ClientError::Build(format!(
            "the idempotency key {key:?} is not printable ASCII, so it cannot be sent"
        )));
    }
    let mut quoted = String::with_capacity(key.len() + 2);
    quoted.push('"');
    for c in key.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    HeaderValue::try_from(quoted)
        .map_err(|e| ClientError::Build(format!("the idempotency key {key:?}: {e}")))
}

fn give_up(key: &str, attempts: Vec<Attempt>, reason: &str) -> ClientError {
    let last = match attempts.last() {
        Some(attempt) => format!("{} from {}; {reason}", attempt.outcome, attempt.endpoint),
        None => reason.to_owned(),
    };
    ClientError::GaveUp {
        key: key.to_owned(),
        attempts,
        last,
    }
}

/// An error and all its causes, `: `-separated: reqwest's own message alone
/// ("error sending request") hides whether the port was closed or the peer reset.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_as_quoted_strings_with_escapes() {
        let uuid = "5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13";
        assert_eq!(quoted_key(uuid).unwrap(), format!("\"{uuid}\"").as_str());
        assert_eq!(quoted_key(r#"a"b\c"#).unwrap(), r#""a\"b\\c""#);
    }

    #[test]
    fn keys_that_cannot_be_header_values_are_refused() {
        assert!(matches!(quoted_key("a\nb"), Err(ClientError::Build(_))));
        assert!(matches!(quoted_key("chave-é"), Err(ClientError::Build(_))));
        assert!(matches!(
            quoted_key("tab\there"),
            Err(ClientError::Build(_))
        ));
    }

    fn new(endpoints: &[&str]) -> Result<Client, ClientError> {
        let endpoints = endpoints.iter().map(|e| e.to_string()).collect();
        Client::new(endpoints, "s3cret", RetryPolicy::default())
    }

    #[test]
    fn endpoints_are_checked_up_front() {
        assert!(matches!(new(&[]), Err(ClientError::NoEndpoints)));
        for bad in [
            "not a url",
            "https://127.0.0.1:1",
            "http://h:1/?q=1",
            "ftp://h",
        ] {
            assert!(matches!(new(&[bad]), Err(ClientError::Build(_))), "{bad}");
        }
        let client = new(&["http://127.0.0.1:8080/", "http://10.0.0.1:8080/base"]).unwrap();
        let urls: Vec<&str> = client
            .inner
            .endpoints
            .iter()
            .map(|e| e.charges.as_str())
            .collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:8080/v1/charges",
                "http://10.0.0.1:8080/base/v1/charges"
            ]
        );
    }

    #[test]
    fn operations_on_a_charge_name_it_and_no_other_route() {
        assert_eq!(
            charge_path("ch_4f9QzXk2LmP8rT1vWb6yNc3d", "captures").unwrap(),
            "/v1/charges/ch_4f9QzXk2LmP8rT1vWb6yNc3d/captures"
        );
        assert_eq!(
            charge_path("ch_1", "void").unwrap(),
            "/v1/charges/ch_1/void"
        );
        for bad in ["", "ch_1/../x", "ch 1", "ch_1?x=1", "ch_é"] {
            assert!(
                matches!(charge_path(bad, "void"), Err(ClientError::Build(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_authorization_is_the_charge_with_capture_false() {
        let charge = ChargeRequest {
            order_id: 7,
            amount_cents: 25_000,
            currency: None,
            description: Some("d".into()),
        };
        let body = serde_json::to_string(&AuthorizationRequest {
            charge: &charge,
            capture: false,
        })
        .unwrap();
        assert_eq!(
            body,
            r#"{"order_id":7,"amount_cents":25000,"description":"d","capture":false}"#
        );
        let capture = |request: CaptureRequest| serde_json::to_string(&request).unwrap();
        assert_eq!(capture(CaptureRequest::default()), r#"{"final":true}"#);
        assert_eq!(
            capture(CaptureRequest {
                amount_cents: Some(10_000),
                final_capture: false
            }),
            r#"{"amount_cents":10000,"final":false}"#
        );
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let client = new(&["http://127.0.0.1:8080"]).unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("127.0.0.1:8080"), "{shown}");
    }
}
