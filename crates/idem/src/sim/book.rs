//! The simulator's book of captures, keyed by reference: the dedup table and
//! the ledger at once.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::acquirer::protocol::{CaptureOutcome, CaptureRequest};

/// The result of presenting a capture request to the book.
pub enum Recorded {
    /// The outcome for this reference: new, or the first one repeated.
    Outcome(CaptureOutcome),
    /// The reference is known with other parameters.
    Mismatch,
}

#[derive(Default)]
pub struct Book {
    by_reference: HashMap<String, (CaptureRequest, CaptureOutcome)>,
    /// Every capture in the order it was made.
    captures: Vec<LedgerCapture>,
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
}

impl Book {
    pub fn capture(&mut self, request: CaptureRequest, decline: bool) -> Recorded {
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
                reference: request.reference.clone(),
                merchant: request.merchant.clone(),
                order_id: request.order_id,
                amount_cents: request.amount_cents,
                currency: request.currency.clone(),
            });
            CaptureOutcome::Captured {
                capture_id,
                reference: request.reference.clone(),
            }
        };
        self.by_reference
            .insert(request.reference.clone(), (request, outcome.clone()));
        Recorded::Outcome(outcome)
    }

    pub fn outcome(&self, reference: &str) -> Option<CaptureOutcome> {
        self.by_reference.get(reference).map(|(_, o)| o.clone())
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

    #[test]
    fn a_known_reference_moves_no_money_twice() {
        let mut book = Book::default();
        let Recorded::Outcome(first) = book.capture(req("r1", 100), false) else {
            panic!()
        };
        let Recorded::Outcome(again) = book.capture(req("r1", 100), false) else {
            panic!()
        };
        assert_eq!(first, again);
        assert!(matches!(
            book.capture(req("r1", 999), false),
            Recorded::Mismatch
        ));
        let ledger = book.ledger();
        assert_eq!(ledger.captures.len(), 1);
        assert_eq!(ledger.counts[0].captures, 1);
    }

    #[test]
    fn a_decline_is_remembered_and_not_a_capture() {
        let mut book = Book::default();
        book.capture(req("r1", 100), true);
        let Recorded::Outcome(again) = book.capture(req("r1", 100), false) else {
            panic!()
        };
        assert!(matches!(again, CaptureOutcome::Declined { .. }));
        assert_eq!(book.ledger().captures.len(), 0);
        assert_eq!(book.ledger().declines, 1);
    }
}
