"""The conformance suite (clients/conformance/scenarios.json) against a live
``idem-lab conformance-env``: every scenario with the sync and the async
client, and once with a client that breaks the one-key rule, which the suite
must fail."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Iterator

import pytest

from conformance_runner import (
    Clients,
    Environment,
    LOG,
    EnvironmentMissing,
    RunningEnvironment,
    ScenarioRun,
    load_suite,
    run_scenario,
    validate,
)
from idem_client import CaptureResult, ChargeResult, Client, RefundResult, VoidResult
from idem_client._core import (
    Action,
    AuthorizeCall,
    CaptureCall,
    ChargeCall,
    RefundCall,
    Send,
    VoidCall,
    new_key,
    quote_key,
)

SUITE = load_suite()
SCENARIOS: Dict[str, Dict[str, Any]] = {s["name"]: s for s in SUITE["scenarios"]}


@pytest.fixture(scope="session")
def environment() -> Iterator[Environment]:
    try:
        running = RunningEnvironment()
    except EnvironmentMissing as e:
        missing = str(e)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    try:
        yield running.environment
    finally:
        running.stop()


def test_the_runner_understands_every_scenario() -> None:
    problems = [p for s in SUITE["scenarios"] for p in validate(SUITE, s, ["idem", "lossy", "refused"])]
    assert not problems, "\n".join(problems)
    assert len(SCENARIOS) == len(SUITE["scenarios"]), "two scenarios share a name"


def failed(run: ScenarioRun) -> str:
    return (
        f"scenario {run.name} ({run.mode} client, run_base {run.run_base}) failed:\n  "
        + "\n  ".join(run.failures)
        + f"\n(idem's log: {LOG})"
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(environment: Environment, name: str, mode: str) -> None:
    run = run_scenario(environment, SUITE, SCENARIOS[name], mode)
    assert not run.failures, failed(run)


def new_key_on_retries(action: Action[Any]) -> Action[Any]:
    """Breaks the rule: the first attempt carries the call's key, every retry a new one."""
    if isinstance(action, Send) and action.number > 0:
        return replace(action, headers={**action.headers, "Idempotency-Key": quote_key(new_key())})
    return action


class NewKeyEveryRetryCall(ChargeCall):
    def next(self, now: float) -> Action[ChargeResult]:
        return new_key_on_retries(super().next(now))


class NewKeyEveryRetryRefundCall(RefundCall):
    def next(self, now: float) -> Action[RefundResult]:
        return new_key_on_retries(super().next(now))


class NewKeyEveryRetryAuthorizeCall(AuthorizeCall):
    def next(self, now: float) -> Action[ChargeResult]:
        return new_key_on_retries(super().next(now))


class NewKeyEveryRetryCaptureCall(CaptureCall):
    def next(self, now: float) -> Action[CaptureResult]:
        return new_key_on_retries(super().next(now))


class NewKeyEveryRetryVoidCall(VoidCall):
    def next(self, now: float) -> Action[VoidResult]:
        return new_key_on_retries(super().next(now))


class NewKeyEveryRetryClient(Client):
    _call_type = NewKeyEveryRetryCall
    _refund_call_type = NewKeyEveryRetryRefundCall
    _authorize_call_type = NewKeyEveryRetryAuthorizeCall
    _capture_call_type = NewKeyEveryRetryCaptureCall
    _void_call_type = NewKeyEveryRetryVoidCall


#: The scenarios whose calls retry after an attempt that did the work, and the order each charges.
RETRYING = {
    "unknown-outcome-then-settled": "2",
    "timeout-then-retry": "3",
    "server-goes-away-mid-retry": "8",
    "refund-answer-lost": "10",
}
#: Of those, the scenarios whose refund retries, and the order whose capture it refunds.
REFUND_RETRYING = {"refund-answer-lost": "10"}
#: The scenarios whose capture of an authorization retries after an attempt
#: that captured, and the order authorized.
CAPTURE_RETRYING = {"capture-timeout-then-retry": "18", "two-step-answers-lost": "19"}


def test_the_suite_fails_a_client_that_makes_a_new_key_on_every_retry(environment: Environment) -> None:
    runs = {
        name: run_scenario(environment, SUITE, scenario, "sync", Clients(sync=NewKeyEveryRetryClient))
        for name, scenario in SCENARIOS.items()
    }
    report = "\n".join(
        f"{name}: {'passed' if not run.failures else 'failed'}; captures {run.captures}, refunds {run.refunds}, "
        f"{run.ledger_lists}"
        for name, run in runs.items()
    )
    assert not runs["first-try"].failures, failed(runs["first-try"])
    for name, order in RETRYING.items():
        run = runs[name]
        assert run.failures, f"the suite passed {name} with a new key on every retry:\n{report}"
        assert run.captures.get(order, 0) >= 2, (
            f"{name}: a new key on every retry should charge order {order} again, "
            f"but the ledger shows {run.captures.get(order)}:\n{failed(run)}"
        )
        assert any(f"captures of order {order}" in f for f in run.failures), failed(run)
    for name, order in REFUND_RETRYING.items():
        run = runs[name]
        assert run.refunds.get(order, 0) >= 2, (
            f"{name}: a new key on every retry should refund order {order}'s capture again, "
            f"but the ledger shows {run.refunds.get(order)}:\n{failed(run)}"
        )
        assert any(f"refunds of order {order}" in f for f in run.failures), failed(run)
    for name, order in CAPTURE_RETRYING.items():
        run = runs[name]
        captured = run.ledger_lists.get("authorization_captures", {}).get(order, 0)
        assert captured >= 2, (
            f"{name}: a new key on every retry should capture order {order}'s authorization again, "
            f"but the ledger shows {captured}:\n{failed(run)}"
        )
        assert any(f"authorization_captures of order {order}" in f for f in run.failures), failed(run)
    failing = {name for name, run in runs.items() if run.failures}
    expected = set(RETRYING) | set(CAPTURE_RETRYING)
    assert failing == expected, f"expected exactly {sorted(expected)} to fail:\n{report}"
