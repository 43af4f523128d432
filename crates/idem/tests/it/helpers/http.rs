//! A small client of the charge API, and raw requests for what a client library
//! would not send.

use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;

/// One HTTP answer, kept whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
    pub elapsed: Duration,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem `type` of an error answer, checking its media type.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "status {} body {:?}",
            self.status,
            self.body
        );
        let p = self.json();
        assert_eq!(p["status"], self.status, "problem status matches");
        assert!(p["title"].is_string() && p["detail"].is_string(), "{p}");
        p["type"].as_str().expect("type").to_owned()
    }
}

/// A client for the charge API.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub secret: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, secret: &str) -> Self {
        Self {
            base: base.to_owned(),
            secret: secret.to_owned(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .expect("client"),
        }
    }

    /// `POST /v1/charges` with a JSON body given as text (so tests can send any bytes).
    pub async fn charge(&self, key: &str, body: &str) -> Answer {
        self.send(self.charge_request(key, body)).await
    }

    /// `POST /v1/charges` with a `Prefer` header (`wait=N`).
    pub async fn charge_preferring(&self, key: &str, body: &str, prefer: &str) -> Answer {
        self.charge_with(key, body, &[("Prefer", prefer)]).await
    }

    /// `POST /v1/charges` with extra headers (`traceparent`, say).
    pub async fn charge_with(&self, key: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = self.charge_request(key, body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request).await
    }

    fn charge_request(&self, key: &str, body: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/v1/charges", self.base))
            .bearer_auth(&self.secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
    }

    pub async fn get_charge(&self, id: &str) -> Answer {
        self.send(
            self.http
                .get(format!("{}/v1/charges/{id}", self.base))
                .bearer_auth(&self.secret),
        )
        .await
    }

    /// `POST /v1/charges/{charge_id}/refunds` with a JSON body given as text.
    pub async fn refund(&self, charge_id: &str, key: &str, body: &str) -> Answer {
        self.refund_with(charge_id, key, body, &[]).await
    }

    /// [`Client::refund`] with extra headers.
    pub async fn refund_with(
        &self,
        charge_id: &str,
        key: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = self
            .http
            .post(format!("{}/v1/charges/{charge_id}/refunds", self.base))
            .bearer_auth(&self.secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request).await
    }

    /// `POST /v1/charges/{charge_id}/captures` with a JSON body given as text.
    pub async fn capture(&self, charge_id: &str, key: &str, body: &str) -> Answer {
        self.post_keyed(&format!("/v1/charges/{charge_id}/captures"), key, body)
            .await
    }

    /// `POST /v1/charges/{charge_id}/void` with an empty body.
    pub async fn void(&self, charge_id: &str, key: &str) -> Answer {
        self.post_keyed(&format!("/v1/charges/{charge_id}/void"), key, "")
            .await
    }

    /// `POST` a JSON body given as text to a path of the API under a key.
    pub async fn post_keyed(&self, path: &str, key: &str, body: &str) -> Answer {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .bearer_auth(&self.secret)
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(body.to_owned()),
        )
        .await
    }

    /// Retries a refund on `409` and `503` until it is final.
    pub async fn refund_until_final(&self, charge_id: &str, key: &str, body: &str) -> Answer {
        let started = Instant::now();
        loop {
            let a = self.refund(charge_id, key, body).await;
            if a.status != 409 && a.status != 503 {
                return a;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "never final: {a:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET` a path of the API as this merchant.
    pub async fn get(&self, path: &str) -> Answer {
        self.send(
            self.http
                .get(format!("{}{path}", self.base))
                .bearer_auth(&self.secret),
        )
        .await
    }

    /// Any request, built by the caller.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let started = Instant::now();
        let r = request.send().await.expect("request");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.bytes().await.expect("body");
        Answer {
            status,
            headers,
            body,
            elapsed: started.elapsed(),
        }
    }

    pub fn raw(&self) -> &reqwest::Client {
        &self.http
    }

    /// Retries a charge on `409` and `503` until it is final, as a good client would.
    pub async fn charge_until_final(&self, key: &str, body: &str) -> Answer {
        let started = Instant::now();
        loop {
            let a = self.charge(key, body).await;
            if a.status != 409 && a.status != 503 {
                return a;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "never final: {a:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An HTTP/1.1 answer read off a raw socket.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    /// The head, lower-cased, for `contains` checks on header lines.
    pub head: String,
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The value of header `name` (lower case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n.trim() == name).then(|| v.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// Writes `request` as is to `addr` and reads one answer, for requests no
/// well-behaved client would send (bad framing, stalls). The request should
/// say `Connection: close` so the server ends the answer by closing.
pub async fn raw_request(addr: &str, request: &[u8], within: Duration) -> RawAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut bytes = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut bytes))
        .await
        .expect("the server answers and closes in time")
        .expect("read");
    let text = String::from_utf8_lossy(&bytes);
    let (head, _) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {text:?}"));
    let head_len = head.len() + 4;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    RawAnswer {
        status,
        head: head.to_ascii_lowercase(),
        body: bytes[head_len..].to_vec(),
    }
}

/// `host:port` of a base URL such as `http://127.0.0.1:8080`.
pub fn authority(url: &str) -> &str {
    url.trim_start_matches("http://")
}
