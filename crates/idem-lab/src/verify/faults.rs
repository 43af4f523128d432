//! The faults a verify run brings while its workload runs: the user's own
//! `--fault-cmd` every `--fault-every` (restart an instance, kill a database
//! node, cut a link), and, when the acquirer is the simulator, a script of the
//! simulator's faults. Stopping puts the simulator's settings back as they were.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::client::Client;
use super::history::Fault as Event;
use crate::sim::{Fault, Faults};

/// How often the simulator's script moves to its next step.
pub const SIM_STEP: Duration = Duration::from_millis(500);

/// The longest a `--fault-cmd` run may take before it is killed: a fault
/// command that hangs must not hang the run.
const FAULT_CMD_LIMIT: Duration = Duration::from_secs(30);

/// How long a scripted hang withholds the simulator's answer: past a
/// deployment's usual acquirer timeout only if it is short.
const SCRIPTED_HANG: Duration = Duration::from_millis(1500);

/// The simulator's script, one step per [`SIM_STEP`], over and over: a slow
/// acquirer (the article's case: the client gives up while the capture is
/// under way), then each fault a real acquirer brings, for a few calls each,
/// with a slow step between them. One intent in ten is declined throughout.
pub fn script(client_timeout: Duration) -> Vec<Faults> {
    let slow = Faults {
        latency_ms: u64::try_from((client_timeout + Duration::from_millis(100)).as_millis())
            .unwrap_or(u64::MAX),
        decline_rate: 0.1,
        ..Faults::default()
    };
    let fault = |fault: Fault, count: u64| Faults {
        fault,
        fault_count: Some(count),
        decline_rate: 0.1,
        hang_ms: u64::try_from(SCRIPTED_HANG.as_millis()).unwrap_or(u64::MAX),
        retry_after_secs: matches!(fault, Fault::Status(429)).then_some(1),
        ..Faults::default()
    };
    [
        fault(Fault::ErrorAfter, 3),
        fault(Fault::Hang, 2),
        fault(Fault::Status(409), 3),
        fault(Fault::Status(429), 3),
        fault(Fault::DropAfter, 2),
        fault(Fault::ErrorBefore, 3),
        fault(Fault::Status(503), 3),
    ]
    .into_iter()
    .flat_map(|step| [slow.clone(), step])
    .collect()
}

/// The faults running; [`Driver::stop`] ends them and hands back what ran.
pub struct Driver {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<Vec<Event>>>,
    restore: Option<(String, Faults)>,
}

impl Driver {
    /// Starts the user's command (if any) and the simulator's script (if
    /// `sim` is the simulator's base URL).
    pub async fn start(
        fault_cmd: Option<String>,
        every: Duration,
        sim: Option<String>,
        client_timeout: Duration,
        client: Arc<Client>,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut restore = None;
        // The simulator first: if it cannot be read, nothing has started.
        if let Some(sim) = sim {
            let http = reqwest::Client::new();
            let url = format!("{sim}/_sim/faults");
            let before: Faults = http
                .get(&url)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            restore = Some((url.clone(), before));
            tasks.push(tokio::spawn(run_script(
                http,
                url,
                script(client_timeout),
                client.clone(),
                stop.clone(),
            )));
        }
        if let Some(cmd) = fault_cmd {
            tasks.push(tokio::spawn(run_command(cmd, every, client, stop.clone())));
        }
        Ok(Self {
            stop,
            tasks,
            restore,
        })
    }

    /// Ends the faults, puts the simulator's settings back, and returns every
    /// fault that ran.
    pub async fn stop(self) -> anyhow::Result<Vec<Event>> {
        self.stop.cancel();
        let mut events = Vec::new();
        for task in self.tasks {
            events.extend(task.await?);
        }
        if let Some((url, before)) = self.restore {
            reqwest::Client::new()
                .put(&url)
                .json(&before)
                .send()
                .await?
                .error_for_status()?;
        }
        events.sort_by_key(|e| e.at_ms);
        Ok(events)
    }
}

/// Runs `cmd` with `sh -c` every `every` until `stop` fires.
async fn run_command(
    cmd: String,
    every: Duration,
    client: Arc<Client>,
    stop: CancellationToken,
) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return events,
            _ = tokio::time::sleep(every) => {}
        }
        let at_ms = client.now_ms() as u64;
        let (ok, what) = match run_once(&cmd).await {
            Ok(output) if output.status.success() => (true, "exit 0".to_owned()),
            Ok(output) => {
                let stderr = String::from_utf8_lossy(&output.stderr);
                let last = stderr.lines().last().unwrap_or("").trim().to_owned();
                (false, format!("{}: {last}", output.status))
            }
            Err(e) => (false, e),
        };
        events.push(Event {
            at_ms,
            source: "fault-cmd".to_owned(),
            what,
            ok,
        });
    }
}

async fn run_once(cmd: &str) -> Result<std::process::Output, String> {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("could not start sh -c: {e}"))?;
    match tokio::time::timeout(FAULT_CMD_LIMIT, child.wait_with_output()).await {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(e)) => Err(format!("waiting for it: {e}")),
        Err(_) => Err(format!(
            "still running after {} s, killed",
            FAULT_CMD_LIMIT.as_secs()
        )),
    }
}

/// Puts each step of `script` on the simulator in turn until `stop` fires.
async fn run_script(
    http: reqwest::Client,
    url: String,
    script: Vec<Faults>,
    client: Arc<Client>,
    stop: CancellationToken,
) -> Vec<Event> {
    let mut events = Vec::new();
    for step in script.iter().cycle() {
        let at_ms = client.now_ms() as u64;
        let put = http.put(&url).json(step).send().await;
        let ok = put.is_ok_and(|r| r.status().is_success());
        events.push(Event {
            at_ms,
            source: "simulator".to_owned(),
            what: describe(step),
            ok,
        });
        tokio::select! {
            _ = stop.cancelled() => return events,
            _ = tokio::time::sleep(SIM_STEP) => {}
        }
    }
    events
}

/// A step of the script in a few words.
fn describe(f: &Faults) -> String {
    match (f.fault, f.fault_count) {
        (Fault::None, _) => format!("latency {} ms", f.latency_ms),
        (fault, Some(n)) => format!("{fault} for {n} calls"),
        (fault, None) => fault.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_slow_between_faults_and_declines_some() {
        let steps = script(Duration::from_millis(250));
        assert_eq!(steps.len(), 14);
        assert!(steps.iter().step_by(2).all(|s| s.latency_ms == 350));
        assert!(steps.iter().all(|s| s.decline_rate > 0.0));
        assert_eq!(describe(&steps[1]), "error-after for 3 calls");
        assert_eq!(steps[7].retry_after_secs, Some(1), "{:?}", steps[7]);
    }
}
