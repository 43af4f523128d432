"""The blocking client: a thin loop that carries out what a :class:`Call` decides."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Any, ClassVar, Optional, Sequence, Tuple, Type, TypeVar, Union

import httpx

from ._core import AuthorizeCall, CaptureCall, Call, ChargeCall, Config, RefundCall, Send, Sleep, VoidCall
from ._types import CaptureResult, ChargeResult, RefundReason, RefundResult, RetryPolicy, VoidResult

R = TypeVar("R")

_Answer = Tuple[int, httpx.Headers, bytes]


class Client:
    """A charge, refund and two-step (authorize, capture, void) client for one
    merchant (its ``secret``) and one or more idem instances (attempt ``i``
    goes to ``base_url[i % n]``).

    Thread-safe: one client may serve many threads. Close it (or use it as a
    context manager) to release its connections; an ``http_client`` given to
    it stays open, as its owner's.
    """

    _call_type: ClassVar[Type[ChargeCall]] = ChargeCall
    _refund_call_type: ClassVar[Type[RefundCall]] = RefundCall
    _authorize_call_type: ClassVar[Type[ChargeCall]] = AuthorizeCall
    _capture_call_type: ClassVar[Type[CaptureCall]] = CaptureCall
    _void_call_type: ClassVar[Type[VoidCall]] = VoidCall

    def __init__(
        self,
        base_url: Union[str, Sequence[str]],
        secret: str,
        *,
        policy: RetryPolicy = RetryPolicy(),
        http_client: Optional[httpx.Client] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._config = Config.build(base_url, secret, policy)
        if http_client is not None and transport is not None:
            raise ValueError("give http_client or transport, not both")
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.Client(transport=transport)

    @property
    def policy(self) -> RetryPolicy:
        return self._config.policy

    def charge(
        self,
        *,
        order_id: int,
        amount_cents: int,
        currency: Optional[str] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> ChargeResult:
        """Charges ``amount_cents`` for ``order_id``: one payment intent.

        Every attempt carries one idempotency key (``idempotency_key``, or a new
        one) and the same body, so however often it retries, idem charges at
        most once. Returns the stored outcome (captured, declined or failed:
        ``result.charge.status``); raises :class:`KeyReusedError`,
        :class:`KeyExpiredError`, :class:`ApiError` or :class:`GaveUpError`,
        each with the ``key``. Bad input raises :class:`ValueError` or
        :class:`TypeError` before any attempt.
        """
        call = self._call_type(
            self._config,
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            description=description,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return self._run(call)

    def refund(
        self,
        charge_id: str,
        amount_cents: Optional[int] = None,
        *,
        reason: Optional[RefundReason] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> RefundResult:
        """Refunds ``amount_cents`` of charge ``charge_id`` (``None``: all it
        has left): one refund intent, retried exactly as :meth:`charge` is.

        Every attempt carries one idempotency key (``idempotency_key``, or a new one) and
        the same body, so however often it retries, idem refunds at most once.
        Returns the refund the acquirer paid; raises :class:`RefundFailedError`
        (the acquirer refused it: a stored outcome),
        :class:`RefundExceedsCapturedError`, :class:`ChargeNotRefundableError`,
        :class:`KeyReusedError`, :class:`KeyExpiredError`, :class:`ApiError`
        (``404``: no such charge) or :class:`GaveUpError`, each with the
        ``key``. Bad input raises :class:`ValueError` or :class:`TypeError`
        before any attempt.
        """
        call = self._refund_call_type(
            self._config,
            charge_id=charge_id,
            amount_cents=amount_cents,
            reason=reason,
            description=description,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return self._run(call)

    def authorize(
        self,
        *,
        order_id: int,
        amount_cents: int,
        currency: Optional[str] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> ChargeResult:
        """Authorizes ``amount_cents`` for ``order_id`` (holds it on the card,
        to capture later): the first step of a two-step payment,
        ``POST /v1/charges`` with ``"capture": false``. One intent, retried
        exactly as :meth:`charge` is, under one key.

        Returns the stored outcome as a :class:`ChargeResult`: authorized
        (``201``, ``result.charge.status == "authorized"``, with
        ``amount_capturable_cents``), declined or failed; raises as
        :meth:`charge` does.
        """
        call = self._authorize_call_type(
            self._config,
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            description=description,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return self._run(call)

    def capture(
        self,
        charge_id: str,
        amount_cents: Optional[int] = None,
        *,
        final: bool = True,
        idempotency_key: Optional[str] = None,
    ) -> CaptureResult:
        """Captures ``amount_cents`` of the authorized charge ``charge_id``
        (``None``: all the authorization has left). ``final`` (the default)
        closes the authorization and releases what remains; ``final=False``
        leaves the rest capturable. One capture intent, retried exactly as
        :meth:`charge` is, under one key, so idem captures at most once.

        A ``409`` ``authorization-closed`` (a final capture or a void of the
        charge is pending at the acquirer) is retried too: nothing is stored
        under the key, and once that step settles a retry gets this capture
        or a final refusal. Returns the capture the acquirer made; raises
        :class:`CaptureFailedError` (the acquirer refused it: a stored
        outcome), :class:`CaptureExceedsAuthorizationError`,
        :class:`ChargeNotAuthorizedError`, :class:`KeyReusedError`,
        :class:`KeyExpiredError`, :class:`ApiError` (``404``: no such charge)
        or :class:`GaveUpError`, each with the ``key``.
        """
        call = self._capture_call_type(
            self._config,
            charge_id=charge_id,
            amount_cents=amount_cents,
            final=final,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return self._run(call)

    def void(self, charge_id: str, *, idempotency_key: Optional[str] = None) -> VoidResult:
        """Voids the authorized charge ``charge_id``: releases what its
        authorization still holds (after partial captures, the rest). One void
        intent, retried exactly as :meth:`charge` is, under one key.

        A ``409`` ``capture-pending`` (captures of the charge are pending at
        the acquirer) or ``authorization-closed`` is retried too: nothing is
        stored under the key, and once the other step settles a retry gets
        this void or a final refusal. Returns the void; raises
        :class:`VoidFailedError` (the acquirer refused it: a stored outcome),
        :class:`ChargeNotAuthorizedError`, :class:`KeyReusedError`,
        :class:`KeyExpiredError`, :class:`ApiError` or :class:`GaveUpError`.
        """
        call = self._void_call_type(
            self._config,
            charge_id=charge_id,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return self._run(call)

    def _run(self, call: Call[R]) -> R:
        while True:
            action = call.next(time.monotonic())
            if isinstance(action, Send):
                self._attempt(call, action)
            elif isinstance(action, Sleep):
                time.sleep(action.seconds)
            else:
                return action.unwrap()

    def _attempt(self, call: Call[Any], send: Send) -> None:
        # httpx's timeouts bound each network wait, not the whole exchange, so
        # the exchange runs on a thread of its own and this one waits for it at
        # most the attempt's timeout: connect to the last byte of the body. An
        # exchange left behind ends within httpx's timeouts (set to the same),
        # and its answer is dropped, as a timed out attempt's is.
        answer: Future[_Answer] = Future()
        worker = threading.Thread(
            target=self._exchange, args=(send, answer), name="idem-client-attempt", daemon=True
        )
        worker.start()
        try:
            status, headers, body = answer.result(timeout=send.timeout)
        except FutureTimeout:
            call.timed_out(time.monotonic())
        except httpx.TimeoutException:
            call.timed_out(time.monotonic())
        except httpx.RequestError as error:
            call.failed(time.monotonic(), error)
        else:
            call.answered(time.monotonic(), status, headers, body)

    def _exchange(self, send: Send, answer: Future[_Answer]) -> None:
        try:
            with self._http.stream(
                "POST",
                send.url,
                headers=send.headers,
                content=send.body,
                timeout=send.timeout,
                follow_redirects=False,
            ) as response:
                body = response.read()
            answer.set_result((response.status_code, response.headers, body))
        except BaseException as error:  # handed to the caller's thread, which decides
            answer.set_exception(error)

    def close(self) -> None:
        """Closes the connections (not those of an ``http_client`` given to it)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self._config!r})"
