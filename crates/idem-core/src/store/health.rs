//! Whether the store can take a write now, as the writes themselves found it:
//! what readiness reports, without a write of its own per probe.
//!
//! A write that fails because the database cannot write (a full disk, a
//! read-only file system, an I/O error: [`StoreError::Unwritable`]) turns the
//! store unwritable; the next write that succeeds turns it writable again.
//! Readiness reads that state. While it is unwritable, and only then, a
//! readiness check may make one small write of its own (a probe), at most
//! once per [`PROBE_EVERY`], so that an instance the load balancer stopped
//! sending charges to still learns that the disk has room again. Each change
//! of state is logged once, with its cause.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error::StoreError;

/// How often, at most, a readiness check probes an unwritable store with a
/// write of its own.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The store's ability to write, shared by everything that writes through
/// one store; cheap to clone. A std mutex: held for a few instructions, never
/// across an await.
#[derive(Clone, Default)]
pub(super) struct WriteHealth(Arc<Mutex<State>>);

#[derive(Default)]
enum State {
    #[default]
    Writable,
    Unwritable {
        /// The error that turned it unwritable, for readiness to repeat.
        cause: String,
        /// When a readiness check last probed.
        probed: Option<Instant>,
    },
}

/// What readiness should do about writing.
pub(super) enum Check {
    /// The last write succeeded (or none failed yet): nothing to do.
    Writable,
    /// The store was unwritable and no probe ran lately: make one write.
    ProbeDue,
    /// Unwritable, and probed lately: report it without writing.
    Unwritable(StoreError),
}

impl WriteHealth {
    /// Records what a write came to. `wrote`: the operation is known to have
    /// written, so its success proves the store writes again (an operation
    /// that may only have read proves nothing and leaves the state as it is).
    pub(super) fn saw<T>(&self, result: &Result<T, StoreError>, wrote: bool) {
        match result {
            Err(StoreError::Unwritable(cause)) => {
                let mut state = self.lock();
                if matches!(*state, State::Writable) {
                    tracing::error!(class = "unwritable", %cause,
                        "the database cannot take writes: charges answer 503 and readiness is red \
                         until a write succeeds");
                    *state = State::Unwritable {
                        cause: cause.to_string(),
                        probed: None,
                    };
                }
            }
            Ok(_) if wrote => {
                let mut state = self.lock();
                if matches!(*state, State::Unwritable { .. }) {
                    tracing::warn!("the database takes writes again");
                    *state = State::Writable;
                }
            }
            _ => {}
        }
    }

    /// What a readiness check should do; a [`Check::ProbeDue`] is handed to
    /// one caller per [`PROBE_EVERY`].
    pub(super) fn check(&self) -> Check {
        let mut state = self.lock();
        match &mut *state {
            State::Writable => Check::Writable,
            State::Unwritable { probed, .. }
                if probed.is_none_or(|at| at.elapsed() >= PROBE_EVERY) =>
            {
                *probed = Some(Instant::now());
                Check::ProbeDue
            }
            State::Unwritable { cause, .. } => Check::Unwritable(StoreError::Unwritable(
                sqlx::Error::Protocol(format!("the last write failed: {cause}")),
            )),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Result<(), StoreError> {
        Err(StoreError::Unwritable(sqlx::Error::Protocol(
            "disk full".into(),
        )))
    }

    #[test]
    fn an_unwritable_error_turns_it_red_until_a_write_succeeds() {
        let health = WriteHealth::default();
        assert!(matches!(health.check(), Check::Writable));
        health.saw(&full(), true);
        assert!(matches!(health.check(), Check::ProbeDue));
        assert!(
            matches!(health.check(), Check::Unwritable(StoreError::Unwritable(_))),
            "one probe per interval"
        );
        health.saw(&Ok(()), false);
        assert!(
            matches!(health.check(), Check::Unwritable(_)),
            "a read proves nothing"
        );
        health.saw(&Err::<(), _>(StoreError::Corrupt("x".into())), true);
        assert!(matches!(health.check(), Check::Unwritable(_)));
        health.saw(&Ok(()), true);
        assert!(matches!(health.check(), Check::Writable));
    }

    #[test]
    fn a_probe_is_due_again_after_the_interval() {
        let health = WriteHealth::default();
        health.saw(&full(), true);
        assert!(matches!(health.check(), Check::ProbeDue));
        if let State::Unwritable { probed, .. } = &mut *health.lock() {
            *probed = Instant::now().checked_sub(PROBE_EVERY);
        }
        assert!(matches!(health.check(), Check::ProbeDue));
    }
}
