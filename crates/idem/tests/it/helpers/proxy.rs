//! A TCP proxy in front of the database that can cut or freeze the connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use idem_testkit::db::TestDb;

/// A TCP proxy in front of PostgreSQL that a test can cut and restore, to take
/// the database away from a running server as a network failure would, or
/// freeze and thaw, as a partition that drops packets without a reset would.
pub struct DbProxy {
    pub url: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
    frozen: tokio::sync::watch::Sender<bool>,
    stop: CancellationToken,
}

impl DbProxy {
    pub async fn start(db: &TestDb) -> Self {
        Self::start_with_latency(db, Duration::ZERO).await
    }

    /// A proxy that holds each chunk from client to database for `latency`, so
    /// every statement takes at least that long: a slow or distant database.
    pub async fn start_with_latency(db: &TestDb, latency: Duration) -> Self {
        let target = reqwest::Url::parse(&db.url).expect("db url");
        let upstream = format!(
            "{}:{}",
            target.host_str().expect("host"),
            target.port().unwrap_or(5432)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let mut url = target.clone();
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(port)).expect("port");
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let (frozen, _) = tokio::sync::watch::channel(false);
        let stop = CancellationToken::new();
        let (cut2, gen2, frozen2, stop2) = (
            cut.clone(),
            generation.clone(),
            frozen.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            loop {
                let (inbound, _) = tokio::select! {
                    _ = stop2.cancelled() => return,
                    accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
                };
                if cut2.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut severed = gen2.subscribe();
                let frozen = frozen2.subscribe();
                tokio::spawn(async move {
                    // A connection opened during a freeze hangs, as a SYN
                    // into a partition does.
                    thawed(frozen.clone()).await;
                    let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (from_client, to_client) = inbound.into_split();
                    let (from_db, to_db) = outbound.into_split();
                    tokio::select! {
                        _ = pump(from_client, to_db, latency, frozen.clone()) => {}
                        _ = pump(from_db, to_client, Duration::ZERO, frozen) => {}
                        _ = severed.changed() => {}
                    }
                });
            }
        });
        Self {
            url: url.to_string(),
            cut,
            generation,
            frozen,
            stop,
        }
    }

    /// Severs every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// A partition: no byte crosses either way, and nothing is closed or
    /// reset; a new connection hangs unanswered.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Ends the partition: what was held goes through.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

/// Waits while `frozen` says so.
async fn thawed(mut frozen: tokio::sync::watch::Receiver<bool>) {
    let _ = frozen.wait_for(|f| !*f).await;
}

/// Copies one direction of a proxied connection, each chunk held `latency`,
/// and none passed on while the proxy is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: Duration,
    frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        thawed(frozen.clone()).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.cut();
        self.thaw();
        self.stop.cancel();
    }
}
