//! The simulator's book of captures, refunds, authorizations and voids, each
//! keyed by reference: the dedup tables and the ledger at once. A refund is
//! paid back from a capture only while the capture has that much left: the
//! acquirer's own sum rule, which a lenient book (the `lenient-refunds`
//! fault) leaves to its caller. Captures of an authorization keep the same
//! kind of rule: together never above what it holds (unless lenient: the
//! `lenient-captures` fault), and none once a final capture or a void has
//! closed it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use idem_core::acquirer::protocol::{
    AuthorizationCaptureOutcome, AuthorizationCaptureRequest, AuthorizationOutcome,
    AuthorizationRequest, CaptureOutcome, CaptureRequest, Echo, RefundOutcome, RefundRequest,
    VoidOutcome, VoidRequest,
};

/// The result of presenting a request (a capture of either kind, a refund, an
/// authorization, a void) to the book.
pub enum Recorded<O> {
    /// The outcome for this reference: new, or the first one repeated.
    Outcome(O),
    /// The reference is known with other parameters.
    Mismatch,
}

impl<O> Recorded<O> {
    /// The same result with its outcome written as `f` writes it (a capture
    /// of either kind answered on one path).
    pub fn map<P>(self, f: impl FnOnce(O) -> P) -> Recorded<P> {
        match self {
            Self::Outcome(o) => Recorded::Outcome(f(o)),
            Self::Mismatch => Recorded::Mismatch,
        }
    }
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
    /// Every capture made, of either kind, by its reference: what a refund
    /// may pay back from, found without a walk of the captures.
    refundable: HashMap<String, Refundable>,
    authorizations_by_reference: HashMap<String, (AuthorizationRequest, AuthorizationOutcome)>,
    /// Every authorization made, in order.
    authorizations: Vec<LedgerAuthorization>,
    /// What each authorization (by its reference) holds and has captured,
    /// and whether it is closed: the sum rule's reading in constant time, as
    /// `refunded` is for refunds.
    holds: HashMap<String, Hold>,
    authorization_captures_by_reference:
        HashMap<String, (AuthorizationCaptureRequest, AuthorizationCaptureOutcome)>,
    /// Every capture of an authorization made, in order.
    authorization_captures: Vec<LedgerAuthorizationCapture>,
    voids_by_reference: HashMap<String, (VoidRequest, VoidOutcome)>,
    /// Every void made, in order.
    voids: Vec<LedgerVoid>,
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
            refundable: HashMap::new(),
            authorizations_by_reference: HashMap::new(),
            authorizations: Vec::new(),
            holds: HashMap::new(),
            authorization_captures_by_reference: HashMap::new(),
            authorization_captures: Vec::new(),
            voids_by_reference: HashMap::new(),
            voids: Vec::new(),
            epoch: Instant::now(),
        }
    }
}

/// A capture as a refund sees it: what it moved, and in which currency. An
/// authorization is one too, once captured: what its captures moved in all
/// (so a refund may name the authorization, as Adyen's refund of a payment
/// names the payment, and be paid across its captures).
#[derive(Clone)]
struct Refundable {
    capture_id: String,
    amount_cents: i64,
    currency: String,
    /// A capture of an authorization: its authorization's reference, whose
    /// sum its refunds count against too.
    authorization_reference: Option<String>,
}

/// An authorization made, and what became of it since.
struct Hold {
    authorization_id: String,
    order_id: i64,
    /// What it holds in all (what the authorization moved onto the hold).
    amount_cents: i64,
    currency: String,
    /// What its captures took so far.
    captured_cents: i64,
    /// Why it takes no more captures or voids, once closed: a final capture
    /// ([`refusal::AUTHORIZATION_CAPTURED`]) or a void
    /// ([`refusal::AUTHORIZATION_VOIDED`]).
    closed: Option<&'static str>,
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

/// Why the book refuses a refund, an authorization, a capture of an
/// authorization or a void (the `reason` of its `422`).
pub mod refusal {
    /// No capture under that reference (never made, or declined).
    pub const UNKNOWN_CAPTURE: &str = "unknown_capture";
    /// The refund's currency is not the capture's, or a capture's is not
    /// its authorization's.
    pub const CURRENCY_MISMATCH: &str = "currency_mismatch";
    /// More than the capture has left after its earlier refunds.
    pub const EXCEEDS_CAPTURE: &str = "exceeds_capture";
    /// Not a positive amount.
    pub const INVALID_AMOUNT: &str = "invalid_amount";
    /// No authorization under that reference (never made, declined or
    /// refused).
    pub const UNKNOWN_AUTHORIZATION: &str = "unknown_authorization";
    /// More than the authorization has left after its earlier captures.
    pub const EXCEEDS_AUTHORIZATION: &str = "exceeds_authorization";
    /// A final capture has closed the authorization: nothing is left to
    /// capture or to void.
    pub const AUTHORIZATION_CAPTURED: &str = "authorization_captured";
    /// A void has closed the authorization.
    pub const AUTHORIZATION_VOIDED: &str = "authorization_voided";
}

/// One authorization that holds money on a card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerAuthorization {
    pub authorization_id: String,
    pub reference: String,
    pub merchant: String,
    pub order_id: i64,
    /// What it holds (before any capture or void).
    pub amount_cents: i64,
    pub currency: String,
    /// As a capture's.
    pub at_micros: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// One capture of an authorization that moved money. Listed apart from the
/// one-step captures (`captures`), whose count per order is "charged exactly
/// once": an order captured in three parts is charged once, in parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerAuthorizationCapture {
    pub capture_id: String,
    pub reference: String,
    /// The reference of the authorization it captures from.
    pub authorization_reference: String,
    pub authorization_id: String,
    pub merchant: String,
    /// The authorization's order.
    pub order_id: i64,
    pub amount_cents: i64,
    pub currency: String,
    /// It closed the authorization.
    #[serde(rename = "final")]
    pub final_capture: bool,
    /// What it released of the authorization (0 unless final).
    pub released_cents: i64,
    /// As a capture's.
    pub at_micros: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// One void that released what an authorization still held, and closed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerVoid {
    pub void_id: String,
    pub reference: String,
    /// The reference of the authorization it voided.
    pub authorization_reference: String,
    pub authorization_id: String,
    pub merchant: String,
    /// The authorization's order.
    pub order_id: i64,
    /// What it released: the authorization's amount less its captures.
    pub released_cents: i64,
    /// As a capture's.
    pub at_micros: u64,
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
    /// Every refund paid (none in a ledger that predates refunds).
    #[serde(default)]
    pub refunds: Vec<LedgerRefund>,
    /// Every authorization made (none in a ledger that predates them).
    #[serde(default)]
    pub authorizations: Vec<LedgerAuthorization>,
    /// Every capture of an authorization made, each with its
    /// `authorization_reference` (none in a ledger that predates them).
    #[serde(default)]
    pub authorization_captures: Vec<LedgerAuthorizationCapture>,
    /// Every void made (none in a ledger that predates them).
    #[serde(default)]
    pub voids: Vec<LedgerVoid>,
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
        if self
            .authorization_captures_by_reference
            .contains_key(&request.reference)
        {
            // Known as a capture of an authorization: other parameters.
            return Recorded::Mismatch;
        }
        let outcome = if decline {
            CaptureOutcome::Declined {
                reference: request.reference.clone(),
                reason: "insufficient_funds".to_owned(),
            }
        } else {
            let capture_id = self.next_capture_id();
            self.refundable.insert(
                moved.reference.clone(),
                Refundable {
                    capture_id: capture_id.clone(),
                    amount_cents: moved.amount_cents,
                    currency: moved.currency.clone(),
                    authorization_reference: None,
                },
            );
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
        let capture = self.refundable.get(&request.capture_reference).cloned();
        let capture_reference = &request.capture_reference;
        let outcome = match capture {
            _ if request.amount_cents <= 0 => refused(refusal::INVALID_AMOUNT),
            None => refused(refusal::UNKNOWN_CAPTURE),
            Some(c) if c.currency != request.currency => refused(refusal::CURRENCY_MISMATCH),
            Some(c) if !lenient && moved.amount_cents > self.refund_left(capture_reference, &c) => {
                refused(refusal::EXCEEDS_CAPTURE)
            }
            Some(c) => {
                let refund_id = format!("rf_{}", self.refunds.len() + 1);
                *self.refunded.entry(capture_reference.clone()).or_default() += moved.amount_cents;
                if let Some(authorization) = &c.authorization_reference {
                    *self.refunded.entry(authorization.clone()).or_default() += moved.amount_cents;
                }
                self.refunds.push(LedgerRefund {
                    refund_id: refund_id.clone(),
                    reference: moved.reference.clone(),
                    capture_reference: capture_reference.clone(),
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

    /// What a refund of `capture` (under `capture_reference`) may still pay:
    /// what it has left, and for a capture of an authorization no more than
    /// the authorization's captures have left in all.
    fn refund_left(&self, capture_reference: &str, capture: &Refundable) -> i64 {
        let own = capture.amount_cents - self.refunded(capture_reference);
        match capture
            .authorization_reference
            .as_ref()
            .and_then(|a| Some((a, self.refundable.get(a)?)))
        {
            Some((a, all)) => own.min(all.amount_cents - self.refunded(a)),
            None => own,
        }
    }

    /// What the refunds of the capture under `capture_reference` paid back.
    fn refunded(&self, capture_reference: &str) -> i64 {
        self.refunded.get(capture_reference).copied().unwrap_or(0)
    }

    /// The id of the next capture of either kind: one sequence, so a
    /// capture id names one capture whichever list it is in.
    fn next_capture_id(&self) -> String {
        format!(
            "cap_{}",
            self.captures.len() + self.authorization_captures.len() + 1
        )
    }

    /// Presents an authorization of `request`. A known reference gets its
    /// first outcome again (or a mismatch). A new one is refused if its
    /// amount is not positive, declined if `decline`, else holds `held`
    /// (`request` unless a fault lies), and its outcome echoes that.
    pub fn authorize(
        &mut self,
        request: AuthorizationRequest,
        decline: bool,
        held: AuthorizationRequest,
        traceparent: Option<String>,
    ) -> Recorded<AuthorizationOutcome> {
        if let Some((first, outcome)) = self.authorizations_by_reference.get(&request.reference) {
            return if *first == request {
                Recorded::Outcome(outcome.clone())
            } else {
                Recorded::Mismatch
            };
        }
        let outcome = if request.amount_cents <= 0 {
            AuthorizationOutcome::Refused {
                reference: request.reference.clone(),
                reason: refusal::INVALID_AMOUNT.to_owned(),
            }
        } else if decline {
            AuthorizationOutcome::Declined {
                reference: request.reference.clone(),
                reason: "insufficient_funds".to_owned(),
            }
        } else {
            let authorization_id = format!("auth_{}", self.authorizations.len() + 1);
            self.holds.insert(
                request.reference.clone(),
                Hold {
                    authorization_id: authorization_id.clone(),
                    order_id: held.order_id,
                    amount_cents: held.amount_cents,
                    currency: held.currency.clone(),
                    captured_cents: 0,
                    closed: None,
                },
            );
            self.authorizations.push(LedgerAuthorization {
                authorization_id: authorization_id.clone(),
                reference: held.reference.clone(),
                merchant: held.merchant.clone(),
                order_id: held.order_id,
                amount_cents: held.amount_cents,
                currency: held.currency.clone(),
                at_micros: self.micros_since_epoch(),
                traceparent,
            });
            AuthorizationOutcome::Authorized {
                authorization_id,
                reference: request.reference.clone(),
                echo: Echo::of_authorization(&held),
            }
        };
        self.authorizations_by_reference
            .insert(request.reference.clone(), (request, outcome.clone()));
        Recorded::Outcome(outcome)
    }

    pub fn authorization_outcome(&self, reference: &str) -> Option<AuthorizationOutcome> {
        self.authorizations_by_reference
            .get(reference)
            .map(|(_, o)| o.clone())
    }

    /// Presents a capture of `request` from its authorization. A known
    /// reference (of a capture of either kind) gets its first outcome again
    /// (or a mismatch). A new one moves `moved` (`request` unless a fault
    /// lies) if the authorization exists, is not closed, is in its currency
    /// and has that much left after its earlier captures (unless `lenient`:
    /// then whatever it has left); a final one then closes it and releases
    /// the rest, if any. Else it is refused, and the refusal is remembered
    /// as its outcome.
    pub fn capture_authorization(
        &mut self,
        request: AuthorizationCaptureRequest,
        moved: AuthorizationCaptureRequest,
        lenient: bool,
        traceparent: Option<String>,
    ) -> Recorded<AuthorizationCaptureOutcome> {
        if let Some((first, outcome)) = self
            .authorization_captures_by_reference
            .get(&request.reference)
        {
            return if *first == request {
                Recorded::Outcome(outcome.clone())
            } else {
                Recorded::Mismatch
            };
        }
        if self.by_reference.contains_key(&request.reference) {
            // Known as a one-step capture: other parameters.
            return Recorded::Mismatch;
        }
        let refused = |reason: &str| AuthorizationCaptureOutcome::Refused {
            reference: request.reference.clone(),
            reason: reason.to_owned(),
        };
        let capture_id = self.next_capture_id();
        let at_micros = self.micros_since_epoch();
        let outcome = match self.holds.get_mut(&request.authorization_reference) {
            _ if request.amount_cents <= 0 => refused(refusal::INVALID_AMOUNT),
            None => refused(refusal::UNKNOWN_AUTHORIZATION),
            Some(Hold {
                closed: Some(why), ..
            }) => refused(why),
            Some(hold) if hold.currency != request.currency => refused(refusal::CURRENCY_MISMATCH),
            Some(hold)
                if !lenient && moved.amount_cents > hold.amount_cents - hold.captured_cents =>
            {
                refused(refusal::EXCEEDS_AUTHORIZATION)
            }
            Some(hold) => {
                hold.captured_cents += moved.amount_cents;
                let released_cents = if moved.final_capture {
                    hold.closed = Some(refusal::AUTHORIZATION_CAPTURED);
                    (hold.amount_cents - hold.captured_cents).max(0)
                } else {
                    0
                };
                self.refundable.insert(
                    moved.reference.clone(),
                    Refundable {
                        capture_id: capture_id.clone(),
                        amount_cents: moved.amount_cents,
                        currency: moved.currency.clone(),
                        authorization_reference: Some(moved.authorization_reference.clone()),
                    },
                );
                self.refundable
                    .entry(moved.authorization_reference.clone())
                    .or_insert_with(|| Refundable {
                        capture_id: hold.authorization_id.clone(),
                        amount_cents: 0,
                        currency: hold.currency.clone(),
                        authorization_reference: None,
                    })
                    .amount_cents += moved.amount_cents;
                self.authorization_captures
                    .push(LedgerAuthorizationCapture {
                        capture_id: capture_id.clone(),
                        reference: moved.reference.clone(),
                        authorization_reference: moved.authorization_reference.clone(),
                        authorization_id: hold.authorization_id.clone(),
                        merchant: moved.merchant.clone(),
                        order_id: hold.order_id,
                        amount_cents: moved.amount_cents,
                        currency: moved.currency.clone(),
                        final_capture: moved.final_capture,
                        released_cents,
                        at_micros,
                        traceparent,
                    });
                AuthorizationCaptureOutcome::Captured {
                    capture_id,
                    reference: request.reference.clone(),
                    released_cents: Some(released_cents),
                    echo: Echo::of_authorization_capture(&moved),
                }
            }
        };
        self.authorization_captures_by_reference
            .insert(request.reference.clone(), (request, outcome.clone()));
        Recorded::Outcome(outcome)
    }

    pub fn authorization_capture_outcome(
        &self,
        reference: &str,
    ) -> Option<AuthorizationCaptureOutcome> {
        self.authorization_captures_by_reference
            .get(reference)
            .map(|(_, o)| o.clone())
    }

    /// Presents a void of `request`. A known reference gets its first
    /// outcome again (or a mismatch). A new one releases what its
    /// authorization still holds and closes it, unless the authorization is
    /// unknown or already closed (by a final capture or another void): then
    /// it is refused, and the refusal is remembered as its outcome.
    pub fn void(
        &mut self,
        request: VoidRequest,
        traceparent: Option<String>,
    ) -> Recorded<VoidOutcome> {
        if let Some((first, outcome)) = self.voids_by_reference.get(&request.reference) {
            return if *first == request {
                Recorded::Outcome(outcome.clone())
            } else {
                Recorded::Mismatch
            };
        }
        let refused = |reason: &str| VoidOutcome::Refused {
            reference: request.reference.clone(),
            reason: reason.to_owned(),
        };
        let void_id = format!("void_{}", self.voids.len() + 1);
        let at_micros = self.micros_since_epoch();
        let outcome = match self.holds.get_mut(&request.authorization_reference) {
            None => refused(refusal::UNKNOWN_AUTHORIZATION),
            Some(Hold {
                closed: Some(why), ..
            }) => refused(why),
            Some(hold) => {
                let released_cents = (hold.amount_cents - hold.captured_cents).max(0);
                hold.closed = Some(refusal::AUTHORIZATION_VOIDED);
                self.voids.push(LedgerVoid {
                    void_id: void_id.clone(),
                    reference: request.reference.clone(),
                    authorization_reference: request.authorization_reference.clone(),
                    authorization_id: hold.authorization_id.clone(),
                    merchant: request.merchant.clone(),
                    order_id: hold.order_id,
                    released_cents,
                    at_micros,
                    traceparent,
                });
                VoidOutcome::Voided {
                    void_id,
                    reference: request.reference.clone(),
                    released_cents: Some(released_cents),
                    echo: Echo::of_void(&request),
                }
            }
        };
        self.voids_by_reference
            .insert(request.reference.clone(), (request, outcome.clone()));
        Recorded::Outcome(outcome)
    }

    pub fn void_outcome(&self, reference: &str) -> Option<VoidOutcome> {
        self.voids_by_reference
            .get(reference)
            .map(|(_, o)| o.clone())
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
            authorizations: self.authorizations.clone(),
            authorization_captures: self.authorization_captures.clone(),
            voids: self.voids.clone(),
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

    fn authorization(reference: &str, amount: i64) -> AuthorizationRequest {
        AuthorizationRequest {
            reference: reference.into(),
            merchant: "m".into(),
            order_id: 7,
            amount_cents: amount,
            currency: "BRL".into(),
        }
    }

    fn authorize(
        book: &mut Book,
        request: AuthorizationRequest,
        decline: bool,
    ) -> AuthorizationOutcome {
        let held = request.clone();
        match book.authorize(request, decline, held, None) {
            Recorded::Outcome(o) => o,
            Recorded::Mismatch => panic!("a mismatch"),
        }
    }

    fn part(
        reference: &str,
        authorization_reference: &str,
        amount: i64,
        final_capture: bool,
    ) -> AuthorizationCaptureRequest {
        AuthorizationCaptureRequest {
            reference: reference.into(),
            authorization_reference: authorization_reference.into(),
            merchant: "m".into(),
            amount_cents: amount,
            currency: "BRL".into(),
            final_capture,
        }
    }

    fn capture_part(
        book: &mut Book,
        request: AuthorizationCaptureRequest,
    ) -> AuthorizationCaptureOutcome {
        let moved = request.clone();
        match book.capture_authorization(request, moved, false, None) {
            Recorded::Outcome(o) => o,
            Recorded::Mismatch => panic!("a mismatch"),
        }
    }

    fn void_of(reference: &str, authorization_reference: &str) -> VoidRequest {
        VoidRequest {
            reference: reference.into(),
            authorization_reference: authorization_reference.into(),
            merchant: "m".into(),
        }
    }

    fn void(book: &mut Book, request: VoidRequest) -> VoidOutcome {
        match book.void(request, None) {
            Recorded::Outcome(o) => o,
            Recorded::Mismatch => panic!("a mismatch"),
        }
    }

    /// What a capture of an authorization came to: its released cents, or
    /// the reason it was refused.
    fn part_came_to(outcome: &AuthorizationCaptureOutcome) -> Result<i64, &str> {
        match outcome {
            AuthorizationCaptureOutcome::Captured { released_cents, .. } => {
                Ok(released_cents.expect("the simulator says what it released"))
            }
            AuthorizationCaptureOutcome::Refused { reason, .. } => Err(reason),
        }
    }

    fn void_came_to(outcome: &VoidOutcome) -> Result<i64, &str> {
        match outcome {
            VoidOutcome::Voided { released_cents, .. } => {
                Ok(released_cents.expect("the simulator says what it released"))
            }
            VoidOutcome::Refused { reason, .. } => Err(reason),
        }
    }

    fn captured_of(book: &Book, authorization_reference: &str) -> i64 {
        book.ledger()
            .authorization_captures
            .iter()
            .filter(|c| c.authorization_reference == authorization_reference)
            .map(|c| c.amount_cents)
            .sum()
    }

    #[test]
    fn a_refund_may_name_the_authorization_and_is_paid_across_its_captures_once() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        assert_eq!(
            reason(&refund(&mut book, refund_of("r0", "a1", 1))),
            "unknown_capture",
            "nothing captured yet"
        );
        capture_part(&mut book, part("c1", "a1", 30, false));
        capture_part(&mut book, part("c2", "a1", 50, false));
        assert_eq!(
            reason(&refund(&mut book, refund_of("r1", "a1", 81))),
            "exceeds_capture"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r2", "a1", 60))),
            "refunded",
            "across both captures"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r3", "c2", 30))),
            "exceeds_capture",
            "c2 has 50 of its own, but the authorization only 20 left"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r4", "c2", 20))),
            "refunded"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r5", "a1", 1))),
            "exceeds_capture",
            "all 80 captured are refunded"
        );
    }

    #[test]
    fn captures_of_an_authorization_never_sum_above_it_and_a_final_one_releases_the_rest() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c1", "a1", 30, false))),
            Ok(0)
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c2", "a1", 50, false))),
            Ok(0)
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c3", "a1", 21, false))),
            Err("exceeds_authorization"),
            "20 remain"
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c4", "a1", 21, true))),
            Err("exceeds_authorization"),
            "a final capture is bound by the same sum"
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c5", "a1", 5, true))),
            Ok(15),
            "the final capture releases what remains"
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c6", "a1", 1, false))),
            Err("authorization_captured"),
            "nothing is captured after a final capture"
        );
        assert_eq!(
            void_came_to(&void(&mut book, void_of("v1", "a1"))),
            Err("authorization_captured"),
            "nor voided"
        );
        assert_eq!(captured_of(&book, "a1"), 85);
        let ledger = book.ledger();
        assert_eq!(ledger.authorization_captures.len(), 3);
        assert!(ledger.voids.is_empty());
        assert_eq!(
            ledger
                .authorization_captures
                .iter()
                .map(|c| c.final_capture)
                .collect::<Vec<_>>(),
            [false, false, true]
        );
        assert!(ledger
            .authorization_captures
            .iter()
            .all(|c| c.authorization_id == "auth_1" && c.order_id == 7));
        assert!(
            ledger.captures.is_empty(),
            "one-step captures are listed apart"
        );
        assert!(ledger.counts.is_empty());
    }

    #[test]
    fn the_sum_rule_holds_for_any_order_of_partial_captures() {
        // Every split of 100 into parts of 1 to 13, each presented in turn:
        // what is captured never exceeds 100, and every refusal came when
        // the part did not fit.
        for step in 1..=13 {
            let mut book = Book::default();
            authorize(&mut book, authorization("a", 100), false);
            let mut expected = 0;
            for n in 0..(100 / step + 2) {
                let came_to = capture_part(&mut book, part(&format!("c{n}"), "a", step, false));
                if expected + step <= 100 {
                    assert_eq!(part_came_to(&came_to), Ok(0), "step {step}, part {n}");
                    expected += step;
                } else {
                    assert_eq!(part_came_to(&came_to), Err("exceeds_authorization"));
                }
                assert_eq!(captured_of(&book, "a"), expected);
            }
        }
    }

    #[test]
    fn a_lenient_book_captures_past_the_authorization_but_never_once_closed() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        let lenient = |book: &mut Book, request: AuthorizationCaptureRequest| {
            let moved = request.clone();
            match book.capture_authorization(request, moved, true, None) {
                Recorded::Outcome(o) => o,
                Recorded::Mismatch => panic!("a mismatch"),
            }
        };
        assert_eq!(
            part_came_to(&lenient(&mut book, part("c1", "a1", 60, false))),
            Ok(0)
        );
        assert_eq!(
            part_came_to(&lenient(&mut book, part("c2", "a1", 61, false))),
            Ok(0),
            "past what the authorization has left: the caller's sum to keep"
        );
        assert_eq!(captured_of(&book, "a1"), 121);
        assert_eq!(
            part_came_to(&lenient(&mut book, part("c3", "a1", 5, true))),
            Ok(0),
            "a final capture releases nothing when nothing remains"
        );
        assert_eq!(
            part_came_to(&lenient(&mut book, part("c4", "a1", 1, false))),
            Err("authorization_captured"),
            "closed is closed, lenient or not"
        );
        authorize(&mut book, authorization("a2", 100), false);
        assert_eq!(void_came_to(&void(&mut book, void_of("v1", "a2"))), Ok(100));
        assert_eq!(
            part_came_to(&lenient(&mut book, part("c5", "a2", 1, false))),
            Err("authorization_voided")
        );
        assert_eq!(book.ledger().authorization_captures.len(), 3);
    }

    #[test]
    fn a_void_releases_what_remains_and_closes_the_authorization() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c1", "a1", 30, false))),
            Ok(0)
        );
        assert_eq!(void_came_to(&void(&mut book, void_of("v1", "a1"))), Ok(70));
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c2", "a1", 10, false))),
            Err("authorization_voided"),
            "nothing is captured after a void"
        );
        assert_eq!(
            void_came_to(&void(&mut book, void_of("v2", "a1"))),
            Err("authorization_voided"),
            "a second void, under another reference, releases nothing"
        );
        assert_eq!(
            void_came_to(&void(&mut book, void_of("v1", "a1"))),
            Ok(70),
            "the same reference, the first outcome"
        );
        assert!(matches!(
            book.void(void_of("v1", "a2"), None),
            Recorded::Mismatch
        ));
        assert_eq!(
            void_came_to(&void(&mut book, void_of("v3", "nope"))),
            Err("unknown_authorization")
        );
        let ledger = book.ledger();
        assert_eq!(ledger.voids.len(), 1);
        assert_eq!(ledger.voids[0].released_cents, 70);
        assert_eq!(ledger.voids[0].authorization_id, "auth_1");
        assert_eq!(
            void_came_to(&book.void_outcome("v2").expect("a refusal is remembered")),
            Err("authorization_voided")
        );
    }

    #[test]
    fn captures_of_an_authorization_refuse_what_a_real_acquirer_refuses() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        authorize(&mut book, authorization("declined", 100), true);
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c1", "nope", 10, false))),
            Err("unknown_authorization")
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c2", "declined", 10, false))),
            Err("unknown_authorization"),
            "a declined authorization holds nothing"
        );
        assert_eq!(
            part_came_to(&capture_part(&mut book, part("c3", "a1", 0, false))),
            Err("invalid_amount")
        );
        let mut other_currency = part("c4", "a1", 10, false);
        other_currency.currency = "USD".into();
        assert_eq!(
            part_came_to(&capture_part(&mut book, other_currency)),
            Err("currency_mismatch")
        );
        assert_eq!(captured_of(&book, "a1"), 0);
        assert_eq!(
            part_came_to(
                &book
                    .authorization_capture_outcome("c1")
                    .expect("remembered")
            ),
            Err("unknown_authorization")
        );
        let refused = authorize(&mut book, authorization("a0", 0), false);
        assert!(
            matches!(&refused, AuthorizationOutcome::Refused { reason, .. } if reason == "invalid_amount"),
            "{refused:?}"
        );
        let ledger = book.ledger();
        assert_eq!(
            ledger.authorizations.len(),
            1,
            "only what holds money is listed"
        );
        assert_eq!(ledger.declines, 0, "declines count one-step captures");
    }

    #[test]
    fn each_reference_is_made_once_and_captures_share_one_space_of_references() {
        let mut book = Book::default();
        let first = authorize(&mut book, authorization("a1", 100), false);
        assert_eq!(authorize(&mut book, authorization("a1", 100), false), first);
        assert!(matches!(
            book.authorize(
                authorization("a1", 99),
                false,
                authorization("a1", 99),
                None
            ),
            Recorded::Mismatch
        ));
        let captured = capture_part(&mut book, part("c1", "a1", 40, false));
        assert_eq!(
            capture_part(&mut book, part("c1", "a1", 40, false)),
            captured
        );
        assert!(matches!(
            book.capture_authorization(
                part("c1", "a1", 40, true),
                part("c1", "a1", 40, true),
                false,
                None
            ),
            Recorded::Mismatch
        ));
        assert!(
            matches!(capture(&mut book, req("c1", 40), false), Recorded::Mismatch),
            "a capture of an authorization's reference is no one-step capture's"
        );
        capture(&mut book, req("one-step", 10), false);
        assert!(matches!(
            book.capture_authorization(
                part("one-step", "a1", 10, false),
                part("one-step", "a1", 10, false),
                false,
                None
            ),
            Recorded::Mismatch
        ));
        let ledger = book.ledger();
        assert_eq!(ledger.authorizations.len(), 1);
        assert_eq!(ledger.authorization_captures.len(), 1);
        assert_eq!(captured_of(&book, "a1"), 40);
        assert_eq!(ledger.captures.len(), 1);
        assert_eq!(
            (
                ledger.authorization_captures[0].capture_id.as_str(),
                ledger.captures[0].capture_id.as_str()
            ),
            ("cap_1", "cap_2"),
            "one sequence of capture ids"
        );
    }

    #[test]
    fn a_capture_of_an_authorization_is_refunded_as_a_capture_is() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        capture_part(&mut book, part("c1", "a1", 60, false));
        assert_eq!(
            reason(&refund(&mut book, refund_of("r1", "c1", 50))),
            "refunded"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r2", "c1", 11))),
            "exceeds_capture",
            "a refund is bound by its capture, not by the authorization"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r3", "a1", 11))),
            "exceeds_capture",
            "naming the authorization, bound by all its captures less their refunds"
        );
        assert_eq!(
            reason(&refund(&mut book, refund_of("r4", "a1", 10))),
            "refunded"
        );
        assert_eq!(book.ledger().refunds[0].capture_id, "cap_1");
    }

    #[test]
    fn a_lie_about_a_capture_of_an_authorization_moves_what_it_says_within_the_sum() {
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        let asked = part("c1", "a1", 50, false);
        let moved = crate::sim::Fault::WrongAmount.captures_of_authorization(&asked);
        let Recorded::Outcome(AuthorizationCaptureOutcome::Captured { echo, .. }) =
            book.capture_authorization(asked, moved, false, None)
        else {
            panic!()
        };
        assert_eq!(echo.amount_cents, Some(51));
        assert_eq!(captured_of(&book, "a1"), 51, "the ledger has what moved");
        let asked = part("c2", "a1", 49, false);
        let moved = crate::sim::Fault::WrongAmount.captures_of_authorization(&asked);
        assert!(
            matches!(
                book.capture_authorization(asked, moved, false, None),
                Recorded::Outcome(AuthorizationCaptureOutcome::Refused { .. })
            ),
            "a lie still keeps to the sum"
        );
        assert_eq!(captured_of(&book, "a1"), 51);
    }

    #[test]
    fn a_ledger_without_two_step_payments_still_reads() {
        let old = r#"{"captures":[],"refunds":[],"counts":[],"declines":0}"#;
        let ledger: Ledger = serde_json::from_str(old).expect("an older ledger parses");
        assert!(ledger.authorizations.is_empty());
        assert!(ledger.authorization_captures.is_empty());
        assert!(ledger.voids.is_empty());
        let mut book = Book::default();
        authorize(&mut book, authorization("a1", 100), false);
        capture_part(&mut book, part("c1", "a1", 100, true));
        let written = serde_json::to_value(book.ledger()).expect("json");
        assert_eq!(written["authorization_captures"][0]["final"], true);
        assert_eq!(
            written["authorization_captures"][0]["authorization_reference"],
            "a1"
        );
        let read: Ledger = serde_json::from_value(written).expect("reads back");
        let now = book.ledger();
        assert_eq!(read.authorizations, now.authorizations);
        assert_eq!(read.authorization_captures, now.authorization_captures);
    }
}
