// The conformance runner: reads clients/conformance/scenarios.json and drives
// a client through one scenario exactly as clients/conformance/README.md says,
// returning the failures (an empty list when the scenario passed).
import { readFileSync } from "node:fs";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { isDeepStrictEqual } from "node:util";

import {
  ApiError,
  CaptureExceedsAuthorizationError,
  CaptureFailedError,
  ChargeNotAuthorizedError,
  ChargeNotRefundableError,
  GaveUpError,
  IdemClient,
  IdemError,
  KeyExpiredError,
  KeyReusedError,
  RefundExceedsCapturedError,
  RefundFailedError,
  VoidFailedError,
} from "../../dist/index.js";
import { REPO_ROOT } from "./env.js";

export const SCENARIOS_FILE = path.join(REPO_ROOT, "clients", "conformance", "scenarios.json");

const POLICY_FIELDS = {
  max_attempts: "maxAttempts",
  attempt_timeout_ms: "attemptTimeoutMs",
  deadline_ms: "deadlineMs",
  prefer_wait_secs: "preferWaitSecs",
  base_delay_ms: "baseDelayMs",
  max_delay_ms: "maxDelayMs",
};
/** The ledger's lists counted per order as they are (each entry has its order). */
const LEDGER_LISTS = ["authorizations", "authorization_captures", "voids"];
const SCENARIO_FIELDS = new Set(["name", "about", "faults", "endpoints", "policy", "calls", "captures", "refunds", ...LEDGER_LISTS]);
const CALL_FIELDS = new Set([
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
]);
const EXPECT_FIELDS = new Set([
  "result",
  "replayed",
  "min_attempts",
  "max_attempts",
  "same_charge_as",
  "same_refund_as",
  "same_capture_as",
  "same_void_as",
  "amount_cents",
  "remaining_cents",
  "ttl_at_most_secs",
  "differing_fields",
]);
/** The operations, and for those on an earlier call's charge, the field naming that call. */
const OPS = { charge: null, authorize: null, refund: "refund_of", capture: "capture_of", void: "void_of" };

/** A call's operation: `charge` (the default), `authorize`, `refund`, `capture` or `void`. */
export function opOf(call) {
  return call.op ?? "charge";
}

/** The field naming the call whose charge this one refunds, captures or voids; `null` for a charge. */
function ofField(call) {
  return OPS[opOf(call)] ?? null;
}

export function loadSuite() {
  return JSON.parse(readFileSync(SCENARIOS_FILE, "utf8"));
}

let lastRunBase = 0;

/** Milliseconds since the epoch times 1,000, never the same twice in this process. */
export function nextRunBase() {
  const base = Math.max(Date.now() * 1000, lastRunBase + 1000);
  lastRunBase = base;
  return base;
}

/** The suite's policy with the scenario's fields over it, as the client's options. */
export function policyFor(suitePolicy, scenarioPolicy = {}) {
  const merged = { ...suitePolicy, ...scenarioPolicy };
  const retry = {};
  for (const [name, value] of Object.entries(merged)) {
    const option = POLICY_FIELDS[name];
    if (option === undefined) {
      throw new Error(`the runner does not know the policy field ${JSON.stringify(name)}`);
    }
    retry[option] = value;
  }
  return retry;
}

/** What a call's operation returned or threw, reduced to the README's outcome. */
export function reduceOutcome(settled) {
  if (settled.ok) {
    const r = settled.value;
    // A refund, a capture or a void; else the charge (captured, authorized, declined, failed).
    const [result, made] =
      r.refund !== undefined
        ? ["refunded", r.refund]
        : r.capture !== undefined
          ? ["captured", r.capture]
          : r.void !== undefined
            ? ["voided", r.void]
            : [r.charge.status, null];
    return {
      result,
      charge_id: made === null ? r.charge.id : made.charge_id,
      refund_id: r.refund?.id ?? null,
      capture_id: r.capture?.id ?? null,
      void_id: r.void?.id ?? null,
      amount_cents: made?.amount_cents ?? null,
      remaining_cents: null,
      replayed: r.replayed,
      attempts: r.attempts.length,
      key: r.key,
      idempotency_ttl: r.idempotencyTtl,
      differing_fields: null,
    };
  }
  const e = settled.error;
  if (!(e instanceof IdemError)) {
    return { result: "exception", error: String(e?.stack ?? e) };
  }
  const outcome = {
    result: "rejected",
    charge_id: null,
    refund_id: null,
    capture_id: null,
    void_id: null,
    amount_cents: null,
    remaining_cents: null,
    replayed: null, // an error does not say; no expectation asks it of one
    attempts: e.attempts.length,
    key: e.key,
    idempotency_ttl: null,
    differing_fields: null,
  };
  if (e instanceof RefundFailedError) {
    return {
      ...outcome,
      result: "refund-failed",
      charge_id: e.refund.charge_id,
      refund_id: e.refund.id,
      amount_cents: e.refund.amount_cents,
      replayed: e.replayed,
      idempotency_ttl: e.idempotencyTtl,
    };
  }
  if (e instanceof RefundExceedsCapturedError) {
    return { ...outcome, result: "refund-exceeds", charge_id: e.chargeId, remaining_cents: e.remainingCents };
  }
  if (e instanceof CaptureFailedError || e instanceof VoidFailedError) {
    const step = e instanceof CaptureFailedError ? e.capture : e.void;
    return {
      ...outcome,
      result: e instanceof CaptureFailedError ? "capture-failed" : "void-failed",
      charge_id: step.charge_id,
      capture_id: e instanceof CaptureFailedError ? step.id : null,
      void_id: e instanceof VoidFailedError ? step.id : null,
      amount_cents: step.amount_cents,
      replayed: e.replayed,
      idempotency_ttl: e.idempotencyTtl,
    };
  }
  if (e instanceof CaptureExceedsAuthorizationError) {
    return { ...outcome, result: "capture-exceeds", charge_id: e.chargeId, remaining_cents: e.remainingCents };
  }
  if (e instanceof ChargeNotAuthorizedError) {
    return { ...outcome, result: "not-authorized", charge_id: e.chargeId };
  }
  if (e instanceof ChargeNotRefundableError) {
    return { ...outcome, result: "not-refundable", charge_id: e.chargeId };
  }
  if (e instanceof KeyReusedError) {
    return {
      ...outcome,
      result: "key-reused",
      charge_id: e.chargeId,
      refund_id: e.refundId,
      capture_id: e.captureId,
      void_id: e.voidId,
      differing_fields: [...e.differingFields],
    };
  }
  if (e instanceof KeyExpiredError) {
    return {
      ...outcome,
      result: "key-expired",
      charge_id: e.chargeId,
      refund_id: e.refundId,
      capture_id: e.captureId,
      void_id: e.voidId,
    };
  }
  if (e instanceof GaveUpError) {
    return { ...outcome, result: "gave-up", error: e.last };
  }
  if (e instanceof ApiError) {
    const chargeId = typeof e.problem?.charge_id === "string" ? e.problem.charge_id : null;
    return { ...outcome, result: "rejected", charge_id: chargeId, status: e.status, error: e.message };
  }
  return { ...outcome, result: "exception", error: String(e.stack ?? e) };
}

/**
 * Checks one call's outcome against its `expect`; `outcomes` has every call's
 * outcome by id (for `same_charge_as`). Returns [{ field, expected, got }].
 */
export function checkExpectations(expect, outcome, outcomes) {
  const misses = [];
  const miss = (field, expected, got) => misses.push({ field, expected, got });
  for (const [field, expected] of Object.entries(expect)) {
    switch (field) {
      case "result":
      case "replayed":
        if (outcome[field] !== expected) miss(field, expected, outcome[field]);
        break;
      case "min_attempts":
        if (!(outcome.attempts >= expected)) miss(field, `at least ${expected}`, outcome.attempts);
        break;
      case "max_attempts":
        if (!(outcome.attempts <= expected)) miss(field, `at most ${expected}`, outcome.attempts);
        break;
      case "same_charge_as": {
        const other = outcomes.get(expected)?.charge_id ?? null;
        if (outcome.charge_id == null || other === null || outcome.charge_id !== other) {
          miss(field, `call ${expected}'s charge_id ${JSON.stringify(other)}`, outcome.charge_id ?? null);
        }
        break;
      }
      case "same_refund_as":
      case "same_capture_as":
      case "same_void_as": {
        const id = `${field.slice("same_".length, -"_as".length)}_id`;
        const other = outcomes.get(expected)?.[id] ?? null;
        if (outcome[id] == null || other === null || outcome[id] !== other) {
          miss(field, `call ${expected}'s ${id} ${JSON.stringify(other)}`, outcome[id] ?? null);
        }
        break;
      }
      case "amount_cents":
      case "remaining_cents":
        if (outcome[field] !== expected) miss(field, expected, outcome[field] ?? null);
        break;
      case "ttl_at_most_secs":
        if (outcome.idempotency_ttl == null || !(outcome.idempotency_ttl <= expected)) {
          miss("idempotency_ttl", `present and at most ${expected}`, outcome.idempotency_ttl ?? null);
        }
        break;
      case "differing_fields":
        if (!isDeepStrictEqual(outcome.differing_fields, expected)) miss(field, expected, outcome.differing_fields);
        break;
      default:
        miss(field, "an expectation this runner knows", "unknown field");
    }
  }
  return misses;
}

/** A `fetch` that records every request's `Idempotency-Key` header, then sends it. */
function recordingFetch(sent) {
  return (url, init) => {
    const headers = new Headers(init?.headers);
    sent.push(headers.get("idempotency-key"));
    return fetch(url, init);
  };
}

/** The key as the client quotes it (`"` and `\` escaped). */
function quoted(key) {
  return `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

async function simulator(env, method, route, body) {
  const response = await fetch(`${env.simulator}${route}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) {
    throw new Error(`${method} ${route} answered ${response.status}: ${text}`);
  }
  return text === "" ? null : JSON.parse(text);
}

function show(value) {
  return JSON.stringify(value);
}

/**
 * Runs one scenario against the environment `env` (conformance-env's JSON)
 * with a client made by `new ClientClass(options)`. Resolves with
 * `{ name, runBase, outcomes, captures, refunds, ledgerLists, failures }`
 * (`ledgerLists`: for each of `authorizations`, `authorization_captures` and
 * `voids` the scenario counts, its entries per order); each failure is
 * `{ scenario, call, field, expected, got, message }` (`call` null for the
 * scenario's own checks) and its message names the scenario, the call, the
 * field and the outcome.
 */
export async function runScenario({ env, suite, scenario, ClientClass = IdemClient, runBase = nextRunBase() }) {
  const name = scenario.name;
  const failures = [];
  const outcomes = new Map();
  const captures = {};
  const refunds = {};
  const ledgerLists = {};
  const fail = (call, field, expected, got, outcome) => {
    const where = call === null ? `scenario ${show(name)}` : `scenario ${show(name)}, call ${show(call)}`;
    let message = `${where}: ${field}: expected ${show(expected)}, got ${show(got)}`;
    if (outcome !== undefined) message += `\n    outcome: ${show(outcome)}`;
    failures.push({ scenario: name, call, field, expected, got, message });
  };

  for (const field of Object.keys(scenario)) {
    if (!SCENARIO_FIELDS.has(field)) fail(null, field, "a scenario field this runner knows", "unknown field");
  }
  const earlier = new Map();
  for (const call of scenario.calls) {
    for (const field of Object.keys(call)) {
      if (!CALL_FIELDS.has(field)) fail(call.id, field, "a call field this runner knows", "unknown field");
    }
    for (const field of Object.keys(call.expect ?? {})) {
      if (!EXPECT_FIELDS.has(field)) fail(call.id, `expect.${field}`, "an expectation this runner knows", "unknown field");
    }
    if (call.after !== undefined && !earlier.has(call.after)) fail(call.id, "after", "the id of an earlier call", call.after);
    const op = opOf(call);
    if (!Object.hasOwn(OPS, op)) {
      fail(call.id, "op", Object.keys(OPS).join(", "), op);
      continue;
    }
    const own = ofField(call);
    for (const field of ["refund_of", "capture_of", "void_of"]) {
      if (field !== own && call[field] !== undefined) fail(call.id, field, `none on a ${op}`, call[field]);
    }
    if (op !== "capture" && call.final !== undefined) fail(call.id, "final", "none: only a capture has final", call.final);
    if (op === "void" && call.amount_cents !== undefined) fail(call.id, "amount_cents", "none on a void", call.amount_cents);
    if (own !== null) {
      const charges = op === "refund" ? ["charge", "authorize"] : ["authorize"];
      const charge = earlier.get(call[own]);
      if (charge === undefined || !charges.includes(opOf(charge))) {
        fail(call.id, own, `the id of an earlier ${charges.join(" or ")} call`, call[own] ?? null);
      }
      if (call.order !== undefined) fail(call.id, "order", `none: a ${op} takes its ${own}'s charge`, call.order);
    } else {
      for (const field of ["order", "amount_cents"]) {
        if (call[field] === undefined) fail(call.id, field, `a ${op}'s`, "nothing");
      }
    }
    earlier.set(call.id, call);
  }
  const baseUrl = scenario.endpoints.map((endpoint) => env.endpoints[endpoint]);
  scenario.endpoints.forEach((endpoint, i) => {
    if (typeof baseUrl[i] !== "string") fail(null, "endpoints", "names the environment gives", endpoint);
  });
  if (failures.length > 0) return { name, runBase, outcomes, captures, refunds, ledgerLists, failures };

  try {
    // 1. The acquirer's faults.
    await simulator(env, "PUT", "/_sim/faults", scenario.faults ?? {});

    // 2. A client for the scenario.
    const sent = [];
    const client = new ClientClass({
      baseUrl,
      secret: env.secret,
      retry: policyFor(suite.policy, scenario.policy),
      fetch: recordingFetch(sent),
    });

    // 3. The calls, concurrently.
    const keyOf = (call) => (call.key === undefined ? undefined : `conf-${runBase}-${name}-${call.key}`);
    const ended = new Map();
    const started = Date.now();
    // A call starts after every call it names (after, refund_of, capture_of,
    // void_of) ended; its delay counts from the last of those ends.
    const run = async (call) => {
      const own = ofField(call);
      for (const other of [call.after, own === null ? undefined : call[own]].filter((id) => id !== undefined)) {
        await ended.get(other);
      }
      await sleep(call.delay_ms ?? 0);
      let chargeId = null;
      if (own !== null) {
        chargeId = outcomes.get(call[own])?.charge_id ?? null;
        if (chargeId === null) {
          outcomes.set(call.id, { result: `never started: call ${call[own]} made no charge` });
          return;
        }
      }
      if (call.faults !== undefined) await simulator(env, "PUT", "/_sim/faults", call.faults);
      const options = keyOf(call) === undefined ? {} : { idempotencyKey: keyOf(call) };
      let settled;
      try {
        const op = opOf(call);
        if (op === "charge" || op === "authorize") {
          const request = { order_id: runBase + call.order, amount_cents: call.amount_cents, currency: "BRL" };
          settled = { ok: true, value: await client[op](request, options) };
        } else {
          if (op !== "void" && call.amount_cents !== undefined) options.amountCents = call.amount_cents;
          if (op === "capture" && call.final !== undefined) options.final = call.final;
          settled = { ok: true, value: await client[op](chargeId, options) };
        }
      } catch (error) {
        settled = { ok: false, error };
      }
      const outcome = reduceOutcome(settled);
      outcome.ended_ms = Date.now() - started;
      outcomes.set(call.id, outcome);
    };
    const pending = new Map();
    let release;
    const go = new Promise((resolve) => {
      release = resolve;
    });
    for (const call of scenario.calls) {
      const promise = go.then(() => run(call));
      ended.set(call.id, promise.catch(() => {}));
      pending.set(call.id, promise);
    }
    release();
    await Promise.all(pending.values());

    // 4. Each outcome against its expectations, and the key every attempt carried.
    for (const call of scenario.calls) {
      const outcome = outcomes.get(call.id);
      if (outcome.result === "exception") {
        fail(call.id, "result", call.expect.result, "exception", outcome);
        continue;
      }
      for (const m of checkExpectations(call.expect, outcome, outcomes)) {
        fail(call.id, m.field, m.expected, m.got, outcome);
      }
      const expectedKey = keyOf(call);
      if (expectedKey !== undefined && outcome.key !== expectedKey) {
        fail(call.id, "key", expectedKey, outcome.key, outcome);
      }
      if (expectedKey === undefined && (typeof outcome.key !== "string" || outcome.key === "")) {
        fail(call.id, "key", "the key the client made", outcome.key, outcome);
      }
    }
    const keys = new Set(
      [...outcomes.values()].filter((o) => typeof o.key === "string").map((o) => quoted(o.key)),
    );
    for (const key of keys) {
      const calls = scenario.calls.filter((c) => quoted(outcomes.get(c.id).key ?? "") === key);
      const attempts = calls.reduce((sum, c) => sum + outcomes.get(c.id).attempts, 0);
      const carried = sent.filter((k) => k === key).length;
      if (carried !== attempts) {
        fail(
          calls.length === 1 ? calls[0].id : null,
          "key",
          `the key ${key} on all ${attempts} attempts of call(s) ${calls.map((c) => c.id).join(", ")}`,
          `${carried} requests carried it; every request carried ${show(sent)}`,
          Object.fromEntries(calls.map((c) => [c.id, outcomes.get(c.id)])),
        );
      }
    }
    const strays = sent.filter((k) => !keys.has(k));
    if (strays.length > 0) {
      fail(
        null,
        "key",
        "every attempt to carry its call's key",
        `attempts carried ${show(strays)}, no call's key`,
        Object.fromEntries(outcomes),
      );
    }

    // 5. The ledger.
    const ledger = await simulator(env, "GET", "/_sim/ledger");
    const all = Object.fromEntries([...outcomes].map(([id, o]) => [id, o]));
    for (const [order, count] of Object.entries(scenario.captures ?? {})) {
      const orderId = runBase + Number(order);
      const got = ledger.captures.filter((c) => c.order_id === orderId).length;
      captures[order] = got;
      if (got !== count) {
        fail(null, "captures", { [`order ${order} (order_id ${orderId})`]: count }, got, all);
      }
    }
    const paid = ledger.refunds ?? []; // absent from an older simulator's ledger
    // A refund of a two-step charge names its authorization.
    const held = [...ledger.captures, ...(ledger.authorizations ?? [])];
    for (const [order, count] of Object.entries(scenario.refunds ?? {})) {
      const orderId = runBase + Number(order);
      const references = new Set(held.filter((c) => c.order_id === orderId).map((c) => c.reference));
      const got = paid.filter((r) => references.has(r.capture_reference)).length;
      refunds[order] = got;
      if (got !== count) {
        fail(null, "refunds", { [`order ${order} (order_id ${orderId}), captures ${show([...references])}`]: count }, got, all);
      }
    }
    for (const list of LEDGER_LISTS) {
      const entries = ledger[list] ?? []; // absent from an older simulator's ledger
      for (const [order, count] of Object.entries(scenario[list] ?? {})) {
        const orderId = runBase + Number(order);
        const got = entries.filter((e) => e.order_id === orderId).length;
        (ledgerLists[list] ??= {})[order] = got;
        if (got !== count) {
          fail(null, list, { [`order ${order} (order_id ${orderId})`]: count }, got, all);
        }
      }
    }
  } catch (error) {
    fail(null, "run", "the scenario to run", String(error?.stack ?? error));
  } finally {
    // 6. A well-behaved acquirer again.
    try {
      await simulator(env, "PUT", "/_sim/faults", {});
    } catch (error) {
      fail(null, "faults reset", "PUT /_sim/faults {} to work", String(error));
    }
  }
  return { name, runBase, outcomes, captures, refunds, ledgerLists, failures };
}
