"""The values a caller gives and gets back: the policy, the charge, the
refund, the capture and the void, the attempts, the results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one call (one payment intent) tries before it gives up.

    Times are in seconds. The defaults are those of every idem client.
    """

    max_attempts: int = 8
    """Attempts in all, the first included."""
    deadline: float = 60.0
    """All attempts and waits of one call end within this; the last attempt's
    timeout is shortened to fit, and a wait that would pass it is not begun."""
    attempt_timeout: float = 10.0
    """One attempt, from connecting to the last byte of the answer."""
    base_delay: float = 0.1
    """Backoff base: the wait before retry ``n`` (0-based) is drawn uniformly
    from ``[0, min(max_delay, base_delay * 2**n)]`` (full jitter)."""
    max_delay: float = 5.0
    """Backoff cap. The server's ``Retry-After`` may ask for longer, and wins."""
    prefer_wait: int = 5
    """``Prefer: wait=N``: how long the server may hold an attempt that meets
    this key's first attempt still in flight, to answer with its outcome
    instead of ``409``. Sent as ``min(prefer_wait, floor(timeout) - 1)``, where
    ``timeout`` is the attempt's, and left out below 1."""

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValueError(f"max_attempts must be an int, not {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1 (the first attempt), not {self.max_attempts}")
        if isinstance(self.prefer_wait, bool) or not isinstance(self.prefer_wait, int):
            raise ValueError(f"prefer_wait must be a whole number of seconds, not {self.prefer_wait!r}")
        for name in ("deadline", "attempt_timeout", "base_delay", "max_delay", "prefer_wait"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
        if not self.attempt_timeout > 0:
            raise ValueError(f"attempt_timeout must be above 0, not {self.attempt_timeout!r}")


@dataclass(frozen=True)
class Charge:
    """A charge as idem shows it (``docs/contract/api.md``, "The charge").

    Fields idem may add later are ignored.
    """

    id: str
    order_id: int
    amount_cents: int
    currency: str
    status: str
    """``captured``, ``declined``, ``failed`` (or ``processing``); for a
    two-step charge also ``authorized`` (held, capturable) and ``voided``
    (released with nothing captured)."""
    acquirer_reference: str
    decline_reason: Optional[str]
    """The acquirer's reason when ``status`` is ``declined``, else ``None``."""
    created_at: str
    """When the charge was claimed: RFC 3339, UTC, to the second."""
    amount_captured_cents: Optional[int] = None
    """A two-step charge's: the sum of its captures made; ``None`` for a
    one-step charge (idem leaves the field out)."""
    amount_capturable_cents: Optional[int] = None
    """A two-step charge's: what a capture may still take (the authorized
    amount less the captures made or pending; 0 once the authorization is
    closed); ``None`` for a one-step charge."""


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt of a call, and how it ended."""

    endpoint: str
    """The base URL it went to, as given to the client."""
    status: Optional[int]
    """The answer's status, when a whole answer was read; else ``None``."""
    error: Optional[str]
    """Why no whole answer was read (``timed out ...``, ``connection failed: ...``); else ``None``."""
    elapsed: float
    """Seconds from sending to the end of the attempt (the wait before it not included)."""
    problem_type: Optional[str] = None
    """The answer's problem ``type``, when it was a problem document."""
    preference_applied: Optional[str] = None
    """The answer's ``Preference-Applied`` (``wait=N``): the server held the
    attempt for the key's first attempt to end."""

    def __str__(self) -> str:
        if self.status is None:
            return str(self.error)
        if self.problem_type:
            return f"status {self.status} ({self.problem_type})"
        return f"status {self.status}"


@dataclass(frozen=True)
class ChargeResult:
    """The stored outcome of a payment intent: captured (``201``), declined
    (``402``) or failed with no money moved (``502`` ``acquirer-rejected``);
    for an authorization, ``201`` is authorized (the amount held).

    ``charge.status`` says which; ``status`` is the HTTP status.
    """

    status: int
    charge: Charge
    key: str
    """The idempotency key every attempt carried."""
    replayed: bool
    """The answer was stored before (``Idempotent-Replayed: true``): by an
    earlier attempt of this call, or an earlier call with this key."""
    idempotency_ttl: Optional[int]
    """``Idempotency-TTL``: seconds the key is still honoured (a late retry
    after that is :class:`~idem_client.KeyExpiredError`)."""
    body: bytes
    """The answer's body, exactly as read: a replay is byte for byte the first answer."""
    attempts: List[Attempt]
    """Every attempt, in order, the final one last."""
    problem: Optional[Dict[str, Any]] = None
    """For a decline or an acquirer rejection, the problem document (``type``,
    ``detail``, ``charge``); ``None`` for a capture."""

    @property
    def captured(self) -> bool:
        """Money moved: the charge's status is ``captured``."""
        return self.charge.status == "captured"

    @property
    def authorized(self) -> bool:
        """The amount is held, to capture later: the charge's status is
        ``authorized`` (the answer to :meth:`~idem_client.Client.authorize`)."""
        return self.charge.status == "authorized"


RefundReason = Literal["requested_by_customer", "duplicate", "fraudulent", "other"]
"""The reasons idem takes for a refund (any other is ``400`` ``invalid-body``)."""


@dataclass(frozen=True)
class Refund:
    """A refund as idem shows it (``docs/contract/api.md``, "The refund").

    Fields idem may add later are ignored.
    """

    id: str
    """``re_`` and 24 letters and digits."""
    charge_id: str
    amount_cents: int
    currency: str
    """The charge's currency."""
    status: str
    """``succeeded``, ``failed`` (or ``pending``)."""
    reason: Optional[str]
    description: Optional[str]
    acquirer_reference: str
    """The refund's own reference at the acquirer, the same on every call."""
    failure_reason: Optional[str]
    """The acquirer's reason when ``status`` is ``failed``, else ``None``."""
    created_at: str
    """When the refund was claimed: RFC 3339, UTC, to the second."""


@dataclass(frozen=True)
class RefundResult:
    """A refund the acquirer paid back (``201``). A refund it refused for good
    is :class:`~idem_client.RefundFailedError`, also a stored outcome."""

    status: int
    """The HTTP status: ``201``."""
    refund: Refund
    key: str
    """The idempotency key every attempt carried."""
    replayed: bool
    """The answer was stored before (``Idempotent-Replayed: true``): by an
    earlier attempt of this call, or an earlier call with this key."""
    idempotency_ttl: Optional[int]
    """``Idempotency-TTL``: seconds the key is still honoured."""
    body: bytes
    """The answer's body, exactly as read: a replay is byte for byte the first answer."""
    attempts: List[Attempt]
    """Every attempt, in order, the final one last."""


@dataclass(frozen=True)
class Capture:
    """A capture of an authorized charge as idem shows it
    (``docs/contract/api.md``, "The capture and the void").

    Fields idem may add later are ignored.
    """

    id: str
    """``cp_`` and 24 letters and digits."""
    charge_id: str
    amount_cents: int
    currency: str
    """The charge's currency."""
    final: bool
    """It closed the authorization (what it left was released)."""
    status: str
    """``succeeded``, ``failed`` (or ``pending``)."""
    acquirer_reference: str
    """The capture's own reference at the acquirer, the same on every call."""
    failure_reason: Optional[str]
    """The acquirer's reason when ``status`` is ``failed``, else ``None``."""
    created_at: str
    """When the capture was claimed: RFC 3339, UTC, to the second."""


@dataclass(frozen=True)
class Void:
    """A void of an authorized charge as idem shows it: what it released of
    the authorization. Fields idem may add later are ignored."""

    id: str
    """``vd_`` and 24 letters and digits."""
    charge_id: str
    amount_cents: int
    """What it released: the authorization's amount less its captures."""
    currency: str
    status: str
    """``succeeded``, ``failed`` (or ``pending``)."""
    acquirer_reference: str
    """The void's own reference at the acquirer, the same on every call."""
    failure_reason: Optional[str]
    created_at: str


@dataclass(frozen=True)
class CaptureResult:
    """A capture the acquirer made (``201``). One it refused for good is
    :class:`~idem_client.CaptureFailedError`, also a stored outcome."""

    status: int
    """The HTTP status: ``201``."""
    capture: Capture
    key: str
    """The idempotency key every attempt carried."""
    replayed: bool
    """The answer was stored before (``Idempotent-Replayed: true``)."""
    idempotency_ttl: Optional[int]
    """``Idempotency-TTL``: seconds the key is still honoured."""
    body: bytes
    """The answer's body, exactly as read."""
    attempts: List[Attempt]
    """Every attempt, in order, the final one last."""


@dataclass(frozen=True)
class VoidResult:
    """A void the acquirer made (``201``): the authorization is released. One
    it refused for good is :class:`~idem_client.VoidFailedError`."""

    status: int
    """The HTTP status: ``201``."""
    void: Void
    key: str
    """The idempotency key every attempt carried."""
    replayed: bool
    """The answer was stored before (``Idempotent-Replayed: true``)."""
    idempotency_ttl: Optional[int]
    """``Idempotency-TTL``: seconds the key is still honoured."""
    body: bytes
    """The answer's body, exactly as read."""
    attempts: List[Attempt]
    """Every attempt, in order, the final one last."""
