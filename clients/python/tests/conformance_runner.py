"""The conformance suite's runner for the Python clients
(``clients/conformance/README.md`` says what it must do; this follows it step
by step).

A scenario run returns what went wrong as a list of failures, each naming the
scenario, the call and the field, with the outcome, instead of asserting deep
inside: the test that runs the suite with a client that breaks the rules
inspects them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Type

import httpx

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

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = REPO / "clients" / "conformance" / "scenarios.json"
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 10.0
#: The environment's standard error (idem's log), kept for a look after a failure.
LOG = REPO / "target" / "clients" / "python" / "conformance-env.log"


def load_suite() -> Dict[str, Any]:
    suite: Dict[str, Any] = json.loads(SCENARIOS.read_text(encoding="utf-8"))
    return suite


# --- The environment ----------------------------------------------------------------


class EnvironmentMissing(Exception):
    pass


@dataclass(frozen=True)
class Environment:
    endpoints: Dict[str, str]
    simulator: str
    secret: str
    key_ttl_secs: int
    log: Path


def lab_binary() -> Path:
    """``$IDEM_LAB_BIN``, else ``<repo>/target/debug/idem-lab``."""
    given = os.environ.get("IDEM_LAB_BIN")
    path = Path(given) if given else REPO / "target" / "debug" / "idem-lab"
    if not (path.is_file() and os.access(path, os.X_OK)):
        where = f"IDEM_LAB_BIN={given}" if given else f"{path} (IDEM_LAB_BIN is not set)"
        raise EnvironmentMissing(
            f"no idem-lab binary at {where}: build it with `cargo build -p idem-lab`, "
            "or point IDEM_LAB_BIN at one; the conformance suite runs against `idem-lab conformance-env`"
        )
    return path


class RunningEnvironment:
    """``idem-lab conformance-env``, started, its first stdout line read; it
    runs until :meth:`stop` closes its stdin."""

    def __init__(self) -> None:
        binary = lab_binary()
        self.log = LOG
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file: IO[bytes] = self.log.open("wb")
        self._process = subprocess.Popen(
            [str(binary), "conformance-env"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
        )
        try:
            self.environment = self._ready()
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> Environment:
        line: List[bytes] = []
        assert self._process.stdout is not None
        stdout = self._process.stdout
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT)
        if not line or not line[0].strip():
            why = "printed nothing" if line else f"printed nothing within {READY_TIMEOUT:g} s"
            raise EnvironmentMissing(f"idem-lab conformance-env {why}; its log ends:\n{self.log_tail()}")
        # Whatever else it prints is read too, so that it never blocks on a full pipe.
        threading.Thread(target=stdout.read, daemon=True).start()
        try:
            doc = json.loads(line[0])
            return Environment(
                endpoints=dict(doc["endpoints"]),
                simulator=str(doc["simulator"]),
                secret=str(doc["secret"]),
                key_ttl_secs=int(doc["key_ttl_secs"]),
                log=self.log,
            )
        except (ValueError, KeyError, TypeError) as e:
            raise EnvironmentMissing(f"idem-lab conformance-env's first line is not the environment ({e}): {line[0]!r}") from None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Closes its stdin, waits up to 10 s, then kills it."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log_file.close()


# --- Outcomes ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a call's client returned or raised, reduced as the README says."""

    result: str
    key: Optional[str] = None
    charge_id: Optional[str] = None
    replayed: Optional[bool] = None
    attempts: int = 0
    idempotency_ttl: Optional[int] = None
    differing_fields: Optional[List[str]] = None
    refund_id: Optional[str] = None
    capture_id: Optional[str] = None
    void_id: Optional[str] = None
    amount_cents: Optional[int] = None
    """A refund's, capture's or void's amount, when there is one."""
    remaining_cents: Optional[int] = None
    """What a refund-exceeds or capture-exceeds error says is left."""
    detail: str = ""

    def __str__(self) -> str:
        fields = [
            f"result={self.result}",
            f"charge_id={self.charge_id}",
            f"refund_id={self.refund_id}",
            f"capture_id={self.capture_id}",
            f"void_id={self.void_id}",
            f"amount_cents={self.amount_cents}",
            f"remaining_cents={self.remaining_cents}",
            f"replayed={self.replayed}",
            f"attempts={self.attempts}",
            f"key={self.key}",
            f"idempotency_ttl={self.idempotency_ttl}",
        ]
        if self.differing_fields is not None:
            fields.append(f"differing_fields={self.differing_fields}")
        return "{" + ", ".join(fields) + "}" + (f" ({self.detail})" if self.detail else "")


def _attempts_text(attempts: Sequence[Any]) -> str:
    return "attempts: " + "; ".join(f"{a} from {a.endpoint} in {a.elapsed:.3f} s" for a in attempts)


def reduce(returned: Any) -> Outcome:
    """A result or a raised error, as an outcome."""
    if isinstance(returned, ChargeResult):
        # A 201 is the charge's status: captured, or authorized (an authorize call).
        by_status = {201: returned.charge.status, 402: "declined", 502: "failed"}
        return Outcome(
            result=by_status.get(returned.status, f"result with status {returned.status}"),
            key=returned.key,
            charge_id=returned.charge.id,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, RefundResult):
        return Outcome(
            result="refunded",
            key=returned.key,
            charge_id=returned.refund.charge_id,
            refund_id=returned.refund.id,
            amount_cents=returned.refund.amount_cents,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, RefundFailedError):
        return Outcome(
            result="refund-failed",
            key=returned.key,
            charge_id=returned.refund.charge_id,
            refund_id=returned.refund.id,
            amount_cents=returned.refund.amount_cents,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, RefundExceedsCapturedError):
        return Outcome(
            result="refund-exceeds",
            key=returned.key,
            charge_id=returned.charge_id,
            remaining_cents=returned.remaining_cents,
            attempts=len(returned.attempts),
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, CaptureResult):
        return Outcome(
            result="captured",
            key=returned.key,
            charge_id=returned.capture.charge_id,
            capture_id=returned.capture.id,
            amount_cents=returned.capture.amount_cents,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, VoidResult):
        return Outcome(
            result="voided",
            key=returned.key,
            charge_id=returned.void.charge_id,
            void_id=returned.void.id,
            amount_cents=returned.void.amount_cents,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, CaptureFailedError):
        return Outcome(
            result="capture-failed",
            key=returned.key,
            charge_id=returned.capture.charge_id,
            capture_id=returned.capture.id,
            amount_cents=returned.capture.amount_cents,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, VoidFailedError):
        return Outcome(
            result="void-failed",
            key=returned.key,
            charge_id=returned.void.charge_id,
            void_id=returned.void.id,
            amount_cents=returned.void.amount_cents,
            replayed=returned.replayed,
            attempts=len(returned.attempts),
            idempotency_ttl=returned.idempotency_ttl,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, CaptureExceedsAuthorizationError):
        return Outcome(
            result="capture-exceeds",
            key=returned.key,
            charge_id=returned.charge_id,
            remaining_cents=returned.remaining_cents,
            attempts=len(returned.attempts),
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, ChargeNotAuthorizedError):
        return Outcome(
            result="not-authorized",
            key=returned.key,
            charge_id=returned.charge_id,
            attempts=len(returned.attempts),
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, ChargeNotRefundableError):
        return Outcome(
            result="not-refundable",
            key=returned.key,
            charge_id=returned.charge_id,
            attempts=len(returned.attempts),
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, KeyReusedError):
        return Outcome(
            result="key-reused",
            key=returned.key,
            charge_id=returned.charge_id,
            refund_id=returned.refund_id,
            capture_id=returned.capture_id,
            void_id=returned.void_id,
            attempts=len(returned.attempts),
            differing_fields=returned.differing_fields,
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, KeyExpiredError):
        return Outcome(
            result="key-expired",
            key=returned.key,
            charge_id=returned.charge_id,
            refund_id=returned.refund_id,
            capture_id=returned.capture_id,
            void_id=returned.void_id,
            attempts=len(returned.attempts),
            detail=_attempts_text(returned.attempts),
        )
    if isinstance(returned, GaveUpError):
        return Outcome(result="gave-up", key=returned.key, attempts=len(returned.attempts), detail=str(returned))
    if isinstance(returned, ApiError):
        return Outcome(result="rejected", key=returned.key, attempts=len(returned.attempts), detail=str(returned))
    return Outcome(result=f"raised {type(returned).__name__}", detail=repr(returned))


# --- One scenario -----------------------------------------------------------------------------

_POLICY_FIELDS = {
    "max_attempts": ("max_attempts", 1),
    "attempt_timeout_ms": ("attempt_timeout", 1000),
    "deadline_ms": ("deadline", 1000),
    "prefer_wait_secs": ("prefer_wait", 1),
    "base_delay_ms": ("base_delay", 1000),
    "max_delay_ms": ("max_delay", 1000),
}


def policy_of(suite: Dict[str, Any], scenario: Dict[str, Any]) -> RetryPolicy:
    """The suite's policy with the scenario's fields over it, in the client's units."""
    merged = {**suite["policy"], **scenario.get("policy", {})}
    unknown = set(merged) - set(_POLICY_FIELDS)
    if unknown:
        raise ValueError(f"policy fields this runner does not know: {sorted(unknown)}")
    kwargs: Dict[str, Any] = {}
    for name, value in merged.items():
        attribute, per_unit = _POLICY_FIELDS[name]
        kwargs[attribute] = value if per_unit == 1 else value / per_unit
    return RetryPolicy(**kwargs)


_last_run_base = 0
_run_base_lock = threading.Lock()


def new_run_base() -> int:
    """Milliseconds since the epoch times 1,000, past every earlier one of this process."""
    global _last_run_base
    with _run_base_lock:
        _last_run_base = max(int(time.time() * 1000) * 1000, _last_run_base + 1000)
        return _last_run_base


#: The ledger's lists counted per order as they are (each entry has its order).
LEDGER_LISTS = ("authorizations", "authorization_captures", "voids")
SCENARIO_FIELDS = {"name", "about", "faults", "endpoints", "policy", "calls", "captures", "refunds", *LEDGER_LISTS}
CALL_FIELDS = {
    "id",
    "op",
    "refund_of",
    "capture_of",
    "void_of",
    "order",
    "amount_cents",
    "final",
    "key",
    "delay_ms",
    "after",
    "faults",
    "expect",
}
#: The operations, and for those on an earlier call's charge, the field naming that call.
OPS: Dict[str, Optional[str]] = {
    "charge": None,
    "authorize": None,
    "refund": "refund_of",
    "capture": "capture_of",
    "void": "void_of",
}


def op_of(call: Dict[str, Any]) -> str:
    """``charge`` (the default), ``authorize``, ``refund``, ``capture`` or ``void``."""
    return str(call.get("op", "charge"))


def of_field(call: Dict[str, Any]) -> Optional[str]:
    """The field naming the call whose charge this one refunds, captures or
    voids (``refund_of``, ``capture_of``, ``void_of``); ``None`` for a charge."""
    return OPS.get(op_of(call))


def validate(suite: Dict[str, Any], scenario: Dict[str, Any], environment_names: Sequence[str]) -> List[str]:
    """What in a scenario this runner cannot run as the README says (a field it
    does not know, an ``after``, ``refund_of``, ``capture_of`` or ``void_of``
    naming no earlier call, a refund of a refund, a capture of a one-step
    charge, an unknown endpoint)."""
    name = scenario.get("name", "?")
    problems = [f"{name}: unknown field {f!r}" for f in sorted(set(scenario) - SCENARIO_FIELDS)]
    try:
        policy_of(suite, scenario)
    except (ValueError, TypeError) as e:
        problems.append(f"{name}: policy: {e}")
    problems += [f"{name}: unknown endpoint {e!r}" for e in scenario["endpoints"] if e not in environment_names]
    ids = {c["id"] for c in scenario["calls"]}
    seen: Dict[str, Dict[str, Any]] = {}
    for call in scenario["calls"]:
        where = f"{name}: call {call.get('id')}"
        problems += [f"{where}: unknown field {f!r}" for f in sorted(set(call) - CALL_FIELDS)]
        problems += [f"{where}: unknown expectation {f!r}" for f in sorted(set(call["expect"]) - set(CHECKS))]
        if "after" in call and call["after"] not in seen:
            problems.append(f"{where}: after {call['after']!r} names no earlier call")
        for check in ("same_charge_as", "same_refund_as", "same_capture_as", "same_void_as"):
            if check in call["expect"] and call["expect"][check] not in ids:
                problems.append(f"{where}: {check} names no call")
        op = op_of(call)
        if op not in OPS:
            problems.append(f"{where}: op {op!r} is not one of {sorted(OPS)}")
            continue
        own = of_field(call)
        problems += [
            f"{where}: a {op} has no {f}" for f in ("refund_of", "capture_of", "void_of") if f in call and f != own
        ]
        if op != "capture" and "final" in call:
            problems.append(f"{where}: only a capture has final")
        if op == "void" and "amount_cents" in call:
            problems.append(f"{where}: a void has no amount_cents")
        if own is not None:
            charges = ("charge", "authorize") if op == "refund" else ("authorize",)
            charge = seen.get(call.get(own, ""))
            if charge is None or op_of(charge) not in charges:
                problems.append(f"{where}: {own} {call.get(own)!r} names no earlier {' or '.join(charges)} call")
            if "order" in call:
                problems.append(f"{where}: a {op} has no order (it takes its {own}'s charge)")
        else:
            problems += [f"{where}: a {op} needs {f!r}" for f in ("order", "amount_cents") if f not in call]
        seen[call["id"]] = call
    return problems


@dataclass
class ScenarioRun:
    name: str
    mode: str
    run_base: int
    outcomes: Dict[str, Outcome] = field(default_factory=dict)
    captures: Dict[str, int] = field(default_factory=dict)
    """Captures the ledger shows per order (the scenario's ``captures`` keys)."""
    refunds: Dict[str, int] = field(default_factory=dict)
    """Refunds the ledger shows of each order's captures (the scenario's ``refunds`` keys)."""
    ledger_lists: Dict[str, Dict[str, int]] = field(default_factory=dict)
    """For each of :data:`LEDGER_LISTS` the scenario counts, its entries per order."""
    failures: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Clients:
    """The client classes a run drives (a variant may stand in for either)."""

    sync: Type[Client] = Client
    async_: Type[AsyncClient] = AsyncClient


def run_scenario(
    env: Environment,
    suite: Dict[str, Any],
    scenario: Dict[str, Any],
    mode: str,
    clients: Clients = Clients(),
    run_base: Optional[int] = None,
) -> ScenarioRun:
    """Runs one scenario with the sync or async client; returns what failed."""
    name = scenario["name"]
    run = ScenarioRun(name=name, mode=mode, run_base=new_run_base() if run_base is None else run_base)
    fail = run.failures.append
    run.failures.extend(validate(suite, scenario, list(env.endpoints)))
    if run.failures:
        return run
    with httpx.Client(timeout=30) as sim:
        # 1. The acquirer's faults.
        answer = sim.put(f"{env.simulator}/_sim/faults", json=scenario.get("faults", {}))
        if answer.status_code >= 300:
            fail(f"{name}: PUT /_sim/faults answered {answer.status_code}: {answer.text}")
            return run
        try:
            # 2. and 3. A client, and the calls.
            policy = policy_of(suite, scenario)
            endpoints = [env.endpoints[e] for e in scenario["endpoints"]]
            calls: List[Dict[str, Any]] = scenario["calls"]
            if mode == "sync":
                run.outcomes = _calls_sync(
                    clients.sync, endpoints, env.secret, policy, calls, run.run_base, name, env.simulator
                )
            elif mode == "async":
                run.outcomes = asyncio.run(
                    _calls_async(
                        clients.async_, endpoints, env.secret, policy, calls, run.run_base, name, env.simulator
                    )
                )
            else:
                raise ValueError(f"mode {mode!r}")
            # 4. Each call's outcome against its expectations.
            for call in calls:
                run.failures.extend(check_call(name, call, run.outcomes, run.run_base))
            # 5. The ledger.
            ledger = sim.get(f"{env.simulator}/_sim/ledger")
            ledger.raise_for_status()
            document = ledger.json()
            captures = document["captures"]
            refunds = document.get("refunds") or []  # absent from an older simulator's ledger
            outcomes_text = "; ".join(f"call {i}: {o}" for i, o in run.outcomes.items())
            for order, expected in scenario.get("captures", {}).items():
                order_id = run.run_base + int(order)
                count = sum(1 for c in captures if c.get("order_id") == order_id)
                run.captures[order] = count
                if count != expected:
                    fail(
                        f"{name}: captures of order {order} (order_id {order_id}): expected {expected}, "
                        f"the ledger shows {count}; outcomes: {outcomes_text}"
                    )
            for order, expected in scenario.get("refunds", {}).items():
                order_id = run.run_base + int(order)
                # A refund of a two-step charge names its authorization.
                held = captures + (document.get("authorizations") or [])
                references = {c.get("reference") for c in held if c.get("order_id") == order_id}
                count = sum(1 for r in refunds if r.get("capture_reference") in references)
                run.refunds[order] = count
                if count != expected:
                    fail(
                        f"{name}: refunds of order {order} (order_id {order_id}, captures {sorted(map(str, references))}): "
                        f"expected {expected}, the ledger shows {count}; outcomes: {outcomes_text}"
                    )
            for list_name in LEDGER_LISTS:
                entries = document.get(list_name) or []  # absent from an older simulator's ledger
                for order, expected in scenario.get(list_name, {}).items():
                    order_id = run.run_base + int(order)
                    count = sum(1 for e in entries if e.get("order_id") == order_id)
                    run.ledger_lists.setdefault(list_name, {})[order] = count
                    if count != expected:
                        fail(
                            f"{name}: {list_name} of order {order} (order_id {order_id}): expected {expected}, "
                            f"the ledger shows {count}; outcomes: {outcomes_text}"
                        )
        finally:
            # 6. A well-behaved acquirer again.
            reset = sim.put(f"{env.simulator}/_sim/faults", json={})
            if reset.status_code >= 300:
                fail(f"{name}: resetting the faults answered {reset.status_code}: {reset.text}")
    return run


def call_key(run_base: int, scenario: str, call: Dict[str, Any]) -> Optional[str]:
    return f"conf-{run_base}-{scenario}-{call['key']}" if "key" in call else None


def _charge_fields(call: Dict[str, Any], run_base: int, scenario: str) -> Dict[str, Any]:
    return {
        "order_id": run_base + int(call["order"]),
        "amount_cents": int(call["amount_cents"]),
        "currency": "BRL",
        "idempotency_key": call_key(run_base, scenario, call),
    }


def _refund_fields(call: Dict[str, Any], run_base: int, scenario: str, charge_id: str) -> Dict[str, Any]:
    amount = call.get("amount_cents")
    return {
        "charge_id": charge_id,
        "amount_cents": None if amount is None else int(amount),
        "idempotency_key": call_key(run_base, scenario, call),
    }


def _capture_fields(call: Dict[str, Any], run_base: int, scenario: str, charge_id: str) -> Dict[str, Any]:
    fields = _refund_fields(call, run_base, scenario, charge_id)
    if "final" in call:  # else the client's default
        fields["final"] = bool(call["final"])
    return fields


def _void_fields(call: Dict[str, Any], run_base: int, scenario: str, charge_id: str) -> Dict[str, Any]:
    return {"charge_id": charge_id, "idempotency_key": call_key(run_base, scenario, call)}


def _waits_for(call: Dict[str, Any]) -> List[str]:
    """The calls this one starts after: its ``after`` and its ``refund_of``,
    ``capture_of`` or ``void_of``."""
    return [call[f] for f in ("after", "refund_of", "capture_of", "void_of") if f in call]


def _never_started(call: Dict[str, Any], outcomes: Dict[str, Outcome]) -> Optional[Outcome]:
    """Why a refund, capture or void call cannot start (the call whose charge
    it takes made none); else ``None``."""
    own = of_field(call)
    if own is None:
        return None
    charged = outcomes.get(call[own])
    if charged is None or charged.charge_id is None:
        return Outcome(result=f"never started: call {call[own]} made no charge ({charged})")
    return None


def _charge_of(call: Dict[str, Any], outcomes: Dict[str, Outcome]) -> str:
    own = of_field(call)
    assert own is not None
    return str(outcomes[call[own]].charge_id)


def _send_sync(
    client: Client, call: Dict[str, Any], outcomes: Dict[str, Outcome], run_base: int, scenario: str
) -> Any:
    """The call's operation on the sync client: its result (or what it raised, returned)."""
    op = op_of(call)
    try:
        if op == "charge":
            return client.charge(**_charge_fields(call, run_base, scenario))
        if op == "authorize":
            return client.authorize(**_charge_fields(call, run_base, scenario))
        charge_id = _charge_of(call, outcomes)
        if op == "refund":
            return client.refund(**_refund_fields(call, run_base, scenario, charge_id))
        if op == "capture":
            return client.capture(**_capture_fields(call, run_base, scenario, charge_id))
        return client.void(**_void_fields(call, run_base, scenario, charge_id))
    except Exception as error:  # every error is an outcome to check
        return error


async def _send_async(
    client: AsyncClient, call: Dict[str, Any], outcomes: Dict[str, Outcome], run_base: int, scenario: str
) -> Any:
    """As :func:`_send_sync`, on the async client."""
    op = op_of(call)
    try:
        if op == "charge":
            return await client.charge(**_charge_fields(call, run_base, scenario))
        if op == "authorize":
            return await client.authorize(**_charge_fields(call, run_base, scenario))
        charge_id = _charge_of(call, outcomes)
        if op == "refund":
            return await client.refund(**_refund_fields(call, run_base, scenario, charge_id))
        if op == "capture":
            return await client.capture(**_capture_fields(call, run_base, scenario, charge_id))
        return await client.void(**_void_fields(call, run_base, scenario, charge_id))
    except Exception as error:  # every error is an outcome to check
        return error


def _call_budget(policy: RetryPolicy) -> float:
    """How long a call may take at most, with room: what a wait on another call is bounded by."""
    return policy.deadline + 30


def _calls_sync(
    client_type: Type[Client],
    endpoints: List[str],
    secret: str,
    policy: RetryPolicy,
    calls: List[Dict[str, Any]],
    run_base: int,
    scenario: str,
    simulator: str,
) -> Dict[str, Outcome]:
    outcomes: Dict[str, Outcome] = {}
    ended = {call["id"]: threading.Event() for call in calls}
    ended_at: Dict[str, float] = {}

    with client_type(endpoints, secret, policy=policy) as client:
        started = time.monotonic()

        def run(call: Dict[str, Any]) -> None:
            try:
                origin = started
                for other in _waits_for(call):
                    if not ended[other].wait(_call_budget(policy) * len(calls)):
                        outcomes[call["id"]] = Outcome(result=f"never started: call {other} never ended")
                        return
                    origin = max(origin, ended_at[other])
                cannot = _never_started(call, outcomes)
                if cannot is not None:
                    outcomes[call["id"]] = cannot
                    return
                delay = origin + call.get("delay_ms", 0) / 1000 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if "faults" in call:
                    httpx.put(f"{simulator}/_sim/faults", json=call["faults"], timeout=30).raise_for_status()
                outcomes[call["id"]] = reduce(_send_sync(client, call, outcomes, run_base, scenario))
            finally:
                ended_at[call["id"]] = time.monotonic()
                ended[call["id"]].set()

        threads = [threading.Thread(target=run, args=(call,), name=f"call-{call['id']}") for call in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return outcomes


async def _calls_async(
    client_type: Type[AsyncClient],
    endpoints: List[str],
    secret: str,
    policy: RetryPolicy,
    calls: List[Dict[str, Any]],
    run_base: int,
    scenario: str,
    simulator: str,
) -> Dict[str, Outcome]:
    outcomes: Dict[str, Outcome] = {}
    ended = {call["id"]: asyncio.Event() for call in calls}
    ended_at: Dict[str, float] = {}

    async with client_type(endpoints, secret, policy=policy) as client:
        started = time.monotonic()

        async def run(call: Dict[str, Any]) -> None:
            try:
                origin = started
                for other in _waits_for(call):
                    try:
                        await asyncio.wait_for(ended[other].wait(), _call_budget(policy) * len(calls))
                    except asyncio.TimeoutError:
                        outcomes[call["id"]] = Outcome(result=f"never started: call {other} never ended")
                        return
                    origin = max(origin, ended_at[other])
                cannot = _never_started(call, outcomes)
                if cannot is not None:
                    outcomes[call["id"]] = cannot
                    return
                delay = origin + call.get("delay_ms", 0) / 1000 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if "faults" in call:
                    async with httpx.AsyncClient(timeout=30) as sim:
                        (await sim.put(f"{simulator}/_sim/faults", json=call["faults"])).raise_for_status()
                outcomes[call["id"]] = reduce(await _send_async(client, call, outcomes, run_base, scenario))
            finally:
                ended_at[call["id"]] = time.monotonic()
                ended[call["id"]].set()

        await asyncio.gather(*(run(call) for call in calls))
    return outcomes


# --- Expectations -------------------------------------------------------------------------------

Check = Callable[[Outcome, Any, Dict[str, Outcome]], Optional[str]]


def _same_charge_as(outcome: Outcome, other_id: Any, outcomes: Dict[str, Outcome]) -> Optional[str]:
    other = outcomes.get(other_id)
    if other is None:
        return f"call {other_id} has no outcome"
    if outcome.charge_id is None or outcome.charge_id != other.charge_id:
        return f"expected call {other_id}'s charge_id {other.charge_id}, got {outcome.charge_id}"
    return None


def _same(field_name: str) -> Check:
    """``same_refund_as`` and its kin: this outcome's ``field_name`` is
    present and is the other call's."""

    def check(outcome: Outcome, other_id: Any, outcomes: Dict[str, Outcome]) -> Optional[str]:
        other = outcomes.get(other_id)
        if other is None:
            return f"call {other_id} has no outcome"
        mine, theirs = getattr(outcome, field_name), getattr(other, field_name)
        if mine is None or mine != theirs:
            return f"expected call {other_id}'s {field_name} {theirs}, got {mine}"
        return None

    return check


def _expect(actual: Any, expected: Any, holds: bool, field_name: str) -> Optional[str]:
    return None if holds else f"expected {field_name} {expected!r}, got {actual!r}"


CHECKS: Dict[str, Check] = {
    "result": lambda o, e, _: _expect(o.result, e, o.result == e, "result"),
    "replayed": lambda o, e, _: _expect(o.replayed, e, o.replayed is e, "replayed"),
    "min_attempts": lambda o, e, _: _expect(o.attempts, e, o.attempts >= e, "at least attempts"),
    "max_attempts": lambda o, e, _: _expect(o.attempts, e, o.attempts <= e, "at most attempts"),
    "same_charge_as": _same_charge_as,
    "ttl_at_most_secs": lambda o, e, _: _expect(
        o.idempotency_ttl, e, o.idempotency_ttl is not None and o.idempotency_ttl <= e, "idempotency_ttl at most"
    ),
    "differing_fields": lambda o, e, _: _expect(o.differing_fields, e, o.differing_fields == e, "differing_fields"),
    "same_refund_as": _same("refund_id"),
    "same_capture_as": _same("capture_id"),
    "same_void_as": _same("void_id"),
    "amount_cents": lambda o, e, _: _expect(o.amount_cents, e, o.amount_cents == e, "amount_cents"),
    "remaining_cents": lambda o, e, _: _expect(o.remaining_cents, e, o.remaining_cents == e, "remaining_cents"),
}


def check_call(scenario: str, call: Dict[str, Any], outcomes: Dict[str, Outcome], run_base: int) -> List[str]:
    """Every expectation of a call that does not hold, as failure messages."""
    where = f"{scenario}: call {call['id']}"
    outcome = outcomes.get(call["id"])
    if outcome is None:
        return [f"{where}: no outcome"]
    failures = []
    for name, expected in call["expect"].items():
        check = CHECKS.get(name)
        why = f"an expectation this runner does not know ({expected!r})" if check is None else check(outcome, expected, outcomes)
        if why is not None:
            failures.append(f"{where}: {name}: {why}; outcome: {outcome}")
    key = call_key(run_base, scenario, call)
    if key is not None and outcome.key != key:
        failures.append(f"{where}: key: expected {key!r}, got {outcome.key!r}; outcome: {outcome}")
    if key is None and not (isinstance(outcome.key, str) and outcome.key):
        failures.append(f"{where}: key: the client made no key, or the outcome does not carry it; outcome: {outcome}")
    return failures
