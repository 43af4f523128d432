//! idem's HTTP client for the acquirer.
//!
//! The acquirer's word is exactly three answers (`docs/contract/acquirer.md`):
//! `201` with a captured body for this reference, `402` with a declined body
//! for this reference, and `422` (the reference is known with other data).
//! A `201` whose echo names another order, amount or currency than asked is
//! the acquirer's word too, but not a capture of this charge:
//! [`AcquirerError::Contradicted`], for a person to look at.
//! Everything else — any other status (a `409` while the first POST of the
//! reference is still in flight, a proxy's `408`/`429`, a wrong route's
//! `404`, a redirect), a timeout, a reset, a body that does not parse or names
//! another reference — is [`AcquirerError::Unknown`]: money may have moved,
//! and only another call with the same reference can settle it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use super::protocol::{CaptureOutcome, CaptureRequest, Echo, RefundOutcome, RefundRequest};

/// The longest `Retry-After` idem takes from the acquirer. A hint beyond it
/// (a misconfigured proxy's "come back tomorrow") would park a charge the
/// reconciler should keep asking about.
const MAX_ACQUIRER_RETRY_AFTER: Duration = Duration::from_secs(600);

/// The acquirer moved the money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub capture_id: String,
}

/// The acquirer paid the refund back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refunded {
    pub refund_id: String,
}

/// The acquirer refused; no money moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined {
    pub reason: String,
}

/// An answer that settles nothing: money may or may not have moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// What happened, for the log.
    pub why: String,
    /// What kind of unknown, for the metric: the acquirer's status code
    /// (`"409"`, `"429"`, `"503"`, ...), or `timeout`, `connect`, `transport`
    /// (a reset or a body cut short) or `body` (a final status whose body is
    /// not this reference's outcome).
    pub cause: String,
    /// The acquirer's own `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
}

/// A capture of this reference that moved something else than was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contradiction {
    pub capture_id: String,
    /// Each field that differs, as `amount_cents 4500 (asked 4400)`.
    pub differences: Vec<String>,
}

/// Errors in the acquirer's words.
#[derive(Debug, thiserror::Error)]
pub enum AcquirerError {
    /// A definite decline.
    #[error("declined: {}", .0.reason)]
    Declined(Declined),
    /// `422`: the acquirer refuses this request for good (a capture's
    /// reference known with other parameters; a refund beyond what its
    /// capture has left, or of a capture it does not know). Final, and no
    /// money moved for this request; `reason` is the acquirer's, when given.
    #[error("rejected by the acquirer with status {status}")]
    Rejected { status: u16, reason: Option<String> },
    /// No answer that settles it: money may or may not have moved.
    #[error("outcome unknown: {}", .0.why)]
    Unknown(Unknown),
    /// The acquirer captured this reference, but its echo contradicts the
    /// request: money moved, not as asked. Final at the acquirer (it
    /// deduplicates by reference and will say the same again), and not this
    /// charge's capture: only a person can settle it.
    #[error("the acquirer captured {}: {}", .0.capture_id, .0.differences.join(", "))]
    Contradicted(Contradiction),
}

impl AcquirerError {
    fn unknown(cause: impl Into<String>, why: impl Into<String>) -> Self {
        Self::Unknown(Unknown {
            why: why.into(),
            cause: cause.into(),
            retry_after: None,
        })
    }

    /// An answer with a status that is not the acquirer's word.
    fn unexpected_status(status: StatusCode, headers: &HeaderMap) -> Self {
        Self::Unknown(Unknown {
            why: format!("the acquirer answered {status}"),
            cause: status.as_u16().to_string(),
            retry_after: retry_after(headers),
        })
    }

    fn transport(e: &reqwest::Error) -> Self {
        let cause = if e.is_timeout() {
            "timeout"
        } else if e.is_connect() {
            "connect"
        } else {
            "transport"
        };
        Self::unknown(cause, describe(e))
    }
}

/// A client bound to one acquirer base URL, with a bounded timeout per call.
#[derive(Clone)]
pub struct AcquirerClient {
    http: reqwest::Client,
    captures_url: String,
    refunds_url: String,
}

/// A definite outcome the acquirer reported.
pub type Settled = Result<Captured, AcquirerError>;

/// A definite outcome of a refund the acquirer reported.
pub type RefundSettled = Result<Refunded, AcquirerError>;

/// An answer read in full: its status, headers and body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: bytes::Bytes,
}

impl AcquirerClient {
    /// A client for the acquirer at `base_url` (`http://` or `https://`). Over
    /// HTTPS it trusts the system's roots, and also `private_ca` (a PEM file
    /// of one or more certificates) when the acquirer's certificate is issued
    /// by a private CA. TLS is rustls; a certificate that does not verify is
    /// a failed connection, so an unknown outcome, never a final one.
    pub fn new(
        base_url: &str,
        timeout: Duration,
        private_ca: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirect is not the acquirer's word, and following one would
            // turn the POST into a GET elsewhere: it is an unknown outcome.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = private_ca {
            let pem = std::fs::read(path)
                .with_context(|| format!("reading the acquirer CA {}", path.display()))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{} holds no PEM certificate", path.display()))?;
            anyhow::ensure!(
                !roots.is_empty(),
                "{} holds no PEM certificate",
                path.display()
            );
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        let http = builder.build()?;
        let base = base_url.trim_end_matches('/');
        Ok(Self {
            http,
            captures_url: format!("{base}/v1/captures"),
            refunds_url: format!("{base}/v1/refunds"),
        })
    }

    /// POSTs `body` to `url` with `reference` as the idempotency key, and
    /// reads the answer in full (a body cut short is a dropped connection:
    /// unknown).
    async fn post(
        &self,
        url: &str,
        reference: &str,
        body: &impl serde::Serialize,
    ) -> Result<Answer, AcquirerError> {
        let request = self
            .http
            .post(url)
            .header("Idempotency-Key", reference)
            .json(body);
        self.send(request).await
    }

    /// GETs `url/reference`: `None` for a `404` (no outcome there).
    async fn get(&self, url: &str, reference: &str) -> Result<Option<Answer>, AcquirerError> {
        let answer = self
            .send(self.http.get(format!("{url}/{reference}")))
            .await?;
        Ok((answer.status != StatusCode::NOT_FOUND).then_some(answer))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Answer, AcquirerError> {
        let response = request
            .headers(trace_headers())
            .send()
            .await
            .map_err(|e| AcquirerError::transport(&e))?;
        let status = response.status();
        record_status(status);
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|e| AcquirerError::transport(&e))?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// `POST /v1/captures` with the charge's reference as the idempotency key.
    pub async fn capture(&self, request: &CaptureRequest) -> Result<Captured, AcquirerError> {
        let Answer {
            status,
            headers,
            body,
        } = self
            .post(&self.captures_url, &request.reference, request)
            .await?;
        match status {
            StatusCode::CREATED | StatusCode::PAYMENT_REQUIRED => {
                match serde_json::from_slice::<CaptureOutcome>(&body) {
                    Ok(CaptureOutcome::Captured {
                        capture_id,
                        reference,
                        echo,
                    }) if status == StatusCode::CREATED && reference == request.reference => {
                        captured(request, capture_id, &echo)
                    }
                    Ok(CaptureOutcome::Declined { reason, reference })
                        if status == StatusCode::PAYMENT_REQUIRED
                            && reference == request.reference =>
                    {
                        Err(AcquirerError::Declined(Declined { reason }))
                    }
                    _ => Err(AcquirerError::unknown(
                        "body",
                        format!("the acquirer answered {status} with a body that is not this reference's outcome"),
                    )),
                }
            }
            StatusCode::UNPROCESSABLE_ENTITY => Err(AcquirerError::Rejected {
                status: status.as_u16(),
                reason: None,
            }),
            s => Err(AcquirerError::unexpected_status(s, &headers)),
        }
    }

    /// `GET /v1/captures/{reference}` for `request`'s reference: the
    /// acquirer's outcome if it has one, its echo checked against `request`
    /// as a POST's would be. `Ok(None)` (404) is not proof that no capture
    /// will happen: a POST still in flight may land later, so only a POST
    /// with the same reference settles it.
    pub async fn lookup(&self, request: &CaptureRequest) -> Result<Option<Settled>, AcquirerError> {
        let reference = request.reference.as_str();
        let Some(Answer {
            status,
            headers,
            body,
        }) = self.get(&self.captures_url, reference).await?
        else {
            return Ok(None);
        };
        if status != StatusCode::OK {
            return Err(AcquirerError::unexpected_status(status, &headers));
        }
        match serde_json::from_slice::<CaptureOutcome>(&body) {
            Ok(CaptureOutcome::Captured {
                capture_id,
                reference: r,
                echo,
            }) if r == reference => Ok(Some(captured(request, capture_id, &echo))),
            Ok(CaptureOutcome::Declined {
                reason,
                reference: r,
            }) if r == reference => Ok(Some(Err(AcquirerError::Declined(Declined { reason })))),
            _ => Err(AcquirerError::unknown(
                "body",
                "the lookup answered a body that is not this reference's outcome",
            )),
        }
    }
}

impl AcquirerClient {
    /// `POST /v1/refunds` with the refund's reference as the idempotency key.
    ///
    /// A `422` is final only once the acquirer says so twice: a real acquirer
    /// may refuse a retry of a refund it has already paid ("nothing left to
    /// refund"), so a refusal is looked up by reference before it is taken,
    /// and a lookup that finds the refund paid wins. A lookup that fails
    /// leaves the outcome unknown.
    pub async fn refund(&self, request: &RefundRequest) -> RefundSettled {
        let Answer {
            status,
            headers,
            body,
        } = self
            .post(&self.refunds_url, &request.reference, request)
            .await?;
        match status {
            // Paid as asked, or paid otherwise (a contradiction); a refusal
            // under a 201 is not the acquirer's word.
            StatusCode::CREATED => match refund_outcome(request, &body) {
                Some(settled) if !matches!(settled, Err(AcquirerError::Rejected { .. })) => {
                    settled
                }
                _ => Err(AcquirerError::unknown(
                    "body",
                    format!("the acquirer answered {status} with a body that is not this refund's outcome"),
                )),
            },
            StatusCode::UNPROCESSABLE_ENTITY => {
                let said = refund_outcome(request, &body).and_then(Result::err);
                match self.lookup_refund(request).await? {
                    Some(settled) => settled,
                    None => Err(said.unwrap_or(AcquirerError::Rejected {
                        status: status.as_u16(),
                        reason: None,
                    })),
                }
            }
            s => Err(AcquirerError::unexpected_status(s, &headers)),
        }
    }

    /// `GET /v1/refunds/{reference}`: the acquirer's outcome for the refund,
    /// if it has one (`404`: none yet; only a POST with the same reference
    /// settles it).
    pub async fn lookup_refund(
        &self,
        request: &RefundRequest,
    ) -> Result<Option<RefundSettled>, AcquirerError> {
        let Some(Answer {
            status,
            headers,
            body,
        }) = self.get(&self.refunds_url, &request.reference).await?
        else {
            return Ok(None);
        };
        if status != StatusCode::OK {
            return Err(AcquirerError::unexpected_status(status, &headers));
        }
        match refund_outcome(request, &body) {
            Some(settled) => Ok(Some(settled)),
            None => Err(AcquirerError::unknown(
                "body",
                "the refund lookup answered a body that is not this reference's outcome",
            )),
        }
    }
}

/// A refund outcome body for `request`'s reference, its echo checked: `None`
/// when the body is not one.
fn refund_outcome(request: &RefundRequest, body: &[u8]) -> Option<RefundSettled> {
    match serde_json::from_slice::<RefundOutcome>(body).ok()? {
        RefundOutcome::Refunded {
            refund_id,
            reference,
            echo,
        } if reference == request.reference => {
            let differences = echo.contradictions(&Echo::of_refund(request));
            Some(if differences.is_empty() {
                Ok(Refunded { refund_id })
            } else {
                Err(AcquirerError::Contradicted(Contradiction {
                    capture_id: refund_id,
                    differences,
                }))
            })
        }
        RefundOutcome::Refused { reference, reason } if reference == request.reference => {
            Some(Err(AcquirerError::Rejected {
                status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(),
                reason: Some(reason),
            }))
        }
        _ => None,
    }
}

/// The current span's `traceparent` for the acquirer (none when tracing is off).
fn trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    crate::trace::inject(&mut crate::trace::HeaderInjector(&mut headers));
    headers
}

/// The acquirer's status on the call's span (a no-op off).
fn record_status(status: StatusCode) {
    if crate::trace::is_on() {
        let span = tracing::Span::current();
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// A capture of `request`'s reference, as its echo says: this charge's
/// capture, or a contradiction.
fn captured(request: &CaptureRequest, capture_id: String, echo: &Echo) -> Settled {
    let differences = echo.contradictions(&Echo::of(request));
    if differences.is_empty() {
        Ok(Captured { capture_id })
    } else {
        Err(AcquirerError::Contradicted(Contradiction {
            capture_id,
            differences,
        }))
    }
}

/// The `Retry-After` of an answer (RFC 9110: delay-seconds or an HTTP-date),
/// capped at [`MAX_ACQUIRER_RETRY_AFTER`]; `None` when absent or unreadable.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(MAX_ACQUIRER_RETRY_AFTER))
}

/// A transport error in words, for logs: a timeout, or the error with its
/// causes (a refused connection and why, "connection closed before message
/// completed", ...). The webhook deliverer describes its own errors with it.
pub fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_owned();
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(value).expect("header"));
        h
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_capped() {
        assert_eq!(
            retry_after(&with_retry_after("3")),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&with_retry_after("999999")),
            Some(MAX_ACQUIRER_RETRY_AFTER)
        );
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        let read = retry_after(&with_retry_after(&soon)).expect("a date");
        assert!(
            read > Duration::from_secs(25) && read <= Duration::from_secs(30),
            "{read:?}"
        );
        let past = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(retry_after(&with_retry_after(past)), Some(Duration::ZERO));
        assert_eq!(retry_after(&with_retry_after("soon")), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }
}
