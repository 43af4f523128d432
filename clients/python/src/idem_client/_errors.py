"""What a call raises when it has no stored outcome to return.

Every error carries the call's idempotency ``key`` and its ``attempts``: with
the key, a caller can always come back to the same intent.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ._types import Attempt


class IdemError(Exception):
    """A call that ended without a stored outcome (a capture, decline or failure)."""

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
    request. Nothing was charged by this call. A new intent needs a new key; the
    same intent must send the very same request."""

    charge_id: Optional[str]
    """The charge the key's first request made (when idem names it)."""
    differing_fields: List[str]
    """The request fields that differ from the key's first request."""
    problem: Dict[str, Any]

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: Optional[str],
        differing_fields: Sequence[str],
        problem: Dict[str, Any],
    ) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.charge_id = charge_id
        self.differing_fields = list(differing_fields)
        self.problem = problem


class KeyExpiredError(IdemError):
    """``410`` ``key-expired``: the same request came after its key's TTL. It
    made ``charge_id`` before; nothing was charged again. Look the charge up
    (``GET /v1/charges/{charge_id}``) instead of charging."""

    charge_id: Optional[str]
    problem: Dict[str, Any]

    def __init__(
        self,
        message: str,
        *,
        key: str,
        attempts: Sequence[Attempt],
        charge_id: Optional[str],
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

    The charge may have happened: the outcome is unknown. Charge again later
    with the same key (``idempotency_key=err.key``) and the same request: idem
    answers with the stored outcome, or finishes the charge, never charging twice.
    """

    last: str
    """The last attempt's outcome, and why no further attempt was made."""

    def __init__(self, message: str, *, key: str, attempts: Sequence[Attempt], last: str) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.last = last
