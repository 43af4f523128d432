//! A virtual host of a test's own on the real RabbitMQ, so that the fixed
//! names of the contract (`idem.charges` and the rest) never meet another
//! test's.
//!
//! The broker is the machine's (127.0.0.1:5672 unless IDEM_TEST_AMQP_URL says
//! otherwise; `scripts/ensure-rabbitmq` starts it). Virtual hosts are made
//! with `rabbitmqctl`. A test that cannot reach the broker fails and says so.

use std::time::Duration;

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Queue tests share the broker; the one that restarts it takes this for writing.
static BROKER: RwLock<()> = RwLock::const_new(());

/// The broker's address, without a virtual host: one given in
/// IDEM_TEST_AMQP_URL (`.../%2f`, say) is dropped, as each test makes its own.
fn broker_base() -> String {
    let url = std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", rest.split('/').next().unwrap_or(rest)),
        None => url,
    }
}

fn broker_addr() -> String {
    let base = broker_base();
    let host = base.rsplit('@').next().unwrap_or("127.0.0.1:5672");
    host.trim_end_matches('/').to_owned()
}

/// Fails with a clear message when no broker answers.
async fn require_broker() {
    let addr = broker_addr();
    let reachable = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::TcpStream::connect(&addr),
    )
    .await;
    assert!(
        matches!(reachable, Ok(Ok(_))),
        "RabbitMQ is not reachable at {addr}: the queue tests need a real broker. \
         scripts/test starts the local one (scripts/ensure-rabbitmq); \
         or point IDEM_TEST_AMQP_URL at one."
    );
}

fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl (the queue tests make a virtual host per test with it)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A virtual host of this test's own on the real broker.
pub struct TestBroker {
    pub url: String,
    vhost: String,
    _shared: Option<RwLockReadGuard<'static, ()>>,
}

impl TestBroker {
    pub async fn new() -> Self {
        let guard = BROKER.read().await;
        Self::create(Some(guard)).await
    }

    /// For the test that restarts the broker: no other queue test runs meanwhile.
    pub async fn exclusive() -> (Self, RwLockWriteGuard<'static, ()>) {
        let guard = BROKER.write().await;
        (Self::create(None).await, guard)
    }

    async fn create(shared: Option<RwLockReadGuard<'static, ()>>) -> Self {
        require_broker().await;
        let vhost = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
        tokio::task::spawn_blocking({
            let vhost = vhost.clone();
            move || {
                rabbitmqctl(&["add_vhost", &vhost]);
                rabbitmqctl(&["set_permissions", "-p", &vhost, "guest", ".*", ".*", ".*"]);
            }
        })
        .await
        .expect("make a virtual host");
        Self {
            url: format!("{}/{vhost}", broker_base().trim_end_matches('/')),
            vhost,
            _shared: shared,
        }
    }

    /// Stops and starts the broker application (a real restart of RabbitMQ).
    pub async fn restart(&self, down_for: Duration) {
        tokio::task::spawn_blocking(|| rabbitmqctl(&["stop_app"]))
            .await
            .expect("stop_app");
        tokio::time::sleep(down_for).await;
        tokio::task::spawn_blocking(|| rabbitmqctl(&["start_app"]))
            .await
            .expect("start_app");
        require_broker().await;
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["delete_vhost", &self.vhost])
            .output();
    }
}
