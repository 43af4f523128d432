"""The sans-IO core: every decision a call makes, driven by hand with a fake clock."""

from __future__ import annotations

import json
import math
import random
import uuid
from typing import Any, Dict, List, Optional, Tuple, TypeVar, Union

import pytest

from idem_client import (
    ApiError,
    Capture,
    CaptureExceedsAuthorizationError,
    CaptureFailedError,
    Charge,
    ChargeNotAuthorizedError,
    ChargeNotRefundableError,
    GaveUpError,
    KeyExpiredError,
    KeyReusedError,
    Refund,
    RefundExceedsCapturedError,
    RefundFailedError,
    RetryPolicy,
    Void,
    VoidFailedError,
    new_key,
)
from idem_client._core import (
    USER_AGENT,
    AuthorizeCall,
    Call,
    CaptureCall,
    ChargeCall,
    Config,
    Finish,
    RefundCall,
    Send,
    Sleep,
    Verdict,
    authorization,
    backoff_ceiling,
    backoff_delay,
    VoidCall,
    captures_path,
    classify,
    classify_capture,
    classify_refund,
    classify_void,
    describe_failure,
    encode_body,
    encode_capture_body,
    encode_refund_body,
    parse_capture,
    parse_charge,
    parse_endpoints,
    parse_refund,
    parse_retry_after,
    parse_void,
    prefer_wait,
    quote_key,
    refunds_path,
    void_path,
)

DRAWS = 2000
R = TypeVar("R")

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


REFUND = {
    "id": "re_7kLmQ2xZ9pR4tV8bN1cW6yHd",
    "charge_id": "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
    "amount_cents": 5000,
    "currency": "BRL",
    "status": "succeeded",
    "reason": "requested_by_customer",
    "description": None,
    "acquirer_reference": "ref_r1",
    "failure_reason": None,
    "created_at": "2026-12-06T20:00:00Z",
}


def problem(status: int, kind: str, **extra: object) -> bytes:
    doc: Dict[str, object] = {"type": f"urn:idem:problem:{kind}", "title": kind, "status": status, "detail": "d"}
    doc.update(extra)
    return json.dumps(doc).encode()


def charge_with(**fields: object) -> Dict[str, object]:
    return {**CHARGE, **fields}


# --- keys, endpoints, secret, body -------------------------------------------


def test_new_key_is_a_random_uuid4() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert uuid.UUID(key).version == 4
        assert str(uuid.UUID(key)) == key


def test_keys_are_sent_as_quoted_strings_with_escapes() -> None:
    key = "5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13"
    assert quote_key(key) == f'"{key}"'
    assert quote_key('a"b\\c') == '"a\\"b\\\\c"'
    assert quote_key(" spaced ~") == '" spaced ~"'


@pytest.mark.parametrize("key", ["", "a\nb", "chave-é", "tab\there", "del\x7f", "nul\x00", "emoji-\U0001f600"])
def test_keys_outside_printable_ascii_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        quote_key(key)


def test_endpoints_are_checked_up_front() -> None:
    (one,) = parse_endpoints("http://127.0.0.1:8080")
    assert one.base == "http://127.0.0.1:8080"
    assert one.charges_url == "http://127.0.0.1:8080/v1/charges"
    many = parse_endpoints(["http://127.0.0.1:8080/", "https://10.0.0.1:8443/base", "HTTP://h"])
    assert [e.charges_url for e in many] == [
        "http://127.0.0.1:8080/v1/charges",
        "https://10.0.0.1:8443/base/v1/charges",
        "HTTP://h/v1/charges",
    ]
    assert [e.base for e in many] == ["http://127.0.0.1:8080/", "https://10.0.0.1:8443/base", "HTTP://h"]


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "",
        "not a url",
        "ftp://h",
        "h:8080",
        "http://",
        "http://h:1/?q=1",
        "http://h:1/?",
        "http://h/#frag",
        "http://user:pw@h",
        "http://h:99999",
        " http://h",
        "http://h/\n",
    ],
)
def test_bad_base_urls_are_refused(bad: Union[str, List[str]]) -> None:
    with pytest.raises(ValueError):
        parse_endpoints(bad)


def test_the_secret_is_checked_and_never_shown() -> None:
    assert authorization("sk_live_x") == "Bearer sk_live_x"
    for bad in ["", "sk live", "sk\n", "sk_é"]:
        with pytest.raises(ValueError) as caught:
            authorization(bad)
        assert bad not in str(caught.value) or bad == ""
    config = Config.build("http://h", "sk_s3cret", RetryPolicy())
    assert "sk_s3cret" not in repr(config)


def test_the_body_is_compact_json_without_absent_fields() -> None:
    assert encode_body(order_id=1, amount_cents=2) == b'{"order_id":1,"amount_cents":2}'
    body = encode_body(order_id=123, amount_cents=25000, currency="BRL", description="caf\u00e9 \"x\"")
    assert json.loads(body) == {"order_id": 123, "amount_cents": 25000, "currency": "BRL", "description": 'café "x"'}
    assert body.isascii()
    bads: List[Dict[str, object]] = [{"order_id": True}, {"order_id": 1.5}, {"amount_cents": "25000"}]
    for bad in bads:
        fields: Dict[str, object] = {"order_id": 1, "amount_cents": 2, **bad}
        with pytest.raises(TypeError):
            encode_body(**fields)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_body(order_id=1, amount_cents=2, currency=3)  # type: ignore[arg-type]


def test_policy_defaults_and_checks() -> None:
    p = RetryPolicy()
    assert (p.max_attempts, p.deadline, p.attempt_timeout, p.base_delay, p.max_delay, p.prefer_wait) == (
        8,
        60.0,
        10.0,
        0.1,
        5.0,
        5,
    )
    for bad in [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"deadline": -1},
        {"attempt_timeout": 0},
        {"base_delay": float("nan")},
        {"max_delay": -0.1},
        {"prefer_wait": 1.5},
        {"prefer_wait": -1},
    ]:
        with pytest.raises(ValueError):
            RetryPolicy(**bad)  # type: ignore[arg-type]


# --- waiting -------------------------------------------------------------------


def policy(base: float, cap: float, **more: object) -> RetryPolicy:
    return RetryPolicy(base_delay=base, max_delay=cap, **more)  # type: ignore[arg-type]


def draws(p: RetryPolicy, retry: int, retry_after: Optional[float] = None) -> List[float]:
    return [backoff_delay(p, retry, retry_after) for _ in range(DRAWS)]


def test_full_jitter_stays_within_and_spans_the_window() -> None:
    # Missing a quarter of the window in 2000 uniform draws: (3/4)**2000.
    p = policy(0.01, 1000)
    for retry in range(8):
        ceiling = 0.01 * 2**retry
        ds = draws(p, retry)
        assert all(0 <= d <= ceiling for d in ds), retry
        assert any(d < ceiling / 4 for d in ds), f"retry {retry}: nothing in the bottom quarter"
        assert any(d > ceiling * 3 / 4 for d in ds), f"retry {retry}: nothing in the top quarter"


def test_the_window_doubles_per_retry_up_to_the_cap() -> None:
    p = policy(0.1, 5)
    assert [backoff_ceiling(p, r) for r in range(8)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5, 5])
    assert backoff_delay(p, 3, uniform=lambda: 1.0) == pytest.approx(0.8)
    assert backoff_delay(p, 3, uniform=lambda: 0.0) == 0.0
    assert any(d > 0.1 * 16 for d in draws(policy(0.1, 100), 5))


def test_the_cap_bounds_every_draw_even_for_huge_retries() -> None:
    p = policy(0.1, 5)
    for retry in [6, 10, 64, 1023, 1024, 10**6]:
        ds = draws(p, retry)
        assert all(d <= 5 for d in ds), retry
        assert any(d > 5 * 3 / 4 for d in ds), f"retry {retry}: the capped window is not used in full"
    assert backoff_delay(policy(1e300, 1e308), 10**9) <= 1e308


def test_retry_after_is_a_floor_above_the_window() -> None:
    assert all(d == 2.0 for d in draws(policy(0.001, 0.05), 3, 2.0))


def test_retry_after_inside_the_window_only_lifts_low_draws() -> None:
    ds = draws(policy(0.1, 0.1), 0, 0.05)
    assert all(0.05 <= d <= 0.1 for d in ds)
    assert 0.05 in ds
    assert any(d > 0.075 for d in ds)


def test_a_zero_base_or_cap_means_no_wait_unless_the_server_asks() -> None:
    assert all(d == 0 for d in draws(policy(0, 5), 4))
    assert all(d == 0 for d in draws(policy(0.1, 0), 4))
    assert backoff_delay(policy(0, 5), 4, 1.0) == 1.0


def test_retry_after_is_whole_seconds_only() -> None:
    assert parse_retry_after("0") == 0
    assert parse_retry_after(" 3 ") == 3
    assert parse_retry_after("99999999999999999999999") == math.inf
    for bad in [None, "", "-1", "1.5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "\u0663"]:
        assert parse_retry_after(bad) is None, bad


@pytest.mark.parametrize(
    ("configured", "timeout", "sent"),
    [
        (5, 10, 5),
        (5, 8, 5),
        (5, 6, 5),
        (5, 5.9, 4),
        (5, 2, 1),
        (5, 1.99, None),
        (5, 1, None),
        (5, 0.5, None),
        (0, 10, None),
        (30, 10, 9),
        (5, math.inf, 5),
    ],
)
def test_prefer_wait_leaves_a_second_of_the_attempt(configured: int, timeout: float, sent: Optional[int]) -> None:
    assert prefer_wait(configured, timeout) == sent


# --- what an answer means ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind", "verdict"),
    [
        (201, None, Verdict.RESULT),
        (402, "charge-declined", Verdict.RESULT),
        (502, "acquirer-rejected", Verdict.RESULT),
        (502, None, Verdict.RETRY),
        (502, "internal", Verdict.RETRY),
        (409, "request-in-flight", Verdict.RETRY),
        (429, None, Verdict.RETRY),
        (503, "outcome-unknown", Verdict.RETRY),
        (503, "overloaded", Verdict.RETRY),
        (503, "charge-under-review", Verdict.RETRY),
        (504, "timeout", Verdict.RETRY),
        (504, None, Verdict.RETRY),
        (422, "idempotency-key-reused", Verdict.KEY_REUSED),
        (422, None, Verdict.API_ERROR),
        (410, "key-expired", Verdict.KEY_EXPIRED),
        (410, None, Verdict.API_ERROR),
        (200, None, Verdict.API_ERROR),
        (202, None, Verdict.API_ERROR),
        (204, None, Verdict.API_ERROR),
        (301, None, Verdict.API_ERROR),
        (302, None, Verdict.API_ERROR),
        (307, None, Verdict.API_ERROR),
        (308, None, Verdict.API_ERROR),
        (400, "invalid-body", Verdict.API_ERROR),
        (400, "malformed-idempotency-key", Verdict.API_ERROR),
        (401, "unauthorized", Verdict.API_ERROR),
        (404, "not-found", Verdict.API_ERROR),
        (405, "method-not-allowed", Verdict.API_ERROR),
        (413, "body-too-large", Verdict.API_ERROR),
        (415, "unsupported-media-type", Verdict.API_ERROR),
        (500, "internal", Verdict.API_ERROR),
        (501, None, Verdict.API_ERROR),
    ],
)
def test_every_status_is_classified(status: int, kind: Optional[str], verdict: Verdict) -> None:
    assert classify(status, f"urn:idem:problem:{kind}" if kind else None) is verdict


def test_a_charge_is_read_with_its_types_and_unknown_fields_ignored() -> None:
    charge = parse_charge({**CHARGE, "new_field": 1})
    assert charge == Charge(**CHARGE)  # type: ignore[arg-type]
    assert parse_charge(charge_with(decline_reason="insufficient_funds", status="declined")) is not None
    bads: List[object] = [None, [], {}, charge_with(order_id="123"), charge_with(amount_cents=True), charge_with(id=None)]
    for bad in bads:
        assert parse_charge(bad) is None
    missing = dict(CHARGE)
    del missing["created_at"]
    assert parse_charge(missing) is None


def test_a_connection_failure_is_described_with_its_causes() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as cause:
            raise RuntimeError("error sending request") from cause
    except RuntimeError as error:
        text = describe_failure(error)
    assert text == (
        "connection failed: RuntimeError: error sending request <- ConnectionRefusedError: [Errno 111] Connection refused"
    )


# --- one call, driven by hand ---------------------------------------------------------------

Headers = Dict[str, str]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0


def new_call(
    endpoints: Union[str, List[str]] = "http://a",
    key: Optional[str] = "k-1",
    uniform: float = 0.5,
    **policy_fields: object,
) -> Tuple[ChargeCall, Clock]:
    clock = Clock()
    config = Config.build(endpoints, "sk_test", RetryPolicy(**policy_fields))  # type: ignore[arg-type]
    call = ChargeCall(
        config,
        order_id=123,
        amount_cents=25000,
        idempotency_key=key,
        now=clock.now,
        uniform=lambda: uniform,
    )
    return call, clock


def send_of(call: Call[Any], clock: Clock) -> Send:
    action = call.next(clock.now)
    assert isinstance(action, Send), action
    return action


def answer(
    call: Call[Any],
    clock: Clock,
    status: int,
    body: bytes = b"",
    headers: Optional[Headers] = None,
    took: float = 0.25,
) -> Send:
    send = send_of(call, clock)
    clock.now += took
    call.answered(clock.now, status, headers or {}, body)
    return send


def sleep_of(call: Call[Any], clock: Clock) -> float:
    action = call.next(clock.now)
    assert isinstance(action, Sleep), action
    clock.now += action.seconds
    return action.seconds


def finish_of(call: Call[R], clock: Clock) -> Finish[R]:
    action = call.next(clock.now)
    assert isinstance(action, Finish), action
    return action


def test_a_capture_at_the_first_attempt() -> None:
    call, clock = new_call()
    body = json.dumps(CHARGE).encode()
    send = answer(call, clock, 201, body, {"Idempotency-TTL": "86399", "Location": "/v1/charges/ch_x"})
    assert send.url == "http://a/v1/charges"
    assert send.endpoint == "http://a"
    assert send.timeout == 10.0
    assert send.body == b'{"order_id":123,"amount_cents":25000}'
    assert send.headers == {
        "Authorization": "Bearer sk_test",
        "Content-Type": "application/json",
        "Accept": "application/json, application/problem+json",
        "Idempotency-Key": '"k-1"',
        "User-Agent": USER_AGENT,
        "Prefer": "wait=5",
    }
    assert USER_AGENT.startswith("idem-client-python/")
    result = finish_of(call, clock).unwrap()
    assert result.status == 201
    assert result.charge == Charge(**CHARGE)  # type: ignore[arg-type]
    assert result.captured
    assert result.key == "k-1"
    assert result.replayed is False
    assert result.idempotency_ttl == 86399
    assert result.body == body
    assert result.problem is None
    assert len(result.attempts) == 1
    attempt = result.attempts[0]
    assert (attempt.endpoint, attempt.status, attempt.error, attempt.elapsed) == ("http://a", 201, None, 0.25)
    assert str(attempt) == "status 201"


def test_a_call_without_a_key_makes_one() -> None:
    call, _ = new_call(key=None)
    assert uuid.UUID(call.key).version == 4


def test_every_attempt_carries_the_same_key_and_bytes_and_rotates_endpoints() -> None:
    call, clock = new_call(["http://a", "http://b", "http://c"], max_attempts=5)
    sends = []
    for _ in range(4):
        sends.append(answer(call, clock, 503, problem(503, "outcome-unknown"), {"Retry-After": "1"}))
        sleep_of(call, clock)
    sends.append(answer(call, clock, 201, json.dumps(CHARGE).encode(), {"idempotent-replayed": "true"}))
    assert [s.endpoint for s in sends] == ["http://a", "http://b", "http://c", "http://a", "http://b"]
    assert [s.number for s in sends] == [0, 1, 2, 3, 4]
    assert len({s.body for s in sends}) == 1
    assert {s.headers["Idempotency-Key"] for s in sends} == {'"k-1"'}
    result = finish_of(call, clock).unwrap()
    assert result.replayed is True
    assert [a.status for a in result.attempts] == [503, 503, 503, 503, 201]
    assert str(result.attempts[0]) == "status 503 (urn:idem:problem:outcome-unknown)"


def test_the_wait_follows_the_backoff_and_the_retry_after_floor() -> None:
    call, clock = new_call(uniform=1.0, base_delay=0.1, max_delay=5)
    answer(call, clock, 409, problem(409, "request-in-flight"), {"Retry-After": "1"})
    assert sleep_of(call, clock) == 1.0  # the window (0.1) is below the floor
    answer(call, clock, 504)
    assert sleep_of(call, clock) == pytest.approx(0.2)  # retry 1: the whole window
    answer(call, clock, 429, b"", {"Retry-After": "3"})
    assert sleep_of(call, clock) == 3.0
    send_of(call, clock)
    clock.now += 10
    call.timed_out(clock.now)
    assert sleep_of(call, clock) == pytest.approx(0.8)  # no Retry-After after a timeout


def test_it_gives_up_after_max_attempts() -> None:
    call, clock = new_call(max_attempts=3)
    for _ in range(2):
        answer(call, clock, 503, problem(503, "outcome-unknown"))
        sleep_of(call, clock)
    answer(call, clock, 503, problem(503, "outcome-unknown"))
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert error.key == "k-1"
    assert len(error.attempts) == 3
    assert error.last == "status 503 (urn:idem:problem:outcome-unknown) from http://a; max_attempts (3) reached"
    message = str(error)
    assert "'k-1'" in message and "after 3 attempts" in message
    assert "may have happened" in message and "same key" in message
    with pytest.raises(GaveUpError):
        finish_of(call, clock).unwrap()


def test_no_wait_runs_past_the_deadline() -> None:
    call, clock = new_call(deadline=2.5, base_delay=0.1)
    answer(call, clock, 503, problem(503, "outcome-unknown"), {"Retry-After": "5"}, took=0.5)
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert len(error.attempts) == 1
    assert error.last.endswith("the next wait (5.000 s) would pass the deadline (2.5 s)")


def test_the_last_attempt_is_shortened_to_fit_the_deadline_and_its_prefer_wait_too() -> None:
    call, clock = new_call(deadline=12, attempt_timeout=10, uniform=0.0)
    first = send_of(call, clock)
    assert (first.timeout, first.headers["Prefer"]) == (10, "wait=5")
    clock.now += 10
    call.timed_out(clock.now)
    assert sleep_of(call, clock) == 0
    clock.now += 0.5
    second = send_of(call, clock)
    assert second.timeout == pytest.approx(1.5)
    assert "Prefer" not in second.headers  # floor(1.5) - 1 = 0
    clock.now += 1.5
    call.timed_out(clock.now)
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert error.last == "timed out after 1.5 s from http://a; the next wait (0.000 s) would pass the deadline (12 s)"


def test_a_sleep_that_overruns_the_deadline_ends_the_call() -> None:
    call, clock = new_call(deadline=3, uniform=1.0, base_delay=1)
    answer(call, clock, 503, took=1.5)
    assert sleep_of(call, clock) == 1.0  # 1.5 s of the deadline were left
    clock.now += 0.6  # the sleep overran
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert error.last == "status 503 from http://a; the deadline (3 s) is spent"


def test_a_zero_deadline_gives_up_before_any_attempt() -> None:
    call, clock = new_call(deadline=0)
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert error.attempts == []
    assert error.last == "the deadline (0 s) is spent"


def test_connection_failures_are_retried_and_recorded() -> None:
    call, clock = new_call(max_attempts=2)
    send_of(call, clock)
    clock.now += 0.01
    call.failed(clock.now, ConnectionRefusedError(111, "Connection refused"))
    sleep_of(call, clock)
    send_of(call, clock)
    call.failed(clock.now, "connection failed: the peer closed mid-body")
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert error.attempts[0].error == "connection failed: ConnectionRefusedError: [Errno 111] Connection refused"
    assert error.attempts[0].status is None
    assert error.attempts[1].error == "connection failed: the peer closed mid-body"


def test_a_decline_and_an_acquirer_rejection_are_results() -> None:
    declined = charge_with(status="declined", decline_reason="insufficient_funds")
    call, clock = new_call()
    body = problem(402, "charge-declined", charge=declined)
    answer(call, clock, 402, body, {"Idempotency-TTL": "7"})
    result = finish_of(call, clock).unwrap()
    assert (result.status, result.charge.status, result.charge.decline_reason) == (402, "declined", "insufficient_funds")
    assert not result.captured
    assert result.problem is not None and result.problem["type"] == "urn:idem:problem:charge-declined"
    assert result.body == body and result.idempotency_ttl == 7

    call, clock = new_call()
    answer(call, clock, 502, problem(502, "acquirer-rejected", charge=charge_with(status="failed")))
    result = finish_of(call, clock).unwrap()
    assert (result.status, result.charge.status, len(result.attempts)) == (502, "failed", 1)


def test_a_gateways_502_is_retried() -> None:
    call, clock = new_call()
    answer(call, clock, 502, b"<html>bad gateway</html>")
    sleep_of(call, clock)
    answer(call, clock, 201, json.dumps(CHARGE).encode())
    assert len(finish_of(call, clock).unwrap().attempts) == 2


def test_a_reused_key_is_a_typed_error() -> None:
    call, clock = new_call()
    body = problem(422, "idempotency-key-reused", differing_fields=["amount_cents", "currency"], charge_id="ch_1")
    answer(call, clock, 422, body)
    error = finish_of(call, clock).error
    assert isinstance(error, KeyReusedError)
    assert (error.key, error.charge_id, error.differing_fields) == ("k-1", "ch_1", ["amount_cents", "currency"])
    assert error.problem["status"] == 422
    assert len(error.attempts) == 1
    assert "amount_cents, currency" in str(error) and "ch_1" in str(error)

    call, clock = new_call()  # before idem named the charge
    answer(call, clock, 422, problem(422, "idempotency-key-reused", differing_fields=["amount_cents"]))
    error = finish_of(call, clock).error
    assert isinstance(error, KeyReusedError) and error.charge_id is None


def test_an_expired_key_is_a_typed_error() -> None:
    call, clock = new_call()
    answer(call, clock, 410, problem(410, "key-expired", charge_id="ch_9"))
    error = finish_of(call, clock).error
    assert isinstance(error, KeyExpiredError)
    assert (error.key, error.charge_id, len(error.attempts)) == ("k-1", "ch_9", 1)
    assert "ch_9" in str(error)


@pytest.mark.parametrize("status", [200, 301, 302, 307, 308, 400, 401, 404, 413, 415, 500, 422, 410])
def test_any_other_answer_is_an_api_error_never_retried(status: int) -> None:
    call, clock = new_call()
    body = problem(status, "internal") if status >= 400 else b""
    answer(call, clock, status, body, {"Location": "http://elsewhere/v1/charges"})
    error = finish_of(call, clock).error
    assert isinstance(error, ApiError)
    assert (error.status, error.body, error.key, len(error.attempts)) == (status, body, "k-1", 1)
    if status >= 400:
        assert error.problem is not None and error.problem["type"] == "urn:idem:problem:internal"
        assert "urn:idem:problem:internal" in str(error)
    else:
        assert error.problem is None


def test_a_result_status_without_a_charge_is_an_api_error() -> None:
    for status, body in [(201, b"not json"), (201, b"{}"), (402, problem(402, "charge-declined"))]:
        call, clock = new_call()
        answer(call, clock, status, body)
        error = finish_of(call, clock).error
        assert isinstance(error, ApiError), status
        assert "without its charge" in str(error)


def test_reports_out_of_turn_are_refused() -> None:
    call, clock = new_call()
    with pytest.raises(RuntimeError):
        call.answered(clock.now, 201, {}, b"")
    send_of(call, clock)
    with pytest.raises(RuntimeError):
        call.next(clock.now)


def test_bad_input_is_refused_before_any_attempt() -> None:
    config = Config.build("http://a", "sk", RetryPolicy())
    with pytest.raises(ValueError):
        ChargeCall(config, order_id=1, amount_cents=1, idempotency_key="chave-é", now=0)
    with pytest.raises(TypeError):
        ChargeCall(config, order_id="1", amount_cents=1, now=0)  # type: ignore[arg-type]


def test_jitter_uses_random_by_default() -> None:
    random.seed(7)
    p = policy(1, 1)
    assert len({backoff_delay(p, 0) for _ in range(10)}) == 10


# --- refunds: the same discipline, their own path, body and final answers ---------------


def new_refund_call(
    endpoints: Union[str, List[str]] = "http://a",
    key: Optional[str] = "r-1",
    uniform: float = 0.5,
    charge_id: str = "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
    amount_cents: Optional[int] = 5000,
    **policy_fields: object,
) -> Tuple[RefundCall, Clock]:
    clock = Clock()
    config = Config.build(endpoints, "sk_test", RetryPolicy(**policy_fields))  # type: ignore[arg-type]
    call = RefundCall(
        config,
        charge_id=charge_id,
        amount_cents=amount_cents,
        idempotency_key=key,
        now=clock.now,
        uniform=lambda: uniform,
    )
    return call, clock


def test_a_refund_body_leaves_out_what_is_not_given() -> None:
    assert encode_refund_body() == b"{}"
    assert encode_refund_body(amount_cents=5000) == b'{"amount_cents":5000}'
    body = encode_refund_body(amount_cents=1, reason="duplicate", description="caf\u00e9")
    assert json.loads(body) == {"amount_cents": 1, "reason": "duplicate", "description": "café"}
    assert body.isascii()
    for bad in [True, 1.5, "5000"]:
        with pytest.raises(TypeError):
            encode_refund_body(amount_cents=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_refund_body(reason=3)  # type: ignore[arg-type]


def test_a_refund_path_names_its_charge_and_no_other_route() -> None:
    assert refunds_path("ch_4f9QzXk2LmP8rT1vWb6yNc3d") == "/v1/charges/ch_4f9QzXk2LmP8rT1vWb6yNc3d/refunds"
    assert refunds_path("../x?y#z") == "/v1/charges/..%2Fx%3Fy%23z/refunds"
    with pytest.raises(ValueError):
        refunds_path("")
    with pytest.raises(TypeError):
        refunds_path(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "kind", "verdict"),
    [
        (201, None, Verdict.RESULT),
        (422, "refund-failed", Verdict.REFUND_FAILED),
        (422, "refund-exceeds-captured", Verdict.REFUND_EXCEEDS),
        (422, "charge-not-refundable", Verdict.NOT_REFUNDABLE),
        (422, "idempotency-key-reused", Verdict.KEY_REUSED),
        (422, None, Verdict.API_ERROR),
        (410, "key-expired", Verdict.KEY_EXPIRED),
        (409, "request-in-flight", Verdict.RETRY),
        (429, None, Verdict.RETRY),
        (503, "outcome-unknown", Verdict.RETRY),
        (503, "refund-under-review", Verdict.RETRY),
        (503, "overloaded", Verdict.RETRY),
        (504, "timeout", Verdict.RETRY),
        (502, None, Verdict.RETRY),
        (502, "acquirer-rejected", Verdict.RETRY),  # never a refund's stored outcome
        (402, "charge-declined", Verdict.API_ERROR),  # never a refund's
        (404, "not-found", Verdict.API_ERROR),
        (400, "invalid-body", Verdict.API_ERROR),
        (500, "internal", Verdict.API_ERROR),
        (307, None, Verdict.API_ERROR),
    ],
)
def test_every_refund_status_is_classified(status: int, kind: Optional[str], verdict: Verdict) -> None:
    assert classify_refund(status, f"urn:idem:problem:{kind}" if kind else None) is verdict


def test_a_refund_is_read_with_its_types_and_unknown_fields_ignored() -> None:
    refund = parse_refund({**REFUND, "new_field": 1})
    assert refund == Refund(**REFUND)  # type: ignore[arg-type]
    failed = parse_refund({**REFUND, "status": "failed", "failure_reason": "exceeds_capture", "reason": None})
    assert failed is not None and (failed.failure_reason, failed.reason) == ("exceeds_capture", None)
    bads: List[object] = [
        None,
        [],
        CHARGE,
        {**REFUND, "amount_cents": True},
        {**REFUND, "amount_cents": "5000"},
        {**REFUND, "charge_id": None},
        {**REFUND, "failure_reason": 3},
    ]
    for bad in bads:
        assert parse_refund(bad) is None, bad


def test_a_refund_retries_as_a_charge_does_with_one_key_and_one_body() -> None:
    call, clock = new_refund_call(["http://a", "http://b/base/"], uniform=1.0, base_delay=0.1)
    unknown = problem(503, "outcome-unknown", refund_id=REFUND["id"])
    first = answer(call, clock, 503, unknown, {"Retry-After": "1"})
    assert sleep_of(call, clock) == 1.0  # the Retry-After floor
    second = answer(call, clock, 409, problem(409, "request-in-flight"))
    assert sleep_of(call, clock) == pytest.approx(0.2)  # retry 1: the whole window
    body = json.dumps(REFUND).encode()
    third = answer(call, clock, 201, body, {"Idempotent-Replayed": "true", "Idempotency-TTL": "86390"})
    assert [s.url for s in (first, second, third)] == [
        "http://a/v1/charges/ch_4f9QzXk2LmP8rT1vWb6yNc3d/refunds",
        "http://b/base/v1/charges/ch_4f9QzXk2LmP8rT1vWb6yNc3d/refunds",
        "http://a/v1/charges/ch_4f9QzXk2LmP8rT1vWb6yNc3d/refunds",
    ]
    assert {s.body for s in (first, second, third)} == {b'{"amount_cents":5000}'}
    assert {s.headers["Idempotency-Key"] for s in (first, second, third)} == {'"r-1"'}
    assert first.headers["Content-Type"] == "application/json" and first.headers["Prefer"] == "wait=5"
    result = finish_of(call, clock).unwrap()
    assert (result.status, result.refund, result.key) == (201, Refund(**REFUND), "r-1")  # type: ignore[arg-type]
    assert (result.replayed, result.idempotency_ttl, result.body) == (True, 86390, body)
    assert [a.status for a in result.attempts] == [503, 409, 201]


def test_a_refund_without_a_key_makes_one_and_without_an_amount_sends_an_empty_object() -> None:
    call, clock = new_refund_call(key=None, amount_cents=None)
    assert uuid.UUID(call.key).version == 4
    assert send_of(call, clock).body == b"{}"


def test_a_refund_gives_up_in_its_own_words() -> None:
    call, clock = new_refund_call(max_attempts=2)
    answer(call, clock, 503, problem(503, "outcome-unknown", refund_id="re_1"))
    sleep_of(call, clock)
    answer(call, clock, 503, problem(503, "refund-under-review", refund_id="re_1"))
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert error.key == "r-1" and len(error.attempts) == 2
    assert error.last.endswith("max_attempts (2) reached")
    assert "the refund may have happened" in str(error) and "never refunds twice" in str(error)


def test_a_refund_above_what_is_left_is_a_typed_error_never_retried() -> None:
    call, clock = new_refund_call(amount_cents=30000)
    answer(call, clock, 422, problem(422, "refund-exceeds-captured", remaining_cents=25000))
    error = finish_of(call, clock).error
    assert isinstance(error, RefundExceedsCapturedError)
    assert (error.key, error.charge_id, error.remaining_cents, len(error.attempts)) == (
        "r-1",
        "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
        25000,
        1,
    )
    assert "25000 cents left" in str(error) and "still free" in str(error)


def test_a_charge_that_cannot_be_refunded_is_a_typed_error_never_retried() -> None:
    call, clock = new_refund_call()
    answer(call, clock, 422, problem(422, "charge-not-refundable", detail="the charge is declined"))
    error = finish_of(call, clock).error
    assert isinstance(error, ChargeNotRefundableError)
    assert (error.charge_id, len(error.attempts)) == ("ch_4f9QzXk2LmP8rT1vWb6yNc3d", 1)
    assert "the charge is declined" in str(error)


def test_a_refused_refund_is_a_stored_outcome_raised_with_its_refund() -> None:
    refused = {**REFUND, "status": "failed", "failure_reason": "unknown_capture"}
    body = problem(422, "refund-failed", refund=refused)
    call, clock = new_refund_call()
    answer(call, clock, 422, body, {"Idempotent-Replayed": "true", "Idempotency-TTL": "9"})
    error = finish_of(call, clock).error
    assert isinstance(error, RefundFailedError)
    assert error.refund == Refund(**refused)  # type: ignore[arg-type]
    assert (error.replayed, error.idempotency_ttl, error.body, len(error.attempts)) == (True, 9, body, 1)
    assert "unknown_capture" in str(error) and "new key" in str(error)

    call, clock = new_refund_call()  # no refund in it: not taken for a refusal
    answer(call, clock, 422, problem(422, "refund-failed"))
    api = finish_of(call, clock).error
    assert isinstance(api, ApiError) and "without its refund" in str(api)


def test_a_refunds_reused_or_expired_key_names_what_the_key_made() -> None:
    call, clock = new_refund_call()
    answer(call, clock, 422, problem(422, "idempotency-key-reused", differing_fields=["operation"], charge_id="ch_k"))
    reused = finish_of(call, clock).error
    assert isinstance(reused, KeyReusedError)
    assert (reused.charge_id, reused.refund_id, reused.differing_fields) == ("ch_k", None, ["operation"])
    assert "nothing was refunded" in str(reused)

    call, clock = new_refund_call()
    answer(call, clock, 422, problem(422, "idempotency-key-reused", differing_fields=["charge_id"], refund_id="re_k"))
    reused = finish_of(call, clock).error
    assert isinstance(reused, KeyReusedError) and (reused.charge_id, reused.refund_id) == (None, "re_k")
    assert "which made refund re_k" in str(reused)

    call, clock = new_refund_call()
    answer(call, clock, 410, problem(410, "key-expired", refund_id="re_old"))
    expired = finish_of(call, clock).error
    assert isinstance(expired, KeyExpiredError) and (expired.refund_id, expired.charge_id) == ("re_old", None)
    assert "made refund re_old" in str(expired) and "nothing was refunded again" in str(expired)


@pytest.mark.parametrize("status", [404, 400, 401, 500, 402, 307])
def test_any_other_answer_to_a_refund_is_an_api_error_never_retried(status: int) -> None:
    call, clock = new_refund_call()
    body = problem(status, "not-found") if status >= 400 else b""
    answer(call, clock, status, body)
    error = finish_of(call, clock).error
    assert isinstance(error, ApiError)
    assert (error.status, len(error.attempts)) == (status, 1)


def test_bad_refund_input_is_refused_before_any_attempt() -> None:
    config = Config.build("http://a", "sk", RetryPolicy())
    with pytest.raises(ValueError):
        RefundCall(config, charge_id="", now=0)
    with pytest.raises(ValueError):
        RefundCall(config, charge_id="ch_1", idempotency_key="chave-é", now=0)
    with pytest.raises(TypeError):
        RefundCall(config, charge_id="ch_1", amount_cents=True, now=0)


# --- two-step payments: authorize, capture, void; the same discipline -------------------

CAPTURE = {
    "id": "cp_7kLmQ2xZ9pR4tV8bN1cW6yHd",
    "charge_id": "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
    "amount_cents": 10000,
    "currency": "BRL",
    "final": False,
    "status": "succeeded",
    "acquirer_reference": "ref_c1",
    "failure_reason": None,
    "created_at": "2026-12-07T03:00:00Z",
}
VOID = {k: v for k, v in CAPTURE.items() if k != "final"}
VOID.update(id="vd_7kLmQ2xZ9pR4tV8bN1cW6yHd", amount_cents=15000)
AUTHORIZED = {**CHARGE, "status": "authorized", "amount_captured_cents": 0, "amount_capturable_cents": 25000}


def config(**policy_fields: object) -> Config:
    return Config.build(["http://a", "http://b"], "sk_test", RetryPolicy(**policy_fields))  # type: ignore[arg-type]


def new_capture_call(
    amount_cents: Optional[int] = 10000, final: bool = False, key: Optional[str] = "c-1", **policy_fields: object
) -> Tuple[CaptureCall, Clock]:
    clock = Clock()
    call = CaptureCall(
        config(**policy_fields),
        charge_id=str(CHARGE["id"]),
        amount_cents=amount_cents,
        final=final,
        idempotency_key=key,
        now=clock.now,
        uniform=lambda: 0.5,
    )
    return call, clock


def new_void_call(key: Optional[str] = "v-1", **policy_fields: object) -> Tuple[VoidCall, Clock]:
    clock = Clock()
    call = VoidCall(
        config(**policy_fields), charge_id=str(CHARGE["id"]), idempotency_key=key, now=clock.now, uniform=lambda: 0.5
    )
    return call, clock


def test_the_steps_bodies_and_paths() -> None:
    assert encode_body(order_id=1, amount_cents=2, capture=False) == b'{"order_id":1,"amount_cents":2,"capture":false}'
    assert encode_body(order_id=1, amount_cents=2) == b'{"order_id":1,"amount_cents":2}'  # a charge: unchanged
    assert encode_capture_body() == b'{"final":true}'
    assert encode_capture_body(amount_cents=10000, final=False) == b'{"amount_cents":10000,"final":false}'
    for bad in [{"amount_cents": True}, {"amount_cents": 1.5}, {"final": "no"}, {"final": None}]:
        with pytest.raises(TypeError):
            encode_capture_body(**bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_body(order_id=1, amount_cents=2, capture=0)  # type: ignore[arg-type]
    assert captures_path("ch_1") == "/v1/charges/ch_1/captures"
    assert void_path("../x?y") == "/v1/charges/..%2Fx%3Fy/void"
    for path in (captures_path, void_path):
        with pytest.raises(ValueError):
            path("")


@pytest.mark.parametrize(
    ("status", "kind", "capture", "void"),
    [
        (201, None, Verdict.RESULT, Verdict.RESULT),
        (409, "request-in-flight", Verdict.RETRY, Verdict.RETRY),
        (409, "authorization-closed", Verdict.RETRY, Verdict.RETRY),
        (409, "capture-pending", Verdict.RETRY, Verdict.RETRY),
        (503, "outcome-unknown", Verdict.RETRY, Verdict.RETRY),
        (503, "step-under-review", Verdict.RETRY, Verdict.RETRY),
        (502, None, Verdict.RETRY, Verdict.RETRY),
        (429, None, Verdict.RETRY, Verdict.RETRY),
        (422, "capture-failed", Verdict.CAPTURE_FAILED, Verdict.API_ERROR),
        (422, "void-failed", Verdict.API_ERROR, Verdict.VOID_FAILED),
        (422, "capture-exceeds-authorization", Verdict.CAPTURE_EXCEEDS, Verdict.API_ERROR),
        (422, "charge-not-authorized", Verdict.NOT_AUTHORIZED, Verdict.NOT_AUTHORIZED),
        (422, "idempotency-key-reused", Verdict.KEY_REUSED, Verdict.KEY_REUSED),
        (410, "key-expired", Verdict.KEY_EXPIRED, Verdict.KEY_EXPIRED),
        (402, "charge-declined", Verdict.API_ERROR, Verdict.API_ERROR),
        (404, "not-found", Verdict.API_ERROR, Verdict.API_ERROR),
        (400, "invalid-body", Verdict.API_ERROR, Verdict.API_ERROR),
    ],
)
def test_every_step_status_is_classified(status: int, kind: Optional[str], capture: Verdict, void: Verdict) -> None:
    problem_type = f"urn:idem:problem:{kind}" if kind else None
    assert classify_capture(status, problem_type) is capture
    assert classify_void(status, problem_type) is void


def test_steps_and_two_step_charges_are_read_with_their_types() -> None:
    assert parse_capture({**CAPTURE, "new": 1}) == Capture(**CAPTURE)  # type: ignore[arg-type]
    assert parse_void(VOID) == Void(**VOID)  # type: ignore[arg-type]
    for bad in [None, CHARGE, {**CAPTURE, "final": None}, {**CAPTURE, "amount_cents": "1"}, {**CAPTURE, "id": 3}]:
        assert parse_capture(bad) is None, bad
    assert parse_void({**VOID, "failure_reason": 3}) is None
    charge = parse_charge(AUTHORIZED)
    assert charge is not None and (charge.status, charge.amount_captured_cents, charge.amount_capturable_cents) == (
        "authorized",
        0,
        25000,
    )
    one_step = parse_charge(CHARGE)
    assert one_step is not None and one_step.amount_capturable_cents is None
    assert parse_charge({**AUTHORIZED, "amount_capturable_cents": "25000"}) is None


def test_an_authorization_is_a_charge_with_capture_false_and_its_own_words() -> None:
    clock = Clock()
    call = AuthorizeCall(config(max_attempts=2), order_id=123, amount_cents=25000, idempotency_key="a-1", now=clock.now)
    first = answer(call, clock, 503, problem(503, "outcome-unknown"), {"Retry-After": "0"})
    sleep_of(call, clock)
    second = answer(call, clock, 201, json.dumps(AUTHORIZED).encode(), {"Idempotency-TTL": "7"})
    assert {s.url for s in (first, second)} == {"http://a/v1/charges", "http://b/v1/charges"}
    assert {s.body for s in (first, second)} == {b'{"order_id":123,"amount_cents":25000,"capture":false}'}
    result = finish_of(call, clock).unwrap()
    assert result.authorized and not result.captured and result.charge.amount_capturable_cents == 25000

    clock = Clock()
    call = AuthorizeCall(config(max_attempts=1), order_id=123, amount_cents=25000, idempotency_key="a-2", now=clock.now)
    answer(call, clock, 503, problem(503, "outcome-unknown"))
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError)
    assert "the authorization may have happened" in str(error) and "never authorizes twice" in str(error)


def test_a_capture_retries_with_one_key_and_one_body_through_an_in_flight_or_closed_authorization() -> None:
    call, clock = new_capture_call()
    first = answer(call, clock, 503, problem(503, "outcome-unknown", capture_id=CAPTURE["id"]), {"Retry-After": "1"})
    sleep_of(call, clock)
    second = answer(call, clock, 409, problem(409, "request-in-flight"), {"Retry-After": "1"})
    sleep_of(call, clock)
    third = answer(call, clock, 409, problem(409, "authorization-closed"))
    sleep_of(call, clock)
    body = json.dumps(CAPTURE).encode()
    fourth = answer(call, clock, 201, body, {"Idempotent-Replayed": "true", "Idempotency-TTL": "86390"})
    sends = (first, second, third, fourth)
    assert [s.url for s in sends] == [
        f"http://{h}/v1/charges/{CHARGE['id']}/captures" for h in ("a", "b", "a", "b")
    ]
    assert {s.body for s in sends} == {b'{"amount_cents":10000,"final":false}'}
    assert {s.headers["Idempotency-Key"] for s in sends} == {'"c-1"'}
    result = finish_of(call, clock).unwrap()
    assert (result.status, result.capture, result.key) == (201, Capture(**CAPTURE), "c-1")  # type: ignore[arg-type]
    assert (result.replayed, result.idempotency_ttl, result.body) == (True, 86390, body)
    assert [a.status for a in result.attempts] == [503, 409, 409, 201]


def test_a_void_retries_through_pending_captures_and_gives_up_in_its_own_words() -> None:
    call, clock = new_void_call()
    first = answer(call, clock, 409, problem(409, "capture-pending"))
    sleep_of(call, clock)
    answer(call, clock, 201, json.dumps(VOID).encode())
    assert first.url == f"http://a/v1/charges/{CHARGE['id']}/void" and first.body == b"{}"
    result = finish_of(call, clock).unwrap()
    assert result.void == Void(**VOID) and [a.status for a in result.attempts] == [409, 201]  # type: ignore[arg-type]

    call, clock = new_void_call(key=None, max_attempts=2)
    assert uuid.UUID(call.key).version == 4
    answer(call, clock, 409, problem(409, "capture-pending"))
    sleep_of(call, clock)
    answer(call, clock, 409, problem(409, "authorization-closed"))
    error = finish_of(call, clock).error
    assert isinstance(error, GaveUpError) and error.key == call.key and len(error.attempts) == 2
    assert "(urn:idem:problem:authorization-closed)" in error.last
    assert "the void may have happened" in str(error) and "never voids twice" in str(error)


def test_a_capture_the_authorization_cannot_take_is_a_typed_error_never_retried() -> None:
    call, clock = new_capture_call(amount_cents=30000)
    answer(call, clock, 422, problem(422, "capture-exceeds-authorization", remaining_cents=15000))
    error = finish_of(call, clock).error
    assert isinstance(error, CaptureExceedsAuthorizationError)
    assert (error.key, error.charge_id, error.remaining_cents, len(error.attempts)) == ("c-1", CHARGE["id"], 15000, 1)
    assert "15000 cents left" in str(error) and "still free" in str(error)

    steps: List[Tuple[Call[Any], Clock]] = [new_capture_call(), new_void_call()]
    for step_call, clock in steps:
        answer(step_call, clock, 422, problem(422, "charge-not-authorized", detail="the charge is voided"))
        action = step_call.next(clock.now)
        assert isinstance(action, Finish)
        refused = action.error
        assert isinstance(refused, ChargeNotAuthorizedError)
        assert (refused.charge_id, len(refused.attempts)) == (CHARGE["id"], 1)
        assert "the charge is voided" in str(refused)


def test_a_step_the_acquirer_refused_is_a_stored_outcome_raised_with_it() -> None:
    refused = {**CAPTURE, "status": "failed", "failure_reason": "exceeds_authorization"}
    body = problem(422, "capture-failed", capture=refused)
    call, clock = new_capture_call()
    answer(call, clock, 422, body, {"Idempotent-Replayed": "true", "Idempotency-TTL": "9"})
    error = finish_of(call, clock).error
    assert isinstance(error, CaptureFailedError)
    assert error.capture == Capture(**refused)  # type: ignore[arg-type]
    assert (error.replayed, error.idempotency_ttl, error.body, len(error.attempts)) == (True, 9, body, 1)
    assert "exceeds_authorization" in str(error) and "new key" in str(error)

    void_refused = {**VOID, "status": "failed", "failure_reason": "authorization_captured"}
    void_call, clock = new_void_call()
    answer(void_call, clock, 422, problem(422, "void-failed", void=void_refused))
    void_error = finish_of(void_call, clock).error
    assert isinstance(void_error, VoidFailedError) and void_error.void == Void(**void_refused)  # type: ignore[arg-type]
    assert "open again" in str(void_error)

    void_call, clock = new_void_call()  # no void in it: not taken for a refusal
    answer(void_call, clock, 422, problem(422, "void-failed"))
    api = finish_of(void_call, clock).error
    assert isinstance(api, ApiError) and "without its void" in str(api)


def test_a_steps_reused_or_expired_key_names_what_the_key_made() -> None:
    call, clock = new_capture_call()
    reused_body = problem(422, "idempotency-key-reused", differing_fields=["amount_cents"], capture_id="cp_k")
    answer(call, clock, 422, reused_body)
    reused = finish_of(call, clock).error
    assert isinstance(reused, KeyReusedError) and (reused.capture_id, reused.void_id) == ("cp_k", None)
    assert "which made capture cp_k" in str(reused) and "nothing was captured" in str(reused)

    void_call, clock = new_void_call()
    answer(void_call, clock, 410, problem(410, "key-expired", void_id="vd_old"))
    expired = finish_of(void_call, clock).error
    assert isinstance(expired, KeyExpiredError) and (expired.void_id, expired.capture_id) == ("vd_old", None)
    assert "made void vd_old" in str(expired) and "nothing was voided again" in str(expired)


def test_bad_step_input_is_refused_before_any_attempt() -> None:
    with pytest.raises(ValueError):
        CaptureCall(config(), charge_id="", now=0)
    with pytest.raises(TypeError):
        CaptureCall(config(), charge_id="ch_1", final="yes", now=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        VoidCall(config(), charge_id="ch_1", idempotency_key="chave-\u00e9", now=0)
    with pytest.raises(TypeError):
        AuthorizeCall(config(), order_id=1, amount_cents="2", now=0)  # type: ignore[arg-type]
