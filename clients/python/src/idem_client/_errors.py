"""What a call raises when it has no stored outcome to return.

Every error carries the call's idempotency ``key`` and its ``attempts``: with
the key, a caller can always come back to the same intent.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ._types import Attempt, Capture, Refund, Void


class IdemError(Exception):
    """A call that ended without a result (:class:`ChargeResult`,
    :class:`RefundResult`, :class:`CaptureResult` or :class:`VoidResult`)."""

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
    to a charge or to a refund of another charge, a capture's to a void...).
    Nothing was done by this call. A new intent needs a new key; the same
    intent must send the very same request."""

    charge_id: Optional[str]
    """The charge the key's first request made (when idem names it)."""
    differing_fields: List[str]
    """The request fields that differ from the key's first request
    (``["operation"]`` for a key of another operation)."""
    problem: Dict[str, Any]
    refund_id: Optional[str]
    """The refund the key's first request made, when it was a refund."""
    capture_id: Optional[str]
    """The capture the key's first request made, when it was a capture."""
    void_id: Optional[str]
    """The void the key's first request made, when it was a void."""

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
        capture_id: Optional[str] = None,
        void_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.differing_fields = list(differing_fields)
        self.problem = problem
        self.refund_id = refund_id
        self.capture_id = capture_id
        self.void_id = void_id


class KeyExpiredError(IdemError):
    """``410`` ``key-expired``: the same request came after its key's TTL. It
    made ``charge_id`` (or, for a refund, ``refund_id``; a capture,
    ``capture_id``; a void, ``void_id``) before; nothing was done again. Look
    it up (``GET /v1/charges/{charge_id}``, ``GET /v1/refunds/{refund_id}``,
    ``GET /v1/captures/{capture_id}``, ``GET /v1/voids/{void_id}``) instead of
    sending it again."""

    charge_id: Optional[str]
    problem: Dict[str, Any]
    refund_id: Optional[str]
    """The refund this request made, when it was a refund."""
    capture_id: Optional[str]
    """The capture this request made, when it was a capture."""
    void_id: Optional[str]
    """The void this request made, when it was a void."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: Optional[str],
        problem: Dict[str, Any],
        refund_id: Optional[str] = None,
        capture_id: Optional[str] = None,
        void_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.problem = problem
        self.refund_id = refund_id
        self.capture_id = capture_id
        self.void_id = void_id


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


class CaptureFailedError(IdemError):
    """``422`` ``capture-failed``: the acquirer refused the capture for good.
    It is the key's stored outcome (a retry with the key replays it); no
    money moved, and its amount is the authorization's to capture again, with
    a new key (a final capture's closing is undone)."""

    capture: Capture
    """The capture, ``status`` ``failed``, with the acquirer's ``failure_reason``."""
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
        capture: Capture,
        replayed: bool,
        idempotency_ttl: Optional[int],
        problem: Dict[str, Any],
        body: bytes,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.capture = capture
        self.replayed = replayed
        self.idempotency_ttl = idempotency_ttl
        self.problem = problem
        self.body = body


class VoidFailedError(IdemError):
    """``422`` ``void-failed``: the acquirer refused the void for good. It is
    the key's stored outcome; the authorization is open again (capture it, or
    void it with a new key)."""

    void: Void
    """The void, ``status`` ``failed``, with the acquirer's ``failure_reason``."""
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
        void: Void,
        replayed: bool,
        idempotency_ttl: Optional[int],
        problem: Dict[str, Any],
        body: bytes,
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.void = void
        self.replayed = replayed
        self.idempotency_ttl = idempotency_ttl
        self.problem = problem
        self.body = body


class CaptureExceedsAuthorizationError(IdemError):
    """``422`` ``capture-exceeds-authorization``: more than the authorization
    has left (captures made and pending count). Nothing was stored and the
    key is still free: the same key with at most ``remaining_cents`` is a
    capture. Not retried: no retry changes what is left."""

    charge_id: str
    """The charge the call tried to capture."""
    remaining_cents: Optional[int]
    """What the authorization has left to capture (``0``: nothing), when idem says."""
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


class ChargeNotAuthorizedError(IdemError):
    """``422`` ``charge-not-authorized``: a capture or a void of a charge that
    is not an open authorization (a one-step charge, one captured or voided
    already, declined, failed, still ``processing``, or awaiting review);
    ``problem``'s ``detail`` names its status. Nothing was stored and the key
    is still free. Not retried: no retry reopens an authorization."""

    charge_id: str
    """The charge the call tried to capture or void."""
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

    The charge (or refund, authorization, capture, void) may have happened:
    the outcome is unknown. Send it again later with the same key
    (``idempotency_key=err.key``) and the same request: idem answers with the
    stored outcome, or finishes it, never doing it twice. (A capture or a void
    that gave up on ``409`` ``authorization-closed`` or ``capture-pending``
    did nothing yet: another step of the authorization was still pending, and
    the same key later gets this one's answer once that step settled.)
    """

    last: str
    """The last attempt's outcome, and why no further attempt was made."""

    def __init__(self, message: str, *, key: str, attempts: Sequence[Attempt], last: str) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.last = last
