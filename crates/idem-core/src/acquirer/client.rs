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
//!
//! Authorizations answer as captures do. Refunds, captures of an
//! authorization and voids are made (`201`) or refused (`422`, looked up
//! before it is believed); their echo is checked the same way.
//!
//! The client is the [`Acquirer`] the engine runs with: its ten calls are
//! that trait's, implemented here with their bodies (no inherent method of
//! the same name for the trait to fall back on).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use super::protocol::{
    AuthorizationCaptureOutcome, AuthorizationCaptureRequest, AuthorizationOutcome,
    AuthorizationRequest, CaptureOutcome, CaptureRequest, Echo, RefundOutcome, RefundRequest,
    VoidOutcome, VoidRequest,
};
use super::Acquirer;

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

/// The acquirer holds the amount on the card, to be captured or voided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    pub authorization_id: String,
}

/// The acquirer captured part or all of an authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizationCaptured {
    pub capture_id: String,
    /// What a final capture released of the authorization, when the
    /// acquirer says.
    pub released_cents: Option<i64>,
}

/// The acquirer released what an authorization still held, and closed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voided {
    pub void_id: String,
    /// What it released, when the acquirer says.
    pub released_cents: Option<i64>,
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

/// A call of this reference that did something else than was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contradiction {
    /// The acquirer's id for what it did: a capture's, or a refund's,
    /// authorization's or void's.
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
    /// `422`: the acquirer refuses this request for good (a capture's or an
    /// authorization's reference known with other parameters; a refund beyond
    /// what its capture has left, or of a capture it does not know; a capture
    /// beyond what its authorization has left, or of one voided or closed; a
    /// void of an authorization closed). Final, and no money moved for this
    /// request; `reason` is the acquirer's, when given.
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
    authorizations_url: String,
    voids_url: String,
}

/// A definite outcome the acquirer reported.
pub type Settled = Result<Captured, AcquirerError>;

/// A definite outcome of a refund the acquirer reported.
pub type RefundSettled = Result<Refunded, AcquirerError>;

/// A definite outcome of an authorization the acquirer reported.
pub type AuthorizationSettled = Result<Authorized, AcquirerError>;

/// A definite outcome of a capture of an authorization the acquirer reported.
pub type AuthorizationCaptureSettled = Result<AuthorizationCaptured, AcquirerError>;

/// A definite outcome of a void the acquirer reported.
pub type VoidSettled = Result<Voided, AcquirerError>;

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
            authorizations_url: format!("{base}/v1/authorizations"),
            voids_url: format!("{base}/v1/voids"),
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
}

/// The acquirer over HTTP: each call one request (a refusal of a refund, a
/// capture of an authorization or a void, two: the POST and its lookup).
#[async_trait::async_trait]
impl Acquirer for AcquirerClient {
    /// `POST /v1/captures` with the charge's reference as the idempotency key.
    async fn capture(&self, request: &CaptureRequest) -> Result<Captured, AcquirerError> {
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
    async fn lookup(&self, request: &CaptureRequest) -> Result<Option<Settled>, AcquirerError> {
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

    /// `POST /v1/refunds` with the refund's reference as the idempotency key.
    ///
    /// A `422` is final only once the acquirer says so twice: a real acquirer
    /// may refuse a retry of a refund it has already paid ("nothing left to
    /// refund"), so a refusal is looked up by reference before it is taken,
    /// and a lookup that finds the refund paid wins. A lookup that fails
    /// leaves the outcome unknown.
    async fn refund(&self, request: &RefundRequest) -> RefundSettled {
        self.post_refusable(&self.refunds_url, request).await
    }

    /// `GET /v1/refunds/{reference}`: the acquirer's outcome for the refund,
    /// if it has one (`404`: none yet; only a POST with the same reference
    /// settles it).
    async fn lookup_refund(
        &self,
        request: &RefundRequest,
    ) -> Result<Option<RefundSettled>, AcquirerError> {
        self.lookup_refusable(&self.refunds_url, request).await
    }

    /// `POST /v1/authorizations` with the authorization's reference as the
    /// idempotency key: the acquirer's word is as a one-step capture's
    /// (`201` authorized, `402` declined, `422` refused for good, the echo
    /// checked), everything else unknown.
    async fn authorize(&self, request: &AuthorizationRequest) -> AuthorizationSettled {
        let Answer {
            status,
            headers,
            body,
        } = self
            .post(&self.authorizations_url, &request.reference, request)
            .await?;
        match status {
            StatusCode::CREATED | StatusCode::PAYMENT_REQUIRED => {
                match authorization_outcome(request, &body) {
                    Some(settled @ (Ok(_) | Err(AcquirerError::Contradicted(_))))
                        if status == StatusCode::CREATED =>
                    {
                        settled
                    }
                    Some(settled @ Err(AcquirerError::Declined(_)))
                        if status == StatusCode::PAYMENT_REQUIRED =>
                    {
                        settled
                    }
                    _ => Err(AcquirerError::unknown(
                        "body",
                        format!("the acquirer answered {status} with a body that is not this authorization's outcome"),
                    )),
                }
            }
            // Refused for good, as a one-step capture's 422: a retry of an
            // authorization uses nothing up, so no retry of it can be
            // refused for something its first attempt did.
            StatusCode::UNPROCESSABLE_ENTITY => Err(match authorization_outcome(request, &body) {
                Some(Err(refused @ AcquirerError::Rejected { .. })) => refused,
                _ => AcquirerError::Rejected {
                    status: status.as_u16(),
                    reason: None,
                },
            }),
            s => Err(AcquirerError::unexpected_status(s, &headers)),
        }
    }

    /// `GET /v1/authorizations/{reference}`: the acquirer's outcome for the
    /// authorization, if it has one, its echo checked as the POST's would be.
    /// `Ok(None)` (404) is not proof that nothing will be held: only a POST
    /// with the same reference settles it.
    async fn lookup_authorization(
        &self,
        request: &AuthorizationRequest,
    ) -> Result<Option<AuthorizationSettled>, AcquirerError> {
        let Some(Answer {
            status,
            headers,
            body,
        }) = self
            .get(&self.authorizations_url, &request.reference)
            .await?
        else {
            return Ok(None);
        };
        if status != StatusCode::OK {
            return Err(AcquirerError::unexpected_status(status, &headers));
        }
        match authorization_outcome(request, &body) {
            Some(settled) => Ok(Some(settled)),
            None => Err(AcquirerError::unknown(
                "body",
                "the authorization lookup answered a body that is not this reference's outcome",
            )),
        }
    }

    /// `POST /v1/captures` of part or all of an authorization, with the
    /// capture's own reference as the idempotency key. A `422` is looked up
    /// before it is believed, as a refund's: a retry of a capture that took
    /// what remained finds nothing left, and the lookup says it was made.
    async fn capture_authorization(
        &self,
        request: &AuthorizationCaptureRequest,
    ) -> AuthorizationCaptureSettled {
        self.post_refusable(&self.captures_url, request).await
    }

    /// `GET /v1/captures/{reference}` of a capture of an authorization (the
    /// same path as a one-step capture's): its outcome if the acquirer has
    /// one (`404`: none yet; only a POST with the same reference settles it).
    async fn lookup_authorization_capture(
        &self,
        request: &AuthorizationCaptureRequest,
    ) -> Result<Option<AuthorizationCaptureSettled>, AcquirerError> {
        self.lookup_refusable(&self.captures_url, request).await
    }

    /// `POST /v1/voids` with the void's reference as the idempotency key. A
    /// `422` is looked up before it is believed, as a refund's: a retry of a
    /// void that was made finds the authorization voided, and the lookup
    /// says it was this void.
    async fn void(&self, request: &VoidRequest) -> VoidSettled {
        self.post_refusable(&self.voids_url, request).await
    }

    /// `GET /v1/voids/{reference}`: the acquirer's outcome for the void, if it
    /// has one (`404`: none yet; only a POST with the same reference settles
    /// it).
    async fn lookup_void(
        &self,
        request: &VoidRequest,
    ) -> Result<Option<VoidSettled>, AcquirerError> {
        self.lookup_refusable(&self.voids_url, request).await
    }
}

impl AcquirerClient {
    /// POSTs a call whose outcome is made or refused (a refund, a capture of
    /// an authorization, a void): `201` made as asked (or a contradiction),
    /// `422` refused, but only once a lookup of the reference agrees (a `404`
    /// or the refusal itself there; a lookup that finds it made wins, and
    /// one that fails leaves the outcome unknown); everything else unknown.
    async fn post_refusable<R: Refusable>(
        &self,
        url: &str,
        request: &R,
    ) -> Result<R::Made, AcquirerError> {
        let Answer {
            status,
            headers,
            body,
        } = self.post(url, request.reference(), request).await?;
        match status {
            // Made as asked, or made otherwise (a contradiction); a refusal
            // under a 201 is not the acquirer's word.
            StatusCode::CREATED => match request.settle(&body) {
                Some(settled) if !matches!(settled, Err(AcquirerError::Rejected { .. })) => settled,
                _ => Err(AcquirerError::unknown(
                    "body",
                    format!(
                        "the acquirer answered {status} with a body that is not this {}'s outcome",
                        R::WHAT
                    ),
                )),
            },
            StatusCode::UNPROCESSABLE_ENTITY => {
                let said = request.settle(&body).and_then(Result::err);
                match self.lookup_refusable(url, request).await? {
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

    /// GETs `url/{reference}` of a call [`Self::post_refusable`] makes: its
    /// outcome, checked as the POST's would be, or `None` (404).
    async fn lookup_refusable<R: Refusable>(
        &self,
        url: &str,
        request: &R,
    ) -> Result<Option<Result<R::Made, AcquirerError>>, AcquirerError> {
        let Some(Answer {
            status,
            headers,
            body,
        }) = self.get(url, request.reference()).await?
        else {
            return Ok(None);
        };
        if status != StatusCode::OK {
            return Err(AcquirerError::unexpected_status(status, &headers));
        }
        match request.settle(&body) {
            Some(settled) => Ok(Some(settled)),
            None => Err(AcquirerError::unknown(
                "body",
                format!(
                    "the {} lookup answered a body that is not this reference's outcome",
                    R::WHAT
                ),
            )),
        }
    }
}

/// A request whose outcome is made or refused, both remembered by reference
/// (a refund, a capture of an authorization, a void): see
/// [`AcquirerClient::post_refusable`].
trait Refusable: serde::Serialize {
    /// What the acquirer made of it.
    type Made;
    /// Its name in the log: `refund`, `capture`, `void`.
    const WHAT: &'static str;
    fn reference(&self) -> &str;
    /// The outcome `body` says for this request's reference, its echo
    /// checked (a refusal is [`AcquirerError::Rejected`] with its reason):
    /// `None` when the body is not one.
    fn settle(&self, body: &[u8]) -> Option<Result<Self::Made, AcquirerError>>;
}

impl Refusable for RefundRequest {
    type Made = Refunded;
    const WHAT: &'static str = "refund";
    fn reference(&self) -> &str {
        &self.reference
    }
    fn settle(&self, body: &[u8]) -> Option<RefundSettled> {
        match serde_json::from_slice::<RefundOutcome>(body).ok()? {
            RefundOutcome::Refunded {
                refund_id,
                reference,
                echo,
            } if reference == self.reference => Some(
                checked(&echo, &Echo::of_refund(self), refund_id)
                    .map(|refund_id| Refunded { refund_id }),
            ),
            RefundOutcome::Refused { reference, reason } if reference == self.reference => {
                Some(Err(refused(reason)))
            }
            _ => None,
        }
    }
}

impl Refusable for AuthorizationCaptureRequest {
    type Made = AuthorizationCaptured;
    const WHAT: &'static str = "capture";
    fn reference(&self) -> &str {
        &self.reference
    }
    fn settle(&self, body: &[u8]) -> Option<AuthorizationCaptureSettled> {
        match serde_json::from_slice::<AuthorizationCaptureOutcome>(body).ok()? {
            AuthorizationCaptureOutcome::Captured {
                capture_id,
                reference,
                released_cents,
                echo,
            } if reference == self.reference => Some(
                checked(&echo, &Echo::of_authorization_capture(self), capture_id).map(
                    |capture_id| AuthorizationCaptured {
                        capture_id,
                        released_cents,
                    },
                ),
            ),
            AuthorizationCaptureOutcome::Refused { reference, reason }
                if reference == self.reference =>
            {
                Some(Err(refused(reason)))
            }
            _ => None,
        }
    }
}

impl Refusable for VoidRequest {
    type Made = Voided;
    const WHAT: &'static str = "void";
    fn reference(&self) -> &str {
        &self.reference
    }
    fn settle(&self, body: &[u8]) -> Option<VoidSettled> {
        match serde_json::from_slice::<VoidOutcome>(body).ok()? {
            VoidOutcome::Voided {
                void_id,
                reference,
                released_cents,
                echo,
            } if reference == self.reference => Some(
                checked(&echo, &Echo::of_void(self), void_id).map(|void_id| Voided {
                    void_id,
                    released_cents,
                }),
            ),
            VoidOutcome::Refused { reference, reason } if reference == self.reference => {
                Some(Err(refused(reason)))
            }
            _ => None,
        }
    }
}

/// An authorization outcome body for `request`'s reference, its echo
/// checked: `None` when the body is not one.
fn authorization_outcome(
    request: &AuthorizationRequest,
    body: &[u8],
) -> Option<AuthorizationSettled> {
    match serde_json::from_slice::<AuthorizationOutcome>(body).ok()? {
        AuthorizationOutcome::Authorized {
            authorization_id,
            reference,
            echo,
        } if reference == request.reference => Some(
            checked(&echo, &Echo::of_authorization(request), authorization_id)
                .map(|authorization_id| Authorized { authorization_id }),
        ),
        AuthorizationOutcome::Declined { reference, reason } if reference == request.reference => {
            Some(Err(AcquirerError::Declined(Declined { reason })))
        }
        AuthorizationOutcome::Refused { reference, reason } if reference == request.reference => {
            Some(Err(refused(reason)))
        }
        _ => None,
    }
}

/// The acquirer's `id` for what it did, if `echo` contradicts nothing that
/// was `asked`; else a contradiction naming each field that differs.
fn checked(echo: &Echo, asked: &Echo, id: String) -> Result<String, AcquirerError> {
    let differences = echo.contradictions(asked);
    if differences.is_empty() {
        Ok(id)
    } else {
        Err(AcquirerError::Contradicted(Contradiction {
            capture_id: id,
            differences,
        }))
    }
}

/// A refusal body's `reason`, as the error it is.
fn refused(reason: String) -> AcquirerError {
    AcquirerError::Rejected {
        status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(),
        reason: Some(reason),
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
    checked(echo, &Echo::of(request), capture_id).map(|capture_id| Captured { capture_id })
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
