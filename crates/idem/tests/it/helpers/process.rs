//! Real `idem` processes: `idem serve` children, one-shot commands, and the
//! previous release.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::sim::TestSim;
use idem_testkit::db::TestDb;

/// A real `idem` child process (killed when dropped).
pub struct IdemProcess {
    child: Child,
}

impl IdemProcess {
    /// Starts `idem ARGS` against the test database, with extra environment.
    pub fn spawn(db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_on(&db.url, args, env)
    }

    /// Starts `idem ARGS` against the database at `db_url`.
    pub fn spawn_on(db_url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_bin(Path::new(env!("CARGO_BIN_EXE_idem")), db_url, args, env)
    }

    /// Starts the `idem` binary at `bin` (another release's, say) with `ARGS`.
    pub fn spawn_bin(bin: &Path, db_url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_logged(bin, db_url, args, env, None)
    }

    /// [`IdemProcess::spawn_bin`], its log (stderr) at `info` appended to
    /// `log` when given; otherwise at `warn`, to the test's own stderr.
    fn spawn_logged(
        bin: &Path,
        db_url: &str,
        args: &[&str],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Self {
        let (level, stderr) = match log {
            Some(path) => {
                let file = std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("the log file");
                ("info", Stdio::from(file))
            }
            None => ("warn", Stdio::inherit()),
        };
        let child = Command::new(bin)
            .args(args)
            .env("DATABASE_URL", db_url)
            .envs(env.iter().copied())
            .env("IDEM_LOG", level)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn idem");
        Self { child }
    }

    /// Waits for the process to exit by itself (e.g. at a crash point).
    #[cfg(feature = "crash-points")]
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait")
    }

    /// Whether the process has exited (reaping it if so).
    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: no shutdown, no cleanup, like a crash.
    pub fn kill_9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        self.child.wait().expect("wait")
    }
}

impl Drop for IdemProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `idem serve` process.
pub struct ServeProcess {
    pub url: String,
    process: IdemProcess,
}

impl std::ops::Deref for ServeProcess {
    type Target = IdemProcess;

    fn deref(&self) -> &IdemProcess {
        &self.process
    }
}

impl std::ops::DerefMut for ServeProcess {
    fn deref_mut(&mut self) -> &mut IdemProcess {
        &mut self.process
    }
}

impl ServeProcess {
    pub async fn start(db: &TestDb, sim: &TestSim, extra: &[&str]) -> Self {
        Self::start_env(db, sim, extra, &[]).await
    }

    /// With extra environment, e.g. `IDEM_CRASH_AT`.
    pub async fn start_env(
        db: &TestDb,
        sim: &TestSim,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_against(db, &sim.url, extra, env).await
    }

    /// Against the acquirer at `acquirer_url` (e.g. a simulator process on HTTPS).
    pub async fn start_against(
        db: &TestDb,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_on(&db.url, acquirer_url, extra, env).await
    }

    /// On the database at `db_url`, against the acquirer at `acquirer_url`.
    pub async fn start_on(
        db_url: &str,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let bin = Path::new(env!("CARGO_BIN_EXE_idem"));
        Self::start_bin(bin, db_url, acquirer_url, extra, env).await
    }

    /// [`ServeProcess::start`], its log at `info` appended to `log` (a file
    /// the test reads), not to the test's stderr.
    pub async fn start_logged(db: &TestDb, sim: &TestSim, extra: &[&str], log: &Path) -> Self {
        let bin = Path::new(env!("CARGO_BIN_EXE_idem"));
        Self::start_bin_logged(bin, &db.url, &sim.url, extra, &[], Some(log)).await
    }

    /// [`ServeProcess::start_on`] with the `idem` binary at `bin`.
    ///
    /// The port is picked free and then bound by the child, so another test
    /// (or another test process) may take it in between: the child then
    /// fails to bind and exits, while `/healthz` on that port answers for the
    /// other server. A test that went on would talk to a stranger (its
    /// merchants unknown there: `401`s). So the server counts as started
    /// only once this child is seen listening on the port, by the kernel's
    /// own table (`/proc`); a child that exited is started again on another
    /// port.
    pub async fn start_bin(
        bin: &Path,
        db_url: &str,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_bin_logged(bin, db_url, acquirer_url, extra, env, None).await
    }

    async fn start_bin_logged(
        bin: &Path,
        db_url: &str,
        acquirer_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let listen = format!("127.0.0.1:{port}");
            let mut args = vec!["serve", "--listen", &listen, "--acquirer-url", acquirer_url];
            args.extend_from_slice(extra);
            let mut process = IdemProcess::spawn_logged(bin, db_url, &args, env, log);
            let url = format!("http://{listen}");
            let started = Instant::now();
            let http = reqwest::Client::new();
            loop {
                if process.exited() {
                    break;
                }
                let up = http.get(format!("{url}/healthz")).send().await.is_ok();
                if up && listens_on(process.child.id(), port) {
                    return Self { url, process };
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "idem serve did not start"
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        panic!("idem serve exited before it listened, five times (see its log above)")
    }
}

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port`, by
/// the kernel's tables: the listening socket's inode in `/proc/net/tcp`,
/// among the process's open files. (Linux only, as these tests are.)
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // Local address, state (0A: LISTEN), inode.
            (cols.get(1) == Some(&local.as_str()) && cols.get(3) == Some(&"0A"))
                .then(|| cols.get(9).map(|i| format!("socket:[{i}]")))
                .flatten()
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
}

/// The repository's `scripts/` folder.
pub fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// The Python that `scripts/NAME` (one of the `ensure-*-venv` scripts) prints,
/// after it has made its virtualenv the first time; run once per test run
/// (the script also takes a lock, for callers in other processes).
pub fn python_from(name: &str) -> String {
    static ENSURED: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let mut ensured = ENSURED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, python)) = ensured.iter().find(|(n, _)| n == name) {
        return python.clone();
    }
    let out = Command::new(scripts().join(name))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"));
    assert!(
        out.status.success(),
        "scripts/{name} failed: these tests need python3 with venv, and PyPI"
    );
    let python = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    ensured.push((name.to_owned(), python.clone()));
    python
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr: SocketAddr = l.local_addr().expect("addr");
    addr.port()
}

/// Runs `idem ARGS` to completion against the test database; returns its
/// exit status, stdout and stderr.
pub async fn run_idem(db: &TestDb, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    run_idem_env(db, args, &[]).await
}

/// [`run_idem`] with extra environment (which may override `DATABASE_URL`).
pub async fn run_idem_env(
    db: &TestDb,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    run_idem_on(&db.url, args, env).await
}

/// [`run_idem_env`] against the database at `db_url`.
pub async fn run_idem_on(
    db_url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    run_bin(Path::new(env!("CARGO_BIN_EXE_idem")), db_url, args, env).await
}

/// [`run_idem_on`] with the `idem` binary at `bin`.
pub async fn run_bin(
    bin: &Path,
    db_url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env("DATABASE_URL", db_url)
        .env("IDEM_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run idem");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `idem` binary of the release before this one, which scripts/test
/// builds with scripts/ensure-previous-idem and names in
/// `IDEM_TEST_PREVIOUS_IDEM`.
pub fn previous_idem() -> PathBuf {
    let path = std::env::var("IDEM_TEST_PREVIOUS_IDEM").unwrap_or_else(|_| {
        panic!(
            "IDEM_TEST_PREVIOUS_IDEM must name the previous release's idem \
             (scripts/test sets it: IDEM_TEST_PREVIOUS_IDEM=$(scripts/ensure-previous-idem))"
        )
    });
    let path = PathBuf::from(path);
    assert!(path.is_file(), "no idem at {}", path.display());
    path
}
