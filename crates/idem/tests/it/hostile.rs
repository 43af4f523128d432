//! Hostile HTTP clients against a real `idem serve`: a client that stalls in
//! its request head or idles on a kept-alive connection is cut off; more
//! requests than the instance works at once are shed with `503` at once, and
//! the instance recovers; `/metrics` can leave the public port.

use std::time::{Duration, Instant};

use idem_lab::sim::Faults;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

const PROBLEM: &str = "urn:idem:problem:";

/// The head deadline the stall test gives the server.
const HEAD_DEADLINE: Duration = Duration::from_secs(1);

/// Reads (and drops) whatever the server sends until it closes the
/// connection; how long that took, or `None` if it was still open at `limit`.
async fn time_to_close(
    mut stream: TcpStream,
    started: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Connects, writes `bytes` and measures until the server closes.
async fn stall(addr: String, bytes: &'static [u8], limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    time_to_close(stream, started, limit).await
}

#[tokio::test]
async fn a_client_that_stalls_in_its_head_or_idles_is_cut_off_at_the_head_deadline() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let deadline = format!("{}ms", HEAD_DEADLINE.as_millis());
    let server =
        ServeProcess::start_env(&db, &sim, &[], &[("IDEM_HEADER_READ_TIMEOUT", &deadline)]).await;
    let addr = authority(&server.url).to_owned();
    // Generous either way on a noisy machine, yet far below "for ever".
    let (low, high) = (HEAD_DEADLINE.mul_f64(0.7), HEAD_DEADLINE * 3);

    let (half_head, silent, idle) = tokio::join!(
        stall(
            addr.clone(),
            b"POST /v1/charges HTTP/1.1\r\nHost: idem\r\nContent-Ty",
            high
        ),
        stall(addr.clone(), b"", high),
        // A whole request answered, then nothing: the kept-alive connection idles.
        stall(
            addr.clone(),
            b"GET /healthz HTTP/1.1\r\nHost: idem\r\n\r\n",
            high
        ),
    );
    for (what, closed) in [
        ("half a head", half_head),
        ("nothing", silent),
        ("idle", idle),
    ] {
        let closed = closed.unwrap_or_else(|| panic!("{what}: still open after {high:?}"));
        assert!(
            closed >= low,
            "{what}: closed after {closed:?}, before the deadline"
        );
        eprintln!("{what}: closed after {closed:?}");
    }

    // A client that keeps sending its head a byte at a time is cut off too:
    // the deadline is for the whole head, not between bytes.
    let started = Instant::now();
    let mut dribble = TcpStream::connect(&addr).await.expect("connect");
    let head =
        b"GET /healthz HTTP/1.1\r\nHost: idem\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut cut_off = false;
    for byte in head {
        if dribble.write_all(&[*byte]).await.is_err() {
            cut_off = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let closed = if cut_off {
        Some(started.elapsed())
    } else {
        time_to_close(dribble, started, high * 2).await
    };
    let closed = closed.expect("a dribbled head is cut off");
    assert!(closed < high * 2, "dribble closed after {closed:?}");

    // The server still serves well-behaved clients.
    let c = Client::new(&server.url, &db.merchant("loja").await);
    assert_eq!(c.charge(&new_key(), &body(1, 100)).await.status, 201);
}

#[tokio::test]
async fn more_requests_than_the_cap_are_shed_at_once_with_503_and_the_server_recovers() {
    const CAP: usize = 4;
    const SENT: usize = 16;
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(1_000)).await;
    let cap = CAP.to_string();
    let server = ServeProcess::start_env(&db, &sim, &[], &[("IDEM_MAX_IN_FLIGHT", &cap)]).await;
    let c = Client::new(&server.url, &db.merchant("loja").await);

    let keys: Vec<String> = (0..SENT).map(|_| new_key()).collect();
    let sent: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (c, key) = (c.clone(), key.clone());
            tokio::spawn(async move { c.charge(&key, &body(i as i64 + 1, 100)).await })
        })
        .collect();
    // While the cap is full, operations still answer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health = c.send(c.raw().get(format!("{}/healthz", server.url))).await;
    assert_eq!(health.status, 200, "health checks are not shed");
    // The cap is the instance's, not each route's: a GET is shed too.
    let read = c.get_charge("ch_none").await;
    assert_eq!(
        read.status, 503,
        "one cap for all /v1 routes: {:?}",
        read.body
    );
    assert_eq!(read.problem_type(), format!("{PROBLEM}overloaded"));

    let mut answers = Vec::new();
    for task in sent {
        answers.push(
            tokio::time::timeout(Duration::from_secs(15), task)
                .await
                .expect("no request hangs")
                .expect("join"),
        );
    }
    let captured = answers.iter().filter(|a| a.status == 201).count();
    let shed: Vec<&Answer> = answers.iter().filter(|a| a.status == 503).collect();
    assert_eq!(captured + shed.len(), SENT, "only 201 or 503: {answers:?}");
    assert!(captured >= CAP, "the cap's worth went through: {captured}");
    assert!(shed.len() >= SENT / 2, "the rest were shed: {}", shed.len());
    for a in &shed {
        assert_eq!(a.problem_type(), format!("{PROBLEM}overloaded"));
        assert_eq!(a.header("retry-after"), Some("1"));
        assert!(
            a.elapsed < Duration::from_millis(700),
            "shed at once, not after waiting: {:?}",
            a.elapsed
        );
    }
    let shed_stored = db.count("charges").await;
    assert_eq!(
        shed_stored as usize, captured,
        "a shed request stores nothing"
    );

    // Recovery: every intent, retried with its key, is charged exactly once.
    for (i, key) in keys.iter().enumerate() {
        let a = c.charge_until_final(key, &body(i as i64 + 1, 100)).await;
        assert_eq!(a.status, 201, "{:?}", a.body);
    }
    assert_eq!(sim.ledger().await.captures.len(), SENT);
}

#[tokio::test]
async fn metrics_listen_moves_metrics_off_the_public_port() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let ops = format!("127.0.0.1:{}", free_port());
    let server = ServeProcess::start_env(&db, &sim, &[], &[("IDEM_METRICS_LISTEN", &ops)]).await;
    let c = Client::new(&server.url, &db.merchant("loja").await);
    assert_eq!(c.charge(&new_key(), &body(1, 100)).await.status, 201);

    let public = c.send(c.raw().get(format!("{}/metrics", server.url))).await;
    assert_eq!(public.status, 404, "no /metrics on the public port");
    assert_eq!(public.problem_type(), format!("{PROBLEM}not-found"));
    assert_eq!(
        c.send(c.raw().get(format!("{}/healthz", server.url)))
            .await
            .status,
        200
    );

    let m = c.send(c.raw().get(format!("http://{ops}/metrics"))).await;
    assert_eq!(m.status, 200);
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains(r#"idem_charge_outcomes_total{outcome="captured"}"#),
        "{text}"
    );
    for path in ["/healthz", "/readyz"] {
        let a = c.send(c.raw().get(format!("http://{ops}{path}"))).await;
        assert_eq!(a.status, 200, "{path}");
    }
}

#[tokio::test]
async fn a_flood_of_made_up_secrets_does_not_starve_real_charges_of_the_pool() {
    let _turn = timing_sensitive().await;
    if !runs_on(
        idem_core::store::Backend::Postgres,
        "the flood is made to hurt through a slow link to PostgreSQL (a TCP proxy)",
    ) {
        return;
    }
    /// Concurrent clients sending made-up secrets, as fast as they are answered.
    const FLOODERS: usize = 50;
    let db = TestDb::new().await;
    // Every statement takes 200 ms: a pool of 4 looks up 20 secrets a second,
    // so if nothing held them back, 50 flooders would keep a queue for the
    // pool as long as its 3 s wait, and each of a real charge's statements
    // would wait that long in it (before the limit: 6 s a charge, not 0.4 s).
    let proxy = DbProxy::start_with_latency(&db, Duration::from_millis(200)).await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let server = ServeProcess::start_env(
        &db,
        &sim,
        &["--db-max-connections", "4", "--no-workers"],
        // In the clear: this proxy delays each chunk the client writes, one
        // after another, and over TLS a statement leaves in several chunks,
        // which the proxy would stretch into a second (a real network carries
        // them in one round trip). TLS has tests of its own (tls.rs).
        &[("DATABASE_URL", &format!("{}?sslmode=disable", proxy.url))],
    )
    .await;
    let real = Client::new(&server.url, &secret);
    // The merchant is known to this instance before the flood starts.
    assert_eq!(real.charge(&new_key(), &body(1, 100)).await.status, 201);

    let stop = tokio_util::sync::CancellationToken::new();
    let flood: Vec<_> = (0..FLOODERS)
        .map(|_| {
            let (url, stop) = (server.url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.is_cancelled() {
                    let bad = Client::new(&url, &format!("sk_{}", new_key()));
                    let (key, order) = (new_key(), body(9, 900));
                    let a = tokio::select! {
                        a = bad.charge(&key, &order) => a,
                        _ = stop.cancelled() => break,
                    };
                    if a.status == 503 {
                        // Shed: a flooder is not polite, but the test's CPU is shared.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    statuses.push(a.status);
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut real_answers = Vec::new();
    for order in 2..8 {
        let a = real.charge(&new_key(), &body(order, 100)).await;
        real_answers.push((a.status, a.elapsed));
    }
    stop.cancel();
    let mut flood_statuses = Vec::new();
    for f in flood {
        flood_statuses.extend(f.await.expect("join"));
    }
    let count = |s: u16| flood_statuses.iter().filter(|&&x| x == s).count();
    eprintln!(
        "flood: {} requests, {} x 401, {} x 503; real: {real_answers:?}",
        flood_statuses.len(),
        count(401),
        count(503)
    );
    assert!(
        count(401) > 0,
        "the flood's secrets were looked up and refused"
    );
    assert!(
        flood_statuses.iter().all(|s| *s == 401 || *s == 503),
        "a made-up secret is never let in"
    );
    for (status, elapsed) in &real_answers {
        assert_eq!(
            *status, 201,
            "a real charge during the flood: {real_answers:?}"
        );
        assert!(*elapsed < Duration::from_secs(3), "{real_answers:?}");
    }
    assert_eq!(db.count("charges").await, 7);
}
