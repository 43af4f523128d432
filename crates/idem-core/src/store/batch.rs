//! Natural batching, the way databases do group commit: the requests that
//! arrive while a batch is at the database wait in a queue, and when a worker
//! comes back it takes all of them (up to a cap) as the next batch: one
//! statement and one commit for many requests. There is no timer: a request
//! that finds a worker idle goes at once, alone, so a lone client waits for
//! nothing; batches only grow when requests already have to wait.
//!
//! A batch answers each of its inputs, in order, or says that one must run
//! alone ([`Batched::Alone`]): a row the multi-row statement could not settle
//! (a duplicate key within the batch, an expired record to reclaim), or every
//! row of a batch that the database refused, so that one row's failure never
//! becomes the others'. The caller then runs it with the one-row path, which
//! gives exactly the answer that request would have had without batching. A
//! batch that met weather (see [`failed`]) is each of its requests' `503`.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, Mutex};

use super::error::StoreError;
use super::model::{Claim, KeyRecord};
use super::params::ClaimValues;
use super::rows::ClaimBatchRow;

/// The answer for one input of a batch.
pub(super) enum Batched<T> {
    Done(Result<T, StoreError>),
    /// Run this one alone, on the one-row path.
    Alone,
}

/// A batch's work: the answers to `inputs`, one per input, in their order.
type RunBatch<I, O> =
    Arc<dyn Fn(Vec<I>) -> Pin<Box<dyn Future<Output = Vec<Batched<O>>> + Send>> + Send + Sync>;

struct Job<I, O> {
    input: I,
    queued: Instant,
    reply: oneshot::Sender<Batched<O>>,
}

/// Sends inputs to a few workers that run them in batches. Cheap to clone; the
/// workers start with the first input (so a store can be made outside a
/// runtime) and end when the last clone is dropped.
pub(super) struct Batcher<I, O> {
    inner: Arc<Inner<I, O>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<I, O> {
    /// The operation, for the batch-size metric.
    name: &'static str,
    run: RunBatch<I, O>,
    /// Batches at the database at once.
    workers: usize,
    /// Inputs per batch at most.
    cap: usize,
    /// How long an input may wait for a worker: past it, it is a `503` (as a
    /// request that waited that long for a connection alone would be), never
    /// run late.
    max_wait: Duration,
    queue: OnceLock<mpsc::UnboundedSender<Job<I, O>>>,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// `workers` batches may be at the database at once, each of at most `cap`
    /// inputs waiting at most `max_wait`, each run as `run(on, inputs)` with a
    /// clone of `on` (a pool, a connection). Neither may hold the batcher (or
    /// a store holding it), or the workers would never end.
    pub(super) fn new<C, F, Fut>(
        name: &'static str,
        workers: usize,
        cap: usize,
        max_wait: Duration,
        on: C,
        run: F,
    ) -> Self
    where
        C: Clone + Send + Sync + 'static,
        F: Fn(C, Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Batched<O>>> + Send + 'static,
    {
        let run: RunBatch<I, O> = Arc::new(move |inputs| Box::pin(run(on.clone(), inputs)));
        Self {
            inner: Arc::new(Inner {
                name,
                run,
                workers: workers.max(1),
                cap: cap.max(1),
                max_wait,
                queue: OnceLock::new(),
            }),
        }
    }

    /// Runs `input` in the next batch. `Alone` also when no worker could take
    /// it (the runtime is shutting down).
    pub(super) async fn submit(&self, input: I) -> Batched<O> {
        let queue = self.inner.queue.get_or_init(|| self.start());
        let (reply, answer) = oneshot::channel();
        let job = Job {
            input,
            queued: Instant::now(),
            reply,
        };
        if queue.send(job).is_err() {
            return Batched::Alone;
        }
        // No deadline of its own here: a batch is bounded where it runs (a
        // PostgreSQL operation by the store's deadline, SQLite's by its busy
        // timeout), and an input waits for one batch ahead at most before it
        // is refused as late. Giving up while its batch runs would leave a
        // claim that batch commits with no attempt to drive it.
        answer.await.unwrap_or(Batched::Alone)
    }

    fn start(&self) -> mpsc::UnboundedSender<Job<I, O>> {
        let (queue, waiting) = mpsc::unbounded_channel();
        let waiting = Arc::new(Mutex::new(waiting));
        for _ in 0..self.inner.workers {
            tokio::spawn(work(waiting.clone(), self.inner.clone()));
        }
        queue
    }
}

/// One worker: takes the first waiting input, and every other one already
/// waiting behind it up to the cap, runs them as one batch, answers each.
async fn work<I, O>(
    waiting: Arc<Mutex<mpsc::UnboundedReceiver<Job<I, O>>>>,
    batcher: Arc<Inner<I, O>>,
) {
    loop {
        let jobs = {
            let mut waiting = waiting.lock().await;
            let Some(first) = waiting.recv().await else {
                return;
            };
            let mut jobs = vec![first];
            while jobs.len() < batcher.cap {
                match waiting.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            jobs
        };
        let (jobs, late): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|job| job.queued.elapsed() < batcher.max_wait);
        for job in late {
            let waited = sqlx::Error::PoolTimedOut;
            let _ = job
                .reply
                .send(Batched::Done(Err(StoreError::Unavailable(waited))));
        }
        if jobs.is_empty() {
            continue;
        }
        metrics::histogram!(crate::metrics::STORE_BATCH_ROWS, "op" => batcher.name)
            .record(jobs.len() as f64);
        let (inputs, replies): (Vec<I>, Vec<_>) =
            jobs.into_iter().map(|job| (job.input, job.reply)).unzip();
        let answers = (batcher.run)(inputs).await;
        debug_assert_eq!(answers.len(), replies.len());
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A request that went away (its client hung up) is not waiting.
            let _ = reply.send(answer);
        }
    }
}

/// For a batch that failed as a whole: what each of its `n` inputs gets.
/// Weather (the database unreachable, busy, timed out, or unable to write:
/// [`StoreError::is_transient`]) is every request's `503`, at once, as it
/// would be alone: running each row again would only wait out the same
/// weather once per row. Any other failure may be one row's doing (a
/// constraint, text the database refuses), so each row runs alone and gets
/// its own answer.
pub(super) fn failed<T>(n: usize, error: &StoreError) -> Vec<Batched<T>> {
    if !error.is_transient() {
        return (0..n).map(|_| Batched::Alone).collect();
    }
    (0..n)
        .map(|_| Batched::Done(Err(error.for_batch_member())))
        .collect()
}

/// A batch of claims' answers from its statement's rows, on either backend:
/// a claim that won, or lost to a live record, is answered; a claim with no
/// row (a live tombstone of the same request, or the sweeper deleting the
/// record in between), or that found another request's expired record to
/// reclaim, goes alone. Behind a claim that goes alone, the later claims of
/// its key (that did not win here) go alone too, after it: as they arrived.
pub(super) fn claim_answers(
    claims: &[ClaimValues],
    rows: Vec<ClaimBatchRow>,
) -> Vec<Batched<Claim>> {
    let mut answers: Vec<Batched<Claim>> = claims.iter().map(|_| Batched::Alone).collect();
    for row in rows {
        let Some(place) = usize::try_from(row.n - 1)
            .ok()
            .filter(|p| *p < claims.len())
        else {
            continue;
        };
        let record = match KeyRecord::try_from(row.record) {
            Ok(record) => record,
            Err(e) => {
                answers[place] = Batched::Done(Err(e));
                continue;
            }
        };
        answers[place] = if row.won {
            Batched::Done(Ok(Claim::Won(record)))
        } else if record.expired && record.fingerprint.as_bytes() != claims[place].fingerprint() {
            Batched::Alone
        } else {
            Batched::Done(Ok(Claim::Lost(record)))
        };
    }
    let mut gone_alone = HashSet::new();
    for (values, answer) in claims.iter().zip(answers.iter_mut()) {
        let key = (values.merchant_id(), values.key());
        match answer {
            Batched::Alone => {
                gone_alone.insert(key);
            }
            Batched::Done(Ok(Claim::Won(_))) => {}
            Batched::Done(_) if gone_alone.contains(&key) => *answer = Batched::Alone,
            Batched::Done(_) => {}
        }
    }
    answers
}
