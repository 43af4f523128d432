//! The acquirer simulator on loopback, for the tests of idem's acquirer
//! client against it (refunds, two-step payments).

use axum::http::StatusCode;
use idem_lab::sim::{self, Fault, Faults};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A simulator on loopback, stopped when dropped.
pub struct Sim {
    pub url: String,
    stop: CancellationToken,
    http: reqwest::Client,
}

impl Sim {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = CancellationToken::new();
        tokio::spawn(sim::serve(listener, Faults::default(), None, stop.clone()));
        Self {
            url,
            stop,
            http: reqwest::Client::new(),
        }
    }

    pub async fn set(&self, faults: &Faults) {
        let r = self
            .http
            .put(format!("{}/_sim/faults", self.url))
            .json(faults)
            .send()
            .await
            .expect("faults");
        assert!(r.status().is_success());
    }

    /// The next call that POSTs suffers `fault`, the ones after it none.
    pub async fn once(&self, fault: Fault) {
        self.set(&Faults {
            fault,
            fault_count: Some(1),
            ..Faults::default()
        })
        .await;
    }

    pub async fn ledger(&self) -> sim::Ledger {
        let r = self
            .http
            .get(format!("{}/_sim/ledger", self.url))
            .send()
            .await;
        r.expect("ledger").json().await.expect("ledger json")
    }

    /// The status of a POST of `body` to `path`, sent raw, with its
    /// reference as the key.
    pub async fn raw_post(
        &self,
        path: &str,
        reference: &str,
        body: &impl serde::Serialize,
    ) -> StatusCode {
        self.http
            .post(format!("{}{path}", self.url))
            .header("Idempotency-Key", reference)
            .json(body)
            .send()
            .await
            .expect("post")
            .status()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
