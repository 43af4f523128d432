//! Crash points: places on the request path where a test can make the process
//! die at once (`abort`, no cleanup, like `kill -9`), to prove that a crash at
//! any step leaves the data consistent and recoverable.
//!
//! Compiled in only with the cargo feature `crash-points`, which the test
//! command turns on and a release build never has; without it every point is
//! an empty inline function. With it, a point fires only when `IDEM_CRASH_AT`
//! names it.

use std::future::Future;

/// The boundaries of the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// The claim is committed; the acquirer has not been called.
    AfterClaim,
    /// The acquirer answered; nothing of its answer is stored.
    AfterAcquirer,
    /// The finalize statement is on its way; the process dies without its
    /// answer. The statement is atomic, so it committed whole or not at all.
    /// (Named only by the armed points: without the feature, nothing does.)
    #[cfg_attr(not(feature = "crash-points"), allow(dead_code))]
    MidFinalize,
}

#[cfg(feature = "crash-points")]
impl CrashPoint {
    pub fn name(self) -> &'static str {
        match self {
            Self::AfterClaim => "after-claim",
            Self::AfterAcquirer => "after-acquirer",
            Self::MidFinalize => "mid-finalize",
        }
    }
}

#[cfg(feature = "crash-points")]
mod armed {
    use std::sync::OnceLock;

    use super::CrashPoint;

    fn armed() -> Option<&'static str> {
        static AT: OnceLock<Option<String>> = OnceLock::new();
        AT.get_or_init(|| std::env::var("IDEM_CRASH_AT").ok())
            .as_deref()
    }

    pub fn is_armed(point: CrashPoint) -> bool {
        armed() == Some(point.name())
    }

    pub fn die(point: CrashPoint) -> ! {
        eprintln!("idem: crash point {} reached; aborting", point.name());
        std::process::abort()
    }
}

/// Dies here if this point is armed.
#[inline(always)]
pub fn point(point: CrashPoint) {
    #[cfg(feature = "crash-points")]
    if armed::is_armed(point) {
        armed::die(point);
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = point;
}

/// Runs the finalize statement; at the armed `mid-finalize` point, starts it
/// and dies a moment later without waiting for its answer.
pub async fn around_finalize<F: Future>(finalize: F) -> F::Output {
    #[cfg(feature = "crash-points")]
    if armed::is_armed(CrashPoint::MidFinalize) {
        let mut finalize = std::pin::pin!(finalize);
        let _ = tokio::time::timeout(std::time::Duration::from_micros(500), &mut finalize).await;
        armed::die(CrashPoint::MidFinalize);
    }
    finalize.await
}
