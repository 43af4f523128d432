//! Fault injection: what the next captures will suffer, set at start
//! (`idem acquirer-sim --fault ...`) and changed at run time (`PUT /_sim/faults`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One kind of misbehaviour, applied to a capture call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Behave.
    #[default]
    None,
    /// Answer 500 without capturing.
    ErrorBefore,
    /// Capture, then answer 502: money moved, the caller cannot know.
    ErrorAfter,
    /// Capture, then withhold the answer for `hang_ms` (past the caller's timeout).
    Hang,
    /// Capture, then drop the connection mid-response.
    DropAfter,
}

/// The simulator's fault settings; the JSON body of `/_sim/faults`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Delay before each capture is processed.
    pub latency_ms: u64,
    /// Chance, 0.0 to 1.0, that a new reference is declined (`insufficient_funds`).
    pub decline_rate: f64,
    pub fault: Fault,
    /// How many calls the fault applies to before it switches itself off;
    /// `null` for every call.
    pub fault_count: Option<u64>,
    /// How long `hang` withholds the answer.
    pub hang_ms: u64,
}

/// Long enough to outlast any sane client timeout.
const DEFAULT_HANG: Duration = Duration::from_secs(120);

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            decline_rate: 0.0,
            fault: Fault::None,
            fault_count: None,
            hang_ms: u64::try_from(DEFAULT_HANG.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// What one call will suffer, drawn from the settings.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub latency: Duration,
    /// Decline if the reference is new.
    pub decline: bool,
    pub fault: Fault,
    pub hang: Duration,
}

impl Faults {
    /// Draws the plan for one call, counting down a limited fault.
    pub fn take(&mut self) -> Plan {
        let fault = match self.fault_count {
            Some(0) => Fault::None,
            Some(n) => {
                self.fault_count = Some(n - 1);
                self.fault
            }
            None => self.fault,
        };
        if self.fault_count == Some(0) {
            self.fault = Fault::None;
            self.fault_count = None;
        }
        Plan {
            latency: Duration::from_millis(self.latency_ms),
            decline: self.decline_rate > 0.0 && rand::random::<f64>() < self.decline_rate,
            fault,
            hang: Duration::from_millis(self.hang_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_fault_switches_itself_off() {
        let mut f = Faults {
            fault: Fault::ErrorAfter,
            fault_count: Some(2),
            ..Faults::default()
        };
        assert_eq!(f.take().fault, Fault::ErrorAfter);
        assert_eq!(f.take().fault, Fault::ErrorAfter);
        assert_eq!(f.take().fault, Fault::None);
        assert_eq!(f.fault, Fault::None);
    }

    #[test]
    fn decline_rate_bounds_are_exact() {
        let mut always = Faults {
            decline_rate: 1.0,
            ..Faults::default()
        };
        let mut never = Faults::default();
        assert!((0..100).all(|_| always.take().decline));
        assert!((0..100).all(|_| !never.take().decline));
    }
}
