//! The verifier's client side: one request to one of the deployment's URLs,
//! sent with the merchant's secret and given up after `--client-timeout`, and
//! recorded whatever happens to it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::history::{digest, Intent, Purpose, Request, TIMEOUT};

/// How long the run's first look at each URL may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a request sits in an intent's story.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    pub purpose: Purpose,
    pub copy: usize,
    pub attempt: usize,
    pub instance: usize,
}

pub struct Client {
    http: reqwest::Client,
    urls: Vec<String>,
    secret: String,
    timeout: Duration,
    /// The run's clock starts here.
    t0: Instant,
    /// Every request sent, in the order answered. A std mutex: held only to push.
    log: Mutex<Vec<Request>>,
}

impl Client {
    pub fn new(urls: Vec<String>, secret: String, timeout: Duration) -> anyhow::Result<Self> {
        anyhow::ensure!(!urls.is_empty(), "no --url to verify");
        Ok(Self {
            // Enough idle connections for every client at once, as the
            // clients of a real deployment keep theirs.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()?,
            urls: urls
                .into_iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            secret,
            timeout,
            t0: Instant::now(),
            log: Mutex::new(Vec::new()),
        })
    }

    /// How many URLs the deployment has.
    pub fn instances(&self) -> usize {
        self.urls.len()
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Milliseconds on the run's clock.
    pub fn now_ms(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1000.0
    }

    /// `POST` of `body` to `path` (`/v1/charges`, or a charge's refunds)
    /// under the intent's key.
    pub async fn post(&self, intent: &Intent, path: &str, body: &str, turn: Turn) -> Request {
        let request = self
            .http
            .post(format!("{}{path}", self.urls[turn.instance]))
            .header("idempotency-key", &intent.key)
            .header("content-type", "application/json")
            .body(body.to_owned());
        let record = self.send(intent.index, turn, request, self.timeout).await;
        self.record(record)
    }

    /// `GET /v1/idempotency-keys/{key}`.
    pub async fn read_key(&self, intent: usize, key: &str, turn: Turn) -> Request {
        let request = self.http.get(format!(
            "{}/v1/idempotency-keys/{key}",
            self.urls[turn.instance]
        ));
        let record = self.send(intent, turn, request, self.timeout).await;
        self.record(record)
    }

    /// A key read that is not part of the history, with time to answer: does
    /// the URL answer, and take the secret?
    pub async fn probe(&self, instance: usize, key: &str) -> Request {
        let request = self
            .http
            .get(format!("{}/v1/idempotency-keys/{key}", self.urls[instance]));
        let turn = Turn {
            purpose: Purpose::KeyRead,
            copy: 0,
            attempt: 0,
            instance,
        };
        self.send(usize::MAX, turn, request, PROBE_TIMEOUT).await
    }

    async fn send(
        &self,
        intent: usize,
        turn: Turn,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Request {
        let sent_ms = self.now_ms();
        let answer = async {
            let response = request
                .bearer_auth(&self.secret)
                .timeout(timeout)
                .send()
                .await?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.as_str().to_owned(), value)
                })
                .collect();
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        }
        .await;
        let received_ms = self.now_ms();
        let mut record = Request {
            intent,
            purpose: turn.purpose,
            copy: turn.copy,
            attempt: turn.attempt,
            instance: turn.instance,
            sent_ms,
            received_ms,
            status: None,
            error: None,
            body_sha256: None,
            body: None,
            headers: Default::default(),
        };
        match answer {
            Ok((status, headers, body)) => {
                record.status = Some(status);
                record.body_sha256 = Some(digest(&body));
                record.body = Some(String::from_utf8_lossy(&body).into_owned());
                record.headers = headers;
            }
            Err(e) if e.is_timeout() => record.error = Some(TIMEOUT.to_owned()),
            Err(e) => record.error = Some(idem_client::error_chain(&e)),
        }
        record
    }

    fn record(&self, record: Request) -> Request {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record.clone());
        record
    }

    /// Every request sent so far.
    pub fn take_log(&self) -> Vec<Request> {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The wait an answer asks for in `Retry-After` (seconds), if any.
pub fn retry_after(r: &Request) -> Option<Duration> {
    r.headers
        .get("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}
