//! What an idempotency key stands for: the charge, the refund, the capture or
//! the void its first request made. One key space serves every operation, so a key's record,
//! tombstone and answers name their subject by this id.

use super::{ChargeId, RefundId, StepId, StepKind};

/// The id of a key's subject: `ch_...`, `re_...`, `cp_...` or `vd_...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SubjectId {
    Charge(ChargeId),
    Refund(RefundId),
    /// A capture or a void (its id says which).
    Step(StepId),
}

impl SubjectId {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Charge(id) => id.as_str(),
            Self::Refund(id) => id.as_str(),
            Self::Step(id) => id.as_str(),
        }
    }

    /// The subject's kind as the API names it: `charge`, `refund`, `capture`
    /// or `void`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Charge(_) => "charge",
            Self::Refund(_) => "refund",
            Self::Step(id) => id.kind().as_str(),
        }
    }

    /// Where the API shows the subject: `/v1/charges/{id}` or `/v1/refunds/{id}`.
    pub fn location(&self) -> String {
        match self {
            Self::Charge(id) => format!("/v1/charges/{id}"),
            Self::Refund(id) => format!("/v1/refunds/{id}"),
            Self::Step(id) => match id.kind() {
                StepKind::Capture => format!("/v1/captures/{id}"),
                StepKind::Void => format!("/v1/voids/{id}"),
            },
        }
    }

    /// The subject of a key record or tombstone, from its three columns (a
    /// record names exactly one); `None` when it names none.
    pub fn from_columns(
        charge_id: Option<String>,
        refund_id: Option<String>,
        step_id: Option<String>,
    ) -> Option<Self> {
        match (charge_id, refund_id, step_id) {
            (Some(id), _, _) => Some(Self::Charge(ChargeId::from_trusted(id))),
            (None, Some(id), _) => Some(Self::Refund(RefundId::from_trusted(id))),
            (None, None, Some(id)) => Some(Self::Step(StepId::from_trusted(id))),
            (None, None, None) => None,
        }
    }
}

impl std::fmt::Display for SubjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ChargeId> for SubjectId {
    fn from(id: ChargeId) -> Self {
        Self::Charge(id)
    }
}

impl From<RefundId> for SubjectId {
    fn from(id: RefundId) -> Self {
        Self::Refund(id)
    }
}

impl From<StepId> for SubjectId {
    fn from(id: StepId) -> Self {
        Self::Step(id)
    }
}
