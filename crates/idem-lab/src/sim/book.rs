//! The simulator's book of captures, keyed by reference: the dedup table and
//! the ledger at once.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use idem_core::acquirer::protocol::{CaptureOutcome, CaptureRequest, Echo};

/// The result of presenting a capture request to the book.
pub enum Recorded {
    /// The outcome for this reference: new, or the first one repeated.
    Outcome(CaptureOutcome),
    /// The reference is known with other parameters.
    Mismatch,
}

pub struct Book {
    by_reference: HashMap<String, (CaptureRequest, CaptureOutcome)>,
    /// Every capture in the order it was made.
    captures: Vec<LedgerCapture>,
    /// The book's clock starts here: captures carry their time since, so a
    /// reader can put them on the same axis as its own events.
    epoch: Instant,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            by_reference: HashMap::new(),
            captures: Vec::new(),
            epoch: Instant::now(),
        }
    }
}

/// One capture that moved money.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCapture {
    pub capture_id: String,
    pub reference: String,
    pub merchant: String,
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
    /// When the money moved, in microseconds since the simulator started
    /// (0 from a ledger that predates the field).
    #[serde(default)]
    pub at_micros: u64,
    /// The W3C `traceparent` the capture's POST carried, if any: what a
    /// traced idem told the acquirer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Captures per `(merchant, order_id)`; more than one is a double charge
/// unless the merchant meant to charge the order twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCount {
    pub merchant: String,
    pub order_id: i64,
    pub captures: u64,
}

/// `GET /_sim/ledger`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub captures: Vec<LedgerCapture>,
    pub counts: Vec<LedgerCount>,
    pub declines: u64,
    /// The simulator's clock when it wrote this ledger, in microseconds since
    /// it started: subtracted from the reader's own clock at that moment, it
    /// places every `at_micros` on the reader's time axis.
    #[serde(default)]
    pub now_micros: u64,
    /// True when idem-lab's simulator wrote this ledger: its captures moved no
    /// money. A ledger from anywhere else (an adapter in front of an
    /// acquirer's sandbox) leaves it out, and `idem-lab verify` then asks for
    /// `--allow-real-charges` before it charges anything.
    #[serde(default)]
    pub simulated: bool,
}

impl Book {
    /// Presents a capture of `request`. A new reference is declined if
    /// `decline`, else captured as `moved` (what the capture really moves,
    /// `request` itself unless a fault lies), and its outcome echoes that.
    pub fn capture(
        &mut self,
        request: CaptureRequest,
        decline: bool,
        moved: CaptureRequest,
        traceparent: Option<String>,
    ) -> Recorded {
        if let Some((first, outcome)) = self.by_reference.get(&request.reference) {
            return if *first == request {
                Recorded::Outcome(outcome.clone())
            } else {
                Recorded::Mismatch
            };
        }
        let outcome = if decline {
            CaptureOutcome::Declined {
                reference: request.reference.clone(),
                reason: "insufficient_funds".to_owned(),
            }
        } else {
            let capture_id = format!("cap_{}", self.captures.len() + 1);
            self.captures.push(LedgerCapture {
                capture_id: capture_id.clone(),
                reference: moved.reference.clone(),
                merchant: moved.merchant.clone(),
                order_id: moved.order_id,
                amount_cents: moved.amount_cents,
                currency: moved.currency.clone(),
                at_micros: self.micros_since_epoch(),
                traceparent,
            });
            CaptureOutcome::Captured {
                capture_id,
                reference: request.reference.clone(),
                echo: Echo::of(&moved),
            }
        };
        self.by_reference
            .insert(request.reference.clone(), (request, outcome.clone()));
        Recorded::Outcome(outcome)
    }

    pub fn outcome(&self, reference: &str) -> Option<CaptureOutcome> {
        self.by_reference.get(reference).map(|(_, o)| o.clone())
    }

    fn micros_since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub fn ledger(&self) -> Ledger {
        let mut counts: BTreeMap<(&str, i64), u64> = BTreeMap::new();
        for c in &self.captures {
            *counts.entry((c.merchant.as_str(), c.order_id)).or_default() += 1;
        }
        Ledger {
            captures: self.captures.clone(),
            counts: counts
                .into_iter()
                .map(|((merchant, order_id), captures)| LedgerCount {
                    merchant: merchant.to_owned(),
                    order_id,
                    captures,
                })
                .collect(),
            declines: u64::try_from(self.by_reference.len() - self.captures.len()).unwrap_or(0),
            now_micros: self.micros_since_epoch(),
            simulated: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(reference: &str, amount: i64) -> CaptureRequest {
        CaptureRequest {
            reference: reference.into(),
            merchant: "m".into(),
            order_id: 7,
            amount_cents: amount,
            currency: "BRL".into(),
        }
    }

    fn capture(book: &mut Book, request: CaptureRequest, decline: bool) -> Recorded {
        let moved = request.clone();
        book.capture(request, decline, moved, None)
    }

    #[test]
    fn a_known_reference_moves_no_money_twice() {
        let mut book = Book::default();
        let Recorded::Outcome(first) = capture(&mut book, req("r1", 100), false) else {
            panic!()
        };
        let Recorded::Outcome(again) = capture(&mut book, req("r1", 100), false) else {
            panic!()
        };
        assert_eq!(first, again);
        assert!(matches!(
            capture(&mut book, req("r1", 999), false),
            Recorded::Mismatch
        ));
        let ledger = book.ledger();
        assert_eq!(ledger.captures.len(), 1);
        assert_eq!(ledger.counts[0].captures, 1);
        assert!(ledger.captures[0].at_micros <= ledger.now_micros);
    }

    #[test]
    fn a_lie_moves_what_it_says_and_repeats_itself() {
        let mut book = Book::default();
        let asked = req("r1", 100);
        let moved = crate::sim::Fault::WrongAmount.captures(&asked);
        let Recorded::Outcome(first) = book.capture(asked.clone(), false, moved, None) else {
            panic!()
        };
        let CaptureOutcome::Captured { echo, .. } = &first else {
            panic!("{first:?}")
        };
        assert_eq!(echo.amount_cents, Some(101));
        assert_eq!(
            book.ledger().captures[0].amount_cents,
            101,
            "the ledger has what moved"
        );
        let Recorded::Outcome(again) = capture(&mut book, asked, false) else {
            panic!()
        };
        assert_eq!(first, again, "the same reference, the same lie");
        assert_eq!(book.ledger().captures.len(), 1);
    }

    #[test]
    fn a_ledger_without_times_still_reads() {
        let old = r#"{"captures":[{"capture_id":"cap_1","reference":"r1","merchant":"m",
            "order_id":7,"amount_cents":100,"currency":"BRL"}],"counts":[],"declines":0}"#;
        let ledger: Ledger = serde_json::from_str(old).expect("an older ledger parses");
        assert_eq!(ledger.captures[0].at_micros, 0);
        assert_eq!(ledger.now_micros, 0);
        assert!(
            !ledger.simulated,
            "a ledger that does not say so is not the simulator's"
        );
    }

    #[test]
    fn a_decline_is_remembered_and_not_a_capture() {
        let mut book = Book::default();
        capture(&mut book, req("r1", 100), true);
        let Recorded::Outcome(again) = capture(&mut book, req("r1", 100), false) else {
            panic!()
        };
        assert!(matches!(again, CaptureOutcome::Declined { .. }));
        assert_eq!(book.ledger().captures.len(), 0);
        assert_eq!(book.ledger().declines, 1);
    }
}
