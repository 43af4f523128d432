//! TLS to everything idem talks to: PostgreSQL with `sslmode` in the URL
//! (rustls, no OpenSSL), and the acquirer over HTTPS with a private CA: a
//! throwaway CA and certificate made here, the simulator serving HTTPS on
//! loopback with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_core::store::Backend;
use idem_lab::sim::{self, Faults, Ledger};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio_util::sync::CancellationToken;

use crate::helpers::*;

/// A private CA and a server certificate it issued for `localhost` and
/// `127.0.0.1`, as PEM files in a scratch directory (removed on drop).
struct PrivatePki {
    dir: PathBuf,
}

impl PrivatePki {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("idem_pki_{}", new_key()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "idem test CA");
        let ca_key = KeyPair::generate().expect("ca key");
        let ca = ca_params.self_signed(&ca_key).expect("ca");
        let leaf_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("leaf params");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = leaf_params
            .signed_by(&leaf_key, &ca, &ca_key)
            .expect("leaf");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("ca.pem");
        std::fs::write(dir.join("server.pem"), leaf.pem()).expect("server.pem");
        std::fs::write(dir.join("server.key"), leaf_key.serialize_pem()).expect("server.key");
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for PrivatePki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The acquirer simulator serving HTTPS on loopback with the PKI's
/// certificate, as `idem-lab acquirer-sim --tls-cert --tls-key` does; its URL,
/// and the guard that stops it.
async fn https_simulator(pki: &PrivatePki) -> (tokio_util::sync::DropGuard, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let tls = idem::http::Tls::from_pem_files(
        Path::new(&pki.path("server.pem")),
        Path::new(&pki.path("server.key")),
    )
    .expect("the PKI's certificate");
    let stop = CancellationToken::new();
    tokio::spawn(sim::serve(
        listener,
        Faults::default(),
        Some(tls),
        stop.clone(),
    ));
    (stop.drop_guard(), format!("https://localhost:{port}"))
}

/// The simulator's ledger, read over HTTPS trusting the private CA.
async fn ledger(url: &str, ca: &Path) -> Ledger {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).expect("ca")).expect("ca pem");
    reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .expect("client")
        .get(format!("{url}/_sim/ledger"))
        .send()
        .await
        .expect("ledger over https")
        .json()
        .await
        .expect("ledger json")
}

/// An acquirer on HTTPS with a certificate from a private CA: with
/// `--acquirer-ca`, idem charges through it, once, and replays.
#[tokio::test]
async fn an_https_acquirer_with_a_private_ca_is_charged_once() {
    let db = TestDb::new().await;
    let pki = PrivatePki::new();
    let (_sim, sim_url) = https_simulator(&pki).await;
    let ca = pki.path("ca.pem");
    let server =
        ServeProcess::start_against(&db, &sim_url, &["--acquirer-ca", &ca, "--no-workers"], &[])
            .await;
    let c = Client::new(&server.url, &db.merchant("loja").await);
    let key = new_key();
    let first = c.charge(&key, &body(1, 25_000)).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let replay = c.charge(&key, &body(1, 25_000)).await;
    assert_eq!((replay.status, replay.replayed()), (201, true));
    let ledger = ledger(&sim_url, Path::new(&ca)).await;
    assert_eq!(ledger.captures.len(), 1);
    assert_eq!(
        ledger.captures[0].reference,
        first.json()["acquirer_reference"]
    );
}

/// Without the private CA, the acquirer's certificate does not verify: the
/// handshake fails before any request, so the outcome is unknown (`503`),
/// never a final failure, and a retry once the CA is trusted captures it.
#[tokio::test]
async fn an_acquirer_certificate_that_does_not_verify_is_503_and_nothing_final() {
    let db = TestDb::new().await;
    let pki = PrivatePki::new();
    let (_sim, sim_url) = https_simulator(&pki).await;
    let secret = db.merchant("loja").await;
    let key = new_key();
    {
        let untrusting = ServeProcess::start_against(&db, &sim_url, &["--no-workers"], &[]).await;
        let c = Client::new(&untrusting.url, &secret);
        let refused = c.charge(&key, &body(1, 100)).await;
        assert_eq!(refused.status, 503, "{:?}", refused.body);
        assert_eq!(refused.problem_type(), "urn:idem:problem:outcome-unknown");
    }
    let (status,): (String,) = sqlx::query_as("select status from charges")
        .fetch_one(&db.pool)
        .await
        .expect("charge");
    assert_eq!(status, "processing", "nothing stored as final");
    let ca = pki.path("ca.pem");
    assert!(
        ledger(&sim_url, Path::new(&ca)).await.captures.is_empty(),
        "no request reached the acquirer"
    );

    let trusting =
        ServeProcess::start_against(&db, &sim_url, &["--acquirer-ca", &ca, "--no-workers"], &[])
            .await;
    let c = Client::new(&trusting.url, &secret);
    let settled = c.charge(&key, &body(1, 100)).await;
    assert_eq!(settled.status, 201, "{:?}", settled.body);
    assert_eq!(ledger(&sim_url, Path::new(&ca)).await.captures.len(), 1);
}

/// Whether the test server speaks TLS at all (`scripts/ensure-postgres`
/// starts its throwaway cluster with `ssl=on`; Debian's cluster has it on).
async fn server_has_ssl(db: &TestDb) -> bool {
    let (ssl,): (String,) = sqlx::query_as("select current_setting('ssl')")
        .fetch_one(&db.pool)
        .await
        .expect("show ssl");
    ssl == "on"
}

/// The server's certificate file, to trust it as a private CA (PostgreSQL's
/// own setting; the throwaway cluster's and Debian's are both self-signed,
/// for `localhost`).
async fn server_certificate(db: &TestDb) -> String {
    let (path,): (String,) = sqlx::query_as("select current_setting('ssl_cert_file')")
        .fetch_one(&db.pool)
        .await
        .expect("ssl_cert_file");
    let data_dir: (String,) = sqlx::query_as("select current_setting('data_directory')")
        .fetch_one(&db.pool)
        .await
        .expect("data_directory");
    if path.starts_with('/') {
        path
    } else {
        format!("{}/{path}", data_dir.0)
    }
}

/// `sslmode=verify-full` with the server's CA in `sslrootcert`: idem checks
/// the certificate and the host name, every connection `idem serve` opens is
/// encrypted (PostgreSQL's own `pg_stat_ssl` says so), and charges work.
#[tokio::test]
async fn postgres_over_verified_tls() {
    if !runs_on(Backend::Postgres, "TLS is PostgreSQL's; SQLite is a file") {
        return;
    }
    let db = TestDb::new().await;
    assert!(
        server_has_ssl(&db).await,
        "the test server must have ssl=on (scripts/ensure-postgres sets it up)"
    );
    let sim = TestSim::start(Default::default()).await;
    let secret = db.merchant("loja").await;
    let tls_url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        db.url.replace("127.0.0.1", "localhost"),
        server_certificate(&db).await
    );
    let server = ServeProcess::start_env(&db, &sim, &[], &[("DATABASE_URL", &tls_url)]).await;
    let c = Client::new(&server.url, &secret);
    let first = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(first.status, 201, "{:?}", first.body);

    let (connections, encrypted): (i64, i64) = sqlx::query_as(
        "select count(*), count(*) filter (where s.ssl)
           from pg_stat_activity a join pg_stat_ssl s on s.pid = a.pid
          where a.datname = current_database() and a.application_name = 'idem'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("pg_stat_ssl");
    assert!(connections > 0, "idem holds connections");
    assert_eq!(encrypted, connections, "every idem connection is TLS");
}

/// Without the server's CA among the trusted roots (and under a name its
/// certificate does not carry), `verify-full` refuses the server: idem says
/// why and does not fall back to talking in the clear.
#[tokio::test]
async fn postgres_verify_full_refuses_a_certificate_it_cannot_verify() {
    if !runs_on(Backend::Postgres, "TLS is PostgreSQL's; SQLite is a file") {
        return;
    }
    let db = TestDb::new().await;
    assert!(
        server_has_ssl(&db).await,
        "the test server must have ssl=on"
    );
    let strict = format!("{}?sslmode=verify-full", db.url);
    let (status, _, stderr) = run_idem_env(&db, &["migrate"], &[("DATABASE_URL", &strict)]).await;
    assert!(!status.success(), "an unverified server is refused");
    assert!(stderr.contains("certificate"), "says why: {stderr}");
}

/// A TLS endpoint in front of the test broker, as a managed RabbitMQ offers
/// one: terminates TLS with the PKI's certificate and relays to the plain
/// listener. Returns its port; it stops with `stop`.
async fn tls_in_front_of(pki: &PrivatePki, upstream: String, stop: CancellationToken) -> u16 {
    let tls = idem::http::Tls::from_pem_files(
        Path::new(&pki.path("server.pem")),
        Path::new(&pki.path("server.key")),
    )
    .expect("tls");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let (inbound, _) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
            };
            let (acceptor, upstream, stop) =
                (tls.acceptor().clone(), upstream.clone(), stop.clone());
            tokio::spawn(async move {
                let Ok(mut inbound) = acceptor.accept(inbound).await else {
                    return;
                };
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    port
}

/// `amqps://`: `idem consume` reaches the broker through a TLS endpoint whose
/// certificate comes from a private CA (trusted through `SSL_CERT_FILE`, the
/// standard way to extend the system's roots), takes a command and publishes
/// its result; with the system's roots alone it does not connect at all.
#[tokio::test]
async fn amqps_reaches_a_broker_behind_tls_and_refuses_an_unverified_one() {
    use crate::broker::{Amqp, Cmd, TestBroker};
    use idem::queue::RESULTS_EXCHANGE;

    let db = TestDb::new().await;
    let sim = TestSim::start(Default::default()).await;
    db.merchant("loja").await;
    let broker = TestBroker::new().await;
    let plain = reqwest::Url::parse(&broker.url).expect("amqp url");
    let upstream = format!(
        "{}:{}",
        plain.host_str().expect("host"),
        plain.port().unwrap_or(5672)
    );
    let pki = PrivatePki::new();
    let stop = CancellationToken::new();
    let port = tls_in_front_of(&pki, upstream, stop.clone()).await;
    let mut secure = plain.clone();
    secure.set_scheme("amqps").expect("scheme");
    secure.set_host(Some("localhost")).expect("host");
    secure.set_port(Some(port)).expect("port");
    let secure = secure.to_string();

    let consumer_args = |url: &str| {
        vec![
            "consume".to_owned(),
            "--amqp-url".to_owned(),
            url.to_owned(),
            "--acquirer-url".to_owned(),
            sim.url.clone(),
            "--outbox-poll".to_owned(),
            "100ms".to_owned(),
        ]
    };

    // With the system's roots alone, the broker's certificate does not verify.
    let mut untrusting = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(consumer_args(&secure))
        .env("DATABASE_URL", &db.url)
        .env("IDEM_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn idem consume");
    tokio::time::sleep(Duration::from_secs(3)).await;
    untrusting.start_kill().expect("kill");
    let refused = untrusting.wait_with_output().await.expect("output");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("certificate"),
        "refused for its certificate: {said}"
    );

    let ca = pki.path("ca.pem");
    let args = consumer_args(&secure);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _consumer = IdemProcess::spawn(&db, &args, &[("SSL_CERT_FILE", &ca)]);
    let amqp = Amqp::connect(&broker).await;
    amqp.wait_for_consumers(1).await;
    let results = amqp
        .queue("tls-results", Some((RESULTS_EXCHANGE, "loja")))
        .await;
    let key = new_key();
    amqp.publish(&Cmd::new(&key, "loja", &body(1, 100))).await;
    let result = amqp
        .take(&results, 1, Duration::from_secs(20))
        .await
        .remove(0);
    assert_eq!(result.status(), 201, "{:?}", result.json());
    assert_eq!(sim.ledger().await.captures.len(), 1);
    stop.cancel();
}
