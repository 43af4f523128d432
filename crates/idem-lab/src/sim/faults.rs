//! Fault injection: what the next calls (captures of both kinds, refunds,
//! authorizations, voids) will suffer, set at start
//! (`idem-lab acquirer-sim --fault ...`) and changed at run time (`PUT /_sim/faults`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use idem_core::acquirer::protocol::{
    AuthorizationCaptureRequest, AuthorizationRequest, CaptureRequest, RefundRequest,
};

/// One kind of misbehaviour, applied to a call that POSTs (a capture of
/// either kind, a refund, an authorization, a void). Written the same way
/// on the command line and in `/_sim/faults`: `none`, `error-before`,
/// `error-after`, `hang`, `drop-after`, `wrong-amount`, `wrong-currency`,
/// `wrong-order`, `refuse-paid`, `lenient-refunds`, `lenient-captures`, or
/// `status:N`
/// (`error_before` and the other snake-case spellings are accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Fault {
    /// Behave.
    #[default]
    None,
    /// Answer 500 without capturing.
    ErrorBefore,
    /// Capture, then answer 502: money moved, the caller cannot know.
    ErrorAfter,
    /// Capture, then withhold the answer for `hang_ms` (past the caller's
    /// timeout). The POST stays in flight all that time, so another POST of
    /// the same reference meanwhile is answered `409`.
    Hang,
    /// Capture, then drop the connection mid-response.
    DropAfter,
    /// Answer this status without capturing, as a proxy, a rate limiter or a
    /// wrong route would (with `Retry-After` when `retry_after_secs` is set).
    Status(u16),
    /// Capture one cent more than asked, and say so in the `201`'s echo (a
    /// new reference only: a known one repeats its first outcome).
    WrongAmount,
    /// Capture in another currency than asked (`USD`, or `EUR` for `USD`).
    WrongCurrency,
    /// Capture for the next order id.
    WrongOrder,
    /// A refund's POST of a reference already paid answers `422` ("nothing
    /// left to refund") instead of its first outcome, as some acquirers do to
    /// a retry; its GET still says paid. So do a capture of an authorization
    /// already made ("nothing left to capture") and a void already made
    /// ("already voided"). One-step captures and authorizations behave.
    RefusePaid,
    /// Pay a refund of a capture even past what the capture has left, as an
    /// acquirer that leaves the sum to its caller would: the caller's own sum
    /// rule is then all that stands between two refunds and an over-refund,
    /// and a broken one shows in the ledger. Captures behave.
    LenientRefunds,
    /// Capture an authorization even past what it has left after its
    /// earlier captures, as an acquirer that leaves the sum to its caller
    /// would: the caller's own sum rule is then all that stands between two
    /// captures and an over-capture, and a broken one shows in the ledger.
    /// An authorization closed (by a final capture or a void) still takes no
    /// capture; refunds and one-step captures behave.
    LenientCaptures,
}

impl Fault {
    /// What a capture of `asked` moves under this fault: `asked` itself,
    /// unless the fault is a lie about it.
    pub fn captures(self, asked: &CaptureRequest) -> CaptureRequest {
        let mut moved = asked.clone();
        match self {
            Self::WrongAmount => moved.amount_cents = asked.amount_cents.saturating_add(1),
            Self::WrongCurrency => moved.currency = other_currency(&asked.currency),
            Self::WrongOrder => moved.order_id = asked.order_id.saturating_add(1),
            _ => {}
        }
        moved
    }

    /// What a refund of `asked` pays back under this fault: `asked` itself,
    /// unless the fault is a lie about the amount or the currency (a refund
    /// names no order, so `wrong-order` moves it as asked).
    pub fn refunds(self, asked: &RefundRequest) -> RefundRequest {
        let mut moved = asked.clone();
        match self {
            Self::WrongAmount => moved.amount_cents = asked.amount_cents.saturating_add(1),
            Self::WrongCurrency => moved.currency = other_currency(&asked.currency),
            _ => {}
        }
        moved
    }

    /// What an authorization of `asked` holds under this fault: as a
    /// capture, `asked` itself unless the fault is a lie about it.
    pub fn authorizes(self, asked: &AuthorizationRequest) -> AuthorizationRequest {
        let mut held = asked.clone();
        match self {
            Self::WrongAmount => held.amount_cents = asked.amount_cents.saturating_add(1),
            Self::WrongCurrency => held.currency = other_currency(&asked.currency),
            Self::WrongOrder => held.order_id = asked.order_id.saturating_add(1),
            _ => {}
        }
        held
    }

    /// What a capture of an authorization moves under this fault: as a
    /// refund, `asked` itself unless the fault is a lie about the amount or
    /// the currency (it names no order, so `wrong-order` moves it as asked).
    /// A void names no amount, currency or order: the lies move it as asked.
    pub fn captures_of_authorization(
        self,
        asked: &AuthorizationCaptureRequest,
    ) -> AuthorizationCaptureRequest {
        let mut moved = asked.clone();
        match self {
            Self::WrongAmount => moved.amount_cents = asked.amount_cents.saturating_add(1),
            Self::WrongCurrency => moved.currency = other_currency(&asked.currency),
            _ => {}
        }
        moved
    }
}

/// The currency a `wrong-currency` lie names instead of `asked`.
fn other_currency(asked: &str) -> String {
    if asked == "USD" { "EUR" } else { "USD" }.to_owned()
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown fault {s:?}: use none, error-before, error-after, hang, drop-after, \
                 wrong-amount, wrong-currency, wrong-order, refuse-paid, lenient-refunds, \
                 lenient-captures or status:N (N from 100 to 599)"
            )
        };
        if let Some(code) = s.strip_prefix("status:") {
            return match code.parse::<u16>() {
                Ok(n) if (100..=599).contains(&n) => Ok(Self::Status(n)),
                _ => Err(bad()),
            };
        }
        match s.replace('_', "-").as_str() {
            "none" => Ok(Self::None),
            "error-before" => Ok(Self::ErrorBefore),
            "error-after" => Ok(Self::ErrorAfter),
            "hang" => Ok(Self::Hang),
            "drop-after" => Ok(Self::DropAfter),
            "wrong-amount" => Ok(Self::WrongAmount),
            "wrong-currency" => Ok(Self::WrongCurrency),
            "wrong-order" => Ok(Self::WrongOrder),
            "refuse-paid" => Ok(Self::RefusePaid),
            "lenient-refunds" => Ok(Self::LenientRefunds),
            "lenient-captures" => Ok(Self::LenientCaptures),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::ErrorBefore => f.write_str("error-before"),
            Self::ErrorAfter => f.write_str("error-after"),
            Self::Hang => f.write_str("hang"),
            Self::DropAfter => f.write_str("drop-after"),
            Self::WrongAmount => f.write_str("wrong-amount"),
            Self::WrongCurrency => f.write_str("wrong-currency"),
            Self::WrongOrder => f.write_str("wrong-order"),
            Self::RefusePaid => f.write_str("refuse-paid"),
            Self::LenientRefunds => f.write_str("lenient-refunds"),
            Self::LenientCaptures => f.write_str("lenient-captures"),
            Self::Status(n) => write!(f, "status:{n}"),
        }
    }
}

impl TryFrom<String> for Fault {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Fault> for String {
    fn from(f: Fault) -> Self {
        f.to_string()
    }
}

/// The simulator's fault settings; the JSON body of `/_sim/faults`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Delay before each call that POSTs is processed: every call's, or with
    /// `latency_p99_ms` the median of a drawn one.
    pub latency_ms: u64,
    /// When set, each call's delay is drawn from a lognormal distribution
    /// whose median is `latency_ms` and whose 99th percentile is this, as a
    /// real acquirer's latency is spread (at least `latency_ms`).
    pub latency_p99_ms: Option<u64>,
    /// Chance, 0.0 to 1.0, that a new one-step capture or authorization is
    /// declined (`insufficient_funds`); a capture of an authorization, a
    /// refund and a void are never declined.
    pub decline_rate: f64,
    pub fault: Fault,
    /// How many calls the fault applies to before it switches itself off;
    /// `null` for every call.
    pub fault_count: Option<u64>,
    /// How long `hang` withholds the answer.
    pub hang_ms: u64,
    /// The `Retry-After` (seconds) a `status:N` fault sends; `null` for none.
    pub retry_after_secs: Option<u64>,
    /// Chance, 0.0 to 1.0, that a call with no fault set suffers a random
    /// one, as a real acquirer's calls now and then do: a timeout (`hang`)
    /// or a 5xx (`error-before` or `error-after`), one in three each.
    pub fault_rate: f64,
}

/// Long enough to outlast any sane client timeout.
const DEFAULT_HANG: Duration = Duration::from_secs(120);

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            latency_p99_ms: None,
            decline_rate: 0.0,
            fault: Fault::None,
            fault_count: None,
            hang_ms: u64::try_from(DEFAULT_HANG.as_millis()).unwrap_or(u64::MAX),
            retry_after_secs: None,
            fault_rate: 0.0,
        }
    }
}

/// The standard normal's 99th percentile: a lognormal's p99 is
/// `exp(mu + Z99 * sigma)`, its median `exp(mu)`.
const Z99: f64 = 2.326_347_874_040_841;

/// The faults a random fault is drawn from (`fault_rate`): a timeout, a 5xx
/// before the money moves, a 5xx after.
const RANDOM_FAULTS: [Fault; 3] = [Fault::Hang, Fault::ErrorBefore, Fault::ErrorAfter];

/// What one call will suffer, drawn from the settings.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub latency: Duration,
    /// Decline if the reference is new.
    pub decline: bool,
    pub fault: Fault,
    pub hang: Duration,
    pub retry_after_secs: Option<u64>,
    /// The fault was drawn at random (`fault_rate`), not set.
    pub random_fault: bool,
}

impl Faults {
    /// Whether the settings make sense: rates from 0 to 1, a p99 latency
    /// not below the median.
    pub fn check(&self) -> Result<(), String> {
        for (name, rate) in [
            ("decline_rate", self.decline_rate),
            ("fault_rate", self.fault_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} is a chance from 0.0 to 1.0, not {rate}"));
            }
        }
        match self.latency_p99_ms {
            Some(p99) if p99 < self.latency_ms => Err(format!(
                "latency_p99_ms ({p99}) is below the median latency_ms ({})",
                self.latency_ms
            )),
            _ => Ok(()),
        }
    }

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
        let random_fault = fault == Fault::None
            && self.fault_rate > 0.0
            && rand::random::<f64>() < self.fault_rate;
        Plan {
            latency: self.draw_latency(&mut rand::rng()),
            decline: self.decline_rate > 0.0 && rand::random::<f64>() < self.decline_rate,
            fault: if random_fault {
                RANDOM_FAULTS[rand::random_range(0..RANDOM_FAULTS.len())]
            } else {
                fault
            },
            hang: Duration::from_millis(self.hang_ms),
            retry_after_secs: self.retry_after_secs,
            random_fault,
        }
    }

    /// One call's delay: `latency_ms`, or a draw from the lognormal that
    /// has it as its median and `latency_p99_ms` as its 99th percentile.
    fn draw_latency(&self, rng: &mut impl rand::Rng) -> Duration {
        let median = self.latency_ms as f64;
        let spread = match self.latency_p99_ms {
            Some(p99) if p99 > self.latency_ms && self.latency_ms > 0 => {
                (p99 as f64 / median).ln() / Z99
            }
            _ => return Duration::from_millis(self.latency_ms),
        };
        match rand_distr::LogNormal::new(median.ln(), spread) {
            Ok(lognormal) => Duration::from_secs_f64(rng.sample(lognormal) / 1000.0),
            Err(_) => Duration::from_millis(self.latency_ms),
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
    fn faults_read_and_write_one_spelling() {
        for text in [
            "none",
            "error-before",
            "error-after",
            "hang",
            "drop-after",
            "wrong-amount",
            "wrong-currency",
            "wrong-order",
            "refuse-paid",
            "lenient-refunds",
            "lenient-captures",
            "status:429",
        ] {
            let fault: Fault = text.parse().expect(text);
            assert_eq!(fault.to_string(), text);
        }
        assert_eq!("error_after".parse::<Fault>(), Ok(Fault::ErrorAfter));
        assert_eq!("status:404".parse::<Fault>(), Ok(Fault::Status(404)));
        for bad in [
            "status:",
            "status:99",
            "status:600",
            "status:abc",
            "explode",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
        let json: Faults = serde_json::from_str(r#"{"fault": "status:409"}"#).expect("json");
        assert_eq!(json.fault, Fault::Status(409));
        assert!(serde_json::from_str::<Faults>(r#"{"fault": "status:1"}"#).is_err());
    }

    #[test]
    fn a_drawn_latency_has_the_median_and_p99_asked_for() {
        use rand::SeedableRng;
        let f = Faults {
            latency_ms: 120,
            latency_p99_ms: Some(380),
            ..Faults::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let mut draws: Vec<f64> = (0..100_000)
            .map(|_| f.draw_latency(&mut rng).as_secs_f64() * 1000.0)
            .collect();
        draws.sort_by(f64::total_cmp);
        let (p50, p99) = (draws[50_000], draws[99_000]);
        assert!((p50 - 120.0).abs() < 3.0, "p50 {p50}");
        assert!((p99 - 380.0).abs() < 15.0, "p99 {p99}");
        // Without a p99, every call waits the same.
        let fixed = Faults {
            latency_ms: 120,
            ..Faults::default()
        };
        assert_eq!(fixed.draw_latency(&mut rng), Duration::from_millis(120));
    }

    #[test]
    fn a_fault_rate_draws_timeouts_and_5xx_and_never_overrides_a_set_fault() {
        let mut f = Faults {
            fault_rate: 1.0,
            ..Faults::default()
        };
        let drawn: Vec<Plan> = (0..300).map(|_| f.take()).collect();
        assert!(drawn.iter().all(|p| p.random_fault));
        for fault in RANDOM_FAULTS {
            assert!(drawn.iter().any(|p| p.fault == fault), "{fault} drawn");
        }
        let mut set = Faults {
            fault_rate: 1.0,
            fault: Fault::WrongAmount,
            ..Faults::default()
        };
        let plan = set.take();
        assert_eq!((plan.fault, plan.random_fault), (Fault::WrongAmount, false));
        assert!(!Faults::default().take().random_fault);
    }

    #[test]
    fn settings_out_of_range_are_refused_with_their_name() {
        let bad = |f: Faults| f.check().expect_err("refused");
        assert!(bad(Faults {
            fault_rate: 1.5,
            ..Faults::default()
        })
        .contains("fault_rate"));
        assert!(bad(Faults {
            decline_rate: -0.1,
            ..Faults::default()
        })
        .contains("decline_rate"));
        assert!(bad(Faults {
            latency_ms: 100,
            latency_p99_ms: Some(50),
            ..Faults::default()
        })
        .contains("below the median"));
        assert_eq!(Faults::default().check(), Ok(()));
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
