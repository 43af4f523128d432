"""Everything a call decides, and no I/O: the one place of the client's logic.

:class:`Client` and :class:`AsyncClient` are thin loops around a :class:`Call`
(a :class:`ChargeCall`, :class:`AuthorizeCall`, :class:`RefundCall`,
:class:`CaptureCall` or :class:`VoidCall`): they ask it what to do next
(:meth:`Call.next`: send an attempt, sleep, or finish), do it, and tell it how
the attempt ended (:meth:`Call.answered`, :meth:`Call.timed_out`,
:meth:`Call.failed`). Time comes in as ``now`` (a monotonic clock, in
seconds) and randomness as a function, so every decision can be tested
without a network or a clock.

Owned here: the checks on what the caller gives (base URLs, secret, key,
request), the key's quoting, the body's encoding (once per call), the headers
(``Prefer: wait``), which answers are final (a result or a typed error) and
which are retried, the backoff with full jitter under the ``Retry-After``
floor, the deadline, and the give-up message. A charge, an authorization, a
refund, a capture and a void differ only in their path, their body and what
their final answers mean; the retry discipline is :class:`Call`'s, written
once.
"""

from __future__ import annotations

import abc
import enum
import json
import math
import random
import uuid
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Generic, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import quote, urlsplit

from ._errors import (
    ApiError,
    CaptureExceedsAuthorizationError,
    CaptureFailedError,
    ChargeNotAuthorizedError,
    ChargeNotRefundableError,
    GaveUpError,
    IdemError,
    KeyExpiredError,
    KeyReusedError,
    RefundExceedsCapturedError,
    RefundFailedError,
    VoidFailedError,
)
from ._types import (
    Attempt,
    Capture,
    CaptureResult,
    Charge,
    ChargeResult,
    Refund,
    RefundResult,
    RetryPolicy,
    Void,
    VoidResult,
)
from ._version import __version__

CHARGES_PATH = "/v1/charges"
USER_AGENT = f"idem-client-python/{__version__}"

PROBLEM = "urn:idem:problem:"
ACQUIRER_REJECTED = PROBLEM + "acquirer-rejected"
KEY_REUSED = PROBLEM + "idempotency-key-reused"
KEY_EXPIRED = PROBLEM + "key-expired"
REFUND_FAILED = PROBLEM + "refund-failed"
REFUND_EXCEEDS_CAPTURED = PROBLEM + "refund-exceeds-captured"
CHARGE_NOT_REFUNDABLE = PROBLEM + "charge-not-refundable"
CAPTURE_FAILED = PROBLEM + "capture-failed"
VOID_FAILED = PROBLEM + "void-failed"
CAPTURE_EXCEEDS_AUTHORIZATION = PROBLEM + "capture-exceeds-authorization"
CHARGE_NOT_AUTHORIZED = PROBLEM + "charge-not-authorized"
AUTHORIZATION_CLOSED = PROBLEM + "authorization-closed"
CAPTURE_PENDING = PROBLEM + "capture-pending"

#: Statuses a retry can change: in flight (``409``), too many requests
#: (``429``), unknown outcome or unavailable (``503``), a gateway's timeout
#: (``504``). A ``502`` is retried too unless it is idem's stored
#: ``acquirer-rejected`` (see :func:`classify`).
#:
#: Every ``409`` is retried, whatever its type: ``request-in-flight`` (this
#: key's first attempt is at the acquirer), and, for a capture or a void,
#: ``authorization-closed`` (a final capture or a void of the authorization is
#: pending at the acquirer) and ``capture-pending`` (to a void: captures are).
#: None stores anything under the key, and each is settled by another
#: attempt's or step's outcome, which a retry then meets: this intent's own
#: outcome, or a final refusal (``422`` ``charge-not-authorized``). idem
#: answers ``409`` exactly for what a retry may change (it answers ``422`` for
#: what it cannot), so the clients follow the status, not a list of types.
RETRIED_STATUSES = frozenset({409, 429, 502, 503, 504})


def new_key() -> str:
    """A new idempotency key: a random UUID v4. One per payment intent."""
    return str(uuid.uuid4())


# --- What the caller gives ---------------------------------------------------


def quote_key(key: str) -> str:
    """The key as an IETF Structured Field string: ``"`` + the key with ``\\``
    and ``"`` escaped + ``"``.

    Such a string holds only printable ASCII (``0x20`` to ``0x7e``); a key with
    any other character (or no character) is refused with :class:`ValueError`.
    Whether it is a good key (1 to 255 visible characters) is the server's to
    judge: it answers ``400`` ``malformed-idempotency-key``.
    """
    if not isinstance(key, str):
        raise TypeError(f"an idempotency key is a str, not {type(key).__name__}")
    if not key:
        raise ValueError("an idempotency key cannot be empty")
    bad = [c for c in key if not " " <= c <= "~"]
    if bad:
        raise ValueError(
            f"the idempotency key {key!r} has {bad[0]!r}: a key is printable ASCII, so it cannot be sent"
        )
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Endpoint:
    base: str
    """The base URL as the caller gave it (what :attr:`Attempt.endpoint` reports)."""
    charges_url: str
    """``base`` + ``/v1/charges``."""

    def url(self, path: str) -> str:
        """``base`` (without its trailing ``/``) + ``path``."""
        return self.base.rstrip("/") + path


def refunds_path(charge_id: str) -> str:
    """``/v1/charges/{charge_id}/refunds``, the id percent-encoded (so that no
    id, however odd, names another route: idem answers ``404`` for one that is
    not of its shape). An empty id is refused, as nothing could be sent."""
    return _charge_path(charge_id, "refunds", "refunded")


def captures_path(charge_id: str) -> str:
    """``/v1/charges/{charge_id}/captures``, as :func:`refunds_path`."""
    return _charge_path(charge_id, "captures", "captured")


def void_path(charge_id: str) -> str:
    """``/v1/charges/{charge_id}/void``, as :func:`refunds_path`."""
    return _charge_path(charge_id, "void", "voided")


def _charge_path(charge_id: str, operation: str, done: str) -> str:
    if not isinstance(charge_id, str):
        raise TypeError(f"a charge id is a str, not {type(charge_id).__name__}")
    if not charge_id:
        raise ValueError(f"a charge id cannot be empty: which charge is {done}?")
    return f"{CHARGES_PATH}/{quote(charge_id, safe='')}/{operation}"


def parse_endpoints(base_url: Union[str, Sequence[str]]) -> Tuple[Endpoint, ...]:
    """The base URLs, checked: ``http://`` or ``https://``, a host, no query,
    fragment or credentials. Attempt ``i`` goes to the ``i % n``-th."""
    bases = [base_url] if isinstance(base_url, str) else list(base_url)
    if not bases:
        raise ValueError("no base URL given: a client needs at least one idem endpoint")
    return tuple(_endpoint(base) for base in bases)


def _endpoint(base: str) -> Endpoint:
    if not isinstance(base, str):
        raise TypeError(f"a base URL is a str, not {type(base).__name__}")

    def bad(why: str) -> ValueError:
        return ValueError(f"base URL {base!r}: {why}")

    if not base or base != base.strip() or any(c.isspace() or not c.isprintable() for c in base):
        raise bad("blank, or has white space or control characters")
    try:
        parts = urlsplit(base)
        parts.port  # raises ValueError for a port out of range
    except ValueError as e:
        raise bad(str(e)) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise bad("only http:// and https:// URLs are supported")
    if not parts.hostname:
        raise bad("no host")
    if parts.username is not None or parts.password is not None:
        raise bad("credentials belong in the secret, not the URL")
    if parts.query or parts.fragment or base.endswith(("?", "#")):
        raise bad("a base URL takes no query or fragment")
    return Endpoint(base=base, charges_url=base.rstrip("/") + CHARGES_PATH)


def authorization(secret: str) -> str:
    """``Bearer <secret>``; a secret is visible ASCII (never shown in a message)."""
    if not isinstance(secret, str):
        raise TypeError(f"the secret is a str, not {type(secret).__name__}")
    if not secret or not all("!" <= c <= "~" for c in secret):
        raise ValueError("the secret must be non-empty visible ASCII (no spaces)")
    return f"Bearer {secret}"


def encode_body(
    *,
    order_id: int,
    amount_cents: int,
    currency: Optional[str] = None,
    description: Optional[str] = None,
    capture: bool = True,
) -> bytes:
    """The JSON body of ``POST /v1/charges``, encoded once per call so that every
    attempt carries the very same bytes. ``currency`` and ``description`` are
    left out when ``None`` (the server reads ``BRL`` for no currency). An
    authorization (``capture=False``) ends with ``"capture":false``; a charge
    leaves the field out. Ranges and shapes are the server's to judge
    (``400`` ``invalid-body``)."""
    for name, value in (("order_id", order_id), ("amount_cents", amount_cents)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} is an int, not {type(value).__name__}")
    document: Dict[str, Any] = {"order_id": order_id, "amount_cents": amount_cents}
    for name, text in (("currency", currency), ("description", description)):
        if text is not None:
            if not isinstance(text, str):
                raise TypeError(f"{name} is a str or None, not {type(text).__name__}")
            document[name] = text
    if not isinstance(capture, bool):
        raise TypeError(f"capture is a bool, not {type(capture).__name__}")
    if not capture:
        document["capture"] = False
    return json.dumps(document, separators=(",", ":")).encode("ascii")


def encode_refund_body(
    *, amount_cents: Optional[int] = None, reason: Optional[str] = None, description: Optional[str] = None
) -> bytes:
    """The JSON body of ``POST /v1/charges/{id}/refunds``, encoded once per call.
    Every field is left out when ``None``: no ``amount_cents`` refunds all the
    charge has left, and no field at all is ``{}``. Ranges and the reasons
    idem takes are the server's to judge (``400`` ``invalid-body``)."""
    document: Dict[str, Any] = {}
    if amount_cents is not None:
        if isinstance(amount_cents, bool) or not isinstance(amount_cents, int):
            raise TypeError(f"amount_cents is an int or None, not {type(amount_cents).__name__}")
        document["amount_cents"] = amount_cents
    for name, text in (("reason", reason), ("description", description)):
        if text is not None:
            if not isinstance(text, str):
                raise TypeError(f"{name} is a str or None, not {type(text).__name__}")
            document[name] = text
    return json.dumps(document, separators=(",", ":")).encode("ascii")


def encode_capture_body(*, amount_cents: Optional[int] = None, final: bool = True) -> bytes:
    """The JSON body of ``POST /v1/charges/{id}/captures``, encoded once per
    call. No ``amount_cents`` captures all the authorization has left;
    ``final`` is always sent (``true``: the capture closes the authorization
    and releases the rest; ``false``: the rest stays capturable)."""
    document: Dict[str, Any] = {}
    if amount_cents is not None:
        if isinstance(amount_cents, bool) or not isinstance(amount_cents, int):
            raise TypeError(f"amount_cents is an int or None, not {type(amount_cents).__name__}")
        document["amount_cents"] = amount_cents
    if not isinstance(final, bool):
        raise TypeError(f"final is a bool, not {type(final).__name__}")
    document["final"] = final
    return json.dumps(document, separators=(",", ":")).encode("ascii")


#: The body of ``POST /v1/charges/{id}/void``: a void names no amount.
VOID_BODY = b"{}"


@dataclass(frozen=True)
class Config:
    """What a client is built with, checked once."""

    endpoints: Tuple[Endpoint, ...]
    authorization: str
    policy: RetryPolicy

    @classmethod
    def build(cls, base_url: Union[str, Sequence[str]], secret: str, policy: RetryPolicy) -> Config:
        if not isinstance(policy, RetryPolicy):
            raise TypeError(f"policy is a RetryPolicy, not {type(policy).__name__}")
        return cls(endpoints=parse_endpoints(base_url), authorization=authorization(secret), policy=policy)

    def __repr__(self) -> str:
        bases = [e.base for e in self.endpoints]
        return f"Config(endpoints={bases!r}, secret=<redacted>, policy={self.policy!r})"


# --- Waiting -----------------------------------------------------------------


def backoff_ceiling(policy: RetryPolicy, retry: int) -> float:
    """``min(max_delay, base_delay * 2**retry)``, without overflow for any ``retry``."""
    if policy.base_delay <= 0 or policy.max_delay <= 0:
        return 0.0
    if retry >= 1000:  # 2.0**1000 is near float's end; any base is past the cap by far
        return float(policy.max_delay)
    return float(min(policy.max_delay, policy.base_delay * 2.0**retry))


def backoff_delay(
    policy: RetryPolicy,
    retry: int,
    retry_after: Optional[float] = None,
    uniform: Callable[[], float] = random.random,
) -> float:
    """The wait before retry number ``retry`` (0-based): uniform in
    ``[0, min(max_delay, base_delay * 2**retry)]`` (full jitter, so clients
    that failed together do not come back together), and never less than the
    server's ``Retry-After``. ``uniform`` draws from ``[0, 1]``."""
    wait = uniform() * backoff_ceiling(policy, retry)
    return wait if retry_after is None else max(wait, retry_after)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` as idem sends it: whole seconds. Anything else (an HTTP
    date, a fraction, a negative number) is ignored (``None``): the backoff still applies."""
    if value is None:
        return None
    text = value.strip()
    if not text or not text.isascii() or not text.isdigit():
        return None
    if len(text) > 15:  # far past any deadline: as good as forever
        return math.inf
    return float(int(text))


def prefer_wait(configured: int, attempt_timeout: float) -> Optional[int]:
    """The ``Prefer: wait=N`` of an attempt: the configured wait, at most one
    second less than the attempt's timeout (so the answer arrives before the
    client stops listening); ``None`` (not sent) below 1."""
    wait = configured if math.isinf(attempt_timeout) else min(configured, math.floor(attempt_timeout) - 1)
    return wait if wait >= 1 else None


# --- What an answer means ------------------------------------------------------


class Verdict(enum.Enum):
    RESULT = "result"
    """A stored outcome returned as a result: a charge captured (201), declined
    (402) or failed (502 acquirer-rejected); a refund paid (201)."""
    RETRY = "retry"
    KEY_REUSED = "key-reused"
    KEY_EXPIRED = "key-expired"
    API_ERROR = "api-error"
    REFUND_FAILED = "refund-failed"
    """A refund's stored outcome: the acquirer refused it for good (422)."""
    REFUND_EXCEEDS = "refund-exceeds"
    NOT_REFUNDABLE = "not-refundable"
    CAPTURE_FAILED = "capture-failed"
    """A capture's stored outcome: the acquirer refused it for good (422)."""
    VOID_FAILED = "void-failed"
    """A void's stored outcome: the acquirer refused it for good (422)."""
    CAPTURE_EXCEEDS = "capture-exceeds"
    NOT_AUTHORIZED = "not-authorized"


def classify(status: int, problem_type: Optional[str]) -> Verdict:
    """What an answer to a charge with this status (and problem ``type``) means for the call."""
    if status in (201, 402):
        return Verdict.RESULT
    if status == 502 and problem_type == ACQUIRER_REJECTED:
        return Verdict.RESULT
    if status in RETRIED_STATUSES:
        return Verdict.RETRY
    if status == 422 and problem_type == KEY_REUSED:
        return Verdict.KEY_REUSED
    if status == 410 and problem_type == KEY_EXPIRED:
        return Verdict.KEY_EXPIRED
    return Verdict.API_ERROR


_REFUND_REFUSALS = {
    REFUND_FAILED: Verdict.REFUND_FAILED,
    REFUND_EXCEEDS_CAPTURED: Verdict.REFUND_EXCEEDS,
    CHARGE_NOT_REFUNDABLE: Verdict.NOT_REFUNDABLE,
}


def classify_refund(status: int, problem_type: Optional[str]) -> Verdict:
    """What an answer to a refund means: as a charge's (:func:`classify`), but
    a ``201`` is the only result, the refund ``422``s are final, and every
    ``502`` is retried (idem has no stored ``502`` for a refund: a gateway's
    says nothing about it)."""
    if status == 201:
        return Verdict.RESULT
    if status == 422 and problem_type in _REFUND_REFUSALS:
        return _REFUND_REFUSALS[problem_type]
    if status == 402:
        return Verdict.API_ERROR
    if status == 502:
        return Verdict.RETRY
    return classify(status, problem_type)


_CAPTURE_REFUSALS = {
    CAPTURE_FAILED: Verdict.CAPTURE_FAILED,
    CAPTURE_EXCEEDS_AUTHORIZATION: Verdict.CAPTURE_EXCEEDS,
    CHARGE_NOT_AUTHORIZED: Verdict.NOT_AUTHORIZED,
}

_VOID_REFUSALS = {
    VOID_FAILED: Verdict.VOID_FAILED,
    CHARGE_NOT_AUTHORIZED: Verdict.NOT_AUTHORIZED,
}


def classify_capture(status: int, problem_type: Optional[str]) -> Verdict:
    """What an answer to a capture means: as a refund's
    (:func:`classify_refund`), with the capture ``422``s final
    (``capture-failed``, ``capture-exceeds-authorization``,
    ``charge-not-authorized``). Every ``409`` is retried, ``authorization-closed``
    included (see :data:`RETRIED_STATUSES`)."""
    return _classify_step(status, problem_type, _CAPTURE_REFUSALS)


def classify_void(status: int, problem_type: Optional[str]) -> Verdict:
    """What an answer to a void means: as a capture's, with its own ``422``s
    final (``void-failed``, ``charge-not-authorized``); ``capture-pending`` and
    ``authorization-closed`` (``409``) are retried."""
    return _classify_step(status, problem_type, _VOID_REFUSALS)


def _classify_step(status: int, problem_type: Optional[str], refusals: Mapping[str, Verdict]) -> Verdict:
    if status == 201:
        return Verdict.RESULT
    if status == 422 and problem_type is not None and problem_type in refusals:
        return refusals[problem_type]
    if status == 402:
        return Verdict.API_ERROR
    if status == 502:
        return Verdict.RETRY
    return classify(status, problem_type)


def parse_problem(body: bytes) -> Optional[Dict[str, Any]]:
    """The body as a JSON object (a problem document), or ``None``."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def parse_charge(document: Any) -> Optional[Charge]:
    """A charge from its JSON object; ``None`` if it is not one. Unknown fields are ignored."""
    if not isinstance(document, dict):
        return None
    d = document

    def text(name: str) -> bool:
        return isinstance(d.get(name), str)

    def integer(name: str) -> bool:
        return isinstance(d.get(name), int) and not isinstance(d.get(name), bool)

    if not (text("id") and integer("order_id") and integer("amount_cents") and text("currency")):
        return None
    if not (text("status") and text("acquirer_reference") and text("created_at")):
        return None
    if d.get("decline_reason") is not None and not text("decline_reason"):
        return None
    two_step = ("amount_captured_cents", "amount_capturable_cents")
    if any(d.get(name) is not None and not integer(name) for name in two_step):
        return None
    return Charge(
        id=d["id"],
        order_id=d["order_id"],
        amount_cents=d["amount_cents"],
        currency=d["currency"],
        status=d["status"],
        acquirer_reference=d["acquirer_reference"],
        decline_reason=d.get("decline_reason"),
        created_at=d["created_at"],
        amount_captured_cents=d.get("amount_captured_cents"),
        amount_capturable_cents=d.get("amount_capturable_cents"),
    )


def parse_refund(document: Any) -> Optional[Refund]:
    """A refund from its JSON object; ``None`` if it is not one. Unknown fields are ignored."""
    if not isinstance(document, dict):
        return None
    d = document

    def text(name: str) -> bool:
        return isinstance(d.get(name), str)

    def optional_text(name: str) -> bool:
        return d.get(name) is None or text(name)

    amount = d.get("amount_cents")
    if not (text("id") and text("charge_id") and isinstance(amount, int) and not isinstance(amount, bool)):
        return None
    if not (text("currency") and text("status") and text("acquirer_reference") and text("created_at")):
        return None
    if not (optional_text("reason") and optional_text("description") and optional_text("failure_reason")):
        return None
    return Refund(
        id=d["id"],
        charge_id=d["charge_id"],
        amount_cents=amount,
        currency=d["currency"],
        status=d["status"],
        reason=d.get("reason"),
        description=d.get("description"),
        acquirer_reference=d["acquirer_reference"],
        failure_reason=d.get("failure_reason"),
        created_at=d["created_at"],
    )


def parse_capture(document: Any) -> Optional[Capture]:
    """A capture from its JSON object; ``None`` if it is not one. Unknown fields are ignored."""
    fields = _step_fields(document, "final")
    return None if fields is None else Capture(**fields)


def parse_void(document: Any) -> Optional[Void]:
    """A void from its JSON object; ``None`` if it is not one. Unknown fields are ignored."""
    fields = _step_fields(document, None)
    return None if fields is None else Void(**fields)


def _step_fields(document: Any, flag: Optional[str]) -> Optional[Dict[str, Any]]:
    """A capture's (``flag`` ``"final"``) or a void's fields, checked."""
    if not isinstance(document, dict):
        return None
    d = document
    names = ("id", "charge_id", "currency", "status", "acquirer_reference", "created_at")
    amount = d.get("amount_cents")
    if not all(isinstance(d.get(name), str) for name in names):
        return None
    if not isinstance(amount, int) or isinstance(amount, bool):
        return None
    if d.get("failure_reason") is not None and not isinstance(d.get("failure_reason"), str):
        return None
    fields = {name: d[name] for name in names}
    fields["amount_cents"] = amount
    fields["failure_reason"] = d.get("failure_reason")
    if flag is not None:
        if not isinstance(d.get(flag), bool):
            return None
        fields[flag] = d[flag]
    return fields


def parse_ttl(value: Optional[str]) -> Optional[int]:
    """``Idempotency-TTL``: whole seconds, else ``None``."""
    if value is None:
        return None
    text = value.strip()
    return int(text) if text and text.isascii() and text.isdigit() else None


def describe_failure(error: BaseException) -> str:
    """A connection failure as an attempt records it: the exception's class and
    message, and its causes' where they add something."""
    parts: List[str] = []
    seen = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen and len(parts) < 4:
        seen.add(id(current))
        text = str(current)
        part = f"{type(current).__name__}: {text}" if text else type(current).__name__
        if not any(text and text in p for p in parts):
            parts.append(part)
        current = current.__cause__ or current.__context__
    return "connection failed: " + " <- ".join(parts)


# --- One call ------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send attempt ``number`` (0-based) and read the whole answer within ``timeout`` seconds."""

    number: int
    endpoint: str
    url: str
    headers: Dict[str, str]
    body: bytes
    timeout: float


@dataclass(frozen=True)
class Sleep:
    """Wait this many seconds, then ask again."""

    seconds: float


R = TypeVar("R")
"""What a call returns: :class:`ChargeResult`, :class:`RefundResult`,
:class:`CaptureResult` or :class:`VoidResult`."""


@dataclass(frozen=True)
class Finish(Generic[R]):
    """The call is over: a result or an error."""

    result: Optional[R] = None
    error: Optional[IdemError] = None

    def unwrap(self) -> R:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


Action = Union[Send, Sleep, Finish[R]]


class Call(abc.ABC, Generic[R]):
    """One intent: one key, one body, as many attempts as the policy allows.

    The driver loops: ``action = call.next(now)``; on :class:`Send` it sends and
    reports with :meth:`answered`, :meth:`timed_out` or :meth:`failed`; on
    :class:`Sleep` it sleeps; on :class:`Finish` it returns ``action.unwrap()``.
    Bad input raises :class:`ValueError` or :class:`TypeError` in the
    constructor, before any attempt.

    The retry discipline is all here; a subclass gives the path and the body
    and says what its final answers mean (:meth:`_classify`, :meth:`_outcome`).
    """

    noun: ClassVar[str]
    """What the call makes, for messages: ``charge``, ``refund``,
    ``authorization``, ``capture`` or ``void``."""
    verb: ClassVar[str]
    """What the call does, for messages: ``charge``, ``refund``,
    ``authorize``, ``capture`` or ``void``."""
    done: ClassVar[str]
    """What it did, for messages: ``charged``, ``refunded``, ``authorized``,
    ``captured`` or ``voided``."""

    def __init__(
        self,
        config: Config,
        *,
        path: str,
        body: bytes,
        idempotency_key: Optional[str],
        now: float,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self.key = new_key() if idempotency_key is None else idempotency_key
        self._key_header = quote_key(self.key)
        self.body = body
        self._path = path
        self._config = config
        self._policy = config.policy
        self._started = now
        self._uniform = uniform
        self.attempts: List[Attempt] = []
        self._sending: Optional[Tuple[Send, float]] = None
        self._sleep: Optional[float] = None
        self._finish: Optional[Finish[R]] = None

    # The driver's side.

    def next(self, now: float) -> Action[R]:
        """What to do now."""
        if self._sending is not None:
            raise RuntimeError("the attempt in flight has not been reported")
        if self._finish is not None:
            return self._finish
        if self._sleep is not None:
            seconds, self._sleep = self._sleep, None
            return Sleep(seconds)
        remaining = self._remaining(now)
        if remaining <= 0:
            return self._give_up(f"the deadline ({self._policy.deadline:g} s) is spent")
        send = self._send(len(self.attempts), min(self._policy.attempt_timeout, remaining))
        self._sending = (send, now)
        return send

    def answered(self, now: float, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """The attempt in flight got a whole answer."""
        send, sent = self._take_sending()
        fields = {name.lower(): value for name, value in headers.items()}
        problem = parse_problem(body) if status >= 300 else None
        problem_type = problem.get("type") if problem is not None else None
        if not isinstance(problem_type, str):
            problem_type = None
        self.attempts.append(
            Attempt(
                endpoint=send.endpoint,
                status=status,
                error=None,
                elapsed=max(0.0, now - sent),
                problem_type=problem_type,
                preference_applied=fields.get("preference-applied"),
            )
        )
        verdict = self._classify(status, problem_type)
        if verdict is Verdict.RETRY:
            self._after_retryable(now, parse_retry_after(fields.get("retry-after")))
        else:
            self._finish = self._final(verdict, status, fields, body, problem)

    def timed_out(self, now: float) -> None:
        """The attempt in flight got no whole answer within its timeout."""
        send, sent = self._take_sending()
        error = f"timed out after {send.timeout:g} s"
        self.attempts.append(Attempt(endpoint=send.endpoint, status=None, error=error, elapsed=max(0.0, now - sent)))
        self._after_retryable(now, None)

    def failed(self, now: float, error: Union[BaseException, str]) -> None:
        """The attempt in flight's connection failed: refused, reset, or closed
        before the whole answer was read (a body cut off half way is one)."""
        send, sent = self._take_sending()
        text = error if isinstance(error, str) else describe_failure(error)
        self.attempts.append(Attempt(endpoint=send.endpoint, status=None, error=text, elapsed=max(0.0, now - sent)))
        self._after_retryable(now, None)

    # The decisions.

    def _remaining(self, now: float) -> float:
        return self._policy.deadline - (now - self._started)

    def _send(self, number: int, timeout: float) -> Send:
        endpoint = self._config.endpoints[number % len(self._config.endpoints)]
        headers = {
            "Authorization": self._config.authorization,
            "Content-Type": "application/json",
            "Accept": "application/json, application/problem+json",
            "Idempotency-Key": self._key_header,
            "User-Agent": USER_AGENT,
        }
        wait = prefer_wait(self._policy.prefer_wait, timeout)
        if wait is not None:
            headers["Prefer"] = f"wait={wait}"
        return Send(
            number=number,
            endpoint=endpoint.base,
            url=endpoint.url(self._path),
            headers=headers,
            body=self.body,
            timeout=timeout,
        )

    def _take_sending(self) -> Tuple[Send, float]:
        if self._sending is None:
            raise RuntimeError("no attempt is in flight")
        sending, self._sending = self._sending, None
        return sending

    def _after_retryable(self, now: float, retry_after: Optional[float]) -> None:
        if len(self.attempts) >= self._policy.max_attempts:
            self._finish = self._give_up(f"max_attempts ({self._policy.max_attempts}) reached")
            return
        wait = backoff_delay(self._policy, len(self.attempts) - 1, retry_after, self._uniform)
        if wait >= self._remaining(now):
            self._finish = self._give_up(
                f"the next wait ({wait:.3f} s) would pass the deadline ({self._policy.deadline:g} s)"
            )
            return
        self._sleep = wait

    def _give_up(self, reason: str) -> Finish[R]:
        last = f"{self.attempts[-1]} from {self.attempts[-1].endpoint}; {reason}" if self.attempts else reason
        n = len(self.attempts)
        noun, verb = self.noun, self.verb
        message = (
            f"gave up on idempotency key {self.key!r} after {n} attempt{'' if n == 1 else 's'}: {last}. "
            f"The outcome is unknown: the {noun} may have happened. {verb.capitalize()} again with the same key "
            f"and the same request to learn it; that never {verb}s twice."
        )
        self._finish = Finish(error=GaveUpError(message, key=self.key, attempts=self.attempts, last=last))
        return self._finish

    @abc.abstractmethod
    def _classify(self, status: int, problem_type: Optional[str]) -> Verdict:
        """What an answer means for this operation."""

    @abc.abstractmethod
    def _outcome(
        self,
        verdict: Verdict,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        problem: Optional[Dict[str, Any]],
    ) -> Optional[Finish[R]]:
        """The end of the call for a final answer this operation has words
        of its own for (its results and refusals); ``None`` for the rest."""

    def _final(
        self,
        verdict: Verdict,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        problem: Optional[Dict[str, Any]],
    ) -> Finish[R]:
        key, attempts = self.key, self.attempts
        if verdict is Verdict.KEY_REUSED and problem is not None:
            charge_id = _optional_str(problem.get("charge_id"))
            refund_id = _optional_str(problem.get("refund_id"))
            capture_id = _optional_str(problem.get("capture_id"))
            void_id = _optional_str(problem.get("void_id"))
            fields = problem.get("differing_fields")
            differing = [f for f in fields if isinstance(f, str)] if isinstance(fields, list) else []
            made = _made(charge_id, refund_id, capture_id, void_id)
            message = (
                f"idempotency key {key!r} was first used with another request"
                + (f" (it differs in {', '.join(differing)})" if differing else "")
                + (f", which made {made}" if made else "")
                + f": nothing was {self.done}. A new intent needs a new key; a retry must send the same request."
            )
            error: IdemError = KeyReusedError(
                message,
                key=key,
                attempts=attempts,
                charge_id=charge_id,
                differing_fields=differing,
                problem=problem,
                refund_id=refund_id,
                capture_id=capture_id,
                void_id=void_id,
            )
            return Finish(error=error)
        if verdict is Verdict.KEY_EXPIRED and problem is not None:
            charge_id = _optional_str(problem.get("charge_id"))
            refund_id = _optional_str(problem.get("refund_id"))
            capture_id = _optional_str(problem.get("capture_id"))
            void_id = _optional_str(problem.get("void_id"))
            made = _made(charge_id, refund_id, capture_id, void_id) or "what it made"
            message = (
                f"idempotency key {key!r} has expired; this same request made {made} before, "
                f"and nothing was {self.done} again"
            )
            return Finish(
                error=KeyExpiredError(
                    message,
                    key=key,
                    attempts=attempts,
                    charge_id=charge_id,
                    problem=problem,
                    refund_id=refund_id,
                    capture_id=capture_id,
                    void_id=void_id,
                )
            )
        finish = self._outcome(verdict, status, headers, body, problem)
        return finish if finish is not None else Finish(error=self._api_error(status, body, problem, None))

    def _api_error(
        self, status: int, body: bytes, problem: Optional[Dict[str, Any]], why: Optional[str]
    ) -> ApiError:
        kind = _optional_str((problem or {}).get("type"))
        detail = _optional_str((problem or {}).get("detail"))
        message = (
            f"idem answered {status}"
            + (f" {kind}" if kind else "")
            + (f": {detail}" if detail else "")
            + (f" ({why})" if why else "")
            + f" [idempotency key {self.key!r}]"
        )
        return ApiError(message, key=self.key, attempts=self.attempts, status=status, problem=problem, body=body)


def _optional_str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _made(
    charge_id: Optional[str], refund_id: Optional[str], capture_id: Optional[str], void_id: Optional[str]
) -> Optional[str]:
    """What a key made, in words (``refund re_...``), from a problem's ids."""
    for noun, made in (("refund", refund_id), ("capture", capture_id), ("void", void_id), ("charge", charge_id)):
        if made:
            return f"{noun} {made}"
    return None


def _replayed(headers: Mapping[str, str]) -> bool:
    return headers.get("idempotent-replayed", "").strip().lower() == "true"


class ChargeCall(Call[ChargeResult]):
    """One payment intent: ``POST /v1/charges``, one key, one body."""

    noun = "charge"
    verb = "charge"
    done = "charged"
    capture: ClassVar[bool] = True
    """``False`` for an authorization: the body says ``"capture":false``."""

    def __init__(
        self,
        config: Config,
        *,
        order_id: int,
        amount_cents: int,
        currency: Optional[str] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        now: float,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        body = encode_body(
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            description=description,
            capture=self.capture,
        )
        super().__init__(
            config, path=CHARGES_PATH, body=body, idempotency_key=idempotency_key, now=now, uniform=uniform
        )

    def _classify(self, status: int, problem_type: Optional[str]) -> Verdict:
        return classify(status, problem_type)

    def _outcome(
        self,
        verdict: Verdict,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        problem: Optional[Dict[str, Any]],
    ) -> Optional[Finish[ChargeResult]]:
        if verdict is not Verdict.RESULT:
            return None
        document = parse_problem(body) if status == 201 else (problem or {}).get("charge")
        charge = parse_charge(document)
        if charge is None:
            return Finish(error=self._api_error(status, body, problem, "an answer without its charge"))
        return Finish(
            result=ChargeResult(
                status=status,
                charge=charge,
                key=self.key,
                replayed=_replayed(headers),
                idempotency_ttl=parse_ttl(headers.get("idempotency-ttl")),
                body=body,
                attempts=self.attempts,
                problem=problem,
            )
        )


class AuthorizeCall(ChargeCall):
    """One authorization intent (the first step of a two-step payment):
    ``POST /v1/charges`` with ``"capture":false``, one key, one body, retried
    exactly as a charge is. Its ``201`` is the charge, ``authorized``."""

    noun = "authorization"
    verb = "authorize"
    done = "authorized"
    capture = False


class RefundCall(Call[RefundResult]):
    """One refund intent: ``POST /v1/charges/{charge_id}/refunds``, one key,
    one body, retried exactly as a charge is."""

    noun = "refund"
    verb = "refund"
    done = "refunded"

    def __init__(
        self,
        config: Config,
        *,
        charge_id: str,
        amount_cents: Optional[int] = None,
        reason: Optional[str] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        now: float,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        path = refunds_path(charge_id)
        body = encode_refund_body(amount_cents=amount_cents, reason=reason, description=description)
        super().__init__(config, path=path, body=body, idempotency_key=idempotency_key, now=now, uniform=uniform)
        self.charge_id = charge_id

    def _classify(self, status: int, problem_type: Optional[str]) -> Verdict:
        return classify_refund(status, problem_type)

    def _outcome(
        self,
        verdict: Verdict,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        problem: Optional[Dict[str, Any]],
    ) -> Optional[Finish[RefundResult]]:
        key, attempts = self.key, self.attempts
        ttl = parse_ttl(headers.get("idempotency-ttl"))
        if verdict is Verdict.RESULT:
            refund = parse_refund(parse_problem(body))
            if refund is None:
                return Finish(error=self._api_error(status, body, problem, "an answer without its refund"))
            result = RefundResult(
                status=status,
                refund=refund,
                key=key,
                replayed=_replayed(headers),
                idempotency_ttl=ttl,
                body=body,
                attempts=attempts,
            )
            return Finish(result=result)
        if problem is None:
            return None
        detail = _optional_str(problem.get("detail"))
        if verdict is Verdict.REFUND_FAILED:
            refund = parse_refund(problem.get("refund"))
            if refund is None:
                return Finish(error=self._api_error(status, body, problem, "an answer without its refund"))
            message = (
                f"the acquirer refused refund {refund.id} of charge {refund.charge_id} for good"
                + (f" ({refund.failure_reason})" if refund.failure_reason else "")
                + f"; no money moved. That is the stored outcome of idempotency key {key!r}: "
                "refunding again needs a new key"
            )
            return Finish(
                error=RefundFailedError(
                    message,
                    key=key,
                    attempts=attempts,
                    refund=refund,
                    replayed=_replayed(headers),
                    idempotency_ttl=ttl,
                    problem=problem,
                    body=body,
                )
            )
        if verdict is Verdict.REFUND_EXCEEDS:
            remaining = problem.get("remaining_cents")
            remaining_cents = remaining if isinstance(remaining, int) and not isinstance(remaining, bool) else None
            message = (
                f"charge {self.charge_id} has less left to refund than asked"
                + (f" ({remaining_cents} cents left)" if remaining_cents is not None else "")
                + f": nothing was refunded or stored, and idempotency key {key!r} is still free"
            )
            return Finish(
                error=RefundExceedsCapturedError(
                    message,
                    key=key,
                    attempts=attempts,
                    charge_id=self.charge_id,
                    remaining_cents=remaining_cents,
                    problem=problem,
                )
            )
        if verdict is Verdict.NOT_REFUNDABLE:
            message = (
                f"charge {self.charge_id} cannot be refunded"
                + (f": {detail}" if detail else "")
                + f" [idempotency key {key!r}]"
            )
            return Finish(
                error=ChargeNotRefundableError(
                    message, key=key, attempts=attempts, charge_id=self.charge_id, problem=problem
                )
            )
        return None


class CaptureCall(Call[CaptureResult]):
    """One capture intent: ``POST /v1/charges/{charge_id}/captures``, one
    key, one body, retried exactly as a charge is (every ``409`` included:
    ``authorization-closed`` says a final capture or a void of the
    authorization is pending, which a retry meets settled)."""

    noun = "capture"
    verb = "capture"
    done = "captured"

    def __init__(
        self,
        config: Config,
        *,
        charge_id: str,
        amount_cents: Optional[int] = None,
        final: bool = True,
        idempotency_key: Optional[str] = None,
        now: float,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        path = captures_path(charge_id)
        body = encode_capture_body(amount_cents=amount_cents, final=final)
        super().__init__(config, path=path, body=body, idempotency_key=idempotency_key, now=now, uniform=uniform)
        self.charge_id = charge_id

    def _classify(self, status: int, problem_type: Optional[str]) -> Verdict:
        return classify_capture(status, problem_type)

    def _outcome(
        self,
        verdict: Verdict,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        problem: Optional[Dict[str, Any]],
    ) -> Optional[Finish[CaptureResult]]:
        key, attempts = self.key, self.attempts
        ttl = parse_ttl(headers.get("idempotency-ttl"))
        if verdict is Verdict.RESULT:
            capture = parse_capture(parse_problem(body))
            if capture is None:
                return Finish(error=self._api_error(status, body, problem, "an answer without its capture"))
            result = CaptureResult(
                status=status,
                capture=capture,
                key=key,
                replayed=_replayed(headers),
                idempotency_ttl=ttl,
                body=body,
                attempts=attempts,
            )
            return Finish(result=result)
        if problem is None:
            return None
        if verdict is Verdict.CAPTURE_FAILED:
            refused = parse_capture(problem.get("capture"))
            if refused is None:
                return Finish(error=self._api_error(status, body, problem, "an answer without its capture"))
            message = (
                f"the acquirer refused capture {refused.id} of charge {refused.charge_id} for good"
                + (f" ({refused.failure_reason})" if refused.failure_reason else "")
                + f"; no money moved. That is the stored outcome of idempotency key {key!r}: "
                "capturing again needs a new key"
            )
            return Finish(
                error=CaptureFailedError(
                    message,
                    key=key,
                    attempts=attempts,
                    capture=refused,
                    replayed=_replayed(headers),
                    idempotency_ttl=ttl,
                    problem=problem,
                    body=body,
                )
            )
        if verdict is Verdict.CAPTURE_EXCEEDS:
            remaining = problem.get("remaining_cents")
            remaining_cents = remaining if isinstance(remaining, int) and not isinstance(remaining, bool) else None
            message = (
                f"the authorization of charge {self.charge_id} has less left to capture than asked"
                + (f" ({remaining_cents} cents left)" if remaining_cents is not None else "")
                + f": nothing was captured or stored, and idempotency key {key!r} is still free"
            )
            return Finish(
                error=CaptureExceedsAuthorizationError(
                    message,
                    key=key,
                    attempts=attempts,
                    charge_id=self.charge_id,
                    remaining_cents=remaining_cents,
                    problem=problem,
                )
            )
        if verdict is Verdict.NOT_AUTHORIZED:
            return Finish(error=_not_authorized(self, problem))
        return None


class VoidCall(Call[VoidResult]):
    """One void intent: ``POST /v1/charges/{charge_id}/void`` with ``{}``,
    one key, retried exactly as a charge is (every ``409`` included:
    ``capture-pending`` says captures of the authorization are pending, which
    a retry meets settled)."""

    noun = "void"
    verb = "void"
    done = "voided"

    def __init__(
        self,
        config: Config,
        *,
        charge_id: str,
        idempotency_key: Optional[str] = None,
        now: float,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        path = void_path(charge_id)
        super().__init__(config, path=path, body=VOID_BODY, idempotency_key=idempotency_key, now=now, uniform=uniform)
        self.charge_id = charge_id

    def _classify(self, status: int, problem_type: Optional[str]) -> Verdict:
        return classify_void(status, problem_type)

    def _outcome(
        self,
        verdict: Verdict,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        problem: Optional[Dict[str, Any]],
    ) -> Optional[Finish[VoidResult]]:
        key, attempts = self.key, self.attempts
        ttl = parse_ttl(headers.get("idempotency-ttl"))
        if verdict is Verdict.RESULT:
            void = parse_void(parse_problem(body))
            if void is None:
                return Finish(error=self._api_error(status, body, problem, "an answer without its void"))
            result = VoidResult(
                status=status,
                void=void,
                key=key,
                replayed=_replayed(headers),
                idempotency_ttl=ttl,
                body=body,
                attempts=attempts,
            )
            return Finish(result=result)
        if problem is None:
            return None
        if verdict is Verdict.VOID_FAILED:
            refused = parse_void(problem.get("void"))
            if refused is None:
                return Finish(error=self._api_error(status, body, problem, "an answer without its void"))
            message = (
                f"the acquirer refused void {refused.id} of charge {refused.charge_id} for good"
                + (f" ({refused.failure_reason})" if refused.failure_reason else "")
                + f"; the authorization is open again. That is the stored outcome of idempotency key {key!r}: "
                "voiding again needs a new key"
            )
            return Finish(
                error=VoidFailedError(
                    message,
                    key=key,
                    attempts=attempts,
                    void=refused,
                    replayed=_replayed(headers),
                    idempotency_ttl=ttl,
                    problem=problem,
                    body=body,
                )
            )
        if verdict is Verdict.NOT_AUTHORIZED:
            return Finish(error=_not_authorized(self, problem))
        return None


def _not_authorized(call: Union[CaptureCall, VoidCall], problem: Dict[str, Any]) -> ChargeNotAuthorizedError:
    detail = _optional_str(problem.get("detail"))
    message = (
        f"charge {call.charge_id} is not an open authorization, so it cannot be {call.done}"
        + (f": {detail}" if detail else "")
        + f" [idempotency key {call.key!r}]"
    )
    return ChargeNotAuthorizedError(
        message, key=call.key, attempts=call.attempts, charge_id=call.charge_id, problem=problem
    )
