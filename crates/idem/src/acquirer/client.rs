//! idem's HTTP client for the acquirer.

use std::time::Duration;

use reqwest::StatusCode;

use super::protocol::{CaptureOutcome, CaptureRequest};

/// The acquirer moved the money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub capture_id: String,
}

/// The acquirer refused; no money moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined {
    pub reason: String,
}

/// Errors in the acquirer's words.
#[derive(Debug, thiserror::Error)]
pub enum AcquirerError {
    /// A definite decline.
    #[error("declined: {}", .0.reason)]
    Declined(Declined),
    /// The acquirer rejected the request itself (e.g. `422`: the reference is
    /// known with other parameters). Final, and no money moved for this request.
    #[error("rejected by the acquirer with status {status}")]
    Rejected { status: u16 },
    /// No answer that settles it: money may or may not have moved.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

/// A client bound to one acquirer base URL, with a bounded timeout per call.
#[derive(Clone)]
pub struct AcquirerClient {
    http: reqwest::Client,
    captures_url: String,
}

/// A definite outcome the acquirer reported.
pub type Settled = Result<Captured, AcquirerError>;

impl AcquirerClient {
    pub fn new(base_url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self {
            http,
            captures_url: format!("{}/v1/captures", base_url.trim_end_matches('/')),
        })
    }

    /// `POST /v1/captures` with the charge's reference as the idempotency key.
    pub async fn capture(&self, request: &CaptureRequest) -> Result<Captured, AcquirerError> {
        let response = self
            .http
            .post(&self.captures_url)
            .header("Idempotency-Key", &request.reference)
            .json(request)
            .send()
            .await
            .map_err(|e| AcquirerError::Unknown(describe(&e)))?;
        let status = response.status();
        // A body that cannot be read in full is a dropped connection: unknown.
        let body = response
            .bytes()
            .await
            .map_err(|e| AcquirerError::Unknown(describe(&e)))?;
        match status {
            StatusCode::CREATED | StatusCode::PAYMENT_REQUIRED => {
                match serde_json::from_slice::<CaptureOutcome>(&body) {
                    Ok(CaptureOutcome::Captured {
                        capture_id,
                        reference,
                    }) if status == StatusCode::CREATED && reference == request.reference => {
                        Ok(Captured { capture_id })
                    }
                    Ok(CaptureOutcome::Declined { reason, reference })
                        if status == StatusCode::PAYMENT_REQUIRED
                            && reference == request.reference =>
                    {
                        Err(AcquirerError::Declined(Declined { reason }))
                    }
                    _ => Err(AcquirerError::Unknown(format!(
                        "status {status} with an unexpected body"
                    ))),
                }
            }
            s if s.is_client_error() => Err(AcquirerError::Rejected { status: s.as_u16() }),
            s => Err(AcquirerError::Unknown(format!("status {s}"))),
        }
    }
}

impl AcquirerClient {
    /// `GET /v1/captures/{reference}`: the acquirer's outcome if it has one.
    /// `Ok(None)` (404) is not proof that no capture will happen: a POST still
    /// in flight may land later, so only a POST with the same reference settles it.
    pub async fn lookup(&self, reference: &str) -> Result<Option<Settled>, AcquirerError> {
        let response = self
            .http
            .get(format!("{}/{reference}", self.captures_url))
            .send()
            .await
            .map_err(|e| AcquirerError::Unknown(describe(&e)))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| AcquirerError::Unknown(describe(&e)))?;
        if status != StatusCode::OK {
            return Err(AcquirerError::Unknown(format!("lookup answered {status}")));
        }
        match serde_json::from_slice::<CaptureOutcome>(&body) {
            Ok(CaptureOutcome::Captured {
                capture_id,
                reference: r,
            }) if r == reference => Ok(Some(Ok(Captured { capture_id }))),
            Ok(CaptureOutcome::Declined {
                reason,
                reference: r,
            }) if r == reference => Ok(Some(Err(AcquirerError::Declined(Declined { reason })))),
            _ => Err(AcquirerError::Unknown(
                "lookup answered an unexpected body".to_owned(),
            )),
        }
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "could not connect".to_owned()
    } else {
        // Includes the cause chain (e.g. "connection closed before message completed").
        let mut text = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }
}
