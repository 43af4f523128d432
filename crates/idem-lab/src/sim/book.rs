//! The simulator's book of captures and refunds, each keyed by reference: the
//! dedup tables and the ledger at once. A refund is paid back from a capture
//! only while the capture has that much left: the acquirer's own sum rule,
//! which a lenient book (the `lenient-refunds` fault) leaves to its caller.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use idem_core::acquirer::protocol::{
    CaptureOutcome, CaptureRequest, Echo, RefundOutcome, RefundRequest,
};

/// The result of presenting a capture or refund request to the book.
pub enum Recorded<O> {
    /// The outcome for this reference: new, or the first one repeated.
    Outcome(O),
    /// The reference is known with other parameters.
    Mismatch,
}

pub struct Book {
    by_reference: HashMap<String, (CaptureRequest, CaptureOutcome)>,
    /// Every capture in the order it was made.
    captures: Vec<LedgerCapture>,
    refunds_by_reference: HashMap<String, (RefundRequest, RefundOutcome)>,
    /// Every refund paid, in order.
    refunds: Vec<LedgerRefund>,
    /// What the refunds of each capture (by its reference) paid back: the
    /// sum rule's reading in constant time, not a walk of every refund (a
    /// benchmark pays tens of thousands).
    refunded: HashMap<String, i64>,
    /// The book's clock starts here: captures carry their time since, so a
    /// reader can put them on the same axis as its own events.
    epoch: Instant,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            by_reference: HashMap::new(),
            captures: Vec::new(),
            refunds_by_reference: HashMap::new(),
            refunds: Vec::new(),
            refunded: HashMap::new(),
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

/// One refund that paid money back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRefund {
    pub refund_id: String,
    pub reference: String,
    /// The reference of the capture it pays back from.
    pub capture_reference: String,
    pub capture_id: String,
    pub merchant: String,
    pub amount_cents: i64,
    pub currency: String,
    /// As a capture's.
    pub at_micros: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Why the book refuses a refund (the `reason` of its `422`).
pub mod refusal {
    /// No capture under that reference (never made, or declined).
    pub const UNKNOWN_CAPTURE: &str = "unknown_capture";
    /// The refund's currency is not the capture's.
    pub const CURRENCY_MISMATCH: &str = "currency_mismatch";
    /// More than the capture has left after its earlier refunds.
    pub const EXCEEDS_CAPTURE: &str = "exceeds_capture";
    /// Not a positive amount.
    pub const INVALID_AMOUNT: &str = "invalid_amount";
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
    /// Every refund paid (none in a ledger that predates refunds).
    #[serde(default)]
    pub refunds: Vec<LedgerRefund>,
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
    ) -> Recorded<CaptureOutcome> {
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

    /// Presents a refund of `request`. A known reference gets its first
    /// outcome again (or a mismatch). A new one is paid as `moved` (`request`
    /// unless a fault lies) if its capture exists, in its currency, and has
    /// that much left after its earlier refunds (unless `lenient`: then
    /// whatever it has left); else it is refused, and the refusal is
    /// remembered as its outcome.
    pub fn refund(
        &mut self,
        request: RefundRequest,
        moved: RefundRequest,
        lenient: bool,
        traceparent: Option<String>,
    ) -> Recorded<RefundOutcome> {
        if let Some((first, outcome)) = self.refunds_by_reference.get(&request.reference) {
            return if *first == request {
                Recorded::Outcome(outcome.clone())
            } else {
                Recorded::Mismatch
            };
        }
        let refused = |reason: &str| RefundOutcome::Refused {
            reference: request.reference.clone(),
            reason: reason.to_owned(),
        };
        let capture = self
            .captures
            .iter()
            .find(|c| c.reference == request.capture_reference);
        let outcome = match capture {
            _ if request.amount_cents <= 0 => refused(refusal::INVALID_AMOUNT),
            None => refused(refusal::UNKNOWN_CAPTURE),
            Some(c) if c.currency != request.currency => refused(refusal::CURRENCY_MISMATCH),
            Some(c)
                if !lenient
                    && moved.amount_cents > c.amount_cents - self.refunded(&c.reference) =>
            {
                refused(refusal::EXCEEDS_CAPTURE)
            }
            Some(c) => {
                let refund_id = format!("rf_{}", self.refunds.len() + 1);
                *self.refunded.entry(c.reference.clone()).or_default() += moved.amount_cents;
                self.refunds.push(LedgerRefund {
                    refund_id: refund_id.clone(),
                    reference: moved.reference.clone(),
                    capture_reference: c.reference.clone(),
                    capture_id: c.capture_id.clone(),
                    merchant: moved.merchant.clone(),
                    amount_cents: moved.amount_cents,
                    currency: moved.currency.clone(),
                    at_micros: self.micros_since_epoch(),
                    traceparent,
                });
                RefundOutcome::Refunded {
                    refund_id,
                    reference: request.reference.clone(),
                    echo: Echo::of_refund(&moved),
                }
            }
        };
        self.refunds_by_reference
            .insert(request.reference.clone(), (request, outcome.clone()));
        Recorded::Outcome(outcome)
    }

    pub fn refund_outcome(&self, reference: &str) -> Option<RefundOutcome> {
        self.refunds_by_reference
            .get(reference)
            .map(|(_, o)| o.clone())
    }

    /// What the refunds of the capture under `capture_reference` paid back.
    fn refunded(&self, capture_reference: &str) -> i64 {
        self.refunded.get(capture_reference).copied().unwrap_or(0)
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
            refunds: self.refunds.clone(),
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

    fn capture(
        book: &mut Book,
        request: CaptureRequest,
        decline: bool,
    ) -> Recorded<CaptureOutcome> {
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

    fn refund_of(reference: &str, capture_reference: &str, amount: i64) -> RefundRequest {
        RefundRequest {
            reference: reference.into(),
            capture_reference: capture_reference.into(),
            merchant: "m".into(),
            amount_cents: amount,
            currency: "BRL".into(),
        }
    }

    fn refund(book: &mut Book, request: RefundRequest) -> RefundOutcome {
        let moved = request.clone();
        match book.refund(request, moved, false, None) {
            Recorded::Outcome(o) => o,
            Recorded::Mismatch => panic!("a mismatch"),
        }
    }

    fn reason(outcome: &RefundOutcome) -> &str {
        match outcome {
            RefundOutcome::Refused { reason, .. } => reason,
            RefundOutcome::Refunded { .. } => "refunded",
        }
    }

    #[test]
    fn refunds_never_pay_back_more_than_their_capture_and_once_per_reference() {
        let mut book = Book::default();
        capture(&mut book, req("c1", 100), false);
        assert_eq!(
            reason(&refund(&mut book, refund_of("r1", "c1", 60))),
            "refunded"
        );
        assert_eq!(
            refund(&mut book, refund_of("r1", "c1", 60)),
            book.refund_outcome("r1").expect("known"),
            "the same reference, the first outcome"
        );
        assert!(matches!(
            book.refund(
                refund_of("r1", "c1", 61),
                refund_of("r1", "c1", 61),
                false,
                None
            ),
            Recorded::Mismatch
        ));
        assert_eq!(
            reason(&refund(&mut book, refund_of("r2", "c1", 41))),
            "exceeds_capture"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r3", "c1", 40))),
            "refunded"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r4", "c1", 1))),
            "exceeds_capture"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r5", "nope", 1))),
            "unknown_capture"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r6", "c1", 0))),
            "invalid_amount"
        );
        let mut other_currency = refund_of("r7", "c1", 1);
        other_currency.currency = "USD".into();
        assert_eq!(
            reason(&refund(&mut book, other_currency)),
            "currency_mismatch"
        );
        let ledger = book.ledger();
        assert_eq!(ledger.refunds.len(), 2);
        assert_eq!(
            ledger.refunds.iter().map(|r| r.amount_cents).sum::<i64>(),
            100
        );
        assert!(ledger.refunds.iter().all(|r| r.capture_id == "cap_1"));
        assert_eq!(
            reason(&book.refund_outcome("r2").expect("a refusal is remembered")),
            "exceeds_capture"
        );
    }

    #[test]
    fn a_lenient_book_pays_past_the_capture_but_only_from_a_capture_once_per_reference() {
        let mut book = Book::default();
        capture(&mut book, req("c1", 100), false);
        let mut lenient = |request: RefundRequest| {
            let moved = request.clone();
            match book.refund(request, moved, true, None) {
                Recorded::Outcome(o) => o,
                Recorded::Mismatch => panic!("a mismatch"),
            }
        };
        assert_eq!(reason(&lenient(refund_of("r1", "c1", 60))), "refunded");
        assert_eq!(reason(&lenient(refund_of("r2", "c1", 60))), "refunded");
        assert_eq!(reason(&lenient(refund_of("r2", "c1", 60))), "refunded");
        assert_eq!(
            reason(&lenient(refund_of("r3", "nope", 1))),
            "unknown_capture"
        );
        assert_eq!(reason(&lenient(refund_of("r4", "c1", 0))), "invalid_amount");
        let ledger = book.ledger();
        assert_eq!(ledger.refunds.len(), 2, "each reference paid once");
        assert_eq!(
            ledger.refunds.iter().map(|r| r.amount_cents).sum::<i64>(),
            120,
            "past the capture's 100"
        );
    }

    #[test]
    fn a_declined_capture_has_nothing_to_refund() {
        let mut book = Book::default();
        capture(&mut book, req("c1", 100), true);
        assert_eq!(
            reason(&refund(&mut book, refund_of("r1", "c1", 1))),
            "unknown_capture"
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
