//! A scripted acquirer: each test says, call by call, what the acquirer
//! answers, and reads back what it was asked. No network, no simulator: an
//! answer is a value the test wrote, and an acquirer that hangs at the worst
//! moment is a [`Gate`] the test opens when it chooses.
//!
//! A call nobody scripted panics, naming the call and its reference: an
//! engine that calls the acquirer where it must not fails the test at that
//! call, not at a count afterwards.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::acquirer::protocol::{
    AuthorizationCaptureRequest, AuthorizationRequest, CaptureRequest, RefundRequest, VoidRequest,
};
use idem_core::acquirer::{
    Acquirer, AcquirerError, AuthorizationCaptureSettled, AuthorizationCaptured,
    AuthorizationSettled, Authorized, Captured, Contradiction, Declined, RefundSettled, Refunded,
    Settled, Unknown, VoidSettled, Voided,
};
use tokio::sync::Notify;

/// How long a test waits for a call to reach a gate before it fails: far
/// longer than any engine step here takes, so only a call that never comes
/// reaches it.
const GATE_PATIENCE: Duration = Duration::from_secs(10);

/// The ten calls of [`Acquirer`], as the script and the log name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    Capture,
    Lookup,
    Refund,
    LookupRefund,
    Authorize,
    LookupAuthorization,
    CaptureAuthorization,
    LookupAuthorizationCapture,
    Void,
    LookupVoid,
}

/// What the acquirer says to one call, in words every call shares; the fake
/// turns it into that call's result.
#[derive(Debug, Clone)]
pub enum Says {
    /// Done as asked (a POST's `201`, a lookup's `200`): the acquirer's id for it.
    Done(&'static str),
    /// Declined (`402`), for this reason.
    Declined(&'static str),
    /// Refused for good (`422`), for this reason.
    Refused(&'static str),
    /// Done, but not as asked: the echo differs as this says.
    Contradicted(&'static str),
    /// No word that settles it (a timeout, a `5xx`): its cause, and the
    /// acquirer's `Retry-After` if it sent one.
    Unknown {
        cause: &'static str,
        retry_after: Option<Duration>,
    },
    /// A lookup's `404`: no outcome for the reference yet.
    Nothing,
    /// The call waits at the gate until the test opens it, then says the rest.
    Held(Arc<Gate>, Box<Says>),
}

impl Says {
    /// A call that timed out.
    pub fn timeout() -> Self {
        Self::Unknown {
            cause: "timeout",
            retry_after: None,
        }
    }

    /// `then`, once the test opens `gate`; never, if it does not.
    pub fn held(gate: &Arc<Gate>, then: Says) -> Self {
        Self::Held(gate.clone(), Box::new(then))
    }
}

/// Where a held call waits: the test learns the call arrived, and lets it
/// answer when it chooses.
#[derive(Debug, Default)]
pub struct Gate {
    reached: Notify,
    opened: Notify,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Returns once a call waits here (at once, if one already does).
    pub async fn reached(&self) {
        tokio::time::timeout(GATE_PATIENCE, self.reached.notified())
            .await
            .expect("no call reached the gate");
    }

    /// Lets the call waiting here (or the next to come) answer.
    pub fn open(&self) {
        self.opened.notify_one();
    }
}

/// The scripted acquirer. Cheap to clone: every clone shares one script and
/// one log, so a test keeps one while the engine holds another.
#[derive(Clone, Default)]
pub struct FakeAcquirer {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// What each kind of call says next, first in first out.
    script: HashMap<Call, VecDeque<Says>>,
    /// Every call made, in order, with its reference.
    log: Vec<(Call, String)>,
}

impl FakeAcquirer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues what the next calls of `call` say, in order, after any
    /// already queued.
    pub fn script(&self, call: Call, answers: impl IntoIterator<Item = Says>) -> &Self {
        self.lock().script.entry(call).or_default().extend(answers);
        self
    }

    /// How many times `call` was made.
    pub fn calls(&self, call: Call) -> usize {
        self.lock().log.iter().filter(|(c, _)| *c == call).count()
    }

    /// How many calls of any kind named `reference`.
    pub fn calls_for(&self, reference: &str) -> usize {
        self.lock()
            .log
            .iter()
            .filter(|(_, r)| r == reference)
            .count()
    }

    /// The references `call` was made with, in order.
    pub fn references(&self, call: Call) -> Vec<String> {
        self.lock()
            .log
            .iter()
            .filter(|(c, _)| *c == call)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Answers still queued and never asked for, by call.
    pub fn unused(&self) -> Vec<(Call, usize)> {
        self.lock()
            .script
            .iter()
            .filter(|(_, answers)| !answers.is_empty())
            .map(|(call, answers)| (*call, answers.len()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A test that panicked holding the lock has failed already; the
        // script is still readable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs the call, takes its answer from the script, and waits at the
    /// answer's gate, if it has one.
    async fn answer(&self, call: Call, reference: &str) -> Says {
        let next = {
            let mut state = self.lock();
            state.log.push((call, reference.to_owned()));
            state.script.get_mut(&call).and_then(VecDeque::pop_front)
        };
        let mut says = next.unwrap_or_else(|| panic!("unscripted {call:?} of {reference}"));
        while let Says::Held(gate, then) = says {
            gate.reached.notify_one();
            gate.opened.notified().await;
            says = *then;
        }
        says
    }

    /// A POST's result: what it made, or why not.
    async fn post<T>(
        &self,
        call: Call,
        reference: &str,
        made: impl FnOnce(String) -> T,
    ) -> Result<T, AcquirerError> {
        match self.answer(call, reference).await {
            Says::Done(id) => Ok(made(id.to_owned())),
            Says::Nothing => panic!("{call:?} is a POST: it cannot answer Nothing"),
            other => Err(error(other)),
        }
    }

    /// A lookup's result: the outcome found, none (`404`), or no word.
    async fn look<T>(
        &self,
        call: Call,
        reference: &str,
        made: impl FnOnce(String) -> T,
    ) -> Result<Option<Result<T, AcquirerError>>, AcquirerError> {
        match self.answer(call, reference).await {
            Says::Nothing => Ok(None),
            Says::Done(id) => Ok(Some(Ok(made(id.to_owned())))),
            unknown @ Says::Unknown { .. } => Err(error(unknown)),
            other => Ok(Some(Err(error(other)))),
        }
    }
}

/// The acquirer's error for an answer that is not `Done` or `Nothing`.
fn error(says: Says) -> AcquirerError {
    match says {
        Says::Declined(reason) => AcquirerError::Declined(Declined {
            reason: reason.to_owned(),
        }),
        Says::Refused(reason) => AcquirerError::Rejected {
            status: 422,
            reason: Some(reason.to_owned()),
        },
        Says::Contradicted(difference) => AcquirerError::Contradicted(Contradiction {
            capture_id: "acq_contradicted".to_owned(),
            differences: vec![difference.to_owned()],
        }),
        Says::Unknown { cause, retry_after } => AcquirerError::Unknown(Unknown {
            why: format!("scripted: {cause}"),
            cause: cause.to_owned(),
            retry_after,
        }),
        Says::Done(_) | Says::Nothing | Says::Held(..) => unreachable!("not an error: {says:?}"),
    }
}

#[async_trait::async_trait]
impl Acquirer for FakeAcquirer {
    async fn capture(&self, request: &CaptureRequest) -> Settled {
        self.post(Call::Capture, &request.reference, |capture_id| Captured {
            capture_id,
        })
        .await
    }

    async fn lookup(&self, request: &CaptureRequest) -> Result<Option<Settled>, AcquirerError> {
        self.look(Call::Lookup, &request.reference, |capture_id| Captured {
            capture_id,
        })
        .await
    }

    async fn refund(&self, request: &RefundRequest) -> RefundSettled {
        self.post(Call::Refund, &request.reference, |refund_id| Refunded {
            refund_id,
        })
        .await
    }

    async fn lookup_refund(
        &self,
        request: &RefundRequest,
    ) -> Result<Option<RefundSettled>, AcquirerError> {
        self.look(Call::LookupRefund, &request.reference, |refund_id| {
            Refunded { refund_id }
        })
        .await
    }

    async fn authorize(&self, request: &AuthorizationRequest) -> AuthorizationSettled {
        self.post(Call::Authorize, &request.reference, |authorization_id| {
            Authorized { authorization_id }
        })
        .await
    }

    async fn lookup_authorization(
        &self,
        request: &AuthorizationRequest,
    ) -> Result<Option<AuthorizationSettled>, AcquirerError> {
        self.look(
            Call::LookupAuthorization,
            &request.reference,
            |authorization_id| Authorized { authorization_id },
        )
        .await
    }

    async fn capture_authorization(
        &self,
        request: &AuthorizationCaptureRequest,
    ) -> AuthorizationCaptureSettled {
        self.post(
            Call::CaptureAuthorization,
            &request.reference,
            |capture_id| AuthorizationCaptured {
                capture_id,
                released_cents: None,
            },
        )
        .await
    }

    async fn lookup_authorization_capture(
        &self,
        request: &AuthorizationCaptureRequest,
    ) -> Result<Option<AuthorizationCaptureSettled>, AcquirerError> {
        self.look(
            Call::LookupAuthorizationCapture,
            &request.reference,
            |capture_id| AuthorizationCaptured {
                capture_id,
                released_cents: None,
            },
        )
        .await
    }

    async fn void(&self, request: &VoidRequest) -> VoidSettled {
        self.post(Call::Void, &request.reference, |void_id| Voided {
            void_id,
            released_cents: None,
        })
        .await
    }

    async fn lookup_void(
        &self,
        request: &VoidRequest,
    ) -> Result<Option<VoidSettled>, AcquirerError> {
        self.look(Call::LookupVoid, &request.reference, |void_id| Voided {
            void_id,
            released_cents: None,
        })
        .await
    }
}
