//! Losing a machine: a real Patroni cluster (etcd, two PostgreSQL members with
//! synchronous replication, HAProxy in front; `scripts/ha`) losing its leader
//! under three `idem serve` processes and a storm of retrying clients; and a
//! real three-node RabbitMQ cluster (`scripts/rabbit-cluster`) losing the node
//! that leads `idem.charges` while commands flow.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem::queue::{COMMANDS_QUEUE, DEAD_LETTER_QUEUE, RESULTS_EXCHANGE};
use idem_core::store::Backend;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::broker::{Amqp, Cmd};
use crate::helpers::*;

/// Intents in the storm, and the clients sending them at once.
const INTENTS: usize = 300;
const CLIENTS: usize = 24;
/// The leader dies once this many intents are final.
const KILL_AFTER: usize = 80;
/// The acquirer timeout given to the servers; a request may take it plus the
/// request timeout's margin (5 s) before idem answers by itself.
const ACQUIRER_TIMEOUT: &str = "2s";
const LONGEST_ANSWER: Duration = Duration::from_secs(8);

/// A cluster brought up by `scripts/ha` in a scratch directory, taken down
/// (every process stopped, the directory removed) when dropped.
struct HaCluster {
    dir: PathBuf,
    url: String,
}

fn script() -> PathBuf {
    scripts("ha")
}

fn scripts(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// The ports `scripts/ha up DIR PORT` binds, as offsets from PORT: etcd's
/// two, two PostgreSQL members, their two REST APIs, HAProxy.
const HA_PORTS: [u16; 7] = [0, 1, 2, 3, 4, 5, 6];

/// The ports `scripts/rabbit-cluster up DIR PORT` binds, as offsets from
/// PORT: three AMQP listeners, and three Erlang distribution ports.
const RABBIT_PORTS: [u16; 6] = [0, 1, 2, 10, 11, 12];

/// A base port whose every `offset` is free now. Drawn below the kernel's
/// ephemeral range (`ip_local_port_range`, 32768 and up by default), so that
/// no outgoing connection, of this test or of another running beside it, is
/// given one of them between this check and the cluster's own bind: a node
/// that finds its port taken does not start.
fn free_port_block(offsets: &[u16]) -> u16 {
    const LOWEST: u16 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let top = offsets.iter().max().copied().unwrap_or(0);
    let span = ephemeral.saturating_sub(LOWEST + top).max(1);
    for _ in 0..50 {
        let base = LOWEST + rand::random::<u16>() % span;
        if offsets
            .iter()
            .all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
    panic!("no block of free ports for offsets {offsets:?}");
}

impl HaCluster {
    fn up() -> Self {
        let dir = std::env::temp_dir().join(format!("idem-ha-{}", uuid::Uuid::new_v4()));
        let out = Command::new(script())
            .arg("up")
            .arg(&dir)
            .arg(free_port_block(&HA_PORTS).to_string())
            .output()
            .expect("run scripts/ha up");
        let cluster = Self {
            url: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            dir,
        };
        assert!(
            out.status.success(),
            "scripts/ha up failed (it needs root, and installs patroni, etcd and haproxy \
             if missing: scripts/ha install): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    /// The cluster's database for idem (created by `idem migrate`).
    fn database_url(&self) -> String {
        let server = self
            .url
            .strip_suffix("/postgres")
            .expect("the URL of a database");
        format!("{server}/idem")
    }

    fn kill_leader(&self) {
        let out = Command::new(script())
            .arg("leader-pid")
            .arg(&self.dir)
            .output()
            .expect("run scripts/ha leader-pid");
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success() && !pid.is_empty(), "no leader pid");
        let killed = Command::new("kill")
            .args(["-9", &pid])
            .status()
            .expect("kill");
        assert!(killed.success(), "kill -9 {pid}");
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("down").arg(&self.dir).status();
    }
}

/// What the storm saw: each intent's first final answer, and every answer.
#[derive(Default)]
struct Storm {
    finals: HashMap<usize, Answer>,
    /// Answers by status, all attempts.
    statuses: HashMap<u16, usize>,
    /// Problems: a 500, a 503 without `Retry-After`, an answer past the bound.
    problems: Vec<String>,
    /// When each attempt that ended in a 201 was sent.
    captured_sent_at: Vec<Instant>,
}

#[tokio::test]
async fn a_leader_killed_mid_storm_loses_no_answered_outcome_and_charges_no_intent_twice() {
    if !runs_on(Backend::Postgres, "the cluster is PostgreSQL's") {
        return;
    }
    let _turn = timing_sensitive().await;
    let cluster = HaCluster::up();
    let db_url = cluster.database_url();
    let (migrated, _, err) = run_idem_on(&db_url, &["migrate"], &[]).await;
    assert!(migrated.success(), "migrate: {err}");
    let (created, secret, err) = run_idem_on(&db_url, &["merchant", "create", "loja"], &[]).await;
    assert!(created.success(), "tenant create: {err}");
    let secret = secret.trim().to_owned();

    let sim = TestSim::start(latency(20)).await;
    let flags = ["--acquirer-timeout", ACQUIRER_TIMEOUT, "--lease", "3s"];
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(ServeProcess::start_on(&db_url, &sim.url, &flags, &[]).await);
    }
    let clients: Vec<Client> = servers
        .iter()
        .map(|s| Client::new(&s.url, &secret))
        .collect();

    let storm = Arc::new(Mutex::new(Storm::default()));
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..CLIENTS {
        let (clients, storm, next, done) =
            (clients.clone(), storm.clone(), next.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let intent = next.fetch_add(1, Ordering::SeqCst);
                if intent >= INTENTS {
                    return;
                }
                let key = format!("ha-{intent}");
                let body = body(intent as i64 + 1, 1000 + intent as i64);
                let mut attempt = 0usize;
                loop {
                    // Retries go round the instances, as behind a load balancer.
                    let client = &clients[(w + attempt) % clients.len()];
                    attempt += 1;
                    let sent = Instant::now();
                    let a = client.charge(&key, &body).await;
                    let finished = {
                        let mut s = storm.lock().unwrap();
                        *s.statuses.entry(a.status).or_default() += 1;
                        if a.elapsed > LONGEST_ANSWER {
                            s.problems
                                .push(format!("{key}: answered after {:?}", a.elapsed));
                        }
                        match a.status {
                            201 | 402 => {
                                if a.status == 201 {
                                    s.captured_sent_at.push(sent);
                                }
                                s.finals.insert(intent, a);
                                done.fetch_add(1, Ordering::SeqCst);
                                true
                            }
                            409 | 503 => {
                                if a.status == 503 && a.header("retry-after").is_none() {
                                    s.problems.push(format!("{key}: 503 without Retry-After"));
                                }
                                false
                            }
                            other => {
                                s.problems.push(format!(
                                    "{key}: {other} {:?}",
                                    String::from_utf8_lossy(&a.body)
                                ));
                                false
                            }
                        }
                    };
                    if finished {
                        break;
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(120),
                        "{key} never final"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }

    while done.load(Ordering::SeqCst) < KILL_AFTER {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let final_before_kill: Vec<(usize, Answer)> = {
        let s = storm.lock().unwrap();
        s.finals.iter().map(|(i, a)| (*i, a.clone())).collect()
    };
    let killed_at = Instant::now();
    cluster.kill_leader();
    for w in workers {
        w.await.expect("a client");
    }
    let storm = Arc::into_inner(storm).unwrap().into_inner().unwrap();

    let first_201_after = storm
        .captured_sent_at
        .iter()
        .filter(|t| **t > killed_at)
        .min()
        .map(|t| *t - killed_at);
    eprintln!(
        "ha: {INTENTS} intents, {} final before the kill; answers by status {:?}; \
         first 201 sent after the kill was sent {:?} after it; storm took {:?}",
        final_before_kill.len(),
        storm.statuses,
        first_201_after,
        started.elapsed()
    );
    assert!(storm.problems.is_empty(), "{:#?}", storm.problems);
    assert_eq!(storm.finals.len(), INTENTS);
    assert!(
        storm.statuses.get(&503).copied().unwrap_or(0) > 0,
        "the kill was felt: some requests met no leader"
    );

    let answered_201 = storm.finals.values().filter(|a| a.status == 201).count();
    assert_one_capture_per_intent(&sim.ledger().await, answered_201);

    // Every outcome idem answered, before the failover or after, is stored
    // on the leader that survived...
    let db = sqlx::PgPool::connect(&db_url).await.expect("the cluster");
    let unsettled: Vec<(String, String)> = sqlx::query_as(
        "select idempotency_key, state from idempotency_keys where state <> 'completed'",
    )
    .fetch_all(&db)
    .await
    .expect("the key records");
    assert!(
        unsettled.is_empty(),
        "answered but not stored: {unsettled:?}"
    );
    db.close().await;
    // ...and is still its answer: the replay is byte-identical. Replayed as
    // a client must, following a `409`'s `Retry-After`: an instance that saw
    // the key in flight within the last second (a retry that met another
    // instance's attempt) answers from that memory until it ends
    // (idempotency/memo.rs), and the storm's last answers are that recent.
    for (intent, first) in &storm.finals {
        let key = format!("ha-{intent}");
        let body = body(*intent as i64 + 1, 1000 + *intent as i64);
        let asked = Instant::now();
        let replay = loop {
            let replay = clients[0].charge(&key, &body).await;
            let wait = replay
                .header("retry-after")
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|_| replay.status == 409 && asked.elapsed() < Duration::from_secs(10));
            match wait {
                Some(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
                None => break replay,
            }
        };
        assert!(replay.replayed(), "{key}: {replay:?}");
        assert_eq!(
            (replay.status, &replay.body),
            (first.status, &first.body),
            "{key}"
        );
    }
    assert!(final_before_kill.len() >= KILL_AFTER);
    drop(servers);
}

/// Three RabbitMQ nodes, clustered, brought up by `scripts/rabbit-cluster` in
/// a scratch directory and taken down when dropped.
struct RabbitCluster {
    dir: PathBuf,
    urls: Vec<String>,
}

impl RabbitCluster {
    fn up() -> Self {
        let dir = std::env::temp_dir().join(format!("idem-rabbit-{}", uuid::Uuid::new_v4()));
        let out = Command::new(scripts("rabbit-cluster"))
            .arg("up")
            .arg(&dir)
            .arg(free_port_block(&RABBIT_PORTS).to_string())
            .output()
            .expect("run scripts/rabbit-cluster up");
        let cluster = Self {
            urls: String::from_utf8_lossy(&out.stdout)
                .trim()
                .split(',')
                .map(str::to_owned)
                .collect(),
            dir,
        };
        assert!(
            out.status.success() && cluster.urls.len() == 3,
            "scripts/rabbit-cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    /// The node (0, 1 or 2) that leads a quorum queue.
    fn leader(&self, queue: &str) -> usize {
        let out = Command::new(scripts("rabbit-cluster"))
            .arg("leader")
            .arg(&self.dir)
            .arg(queue)
            .output()
            .expect("run scripts/rabbit-cluster leader");
        let n: usize = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no leader: {}", String::from_utf8_lossy(&out.stderr)));
        n - 1
    }

    fn kill(&self, node: usize) {
        let status = Command::new(scripts("rabbit-cluster"))
            .arg("kill")
            .arg(&self.dir)
            .arg((node + 1).to_string())
            .status()
            .expect("run scripts/rabbit-cluster kill");
        assert!(status.success(), "kill -9 of node {node}");
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        let _ = Command::new(scripts("rabbit-cluster"))
            .arg("down")
            .arg(&self.dir)
            .status();
    }
}

/// Commands published, and how many results are in when the leader dies.
const COMMANDS: usize = 200;
const KILL_AFTER_RESULTS: usize = 40;

#[tokio::test]
async fn a_broker_node_killed_while_commands_flow_loses_no_command_and_charges_none_twice() {
    if !runs_on(
        Backend::Postgres,
        "the broker cluster is tested once, on PostgreSQL",
    ) {
        return;
    }
    let _turn = timing_sensitive().await;
    let cluster = RabbitCluster::up();
    let db = TestDb::new().await;
    db.merchant("loja").await;
    // Slow captures, so that most commands are still to do when the node dies.
    let sim = TestSim::start(latency(200)).await;
    // Two consumers (each with its relay), given every node: each connects to
    // one of its own choosing, and to another when that one dies.
    let urls = cluster.urls.join(",");
    let args = [
        "consume",
        "--amqp-url",
        &urls,
        "--acquirer-url",
        &sim.url,
        "--outbox-poll",
        "100ms",
        "--prefetch",
        "8",
    ];
    let _consumers = [
        IdemProcess::spawn(&db, &args, &[]),
        IdemProcess::spawn(&db, &args, &[]),
    ];
    Amqp::connect_url(&cluster.urls[0])
        .await
        .wait_for_consumers(2)
        .await;

    // The test talks to a node that will live; the one that leads the
    // commands' queue is the one that dies.
    let leader = cluster.leader(COMMANDS_QUEUE);
    let survivor = &cluster.urls[(leader + 1) % 3];
    let amqp = Amqp::connect_url(survivor).await;
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    amqp.channel
        .queue_declare(
            "test.results".into(),
            QueueDeclareOptions::durable(),
            quorum,
        )
        .await
        .expect("declare the results queue");
    amqp.channel
        .queue_bind(
            "test.results".into(),
            RESULTS_EXCHANGE.into(),
            "loja".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind the results queue");
    let bodies: Vec<String> = (0..COMMANDS)
        .map(|i| body(i as i64 + 1, 1000 + i as i64))
        .collect();
    for (i, body) in bodies.iter().enumerate() {
        amqp.publish(&Cmd::new(&format!("q-{i}"), "loja", body))
            .await;
    }

    let mut results = amqp
        .channel
        .basic_consume(
            "test.results".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume the results");
    let mut status_of: HashMap<String, i64> = HashMap::new();
    let mut received = 0usize;
    let mut killed_at: Option<Instant> = None;
    let mut first_after_kill = None;
    let started = Instant::now();
    while status_of.len() < COMMANDS {
        let next = tokio::time::timeout(Duration::from_secs(90), results.next()).await;
        let delivery = match next {
            Ok(Some(Ok(d))) => d,
            other => panic!(
                "{} of {COMMANDS} commands answered, then {other:?}",
                status_of.len()
            ),
        };
        delivery
            .ack(BasicAckOptions::default())
            .await
            .expect("ack a result");
        received += 1;
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let key = match headers.inner().get("idempotency-key") {
            Some(AMQPValue::LongString(k)) => k.to_string(),
            other => panic!("a result without its key: {other:?}"),
        };
        let status = match headers.inner().get("status") {
            Some(AMQPValue::ShortInt(s)) => i64::from(*s),
            other => panic!("a result without its status: {other:?}"),
        };
        status_of.insert(key, status);
        if let (Some(at), None) = (killed_at, first_after_kill) {
            first_after_kill = Some(at.elapsed());
        }
        if killed_at.is_none() && status_of.len() >= KILL_AFTER_RESULTS {
            cluster.kill(leader);
            killed_at = Some(Instant::now());
        }
    }
    let killed_at = killed_at.expect("the leader was killed");
    eprintln!(
        "rabbit: {COMMANDS} commands, {KILL_AFTER_RESULTS} answered before the leader's node \
         died; the first result after it came {:?} after it, the last {:?} after it \
         ({received} results in all, {:?} overall)",
        first_after_kill,
        killed_at.elapsed(),
        started.elapsed()
    );

    let odd: Vec<_> = status_of
        .iter()
        .filter(|(_, s)| **s != 201 && **s != 402)
        .collect();
    assert!(odd.is_empty(), "every command final: {odd:?}");
    assert_eq!(
        amqp.ready(DEAD_LETTER_QUEUE).await,
        0,
        "nothing dead-lettered"
    );
    assert_one_capture_per_intent(
        &sim.ledger().await,
        status_of.values().filter(|s| **s == 201).count(),
    );
}

/// Nothing charged twice: at most one capture per intent (each has an order of
/// its own), and one for each `201` idem answered.
fn assert_one_capture_per_intent(ledger: &idem_lab::sim::Ledger, answered_201: usize) {
    let mut per_order: HashMap<i64, usize> = HashMap::new();
    for c in &ledger.captures {
        *per_order.entry(c.order_id).or_default() += 1;
    }
    let twice: Vec<_> = per_order.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "captured twice: {twice:?}");
    assert_eq!(ledger.captures.len(), answered_201);
}
