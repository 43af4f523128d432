"""What a call raises when it has no stored outcome to return.

Every error carries the call's idempotency ``key`` and its ``attempts``: with
the key, a caller can always come back to the same intent.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ._types import Attempt, Refund


class IdemError(Exception):
    """A call that ended without a result (:class:`ChargeResult` or
    :class:`RefundResult`)."""

    key: str
    """The idempotency key every attempt carried."""
    attempts: List[Attempt]
    """Every attempt, in order; empty only when the deadline left no room for one."""

    def __init__(self, message: str, *, key: str, attempts: Sequence[Attempt]) -> None:
        super().__init__(message)
        self.key = key
        self.attempts = list(attempts)


class KeyReusedError(IdemError):
    """``422`` ``idempotency-key-reused``: the key was first used with another
    request (or another operation: a charge's key sent to a refund, a refund's
    to a charge or to a refund of another charge). Nothing was charged or
    refunded by this call. A new intent needs a new key; the same intent must
    send the very same request."""

    charge_id: Optional[str]
    """The charge the key's first request made (when idem names it)."""
    differing_fields: List[str]
    """The request fields that differ from the key's first request
    (``["operation"]`` for a key of another operation)."""
    problem: Dict[str, Any]
    refund_id: Optional[str]
    """The refund the key's first request made, when it was a refund."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: Optional[str],
        differing_fields: Sequence[str],
        problem: Dict[str, Any],
        refund_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.differing_fields = list(differing_fields)
        self.problem = problem
        self.refund_id = refund_id


class KeyExpiredError(IdemError):
    """``410`` ``key-expired``: the same request came after its key's TTL. It
    made ``charge_id`` (or, for a refund, ``refund_id``) before; nothing was
    charged or refunded again. Look it up (``GET /v1/charges/{charge_id}``,
    ``GET /v1/refunds/{refund_id}``) instead of sending it again."""

    charge_id: Optional[str]
    problem: Dict[str, Any]
    refund_id: Optional[str]
    """The refund this request made, when it was a refund."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: Optional[str],
        problem: Dict[str, Any],
        refund_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.problem = problem
        self.refund_id = refund_id


class RefundFailedError(IdemError):
    """``422`` ``refund-failed``: the acquirer refused the refund for good. It
    is the key's stored outcome (a retry with the key replays it); no money
    moved, and the amount is the charge's to refund again, with a new key."""

    refund: Refund
    """The refund, ``status`` ``failed``, with the acquirer's ``failure_reason``."""
    replayed: bool
    """The answer was stored before (``Idempotent-Replayed: true``)."""
    idempotency_ttl: Optional[int]
    """``Idempotency-TTL``: seconds the key is still honoured."""
    problem: Dict[str, Any]
    body: bytes
    """The answer's body, exactly as read."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        refund: Refund,
        replayed: bool,
        idempotency_ttl: Optional[int],
        problem: Dict[str, Any],
        body: bytes,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.refund = refund
        self.replayed = replayed
        self.idempotency_ttl = idempotency_ttl
        self.problem = problem
        self.body = body


class RefundExceedsCapturedError(IdemError):
    """``422`` ``refund-exceeds-captured``: more than the charge has left to
    refund (succeeded and pending refunds count). Nothing was stored and the
    key is still free: the same key with an amount of at most
    ``remaining_cents`` is a refund. Not retried: no retry changes it."""

    charge_id: str
    """The charge the call tried to refund."""
    remaining_cents: Optional[int]
    """What the charge has left to refund (``0``: nothing), when idem says."""
    problem: Dict[str, Any]

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: str,
        remaining_cents: Optional[int],
        problem: Dict[str, Any],
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.remaining_cents = remaining_cents
        self.problem = problem


class ChargeNotRefundableError(IdemError):
    """``422`` ``charge-not-refundable``: the charge is not ``captured`` (still
    ``processing``, ``declined``, ``failed``) or awaits review; ``problem``'s
    ``detail`` names its status. Nothing was stored and the key is still free:
    the same request with the same key works once the charge is captured."""

    charge_id: str
    """The charge the call tried to refund."""
    problem: Dict[str, Any]

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: str,
        problem: Dict[str, Any],
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.problem = problem


class ApiError(IdemError):
    """Any other final answer: ``400``, ``401``, ``413``, ``415``, ``500``, a
    ``3xx`` (redirects are not followed), ... Retrying the same request will not
    change it; ``problem`` says what to fix."""

    status: int
    problem: Optional[Dict[str, Any]]
    """The problem document (``type``, ``title``, ``detail``, ``field``), when the body was one."""
    body: bytes

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        status: int,
        problem: Optional[Dict[str, Any]],
        body: bytes,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.status = status
        self.problem = problem
        self.body = body


class GaveUpError(IdemError):
    """No final answer within the policy's attempts or deadline.

    The charge (or refund) may have happened: the outcome is unknown. Send it
    again later with the same key (``idempotency_key=err.key``, or for a
    refund ``key=err.key``) and the same request: idem answers with the stored
    outcome, or finishes it, never charging or refunding twice.
    """

    last: str
    """The last attempt's outcome, and why no further attempt was made."""

    def __init__(self, message: str, *, key: str, attempts: Sequence[Attempt], last: str) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.last = last
