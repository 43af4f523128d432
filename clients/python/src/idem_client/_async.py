"""The asyncio client: a thin loop that carries out what a :class:`Call` decides."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, ClassVar, Optional, Sequence, Tuple, Type, TypeVar, Union

import httpx

from ._core import AuthorizeCall, CaptureCall, Call, ChargeCall, Config, RefundCall, Send, Sleep, VoidCall
from ._types import CaptureResult, ChargeResult, RefundReason, RefundResult, RetryPolicy, VoidResult

R = TypeVar("R")


class AsyncClient:
    """The asyncio twin of :class:`Client`, with the same behaviour and API
    (``await client.charge(...)``, ``await client.refund(...)``,
    ``await client.authorize(...)``, ``capture``, ``void``). Close it
    with ``await client.aclose()`` or ``async with``; an ``http_client`` given
    to it stays open, as its owner's.
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
        http_client: Optional[httpx.AsyncClient] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._config = Config.build(base_url, secret, policy)
        if http_client is not None and transport is not None:
            raise ValueError("give http_client or transport, not both")
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient(transport=transport)

    @property
    def policy(self) -> RetryPolicy:
        return self._config.policy

    async def charge(
        self,
        *,
        order_id: int,
        amount_cents: int,
        currency: Optional[str] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> ChargeResult:
        """Charges ``amount_cents`` for ``order_id``: one payment intent
        (see :meth:`Client.charge`)."""
        call = self._call_type(
            self._config,
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            description=description,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return await self._run(call)

    async def refund(
        self,
        charge_id: str,
        amount_cents: Optional[int] = None,
        *,
        reason: Optional[RefundReason] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> RefundResult:
        """Refunds ``amount_cents`` of charge ``charge_id`` (``None``: all it
        has left): one refund intent (see :meth:`Client.refund`)."""
        call = self._refund_call_type(
            self._config,
            charge_id=charge_id,
            amount_cents=amount_cents,
            reason=reason,
            description=description,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return await self._run(call)

    async def authorize(
        self,
        *,
        order_id: int,
        amount_cents: int,
        currency: Optional[str] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> ChargeResult:
        """Authorizes ``amount_cents`` for ``order_id``, to capture later
        (see :meth:`Client.authorize`)."""
        call = self._authorize_call_type(
            self._config,
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            description=description,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return await self._run(call)

    async def capture(
        self,
        charge_id: str,
        amount_cents: Optional[int] = None,
        *,
        final: bool = True,
        idempotency_key: Optional[str] = None,
    ) -> CaptureResult:
        """Captures ``amount_cents`` of the authorized charge ``charge_id``
        (``None``: all it has left): one capture intent (see
        :meth:`Client.capture`)."""
        call = self._capture_call_type(
            self._config,
            charge_id=charge_id,
            amount_cents=amount_cents,
            final=final,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return await self._run(call)

    async def void(self, charge_id: str, *, idempotency_key: Optional[str] = None) -> VoidResult:
        """Voids the authorized charge ``charge_id``: one void intent (see
        :meth:`Client.void`)."""
        call = self._void_call_type(
            self._config,
            charge_id=charge_id,
            idempotency_key=idempotency_key,
            now=time.monotonic(),
        )
        return await self._run(call)

    async def _run(self, call: Call[R]) -> R:
        while True:
            action = call.next(time.monotonic())
            if isinstance(action, Send):
                await self._attempt(call, action)
            elif isinstance(action, Sleep):
                await asyncio.sleep(action.seconds)
            else:
                return action.unwrap()

    async def _attempt(self, call: Call[Any], send: Send) -> None:
        try:
            # The timeout covers the whole exchange: connect to the last byte of the body.
            status, headers, body = await asyncio.wait_for(self._exchange(send), send.timeout)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            call.timed_out(time.monotonic())
        except httpx.RequestError as error:
            call.failed(time.monotonic(), error)
        else:
            call.answered(time.monotonic(), status, headers, body)

    async def _exchange(self, send: Send) -> Tuple[int, httpx.Headers, bytes]:
        async with self._http.stream(
            "POST",
            send.url,
            headers=send.headers,
            content=send.body,
            timeout=send.timeout,
            follow_redirects=False,
        ) as response:
            body = await response.aread()
        return response.status_code, response.headers, body

    async def aclose(self) -> None:
        """Closes the connections (not those of an ``http_client`` given to it)."""
        if self._owns_http:
            await self._http.aclose()

    async def close(self) -> None:
        """The same as :meth:`aclose`."""
        await self.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self._config!r})"
