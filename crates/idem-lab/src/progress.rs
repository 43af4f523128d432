//! What the demo (per strategy) and `idem-lab verify` show while they run, on
//! stderr (stdout keeps the table or the JSON): one progress line with the
//! intents done, the captures so far and the time spent. At a terminal it is a live bar
//! (indicatif); otherwise, one plain line when the strategy ends, never an
//! escape code.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio_util::sync::CancellationToken;

use crate::sim::{Ledger, LedgerCapture};

/// How often a live progress line asks the ledger for its captures so far:
/// often enough to see them climb, rare enough to cost nothing.
const LEDGER_POLL: Duration = Duration::from_millis(250);

/// How often a live bar is redrawn: smooth enough to see it move, cheap
/// beside the workload.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// One strategy's progress line; a clone draws on the same line.
#[derive(Clone)]
pub struct Progress {
    name: &'static str,
    total: usize,
    started: Instant,
    /// `None` when stdout or stderr is not a terminal: plain lines then.
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn start(name: &'static str, total: usize) -> Self {
        let live = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let bar = live.then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(u64::try_from(total).unwrap_or(u64::MAX)),
                ProgressDrawTarget::stderr(),
            )
            .with_prefix(name)
            .with_message("0 captures");
            // Under 80 columns, so a narrow terminal does not wrap it. A
            // template that failed to parse would be a bug the first run
            // shows; the default style still counts.
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix:<17} [{bar:16}] {pos:>3}/{len} intents, {msg}, {elapsed}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.enable_steady_tick(REDRAW_EVERY);
            bar
        });
        Self {
            name,
            total,
            started: Instant::now(),
            bar,
        }
    }

    /// A live bar that someone should keep current.
    pub fn is_live(&self) -> bool {
        self.bar.is_some()
    }

    /// Intents answered (or given up on) so far, and captures the acquirer made.
    pub fn update(&self, done: usize, captures: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(u64::try_from(done).unwrap_or(u64::MAX));
            bar.set_message(format!("{captures} captures"));
        }
    }

    /// The strategy's last line, the same at a terminal or not.
    pub fn finish(self, done: usize, captures: usize) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!("{}", self.line(done, captures));
    }

    fn line(&self, done: usize, captures: usize) -> String {
        format!(
            "{:<17} {done:>3}/{} intents, {captures} captures, {:.1} s",
            self.name,
            self.total,
            self.started.elapsed().as_secs_f64()
        )
    }
}

/// Keeps a live progress line current until `stop` fires: `done` intents,
/// and the captures the ledger at `ledger_url` shows that are `mine`.
pub async fn follow(
    progress: Progress,
    done: Arc<AtomicUsize>,
    ledger_url: String,
    mine: impl Fn(&LedgerCapture) -> bool,
    stop: CancellationToken,
) {
    let http = reqwest::Client::new();
    let mut captures = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LEDGER_POLL) => {}
        }
        let ledger = match http.get(&ledger_url).send().await {
            Ok(r) => r.json::<Ledger>().await.ok(),
            Err(_) => None,
        };
        if let Some(ledger) = ledger {
            captures = ledger.captures.iter().filter(|c| mine(c)).count();
        }
        progress.update(done.load(Ordering::SeqCst), captures);
    }
}
