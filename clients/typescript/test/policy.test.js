// Unit tests of the pure decision logic (src/policy.ts): no network, no timers.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  DEFAULT_RETRY_POLICY,
  backoffCeilingMs,
  backoffDelayMs,
  capturesPath,
  classifyCaptureStatus,
  classifyRefundStatus,
  classifyStatus,
  classifyVoidStatus,
  decide,
  decideCapture,
  decideRefund,
  decideVoid,
  describeAttempt,
  encodeCaptureRequest,
  encodeChargeRequest,
  encodeRefundRequest,
  errorChain,
  gaveUpMessage,
  giveUpSummary,
  isPrintableAscii,
  isReplayed,
  parseCapture,
  parseCharge,
  parseProblem,
  parseRefund,
  parseVoid,
  parseRetryAfterMs,
  parseSeconds,
  planAttempt,
  planRetry,
  preferWaitSecs,
  quoteKey,
  refundsPath,
  resolvePolicy,
  voidPath,
} from "../dist/policy.js";

const DRAWS = 2000;
const draws = (policy, retry, retryAfterMs) =>
  Array.from({ length: DRAWS }, () => backoffDelayMs(policy, retry, retryAfterMs));
const policyOf = (baseDelayMs, maxDelayMs) => resolvePolicy({ baseDelayMs, maxDelayMs });

const CHARGE = {
  id: "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
  order_id: 123,
  amount_cents: 25000,
  currency: "BRL",
  status: "captured",
  acquirer_reference: "ref_1",
  decline_reason: null,
  created_at: "2026-12-02T07:00:00Z",
};
const problem = (kind, extra = {}) =>
  JSON.stringify({ type: `urn:idem:problem:${kind}`, title: kind, status: 0, detail: kind, ...extra });

describe("the policy", () => {
  test("defaults match the documented values", () => {
    assert.deepEqual(resolvePolicy(), {
      maxAttempts: 8,
      deadlineMs: 60000,
      attemptTimeoutMs: 10000,
      baseDelayMs: 100,
      maxDelayMs: 5000,
      preferWaitSecs: 5,
    });
    assert.deepEqual(resolvePolicy(), { ...DEFAULT_RETRY_POLICY });
    assert.ok(Object.isFrozen(DEFAULT_RETRY_POLICY));
  });

  test("overrides go over the defaults; undefined keeps the default", () => {
    const p = resolvePolicy({ maxAttempts: 3, deadlineMs: undefined, preferWaitSecs: 0 });
    assert.equal(p.maxAttempts, 3);
    assert.equal(p.deadlineMs, 60000);
    assert.equal(p.preferWaitSecs, 0);
    assert.equal(p.baseDelayMs, 100);
  });

  test("unknown fields and non-numbers are TypeErrors", () => {
    assert.throws(() => resolvePolicy({ maxAttemps: 3 }), TypeError);
    assert.throws(() => resolvePolicy({ max_attempts: 3 }), TypeError);
    assert.throws(() => resolvePolicy({ deadlineMs: "60000" }), TypeError);
    assert.throws(() => resolvePolicy({ baseDelayMs: Number.NaN }), TypeError);
    assert.throws(() => resolvePolicy(5), TypeError);
  });

  test("numbers out of range are RangeErrors", () => {
    for (const bad of [
      { maxAttempts: 0 },
      { maxAttempts: 1.5 },
      { maxAttempts: -1 },
      { deadlineMs: 0 },
      { deadlineMs: -5 },
      { deadlineMs: Number.POSITIVE_INFINITY },
      { deadlineMs: 2 ** 31 },
      { attemptTimeoutMs: 0 },
      { baseDelayMs: -1 },
      { maxDelayMs: Number.POSITIVE_INFINITY },
      { preferWaitSecs: -1 },
      { preferWaitSecs: 1.5 },
    ]) {
      assert.throws(() => resolvePolicy(bad), RangeError, JSON.stringify(bad));
    }
  });
});

describe("backoff", () => {
  test("full jitter stays within the window and spans it", () => {
    const p = policyOf(10, 100000);
    for (let retry = 0; retry < 8; retry++) {
      const ceiling = 10 * 2 ** retry;
      const ds = draws(p, retry, null);
      assert.ok(ds.every((d) => d >= 0 && d <= ceiling && Number.isInteger(d)), `retry ${retry} over ${ceiling}`);
      assert.ok(ds.some((d) => d < ceiling / 4), `retry ${retry}: nothing in the bottom quarter`);
      assert.ok(ds.some((d) => d > (ceiling * 3) / 4), `retry ${retry}: nothing in the top quarter`);
    }
  });

  test("the window's ends are reachable", () => {
    const p = policyOf(100, 5000);
    assert.equal(backoffDelayMs(p, 0, null, () => 0), 0);
    assert.equal(backoffDelayMs(p, 0, null, () => 0.9999999), 100);
    assert.equal(backoffDelayMs(p, 3, null, () => 0.9999999), 800);
  });

  test("the window doubles per retry", () => {
    const p = policyOf(10, 100000);
    assert.ok(draws(p, 5, null).some((d) => d > 10 * 16));
    assert.equal(backoffCeilingMs(p, 0), 10);
    assert.equal(backoffCeilingMs(p, 1), 20);
    assert.equal(backoffCeilingMs(p, 5), 320);
  });

  test("the cap bounds every draw, even for huge retry numbers", () => {
    const p = policyOf(100, 5000);
    for (const retry of [6, 10, 31, 32, 64, 1024, 2 ** 32]) {
      const ds = draws(p, retry, null);
      assert.ok(ds.every((d) => d <= 5000), `retry ${retry}`);
      assert.ok(ds.some((d) => d > 3750), `retry ${retry}: the capped window is not used in full`);
    }
  });

  test("a Retry-After above the window is the wait, exactly, even above the cap", () => {
    const p = policyOf(1, 50);
    assert.ok(draws(p, 3, 2000).every((d) => d === 2000));
  });

  test("a Retry-After inside the window only lifts the low draws", () => {
    const p = policyOf(100, 100);
    const ds = draws(p, 0, 50);
    assert.ok(ds.every((d) => d >= 50 && d <= 100));
    assert.ok(ds.includes(50));
    assert.ok(ds.some((d) => d > 75));
  });

  test("a zero base or cap means no wait unless the server asks for one", () => {
    assert.ok(draws(policyOf(0, 5000), 4, null).every((d) => d === 0));
    assert.ok(draws(policyOf(100, 0), 4, null).every((d) => d === 0));
    assert.equal(backoffDelayMs(policyOf(0, 5000), 4, 1000), 1000);
  });
});

describe("headers", () => {
  test("Retry-After and Idempotency-TTL are whole seconds only", () => {
    assert.equal(parseRetryAfterMs("0"), 0);
    assert.equal(parseRetryAfterMs(" 3 "), 3000);
    assert.equal(parseRetryAfterMs("99999999999999999999999"), 99999999999999999999999 * 1000);
    for (const bad of [null, undefined, "", " ", "-1", "1.5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "1e3"]) {
      assert.equal(parseRetryAfterMs(bad), null, String(bad));
      assert.equal(parseSeconds(bad), null, String(bad));
    }
    assert.equal(parseSeconds("86399"), 86399);
  });

  test("Idempotent-Replayed is true only when it says true", () => {
    assert.equal(isReplayed("true"), true);
    assert.equal(isReplayed(" TRUE "), true);
    for (const no of [null, undefined, "", "false", "1", "yes"]) {
      assert.equal(isReplayed(no), false, String(no));
    }
  });

  test("Prefer: wait is the configured wait, at most a second below the attempt's timeout, not below 1", () => {
    assert.equal(preferWaitSecs(5, 10000), 5);
    assert.equal(preferWaitSecs(5, 8000), 5);
    assert.equal(preferWaitSecs(5, 6000), 5);
    assert.equal(preferWaitSecs(5, 5999), 4);
    assert.equal(preferWaitSecs(10, 6500), 5);
    assert.equal(preferWaitSecs(5, 2999), 1);
    assert.equal(preferWaitSecs(5, 2000), 1);
    assert.equal(preferWaitSecs(5, 1999), null);
    assert.equal(preferWaitSecs(5, 1000), null);
    assert.equal(preferWaitSecs(0, 10000), null);
    assert.equal(preferWaitSecs(1, 10000), 1);
  });
});

describe("the key", () => {
  test("is sent as a quoted Structured Field string with escapes", () => {
    const uuid = "5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13";
    assert.equal(quoteKey(uuid), `"${uuid}"`);
    assert.equal(quoteKey('a"b\\c'), '"a\\"b\\\\c"');
    assert.equal(quoteKey("with space"), '"with space"');
    assert.equal(quoteKey("~!"), '"~!"');
  });

  test("with a character outside printable ASCII is refused (RangeError)", () => {
    for (const bad of ["a\nb", "tab\there", "chave-é", "del\x7f", "nul\0", "emoji-😀", "cr\r"]) {
      assert.throws(() => quoteKey(bad), RangeError, JSON.stringify(bad));
      assert.equal(isPrintableAscii(bad), false);
    }
  });

  test("that is not a string is a TypeError", () => {
    for (const bad of [undefined, null, 5, {}]) {
      assert.throws(() => quoteKey(bad), TypeError, String(bad));
    }
  });
});

describe("the body", () => {
  test("is the contract's fields in order, optional ones left out when absent", () => {
    assert.equal(
      encodeChargeRequest({ order_id: 1, amount_cents: 25000 }),
      '{"order_id":1,"amount_cents":25000}',
    );
    assert.equal(
      encodeChargeRequest({ description: 'a "b"', currency: "BRL", amount_cents: 5, order_id: 7 }),
      '{"order_id":7,"amount_cents":5,"currency":"BRL","description":"a \\"b\\""}',
    );
    assert.equal(
      encodeChargeRequest({ order_id: 7, amount_cents: 5, currency: null, description: undefined }),
      '{"order_id":7,"amount_cents":5}',
    );
  });

  test("takes bigints for ids above 2^53", () => {
    assert.equal(
      encodeChargeRequest({ order_id: 9223372036854775807n, amount_cents: 1n }),
      '{"order_id":9223372036854775807,"amount_cents":1}',
    );
  });

  test("refuses what it cannot send as meant", () => {
    assert.throws(() => encodeChargeRequest({ order_id: 2 ** 53, amount_cents: 1 }), RangeError);
    assert.throws(() => encodeChargeRequest({ order_id: 1.5, amount_cents: 1 }), RangeError);
    assert.throws(() => encodeChargeRequest({ order_id: Number.NaN, amount_cents: 1 }), RangeError);
    assert.throws(() => encodeChargeRequest({ order_id: "1", amount_cents: 1 }), TypeError);
    assert.throws(() => encodeChargeRequest({ amount_cents: 1 }), TypeError);
    assert.throws(() => encodeChargeRequest({ orderId: 1, order_id: 1, amount_cents: 1 }), TypeError);
    assert.throws(() => encodeChargeRequest({ order_id: 1, amount_cents: 1, currency: 986 }), TypeError);
    assert.throws(() => encodeChargeRequest(null), TypeError);
    assert.throws(() => encodeChargeRequest([1, 2]), TypeError);
  });
});

describe("what an answer means", () => {
  const AR = "urn:idem:problem:acquirer-rejected";
  test("every status", () => {
    const cases = [
      [201, null, "result"],
      [402, "urn:idem:problem:charge-declined", "result"],
      [502, AR, "result"],
      [502, null, "retry"],
      [502, "urn:idem:problem:internal", "retry"],
      [409, "urn:idem:problem:request-in-flight", "retry"],
      [429, null, "retry"],
      [503, "urn:idem:problem:outcome-unknown", "retry"],
      [503, null, "retry"],
      [504, "urn:idem:problem:timeout", "retry"],
      [422, "urn:idem:problem:idempotency-key-reused", "key-reused"],
      [422, null, "api-error"],
      [410, "urn:idem:problem:key-expired", "key-expired"],
      [410, null, "api-error"],
    ];
    for (const status of [0, 200, 202, 204, 301, 302, 303, 307, 308, 400, 401, 403, 404, 405, 408, 413, 415, 500, 501, 505]) {
      cases.push([status, null, "api-error"], [status, AR, "api-error"]);
    }
    for (const [status, type, kind] of cases) {
      assert.equal(classifyStatus(status, type), kind, `${status} ${type}`);
    }
  });

  test("a 201 is a result with its charge", () => {
    const d = decide({ status: 201, bodyText: JSON.stringify(CHARGE), retryAfter: null });
    assert.equal(d.kind, "result");
    assert.deepEqual(d.charge, CHARGE);
    assert.equal(d.problem, null);
  });

  test("a 402 and a 502 acquirer-rejected are results with the problem's charge", () => {
    const declined = { ...CHARGE, status: "declined", decline_reason: "insufficient_funds" };
    const d = decide({ status: 402, bodyText: problem("charge-declined", { charge: declined }), retryAfter: null });
    assert.equal(d.kind, "result");
    assert.deepEqual(d.charge, declined);
    assert.equal(d.problem.type, "urn:idem:problem:charge-declined");
    const failed = { ...CHARGE, status: "failed" };
    const f = decide({ status: 502, bodyText: problem("acquirer-rejected", { charge: failed }), retryAfter: "1" });
    assert.equal(f.kind, "result");
    assert.equal(f.charge.status, "failed");
  });

  test("a result status without a charge is an API error, not a result", () => {
    for (const [status, body] of [
      [201, "not json"],
      [201, "{}"],
      [402, problem("charge-declined")],
      [402, "Payment Required"],
      [502, problem("acquirer-rejected")],
    ]) {
      const d = decide({ status, bodyText: body, retryAfter: null });
      assert.equal(d.kind, "api-error", `${status} ${body}`);
      assert.match(d.reason, /holds no charge/);
    }
  });

  test("a retry carries the Retry-After", () => {
    const d = decide({ status: 503, bodyText: problem("outcome-unknown"), retryAfter: "2" });
    assert.deepEqual([d.kind, d.retryAfterMs], ["retry", 2000]);
    const g = decide({ status: 502, bodyText: "<html>Bad Gateway</html>", retryAfter: null });
    assert.deepEqual([g.kind, g.retryAfterMs, g.problem], ["retry", null, null]);
  });

  test("a reused key names its charge and the fields that differ", () => {
    const d = decide({
      status: 422,
      bodyText: problem("idempotency-key-reused", { differing_fields: ["amount_cents", "currency"], charge_id: CHARGE.id }),
      retryAfter: null,
    });
    assert.equal(d.kind, "key-reused");
    assert.equal(d.chargeId, CHARGE.id);
    assert.deepEqual(d.differingFields, ["amount_cents", "currency"]);
    const old = decide({ status: 422, bodyText: problem("idempotency-key-reused"), retryAfter: null });
    assert.equal(old.chargeId, null);
    assert.deepEqual(old.differingFields, []);
  });

  test("an expired key names its charge", () => {
    const d = decide({ status: 410, bodyText: problem("key-expired", { charge_id: CHARGE.id }), retryAfter: null });
    assert.deepEqual([d.kind, d.chargeId], ["key-expired", CHARGE.id]);
  });

  test("any other answer is an API error with its problem, if it has one", () => {
    const d = decide({ status: 400, bodyText: problem("invalid-body", { field: "amount_cents" }), retryAfter: null });
    assert.equal(d.kind, "api-error");
    assert.equal(d.problem.field, "amount_cents");
    const r = decide({ status: 302, bodyText: "", retryAfter: null });
    assert.deepEqual([r.kind, r.problem], ["api-error", null]);
  });

  test("problem and charge parsing are lenient about extra fields, strict about shape", () => {
    assert.equal(parseProblem("[]"), null);
    assert.equal(parseProblem('{"title":"x"}'), null);
    assert.equal(parseProblem('{"type":"t","new":1}').new, 1);
    assert.equal(parseCharge(null), null);
    assert.equal(parseCharge({ id: 1, status: "captured" }), null);
    assert.equal(parseCharge({ ...CHARGE, extra: true }).extra, true);
  });
});

describe("the deadline and the attempts", () => {
  const p = resolvePolicy({ maxAttempts: 3, deadlineMs: 10000, attemptTimeoutMs: 4000, baseDelayMs: 100, maxDelayMs: 1000 });

  test("an attempt gets the policy's timeout, shortened to what is left of the deadline", () => {
    assert.deepEqual(planAttempt(p, 0), { action: "send", timeoutMs: 4000, preferWaitSecs: 3 });
    assert.deepEqual(planAttempt(p, 7500), { action: "send", timeoutMs: 2500, preferWaitSecs: 1 });
    assert.deepEqual(planAttempt(p, 9200), { action: "send", timeoutMs: 800, preferWaitSecs: null });
    const spent = planAttempt(p, 10000);
    assert.equal(spent.action, "give-up");
    assert.match(spent.reason, /deadline \(10000 ms\) is spent/);
  });

  test("no attempt past maxAttempts", () => {
    const r = planRetry(p, 3, 100, null);
    assert.deepEqual(r, { action: "give-up", reason: "max attempts (3) reached" });
    assert.equal(planRetry(p, 2, 100, null).action, "wait");
  });

  test("no wait that reaches the deadline", () => {
    const r = planRetry(p, 1, 8500, 2000);
    assert.equal(r.action, "give-up");
    assert.match(r.reason, /next wait \(2000 ms\) would pass the deadline \(10000 ms\)/);
    assert.deepEqual(planRetry(p, 1, 7000, 2000), { action: "wait", delayMs: 2000 });
    const forever = planRetry(p, 1, 0, Number.POSITIVE_INFINITY);
    assert.equal(forever.action, "give-up");
  });

  test("the wait before retry n is drawn from retry n-1's window", () => {
    assert.deepEqual(planRetry(p, 1, 0, null, () => 0.9999999), { action: "wait", delayMs: 100 });
    assert.deepEqual(planRetry(p, 2, 0, null, () => 0.9999999), { action: "wait", delayMs: 200 });
  });
});

describe("words", () => {
  test("an error chain names every cause", () => {
    const inner = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" });
    const error = new TypeError("fetch failed", { cause: inner });
    assert.equal(errorChain(error), "fetch failed: connect ECONNREFUSED 127.0.0.1:1");
    const agg = Object.assign(new AggregateError([new Error("a"), new Error("b")], ""), { code: "ECONNREFUSED" });
    assert.equal(errorChain(new TypeError("fetch failed", { cause: agg })), "fetch failed: a; b");
    assert.equal(errorChain("plain"), "plain");
  });

  test("attempts in words", () => {
    assert.equal(describeAttempt({ outcome: "answer", status: 503, error: null }), "status 503");
    assert.equal(describeAttempt({ outcome: "timeout", status: null, error: "timed out after 10 ms" }), "timed out after 10 ms");
    assert.equal(
      describeAttempt({ outcome: "connection-failed", status: null, error: "fetch failed" }),
      "connection failed: fetch failed",
    );
  });

  test("a give-up says the last outcome, why it stopped, and to come back with the same key", () => {
    const attempts = [{ endpoint: "http://a", outcome: "answer", status: 503, error: null, startedMs: 0, elapsedMs: 1 }];
    const last = giveUpSummary(attempts, "max attempts (1) reached");
    assert.equal(last, "status 503 from http://a; max attempts (1) reached");
    assert.equal(giveUpSummary([], "the deadline (1 ms) is spent"), "the deadline (1 ms) is spent");
    const message = gaveUpMessage("k-1", 1, last);
    assert.match(message, /gave up on idempotency key "k-1" after 1 attempt: status 503/);
    assert.match(message, /outcome may be unknown/);
    assert.match(message, /same key/);
  });
});

describe("refunds", () => {
  const REFUND = {
    id: "re_7kLmQ2xZ9pR4tV8bN1cW6yHd",
    charge_id: CHARGE.id,
    amount_cents: 5000,
    currency: "BRL",
    status: "succeeded",
    reason: null,
    description: null,
    acquirer_reference: "ref_r1",
    failure_reason: null,
    created_at: "2026-12-06T20:00:00Z",
  };

  test("the body leaves out what is not given; {} refunds all that is left", () => {
    assert.equal(encodeRefundRequest({}), "{}");
    assert.equal(encodeRefundRequest({ amount_cents: null, reason: undefined }), "{}");
    assert.equal(encodeRefundRequest({ amount_cents: 5000n }), '{"amount_cents":5000}');
    assert.equal(
      encodeRefundRequest({ description: "olá", reason: "duplicate", amount_cents: 1 }),
      '{"amount_cents":1,"reason":"duplicate","description":"olá"}',
    );
    assert.throws(() => encodeRefundRequest({ amountCents: 1 }), TypeError);
    assert.throws(() => encodeRefundRequest({ amount_cents: 1.5 }), RangeError);
    assert.throws(() => encodeRefundRequest({ reason: 3 }), TypeError);
    assert.throws(() => encodeRefundRequest(null), TypeError);
  });

  test("the path names the charge and no other route", () => {
    assert.equal(refundsPath(CHARGE.id), `/v1/charges/${CHARGE.id}/refunds`);
    assert.equal(refundsPath("../x?y#z"), "/v1/charges/..%2Fx%3Fy%23z/refunds");
    assert.throws(() => refundsPath(""), TypeError);
    assert.throws(() => refundsPath(7), TypeError);
  });

  test("every status", () => {
    const t = (kind) => `urn:idem:problem:${kind}`;
    const cases = [
      [201, null, "result"],
      [422, t("refund-failed"), "refund-failed"],
      [422, t("refund-exceeds-captured"), "refund-exceeds"],
      [422, t("charge-not-refundable"), "not-refundable"],
      [422, t("idempotency-key-reused"), "key-reused"],
      [422, null, "api-error"],
      [410, t("key-expired"), "key-expired"],
      [409, t("request-in-flight"), "retry"],
      [429, null, "retry"],
      [503, t("outcome-unknown"), "retry"],
      [503, t("refund-under-review"), "retry"],
      [504, null, "retry"],
      [502, null, "retry"],
      [502, t("acquirer-rejected"), "retry"],
      [402, t("charge-declined"), "api-error"],
      [404, t("not-found"), "api-error"],
      [400, t("invalid-body"), "api-error"],
      [500, t("internal"), "api-error"],
      [307, null, "api-error"],
    ];
    for (const [status, type, kind] of cases) {
      assert.equal(classifyRefundStatus(status, type), kind, `${status} ${type}`);
    }
  });

  test("what each answer carries", () => {
    const ok = decideRefund({ status: 201, bodyText: JSON.stringify(REFUND), retryAfter: null });
    assert.deepEqual(ok, { kind: "result", refund: REFUND });
    const refused = { ...REFUND, status: "failed", failure_reason: "unknown_capture" };
    const failed = decideRefund({ status: 422, bodyText: problem("refund-failed", { refund: refused }), retryAfter: null });
    assert.deepEqual([failed.kind, failed.refund], ["refund-failed", refused]);
    const exceeds = decideRefund({ status: 422, bodyText: problem("refund-exceeds-captured", { remaining_cents: 0 }), retryAfter: null });
    assert.deepEqual([exceeds.kind, exceeds.remainingCents], ["refund-exceeds", 0]);
    const unsaid = decideRefund({ status: 422, bodyText: problem("refund-exceeds-captured"), retryAfter: null });
    assert.equal(unsaid.remainingCents, null);
    const reused = decideRefund({ status: 422, bodyText: problem("idempotency-key-reused", { refund_id: "re_1", differing_fields: ["charge_id"] }), retryAfter: null });
    assert.deepEqual([reused.kind, reused.refundId, reused.chargeId, reused.differingFields], ["key-reused", "re_1", null, ["charge_id"]]);
    const expired = decideRefund({ status: 410, bodyText: problem("key-expired", { refund_id: "re_1" }), retryAfter: null });
    assert.deepEqual([expired.kind, expired.refundId], ["key-expired", "re_1"]);
    const retry = decideRefund({ status: 503, bodyText: problem("outcome-unknown", { refund_id: "re_1" }), retryAfter: "1" });
    assert.deepEqual([retry.kind, retry.retryAfterMs], ["retry", 1000]);
  });

  test("an answer that should hold a refund and does not is an API error", () => {
    for (const [status, body] of [
      [201, "{}"],
      [201, JSON.stringify(CHARGE)],
      [422, problem("refund-failed")],
    ]) {
      const d = decideRefund({ status, bodyText: body, retryAfter: null });
      assert.equal(d.kind, "api-error", `${status} ${body}`);
      assert.match(d.reason, /holds no refund/);
    }
    assert.equal(parseRefund({ ...REFUND, amount_cents: "5000" }), null);
    assert.equal(parseRefund({ ...REFUND, extra: 1 }).extra, 1);
  });

  test("a charge's reused key names a refund when the key made one", () => {
    const d = decide({ status: 422, bodyText: problem("idempotency-key-reused", { refund_id: "re_1", differing_fields: ["operation"] }), retryAfter: null });
    assert.deepEqual([d.kind, d.refundId, d.chargeId], ["key-reused", "re_1", null]);
  });

  test("a refund's give-up speaks of a refund", () => {
    const message = gaveUpMessage("k-1", 2, "status 503 from http://a; max attempts (2) reached", "refund");
    assert.match(message, /the refund may have happened\): refund again with the same key/);
    assert.match(message, /without refunding twice/);
  });
});

describe("two-step payments", () => {
  const CAPTURE = {
    id: "cp_7kLmQ2xZ9pR4tV8bN1cW6yHd",
    charge_id: CHARGE.id,
    amount_cents: 10000,
    currency: "BRL",
    final: false,
    status: "succeeded",
    acquirer_reference: "ref_c1",
    failure_reason: null,
    created_at: "2026-12-07T03:00:00Z",
  };
  const { final: _final, ...rest } = CAPTURE;
  const VOID = { ...rest, id: "vd_7kLmQ2xZ9pR4tV8bN1cW6yHd", amount_cents: 15000 };
  const t = (kind) => `urn:idem:problem:${kind}`;

  test("an authorization is the charge's body with capture false; a charge's is unchanged", () => {
    const request = { order_id: 1, amount_cents: 2, currency: "BRL" };
    assert.equal(encodeChargeRequest(request, false), '{"order_id":1,"amount_cents":2,"currency":"BRL","capture":false}');
    assert.equal(encodeChargeRequest(request), '{"order_id":1,"amount_cents":2,"currency":"BRL"}');
    assert.throws(() => encodeChargeRequest({ ...request, capture: false }), TypeError);
  });

  test("a capture's body always says final; a void's path and body", () => {
    assert.equal(encodeCaptureRequest({}), '{"final":true}');
    assert.equal(encodeCaptureRequest({ amount_cents: 10000n, final: false }), '{"amount_cents":10000,"final":false}');
    assert.equal(encodeCaptureRequest({ amount_cents: null, final: null }), '{"final":true}');
    assert.throws(() => encodeCaptureRequest({ amountCents: 1 }), TypeError);
    assert.throws(() => encodeCaptureRequest({ final: "no" }), TypeError);
    assert.throws(() => encodeCaptureRequest({ amount_cents: 1.5 }), RangeError);
    assert.equal(capturesPath(CHARGE.id), `/v1/charges/${CHARGE.id}/captures`);
    assert.equal(voidPath("../x?y"), "/v1/charges/..%2Fx%3Fy/void");
    assert.throws(() => voidPath(""), TypeError);
  });

  test("every status: the 409s another step settles are retried, the refusals final", () => {
    const cases = [
      [201, null, "result", "result"],
      [409, t("request-in-flight"), "retry", "retry"],
      [409, t("authorization-closed"), "retry", "retry"],
      [409, t("capture-pending"), "retry", "retry"],
      [503, t("outcome-unknown"), "retry", "retry"],
      [503, t("step-under-review"), "retry", "retry"],
      [502, null, "retry", "retry"],
      [429, null, "retry", "retry"],
      [422, t("capture-failed"), "step-failed", "api-error"],
      [422, t("void-failed"), "api-error", "step-failed"],
      [422, t("capture-exceeds-authorization"), "capture-exceeds", "api-error"],
      [422, t("charge-not-authorized"), "not-authorized", "not-authorized"],
      [422, t("idempotency-key-reused"), "key-reused", "key-reused"],
      [410, t("key-expired"), "key-expired", "key-expired"],
      [402, t("charge-declined"), "api-error", "api-error"],
      [404, t("not-found"), "api-error", "api-error"],
    ];
    for (const [status, type, capture, voided] of cases) {
      assert.equal(classifyCaptureStatus(status, type), capture, `capture ${status} ${type}`);
      assert.equal(classifyVoidStatus(status, type), voided, `void ${status} ${type}`);
    }
  });

  test("what each answer carries", () => {
    const ok = decideCapture({ status: 201, bodyText: JSON.stringify(CAPTURE), retryAfter: null });
    assert.deepEqual(ok, { kind: "result", step: CAPTURE });
    assert.deepEqual(decideVoid({ status: 201, bodyText: JSON.stringify(VOID), retryAfter: null }), { kind: "result", step: VOID });
    const refused = { ...CAPTURE, status: "failed", failure_reason: "exceeds_authorization" };
    const failed = decideCapture({ status: 422, bodyText: problem("capture-failed", { capture: refused }), retryAfter: null });
    assert.deepEqual([failed.kind, failed.step], ["step-failed", refused]);
    const voidFailed = decideVoid({ status: 422, bodyText: problem("void-failed", { void: VOID }), retryAfter: null });
    assert.deepEqual([voidFailed.kind, voidFailed.step], ["step-failed", VOID]);
    const exceeds = decideCapture({ status: 422, bodyText: problem("capture-exceeds-authorization", { remaining_cents: 15000 }), retryAfter: null });
    assert.deepEqual([exceeds.kind, exceeds.remainingCents], ["capture-exceeds", 15000]);
    const closed = decideCapture({ status: 409, bodyText: problem("authorization-closed"), retryAfter: null });
    assert.deepEqual([closed.kind, closed.retryAfterMs], ["retry", null]);
    const pending = decideVoid({ status: 409, bodyText: problem("capture-pending"), retryAfter: "1" });
    assert.deepEqual([pending.kind, pending.retryAfterMs], ["retry", 1000]);
    for (const [decideStep, status, body] of [
      [decideCapture, 201, JSON.stringify(VOID)],
      [decideVoid, 201, JSON.stringify(CHARGE)],
      [decideCapture, 422, problem("capture-failed")],
      [decideVoid, 422, problem("void-failed")],
    ]) {
      const d = decideStep({ status, bodyText: body, retryAfter: null });
      assert.equal(d.kind, "api-error", `${status} ${body}`);
      assert.match(d.reason, /holds no (capture|void)/);
    }
    assert.equal(parseCapture({ ...CAPTURE, final: undefined }), null);
    assert.equal(parseVoid({ ...VOID, amount_cents: "1" }), null);
  });

  test("a step's give-up speaks of it", () => {
    assert.match(gaveUpMessage("k", 2, "status 409 from http://a", "capture"), /the capture may have happened\): capture again .* without capturing twice/);
    assert.match(gaveUpMessage("k", 2, "status 409 from http://a", "void"), /void again with the same key to learn it without voiding twice/);
    assert.match(gaveUpMessage("k", 1, "timed out", "authorize"), /the authorization may have happened\): authorize again/);
  });
});
