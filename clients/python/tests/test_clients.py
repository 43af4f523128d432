"""Client and AsyncClient over HTTP: what goes on the wire, and how a
misbehaving server's answers end an attempt. Each test runs both clients."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import httpx
import pytest

import idem_client
from idem_client import (
    ApiError,
    AsyncClient,
    CaptureExceedsAuthorizationError,
    CaptureFailedError,
    CaptureResult,
    ChargeNotAuthorizedError,
    ChargeNotRefundableError,
    ChargeResult,
    Client,
    GaveUpError,
    KeyExpiredError,
    KeyReusedError,
    RefundExceedsCapturedError,
    RefundFailedError,
    RefundResult,
    RetryPolicy,
    VoidFailedError,
    VoidResult,
)
from scripted_server import ScriptedServer, close, cut, free_port, hang, respond, trickle

KINDS = ["sync", "async"]
FAST = RetryPolicy(base_delay=0.01, max_delay=0.05, attempt_timeout=2, deadline=10)

CHARGE = {
    "id": "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
    "order_id": 123,
    "amount_cents": 25000,
    "currency": "BRL",
    "status": "captured",
    "acquirer_reference": "ref_abc",
    "decline_reason": None,
    "created_at": "2026-12-02T07:00:00Z",
}
CAPTURED = json.dumps(CHARGE).encode()

REFUND = {
    "id": "re_7kLmQ2xZ9pR4tV8bN1cW6yHd",
    "charge_id": CHARGE["id"],
    "amount_cents": 5000,
    "currency": "BRL",
    "status": "succeeded",
    "reason": "requested_by_customer",
    "description": None,
    "acquirer_reference": "ref_r1",
    "failure_reason": None,
    "created_at": "2026-12-06T20:00:00Z",
}
REFUNDED = json.dumps(REFUND).encode()
REFUNDS_PATH = f"/v1/charges/{CHARGE['id']}/refunds"


def problem(status: int, kind: str, **extra: Any) -> bytes:
    return json.dumps({"type": f"urn:idem:problem:{kind}", "title": kind, "status": status, "detail": "d", **extra}).encode()


def charge(
    kind: str,
    base_url: Union[str, List[str]],
    *,
    policy: RetryPolicy = FAST,
    transport: Optional[httpx.MockTransport] = None,
    **fields: Any,
) -> ChargeResult:
    """One charge through the sync or the async client."""
    fields.setdefault("order_id", 123)
    fields.setdefault("amount_cents", 25000)
    if kind == "sync":
        with Client(base_url, "sk_test", policy=policy, transport=transport) as client:
            return client.charge(**fields)

    async def run() -> ChargeResult:
        async with AsyncClient(base_url, "sk_test", policy=policy, transport=transport) as client:
            return await client.charge(**fields)

    return asyncio.run(run())


def refund(
    kind: str,
    base_url: Union[str, List[str]],
    charge_id: str = str(CHARGE["id"]),
    amount_cents: Optional[int] = 5000,
    *,
    policy: RetryPolicy = FAST,
    transport: Optional[httpx.MockTransport] = None,
    **fields: Any,
) -> RefundResult:
    """One refund through the sync or the async client."""
    if kind == "sync":
        with Client(base_url, "sk_test", policy=policy, transport=transport) as client:
            return client.refund(charge_id, amount_cents, **fields)

    async def run() -> RefundResult:
        async with AsyncClient(base_url, "sk_test", policy=policy, transport=transport) as client:
            return await client.refund(charge_id, amount_cents, **fields)

    return asyncio.run(run())


def step(kind: str, op: str, base_url: Union[str, List[str]], *args: Any, **fields: Any) -> Any:
    """One ``authorize``, ``capture`` or ``void`` through the sync or the async client."""
    policy = fields.pop("policy", FAST)
    transport = fields.pop("transport", None)
    if kind == "sync":
        with Client(base_url, "sk_test", policy=policy, transport=transport) as client:
            return getattr(client, op)(*args, **fields)

    async def run() -> Any:
        async with AsyncClient(base_url, "sk_test", policy=policy, transport=transport) as client:
            return await getattr(client, op)(*args, **fields)

    return asyncio.run(run())


class Recorder:
    """A MockTransport handler that answers from a list and keeps the requests."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: List[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.answers.pop(0)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


@pytest.mark.parametrize("kind", KINDS)
def test_every_attempt_sends_the_same_key_body_and_headers(kind: str) -> None:
    unknown = httpx.Response(503, content=problem(503, "outcome-unknown"))
    recorder = Recorder(
        unknown,
        httpx.Response(502, content=b"bad gateway"),
        httpx.Response(201, content=CAPTURED, headers={"Idempotent-Replayed": "true", "Idempotency-TTL": "86399"}),
    )
    result = charge(
        kind,
        ["http://one:1", "http://two:2/base/"],
        transport=recorder.transport,
        idempotency_key='my "key"',
        currency="BRL",
        description="two coffees",
    )
    assert (result.status, result.replayed, result.idempotency_ttl, result.key) == (201, True, 86399, 'my "key"')
    assert result.body == CAPTURED
    assert [a.status for a in result.attempts] == [503, 502, 201]
    assert [a.endpoint for a in result.attempts] == ["http://one:1", "http://two:2/base/", "http://one:1"]
    urls = [str(r.url) for r in recorder.requests]
    assert urls == ["http://one:1/v1/charges", "http://two:2/base/v1/charges", "http://one:1/v1/charges"]
    bodies = {r.content for r in recorder.requests}
    assert bodies == {b'{"order_id":123,"amount_cents":25000,"currency":"BRL","description":"two coffees"}'}
    for request in recorder.requests:
        assert request.method == "POST"
        assert request.headers["authorization"] == "Bearer sk_test"
        assert request.headers["content-type"] == "application/json"
        assert request.headers["idempotency-key"] == '"my \\"key\\""'
        assert request.headers["prefer"] == "wait=1"  # attempt_timeout 2 s leaves 1
        assert request.headers["user-agent"] == f"idem-client-python/{idem_client.__version__}"
        assert len(request.headers.get_list("idempotency-key")) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_key_per_call_is_made_and_kept_on_the_result(kind: str) -> None:
    recorder = Recorder(
        httpx.Response(409, content=problem(409, "request-in-flight")),
        httpx.Response(201, content=CAPTURED),
    )
    result = charge(kind, "http://h", transport=recorder.transport)
    assert {r.headers["idempotency-key"] for r in recorder.requests} == {f'"{result.key}"'}


@pytest.mark.parametrize("kind", KINDS)
def test_redirects_are_final_answers_not_followed(kind: str) -> None:
    recorder = Recorder(httpx.Response(307, headers={"Location": "http://elsewhere/v1/charges"}))
    with pytest.raises(ApiError) as caught:
        if kind == "sync":
            with httpx.Client(transport=recorder.transport, follow_redirects=True) as http:
                Client("http://h", "sk", policy=FAST, http_client=http).charge(order_id=1, amount_cents=1)
        else:

            async def run() -> None:
                async with httpx.AsyncClient(transport=recorder.transport, follow_redirects=True) as http:
                    await AsyncClient("http://h", "sk", policy=FAST, http_client=http).charge(order_id=1, amount_cents=1)

            asyncio.run(run())
    assert caught.value.status == 307
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_typed_errors_and_results_over_http(kind: str) -> None:
    declined = {**CHARGE, "status": "declined", "decline_reason": "insufficient_funds"}
    recorder = Recorder(
        httpx.Response(402, content=problem(402, "charge-declined", charge=declined), headers={"Idempotency-TTL": "5"}),
        httpx.Response(422, content=problem(422, "idempotency-key-reused", differing_fields=["amount_cents"], charge_id="ch_1")),
        httpx.Response(410, content=problem(410, "key-expired", charge_id="ch_2")),
        httpx.Response(400, content=problem(400, "invalid-body", field="amount_cents")),
    )
    result = charge(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert (result.status, result.charge.status, result.idempotency_ttl) == (402, "declined", 5)
    with pytest.raises(KeyReusedError) as reused:
        charge(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert (reused.value.charge_id, reused.value.differing_fields, reused.value.key) == ("ch_1", ["amount_cents"], "k")
    with pytest.raises(KeyExpiredError) as expired:
        charge(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert expired.value.charge_id == "ch_2"
    with pytest.raises(ApiError) as api:
        charge(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert api.value.problem is not None and api.value.problem["field"] == "amount_cents"
    assert len(recorder.requests) == 4


@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_is_refused_before_any_attempt(kind: str) -> None:
    recorder = Recorder()
    cases: List[Tuple[Union[str, List[str]], Dict[str, Any]]] = [
        ([], {}),
        ("ftp://h", {}),
        ("http://h?x=1", {}),
        ("http://h", {"idempotency_key": "chave-\u00e9"}),
        ("http://h", {"idempotency_key": "line\nbreak"}),
    ]
    for base, fields in cases:
        with pytest.raises(ValueError):
            charge(kind, base, transport=recorder.transport, **fields)
    assert recorder.requests == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_body_cut_off_half_way_is_a_lost_answer_and_retried(kind: str) -> None:
    with ScriptedServer([cut(201, CAPTURED, 20), respond(201, CAPTURED, {"Idempotent-Replayed": "true"})]) as server:
        result = charge(kind, server.url)
    assert (result.status, result.replayed, len(result.attempts)) == (201, True, 2)
    first = result.attempts[0]
    assert first.status is None and first.error is not None and first.error.startswith("connection failed: ")
    assert server.requests[0].body == server.requests[1].body


@pytest.mark.parametrize("kind", KINDS)
def test_the_attempt_timeout_covers_the_whole_body(kind: str) -> None:
    # The head comes at once and each byte within 0.15 s, so no single read
    # waits long; the body as a whole takes far longer than the attempt may.
    policy = RetryPolicy(attempt_timeout=0.6, base_delay=0.01, max_delay=0.01, deadline=10)
    with ScriptedServer([trickle(201, CAPTURED, 0.15), respond(201, CAPTURED)]) as server:
        started = time.monotonic()
        result = charge(kind, server.url, policy=policy)
        took = time.monotonic() - started
    first = result.attempts[0]
    assert first.error == "timed out after 0.6 s", first
    assert 0.55 <= first.elapsed < 0.9, first
    assert len(result.attempts) == 2 and took < 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_hung_server_costs_one_attempt_and_a_closed_one_is_retried(kind: str) -> None:
    policy = RetryPolicy(attempt_timeout=0.5, base_delay=0.01, max_delay=0.01, deadline=10)
    with ScriptedServer([hang(3), close(), respond(201, CAPTURED)]) as server:
        result = charge(kind, server.url, policy=policy)
    assert [str(a).split(":")[0] for a in result.attempts] == ["timed out after 0.5 s", "connection failed", "status 201"]


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_up_on_a_refused_port_with_the_key(kind: str) -> None:
    host, port = free_port()
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.01)
    with pytest.raises(GaveUpError) as caught:
        charge(kind, f"http://{host}:{port}", policy=policy, idempotency_key="kept")
    error = caught.value
    assert error.key == "kept" and len(error.attempts) == 3
    assert all(a.error is not None and a.error.startswith("connection failed: ") for a in error.attempts)
    assert error.last.endswith("max_attempts (3) reached")
    assert "'kept'" in str(error) and "may have happened" in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_no_attempt_runs_past_the_deadline(kind: str) -> None:
    policy = RetryPolicy(deadline=0.8, attempt_timeout=0.5, base_delay=0.01, max_delay=0.01)
    with ScriptedServer([hang(3), hang(3), hang(3)]) as server:
        started = time.monotonic()
        with pytest.raises(GaveUpError) as caught:
            charge(kind, server.url, policy=policy)
        took = time.monotonic() - started
    assert took < 1.1, took
    timeouts = [a.error for a in caught.value.attempts]
    assert timeouts[0] == "timed out after 0.5 s"
    assert len(timeouts) == 2 and timeouts[1] is not None and timeouts[1].startswith("timed out after 0.2")


@pytest.mark.parametrize("kind", KINDS)
def test_a_refund_retries_a_503_with_the_same_key_and_body(kind: str) -> None:
    unknown = problem(503, "outcome-unknown", refund_id=REFUND["id"])
    script = [respond(503, unknown, {"Retry-After": "0"}), respond(201, REFUNDED, {"Idempotency-TTL": "86399"})]
    with ScriptedServer(script) as server:
        result = refund(kind, server.url, reason="requested_by_customer", description="two coffees", idempotency_key='r "1"')
    assert (result.status, result.replayed, result.idempotency_ttl, result.key) == (201, False, 86399, 'r "1"')
    assert result.refund.id == REFUND["id"] and result.refund.amount_cents == 5000
    assert result.body == REFUNDED
    assert [a.status for a in result.attempts] == [503, 201]
    assert len(server.requests) == 2
    for request in server.requests:
        assert (request.method, request.path) == ("POST", REFUNDS_PATH)
        assert request.headers["idempotency-key"] == '"r \\"1\\""'
        assert request.headers["content-type"] == "application/json"
        assert request.headers["authorization"] == "Bearer sk_test"
        assert request.body == b'{"amount_cents":5000,"reason":"requested_by_customer","description":"two coffees"}'


@pytest.mark.parametrize("kind", KINDS)
def test_a_refund_above_what_is_left_is_not_retried(kind: str) -> None:
    exceeds = problem(422, "refund-exceeds-captured", remaining_cents=20000)
    with ScriptedServer([respond(422, exceeds), respond(201, REFUNDED)]) as server:
        with pytest.raises(RefundExceedsCapturedError) as caught:
            refund(kind, server.url, amount_cents=30000, idempotency_key="r-2")
    error = caught.value
    assert (error.remaining_cents, error.charge_id, error.key, len(error.attempts)) == (20000, CHARGE["id"], "r-2", 1)
    assert len(server.requests) == 1, "a refund above what is left was sent again"
    assert server.requests[0].body == b'{"amount_cents":30000}'


@pytest.mark.parametrize("kind", KINDS)
def test_a_refund_whose_answer_was_lost_is_replayed_by_the_retry(kind: str) -> None:
    replayed = {"Idempotent-Replayed": "true", "Idempotency-TTL": "86398"}
    with ScriptedServer([cut(201, REFUNDED, 20), respond(201, REFUNDED, replayed)]) as server:
        result = refund(kind, server.url, amount_cents=None)
    assert (result.status, result.replayed, result.idempotency_ttl, len(result.attempts)) == (201, True, 86398, 2)
    assert result.attempts[0].error is not None and result.attempts[0].error.startswith("connection failed: ")
    assert [r.body for r in server.requests] == [b"{}", b"{}"]  # no amount: all the charge has left
    assert len({r.headers["idempotency-key"] for r in server.requests}) == 1
    assert server.requests[0].headers["idempotency-key"] == f'"{result.key}"'


@pytest.mark.parametrize("kind", KINDS)
def test_a_refunds_typed_errors_over_http(kind: str) -> None:
    refused = {**REFUND, "status": "failed", "failure_reason": "exceeds_capture"}
    recorder = Recorder(
        httpx.Response(422, content=problem(422, "refund-failed", refund=refused), headers={"Idempotency-TTL": "5"}),
        httpx.Response(422, content=problem(422, "charge-not-refundable")),
        httpx.Response(422, content=problem(422, "idempotency-key-reused", differing_fields=["operation"], charge_id="ch_1")),
        httpx.Response(410, content=problem(410, "key-expired", refund_id="re_2")),
        httpx.Response(404, content=problem(404, "not-found")),
    )
    with pytest.raises(RefundFailedError) as failed:
        refund(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert (failed.value.refund.status, failed.value.refund.failure_reason) == ("failed", "exceeds_capture")
    assert (failed.value.replayed, failed.value.idempotency_ttl) == (False, 5)
    with pytest.raises(ChargeNotRefundableError) as not_refundable:
        refund(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert not_refundable.value.charge_id == CHARGE["id"]
    with pytest.raises(KeyReusedError) as reused:
        refund(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert (reused.value.charge_id, reused.value.differing_fields) == ("ch_1", ["operation"])
    with pytest.raises(KeyExpiredError) as expired:
        refund(kind, "http://h", transport=recorder.transport, idempotency_key="k")
    assert expired.value.refund_id == "re_2"
    with pytest.raises(ApiError) as missing:
        refund(kind, "http://h", charge_id="ch_nope", transport=recorder.transport, idempotency_key="k")
    assert missing.value.status == 404
    assert len(recorder.requests) == 5
    assert str(recorder.requests[-1].url) == "http://h/v1/charges/ch_nope/refunds"


@pytest.mark.parametrize("kind", KINDS)
def test_a_refund_gives_up_on_a_refused_port_with_the_key(kind: str) -> None:
    host, port = free_port()
    policy = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01)
    with pytest.raises(GaveUpError) as caught:
        refund(kind, f"http://{host}:{port}", policy=policy, idempotency_key="kept")
    assert caught.value.key == "kept" and len(caught.value.attempts) == 2
    assert "the refund may have happened" in str(caught.value)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_refund_input_is_refused_before_any_attempt(kind: str) -> None:
    recorder = Recorder()
    cases: List[Dict[str, Any]] = [{"charge_id": ""}, {"key": "chave-\u00e9"}, {"amount_cents": 1.5}, {"reason": 3}]
    for fields in cases:
        with pytest.raises((ValueError, TypeError)):
            refund(kind, "http://h", transport=recorder.transport, **fields)
    assert recorder.requests == []


AUTHORIZED = json.dumps(
    {**CHARGE, "status": "authorized", "amount_captured_cents": 0, "amount_capturable_cents": 25000}
).encode()
CAPTURE = {
    "id": "cp_7kLmQ2xZ9pR4tV8bN1cW6yHd",
    "charge_id": CHARGE["id"],
    "amount_cents": 10000,
    "currency": "BRL",
    "final": False,
    "status": "succeeded",
    "acquirer_reference": "ref_c1",
    "failure_reason": None,
    "created_at": "2026-12-07T03:00:00Z",
}
CAPTURED_STEP = json.dumps(CAPTURE).encode()
VOID = {k: v for k, v in CAPTURE.items() if k != "final"}
VOID.update(id="vd_7kLmQ2xZ9pR4tV8bN1cW6yHd", amount_cents=15000)
VOIDED = json.dumps(VOID).encode()


@pytest.mark.parametrize("kind", KINDS)
def test_two_steps_over_http_each_one_key_and_one_body(kind: str) -> None:
    unknown = problem(503, "outcome-unknown")
    script = [
        respond(503, unknown, {"Retry-After": "0"}),
        respond(201, AUTHORIZED, {"Idempotency-TTL": "86399"}),
        cut(201, CAPTURED_STEP, 20),
        respond(201, CAPTURED_STEP, {"Idempotent-Replayed": "true"}),
        respond(409, problem(409, "capture-pending")),
        respond(409, problem(409, "authorization-closed")),
        respond(201, VOIDED),
    ]
    with ScriptedServer(script) as server:
        held = step(kind, "authorize", server.url, order_id=123, amount_cents=25000, idempotency_key="a 1")
        captured = step(kind, "capture", server.url, CHARGE["id"], 10000, final=False)
        voided = step(kind, "void", server.url, CHARGE["id"], idempotency_key="v-1")
    assert isinstance(held, ChargeResult) and held.authorized and held.charge.amount_capturable_cents == 25000
    assert (held.key, [a.status for a in held.attempts]) == ("a 1", [503, 201])
    assert isinstance(captured, CaptureResult) and captured.capture.id == CAPTURE["id"]
    assert (captured.replayed, len(captured.attempts)) == (True, 2)
    assert isinstance(voided, VoidResult) and voided.void.amount_cents == 15000
    assert [a.status for a in voided.attempts] == [409, 409, 201]
    requests = server.requests
    assert [(r.method, r.path) for r in requests] == [("POST", "/v1/charges")] * 2 + [
        ("POST", f"/v1/charges/{CHARGE['id']}/captures")
    ] * 2 + [("POST", f"/v1/charges/{CHARGE['id']}/void")] * 3
    assert [r.body for r in requests] == [b'{"order_id":123,"amount_cents":25000,"capture":false}'] * 2 + [
        b'{"amount_cents":10000,"final":false}'
    ] * 2 + [b"{}"] * 3
    keys = [r.headers["idempotency-key"] for r in requests]
    assert keys[:2] == ['"a 1"'] * 2 and keys[2:4] == [f'"{captured.key}"'] * 2 and keys[4:] == ['"v-1"'] * 3


@pytest.mark.parametrize("kind", KINDS)
def test_the_steps_typed_errors_over_http_none_retried(kind: str) -> None:
    failed_capture = {**CAPTURE, "status": "failed", "failure_reason": "exceeds_authorization"}
    failed_void = {**VOID, "status": "failed", "failure_reason": "authorization_voided"}
    recorder = Recorder(
        httpx.Response(422, content=problem(422, "capture-exceeds-authorization", remaining_cents=15000)),
        httpx.Response(422, content=problem(422, "charge-not-authorized")),
        httpx.Response(422, content=problem(422, "capture-failed", capture=failed_capture)),
        httpx.Response(422, content=problem(422, "void-failed", void=failed_void), headers={"Idempotency-TTL": "5"}),
        httpx.Response(422, content=problem(422, "charge-not-authorized")),
    )
    with pytest.raises(CaptureExceedsAuthorizationError) as exceeds:
        step(kind, "capture", "http://h", CHARGE["id"], 30000, transport=recorder.transport)
    assert (exceeds.value.remaining_cents, exceeds.value.charge_id) == (15000, CHARGE["id"])
    with pytest.raises(ChargeNotAuthorizedError):
        step(kind, "capture", "http://h", CHARGE["id"], transport=recorder.transport)
    with pytest.raises(CaptureFailedError) as capture_failed:
        step(kind, "capture", "http://h", CHARGE["id"], transport=recorder.transport)
    assert capture_failed.value.capture.failure_reason == "exceeds_authorization"
    with pytest.raises(VoidFailedError) as void_failed:
        step(kind, "void", "http://h", CHARGE["id"], transport=recorder.transport)
    assert (void_failed.value.void.status, void_failed.value.idempotency_ttl) == ("failed", 5)
    with pytest.raises(ChargeNotAuthorizedError) as not_authorized:
        step(kind, "void", "http://h", CHARGE["id"], transport=recorder.transport)
    assert len(not_authorized.value.attempts) == 1
    assert len(recorder.requests) == 5, "a refusal was sent again"
    assert recorder.requests[1].content == b'{"final":true}'  # no amount: all that is left, and final


@pytest.mark.parametrize("kind", KINDS)
def test_bad_step_input_is_refused_before_any_attempt(kind: str) -> None:
    recorder = Recorder()
    cases: List[Tuple[str, Tuple[Any, ...], Dict[str, Any]]] = [
        ("capture", ("",), {}),
        ("capture", (CHARGE["id"], 1.5), {}),
        ("capture", (CHARGE["id"],), {"final": "yes"}),
        ("void", ("",), {}),
        ("void", (CHARGE["id"],), {"idempotency_key": "chave-\u00e9"}),
        ("authorize", (), {"order_id": 1, "amount_cents": "2"}),
    ]
    for op, args, fields in cases:
        with pytest.raises((ValueError, TypeError)):
            step(kind, op, "http://h", *args, transport=recorder.transport, **fields)
    assert recorder.requests == []


def test_a_given_http_client_stays_open_and_an_owned_one_is_closed() -> None:
    recorder = Recorder(httpx.Response(201, content=CAPTURED), httpx.Response(201, content=CAPTURED))
    with httpx.Client(transport=recorder.transport) as http:
        with Client("http://h", "sk", http_client=http) as client:
            client.charge(order_id=1, amount_cents=1)
        assert not http.is_closed
    client = Client("http://h", "sk", transport=recorder.transport)
    client.close()
    with pytest.raises(RuntimeError):
        client.charge(order_id=1, amount_cents=1)
    with pytest.raises(ValueError):
        Client("http://h", "sk", http_client=http, transport=recorder.transport)
    assert "sk_secret" not in repr(Client("http://h", "sk_secret"))
    assert "sk_secret" not in repr(AsyncClient("http://h", "sk_secret"))


def test_an_async_client_closes_only_what_it_owns() -> None:
    recorder = Recorder(httpx.Response(201, content=CAPTURED))

    async def run() -> None:
        async with httpx.AsyncClient(transport=recorder.transport) as http:
            async with AsyncClient("http://h", "sk", http_client=http) as client:
                await client.charge(order_id=1, amount_cents=1)
            assert not http.is_closed
        owned = AsyncClient("http://h", "sk", transport=recorder.transport)
        await owned.close()
        with pytest.raises(RuntimeError):
            await owned.charge(order_id=1, amount_cents=1)

    asyncio.run(run())


def test_async_calls_run_concurrently() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.3)
        return httpx.Response(201, content=CAPTURED)

    async def run() -> float:
        async with AsyncClient("http://h", "sk", transport=httpx.MockTransport(handler)) as client:
            started = time.monotonic()
            await asyncio.gather(*(client.charge(order_id=i, amount_cents=1) for i in range(1, 6)))
            return time.monotonic() - started

    assert asyncio.run(run()) < 1.0


def test_the_public_api() -> None:
    assert set(idem_client.__all__) >= {
        "Client",
        "AsyncClient",
        "RetryPolicy",
        "ChargeResult",
        "Charge",
        "RefundResult",
        "Refund",
        "RefundReason",
        "CaptureResult",
        "Capture",
        "VoidResult",
        "Void",
        "Attempt",
        "IdemError",
        "KeyReusedError",
        "KeyExpiredError",
        "RefundFailedError",
        "RefundExceedsCapturedError",
        "ChargeNotRefundableError",
        "CaptureFailedError",
        "VoidFailedError",
        "CaptureExceedsAuthorizationError",
        "ChargeNotAuthorizedError",
        "ApiError",
        "GaveUpError",
        "new_key",
    }
    for error in (
        idem_client.KeyReusedError,
        idem_client.KeyExpiredError,
        idem_client.RefundFailedError,
        idem_client.RefundExceedsCapturedError,
        idem_client.ChargeNotRefundableError,
        idem_client.CaptureFailedError,
        idem_client.VoidFailedError,
        idem_client.CaptureExceedsAuthorizationError,
        idem_client.ChargeNotAuthorizedError,
        idem_client.ApiError,
        idem_client.GaveUpError,
    ):
        assert issubclass(error, idem_client.IdemError)

