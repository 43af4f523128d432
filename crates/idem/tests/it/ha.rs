//! Losing the database's leader: a real Patroni cluster (etcd, two PostgreSQL
//! members with synchronous replication, HAProxy in front; `scripts/ha`), three
//! real `idem serve` processes on the HAProxy address, a storm of retrying
//! clients, and `kill -9` of the leader's postmaster in the middle of it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::store::Backend;

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
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ha")
}

/// Seven consecutive free ports (the cluster's), from a random base.
fn free_port_block() -> u16 {
    for _ in 0..50 {
        let base = 20_000 + (rand::random::<u16>() % 30_000);
        if (0..7).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no block of seven free ports");
}

impl HaCluster {
    fn up() -> Self {
        let dir = std::env::temp_dir().join(format!("idem-ha-{}", uuid::Uuid::new_v4()));
        let out = Command::new(script())
            .arg("up")
            .arg(&dir)
            .arg(free_port_block().to_string())
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
        let server = self.url.strip_suffix("/postgres").expect("the URL of a database");
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
    let (created, secret, err) = run_idem_on(&db_url, &["tenant", "create", "loja"], &[]).await;
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

    // Nothing charged twice: one capture per intent at most, and one for each 201.
    let ledger = sim.ledger().await;
    let mut per_order: HashMap<i64, usize> = HashMap::new();
    for c in &ledger.captures {
        *per_order.entry(c.order_id).or_default() += 1;
    }
    let twice: Vec<_> = per_order.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "captured twice: {twice:?}");
    let answered_201 = storm.finals.values().filter(|a| a.status == 201).count();
    assert_eq!(ledger.captures.len(), answered_201);

    // Every outcome idem answered, before the failover or after, is still its
    // answer: the replay is byte-identical.
    for (intent, first) in &storm.finals {
        let key = format!("ha-{intent}");
        let body = body(*intent as i64 + 1, 1000 + *intent as i64);
        let replay = clients[0].charge(&key, &body).await;
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
