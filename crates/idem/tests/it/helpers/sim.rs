//! The acquirer simulator, in process over loopback, and the faults tests give
//! it.

use idem_lab::sim::{self, Faults, Ledger};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The acquirer simulator, in process, over loopback.
pub struct TestSim {
    pub url: String,
    http: reqwest::Client,
    stop: CancellationToken,
}

impl TestSim {
    pub async fn start(faults: Faults) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind sim");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = CancellationToken::new();
        tokio::spawn(sim::serve(listener, faults, None, stop.clone()));
        Self {
            url,
            http: reqwest::Client::new(),
            stop,
        }
    }

    pub async fn set_faults(&self, faults: Faults) {
        let r = self
            .http
            .put(format!("{}/_sim/faults", self.url))
            .json(&faults)
            .send()
            .await
            .expect("set faults");
        assert!(r.status().is_success(), "set faults: {}", r.status());
    }

    pub async fn ledger(&self) -> Ledger {
        self.http
            .get(format!("{}/_sim/ledger", self.url))
            .send()
            .await
            .expect("ledger")
            .json()
            .await
            .expect("ledger json")
    }
}

impl Drop for TestSim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Faults that make every capture call suffer `fault`.
pub fn failing(fault: idem_lab::sim::Fault) -> Faults {
    Faults {
        fault,
        ..Faults::default()
    }
}

/// Faults with only latency set.
pub fn latency(ms: u64) -> Faults {
    Faults {
        latency_ms: ms,
        ..Faults::default()
    }
}
