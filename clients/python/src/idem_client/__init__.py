"""idem-client: charges through idem that are retried the safe way.

One call of :meth:`Client.charge` (or :meth:`AsyncClient.charge`) is one
payment intent: one idempotency key and the very same body on every attempt,
so however often it retries, idem charges at most once.

    from idem_client import Client, new_key

    key = new_key()  # store it beside the order first
    with Client("https://idem.example", secret) as idem:
        result = idem.charge(order_id=123, amount_cents=25_000, idempotency_key=key)
    result.charge.status  # "captured", "declined" or "failed"
"""

from ._async import AsyncClient
from ._core import new_key
from ._errors import ApiError, GaveUpError, IdemError, KeyExpiredError, KeyReusedError
from ._sync import Client
from ._types import Attempt, Charge, ChargeResult, RetryPolicy
from ._version import __version__

__all__ = [
    "ApiError",
    "AsyncClient",
    "Attempt",
    "Charge",
    "ChargeResult",
    "Client",
    "GaveUpError",
    "IdemError",
    "KeyExpiredError",
    "KeyReusedError",
    "RetryPolicy",
    "__version__",
    "new_key",
]
