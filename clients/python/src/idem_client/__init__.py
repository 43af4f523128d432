"""idem-client: charges and refunds through idem that are retried the safe way.

One call of :meth:`Client.charge` (or :meth:`AsyncClient.charge`) is one
payment intent: one idempotency key and the very same body on every attempt,
so however often it retries, idem charges at most once. :meth:`Client.refund`
is one refund intent, retried the same way: idem refunds at most once. So
are the steps of a two-step payment: :meth:`Client.authorize` (hold the
amount), :meth:`Client.capture` (take part or all of it) and
:meth:`Client.void` (release the rest).

    from idem_client import Client, new_key

    key = new_key()  # store it beside the order first
    with Client("https://idem.example", secret) as idem:
        result = idem.charge(order_id=123, amount_cents=25_000, idempotency_key=key)
        result.charge.status  # "captured", "declined" or "failed"
        refund_key = new_key()  # one per refund intent, stored first too
        idem.refund(result.charge.id, 5_000, idempotency_key=refund_key).refund.status  # "succeeded"

        held = idem.authorize(order_id=124, amount_cents=25_000, idempotency_key=new_key())
        held.charge.status  # "authorized"
        idem.capture(held.charge.id, 10_000, final=False, idempotency_key=new_key())
        idem.void(held.charge.id, idempotency_key=new_key()).void.amount_cents  # 15_000 released
"""

from ._async import AsyncClient
from ._core import new_key
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
from ._sync import Client
from ._types import (
    Attempt,
    Capture,
    CaptureResult,
    Charge,
    ChargeResult,
    Refund,
    RefundReason,
    RefundResult,
    RetryPolicy,
    Void,
    VoidResult,
)
from ._version import __version__

__all__ = [
    "ApiError",
    "AsyncClient",
    "Attempt",
    "Capture",
    "CaptureExceedsAuthorizationError",
    "CaptureFailedError",
    "CaptureResult",
    "Charge",
    "ChargeNotAuthorizedError",
    "ChargeNotRefundableError",
    "ChargeResult",
    "Client",
    "GaveUpError",
    "IdemError",
    "KeyExpiredError",
    "KeyReusedError",
    "Refund",
    "RefundExceedsCapturedError",
    "RefundFailedError",
    "RefundReason",
    "RefundResult",
    "RetryPolicy",
    "Void",
    "VoidFailedError",
    "VoidResult",
    "__version__",
    "new_key",
]
