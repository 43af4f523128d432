// The attempt loop against small local HTTP servers (and a refused port):
// headers, the same bytes on every attempt, endpoint rotation, results,
// typed errors, timeouts that cover the body, cut-off bodies, the deadline,
// the caller's AbortSignal, and refunds and the two-step payment's authorize,
// capture and void through the same loop.
import assert from "node:assert/strict";
import http from "node:http";
import { after, describe, test } from "node:test";

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
  newKey,
} from "../dist/index.js";

const CHARGE = {
  id: "ch_4f9QzXk2LmP8rT1vWb6yNc3d",
  order_id: 42,
  amount_cents: 25000,
  currency: "BRL",
  status: "captured",
  acquirer_reference: "ref_1",
  decline_reason: null,
  created_at: "2026-12-02T07:00:00Z",
};
const REQUEST = { order_id: 42, amount_cents: 25000, currency: "BRL" };
const REFUND = {
  id: "re_7kLmQ2xZ9pR4tV8bN1cW6yHd",
  charge_id: CHARGE.id,
  amount_cents: 5000,
  currency: "BRL",
  status: "succeeded",
  reason: "requested_by_customer",
  description: null,
  acquirer_reference: "ref_r1",
  failure_reason: null,
  created_at: "2026-12-06T20:00:00Z",
};
const REFUNDS_URL = `/v1/charges/${CHARGE.id}/refunds`;
const FAST = { baseDelayMs: 1, maxDelayMs: 5, attemptTimeoutMs: 2000, deadlineMs: 10000 };

const servers = [];
after(() => Promise.all(servers.map((s) => s.close())));

/**
 * A server whose `handler(request, response, n)` answers the n-th request
 * (from 0); every request's method, url, headers and body are in `requests`.
 */
async function serve(handler) {
  const requests = [];
  const sockets = new Set();
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const n = requests.length;
      requests.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks) });
      handler(req, res, n);
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const entry = {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
  servers.push(entry);
  return entry;
}

/** A port nobody listens on. */
async function refusedUrl() {
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

function json(res, status, body, headers = {}) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(text);
}

function problem(res, status, kind, extra = {}, headers = {}) {
  res.writeHead(status, { "content-type": "application/problem+json", ...headers });
  res.end(JSON.stringify({ type: `urn:idem:problem:${kind}`, title: kind, status, detail: `a ${kind}`, ...extra }));
}

function client(baseUrl, retry = FAST, extra = {}) {
  return new IdemClient({ baseUrl, secret: "sk_test_1", retry, ...extra });
}

async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected a rejection");
}

describe("what every attempt sends", () => {
  test("the headers, the key quoted, Prefer: wait, and the same bytes every time", async () => {
    const s = await serve((req, res, n) =>
      n < 2 ? problem(res, 503, "outcome-unknown", {}, { "retry-after": "0" }) : json(res, 201, CHARGE, { "idempotency-ttl": "86399" }),
    );
    const c = client(s.url, { ...FAST, attemptTimeoutMs: 10000, preferWaitSecs: 5 });
    const result = await c.charge({ ...REQUEST, description: "olá \"mundo\"" }, { idempotencyKey: 'k"1\\' });
    assert.equal(s.requests.length, 3);
    const first = s.requests[0];
    for (const r of s.requests) {
      assert.equal(r.method, "POST");
      assert.equal(r.url, "/v1/charges");
      assert.equal(r.headers.authorization, "Bearer sk_test_1");
      assert.equal(r.headers["content-type"], "application/json");
      assert.equal(r.headers["idempotency-key"], '"k\\"1\\\\"');
      assert.equal(r.headers.prefer, "wait=5");
      assert.ok(r.body.equals(first.body), "the same bytes on every attempt");
    }
    assert.deepEqual(JSON.parse(first.body.toString("utf8")), { ...REQUEST, description: 'olá "mundo"' });
    assert.equal(result.key, 'k"1\\');
    assert.equal(result.idempotencyTtl, 86399);
    assert.deepEqual(
      result.attempts.map((a) => [a.outcome, a.status, a.error]),
      [["answer", 503, null], ["answer", 503, null], ["answer", 201, null]],
    );
  });

  test("Prefer: wait is left out when the attempt timeout leaves less than a second", async () => {
    const s = await serve((req, res) => json(res, 201, CHARGE));
    await client(s.url, { ...FAST, attemptTimeoutMs: 1500 }).charge(REQUEST);
    assert.equal(s.requests[0].headers.prefer, undefined);
    await client(s.url, { ...FAST, attemptTimeoutMs: 3000, preferWaitSecs: 9 }).charge(REQUEST);
    assert.equal(s.requests[1].headers.prefer, "wait=2");
  });

  test("a key is made when none is given, and carried on every attempt and the result", async () => {
    const s = await serve((req, res, n) => (n === 0 ? problem(res, 409, "request-in-flight", {}, { "retry-after": "0" }) : json(res, 201, CHARGE)));
    const result = await client(s.url).charge(REQUEST);
    assert.match(result.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.deepEqual(
      s.requests.map((r) => r.headers["idempotency-key"]),
      [`"${result.key}"`, `"${result.key}"`],
    );
    assert.notEqual(newKey(), newKey());
  });

  test("attempt i goes to base URL i mod n, with or without a trailing slash or a path", async () => {
    const a = await serve((req, res) => problem(res, 503, "service-unavailable", {}, { "retry-after": "0" }));
    const b = await serve((req, res) => problem(res, 504, "timeout"));
    const error = await rejection(
      client([a.url, `${b.url}/base/`], { ...FAST, maxAttempts: 5 }).charge(REQUEST),
    );
    assert.ok(error instanceof GaveUpError);
    assert.deepEqual(
      error.attempts.map((x) => x.endpoint),
      [a.url, `${b.url}/base/`, a.url, `${b.url}/base/`, a.url],
    );
    assert.equal(a.requests.length, 3);
    assert.deepEqual(b.requests.map((r) => r.url), ["/base/v1/charges", "/base/v1/charges"]);
  });
});

describe("results", () => {
  test("201: the charge, replayed, the TTL, the exact bytes", async () => {
    const text = ` ${JSON.stringify(CHARGE)}\n`;
    const s = await serve((req, res) => json(res, 201, text, { "idempotent-replayed": "true", "idempotency-ttl": "7" }));
    const result = await client(s.url).charge(REQUEST);
    assert.equal(result.status, 201);
    assert.deepEqual(result.charge, CHARGE);
    assert.equal(result.problem, null);
    assert.equal(result.replayed, true);
    assert.equal(result.idempotencyTtl, 7);
    assert.ok(result.body instanceof Uint8Array);
    assert.equal(Buffer.from(result.body).toString("utf8"), text);
    assert.equal(result.attempts.length, 1);
    assert.equal(result.attempts[0].endpoint, s.url);
    assert.ok(result.attempts[0].elapsedMs >= 0);
  });

  test("402 declined and 502 acquirer-rejected are results; no TTL header is null", async () => {
    const declined = { ...CHARGE, status: "declined", decline_reason: "insufficient_funds" };
    const failed = { ...CHARGE, status: "failed" };
    const s = await serve((req, res, n) =>
      n === 0 ? problem(res, 402, "charge-declined", { charge: declined }) : problem(res, 502, "acquirer-rejected", { charge: failed }),
    );
    const d = await client(s.url).charge(REQUEST);
    assert.deepEqual([d.status, d.charge.status, d.replayed, d.idempotencyTtl], [402, "declined", false, null]);
    assert.equal(d.problem.type, "urn:idem:problem:charge-declined");
    const f = await client(s.url).charge(REQUEST);
    assert.deepEqual([f.status, f.charge.status, f.attempts.length], [502, "failed", 1]);
  });

  test("a gateway's 502, 429, 409, 503 and 504 are retried", async () => {
    const s = await serve((req, res, n) => {
      if (n === 0) return json(res, 502, "<html>bad gateway</html>");
      if (n === 1) return json(res, 429, "slow down");
      if (n === 2) return problem(res, 409, "request-in-flight");
      if (n === 3) return problem(res, 503, "overloaded");
      if (n === 4) return problem(res, 504, "timeout");
      return json(res, 201, CHARGE);
    });
    const result = await client(s.url).charge(REQUEST);
    assert.deepEqual(result.attempts.map((a) => a.status), [502, 429, 409, 503, 504, 201]);
  });

  test("Retry-After is a floor under the backoff", async () => {
    const s = await serve((req, res, n) => (n === 0 ? json(res, 429, "{}", { "retry-after": "1" }) : json(res, 201, CHARGE)));
    const result = await client(s.url).charge(REQUEST);
    const [first, second] = result.attempts;
    assert.ok(second.startedMs - (first.startedMs + first.elapsedMs) >= 990, JSON.stringify(result.attempts));
  });
});

describe("typed errors", () => {
  test("422 idempotency-key-reused: KeyReusedError with the charge and the differing fields, not retried", async () => {
    const s = await serve((req, res) =>
      problem(res, 422, "idempotency-key-reused", { differing_fields: ["amount_cents"], charge_id: CHARGE.id }),
    );
    const error = await rejection(client(s.url).charge(REQUEST, { idempotencyKey: "k-1" }));
    assert.ok(error instanceof KeyReusedError && error instanceof IdemError);
    assert.equal(error.name, "KeyReusedError");
    assert.equal(error.key, "k-1");
    assert.equal(error.chargeId, CHARGE.id);
    assert.deepEqual(error.differingFields, ["amount_cents"]);
    assert.equal(error.problem.type, "urn:idem:problem:idempotency-key-reused");
    assert.equal(error.attempts.length, 1);
    assert.match(error.message, /amount_cents/);
    assert.equal(s.requests.length, 1);
  });

  test("410 key-expired: KeyExpiredError with the charge", async () => {
    const s = await serve((req, res) => problem(res, 410, "key-expired", { charge_id: CHARGE.id }));
    const error = await rejection(client(s.url).charge(REQUEST, { idempotencyKey: "k-2" }));
    assert.ok(error instanceof KeyExpiredError);
    assert.deepEqual([error.key, error.chargeId, error.attempts.length], ["k-2", CHARGE.id, 1]);
  });

  test("400, 401, 413, 415, 500 and a 3xx are API errors, never retried, never followed", async () => {
    for (const [status, kind] of [
      [400, "invalid-body"],
      [401, "unauthorized"],
      [404, "not-found"],
      [413, "body-too-large"],
      [415, "unsupported-media-type"],
      [500, "internal"],
      [422, "something-else"],
      [410, "gone"],
    ]) {
      const s = await serve((req, res) => problem(res, status, kind, { field: "amount_cents" }));
      const error = await rejection(client(s.url).charge(REQUEST, { idempotencyKey: "k-3" }));
      assert.ok(error instanceof ApiError, `${status}`);
      assert.equal(error.status, status);
      assert.equal(error.problem.type, `urn:idem:problem:${kind}`);
      assert.equal(error.key, "k-3");
      assert.match(error.body, new RegExp(kind));
      assert.match(error.message, new RegExp(`${status} urn:idem:problem:${kind}`));
      assert.equal(s.requests.length, 1);
    }
    const target = await serve((req, res) => json(res, 201, CHARGE));
    for (const status of [301, 302, 303, 307, 308]) {
      const s = await serve((req, res) => {
        res.writeHead(status, { location: `${target.url}/v1/charges` });
        res.end();
      });
      const error = await rejection(client(s.url).charge(REQUEST));
      assert.ok(error instanceof ApiError, `${status}`);
      assert.deepEqual([error.status, error.problem, error.body], [status, null, ""]);
    }
    assert.equal(target.requests.length, 0, "no redirect was followed");
  });

  test("a 201 without a charge is an API error", async () => {
    const s = await serve((req, res) => json(res, 201, "created"));
    const error = await rejection(client(s.url).charge(REQUEST));
    assert.ok(error instanceof ApiError);
    assert.match(error.message, /holds no charge/);
  });
});

describe("lost answers and the deadline", () => {
  test("a refused connection is retried and recorded", async () => {
    const refused = await refusedUrl();
    const s = await serve((req, res) => json(res, 201, CHARGE));
    const result = await client([refused, s.url]).charge(REQUEST);
    assert.deepEqual(result.attempts.map((a) => a.outcome), ["connection-failed", "answer"]);
    assert.match(result.attempts[0].error, /ECONNREFUSED/);
  });

  test("a connection closed without an answer, and a body cut off half way, are retried", async () => {
    const s = await serve((req, res, n) => {
      if (n === 0) return req.socket.destroy();
      if (n === 1) {
        res.writeHead(201, { "content-type": "application/json", "content-length": "500" });
        res.write(JSON.stringify(CHARGE).slice(0, 40));
        setTimeout(() => req.socket.destroy(), 20);
        return undefined;
      }
      return json(res, 201, CHARGE);
    });
    const result = await client(s.url).charge(REQUEST);
    assert.deepEqual(result.attempts.map((a) => a.outcome), ["connection-failed", "connection-failed", "answer"]);
    assert.equal(s.requests.length, 3);
  });

  test("the attempt timeout covers the whole body", async () => {
    const s = await serve((req, res, n) => {
      if (n === 0) {
        res.writeHead(201, { "content-type": "application/json" });
        res.write("{");
        return undefined; // never finished
      }
      return json(res, 201, CHARGE);
    });
    const result = await client(s.url, { ...FAST, attemptTimeoutMs: 300 }).charge(REQUEST);
    assert.deepEqual(result.attempts.map((a) => a.outcome), ["timeout", "answer"]);
    assert.match(result.attempts[0].error, /timed out after 300 ms/);
    assert.ok(result.attempts[0].elapsedMs >= 290 && result.attempts[0].elapsedMs < 1000);
  });

  test("max attempts reached: GaveUpError with the key, every attempt and the last outcome", async () => {
    const s = await serve((req, res) => problem(res, 503, "outcome-unknown"));
    const error = await rejection(client(s.url, { ...FAST, maxAttempts: 3 }).charge(REQUEST, { idempotencyKey: "k-4" }));
    assert.ok(error instanceof GaveUpError && error instanceof IdemError);
    assert.equal(error.key, "k-4");
    assert.equal(error.attempts.length, 3);
    assert.equal(error.last, `status 503 from ${s.url}; max attempts (3) reached`);
    assert.match(error.message, /gave up on idempotency key "k-4" after 3 attempts/);
    assert.match(error.message, /may be unknown/);
  });

  test("no attempt runs past the deadline: the last one's timeout is shortened", async () => {
    const s = await serve(() => {}); // never answers
    const started = performance.now();
    const error = await rejection(
      client(s.url, { maxAttempts: 8, deadlineMs: 700, attemptTimeoutMs: 500, baseDelayMs: 1, maxDelayMs: 1 }).charge(REQUEST),
    );
    const took = performance.now() - started;
    assert.ok(error instanceof GaveUpError);
    assert.ok(took >= 690 && took < 2500, `took ${took} ms`);
    assert.equal(error.attempts[0].outcome, "timeout");
    assert.ok(error.attempts.length >= 2);
    const lastAttempt = error.attempts[error.attempts.length - 1];
    assert.ok(lastAttempt.elapsedMs < 500, "the last attempt's timeout was shortened");
    assert.match(error.last, /deadline \(700 ms\)/);
  });

  test("no wait runs past the deadline: a Retry-After beyond it ends the call at once", async () => {
    const s = await serve((req, res) => problem(res, 503, "outcome-unknown", {}, { "retry-after": "30" }));
    const started = performance.now();
    const error = await rejection(client(s.url, { ...FAST, deadlineMs: 5000 }).charge(REQUEST));
    assert.ok(performance.now() - started < 2000);
    assert.match(error.last, /status 503 from .*; the next wait \(30000 ms\) would pass the deadline \(5000 ms\)/);
    assert.equal(error.attempts.length, 1);
  });
});

describe("the caller's signal", () => {
  test("an abort mid-attempt stops the call at once with the reason", async () => {
    const s = await serve(() => {});
    const controller = new AbortController();
    const reason = new Error("the shopper left");
    setTimeout(() => controller.abort(reason), 100);
    const started = performance.now();
    const error = await rejection(client(s.url).charge(REQUEST, { signal: controller.signal }));
    assert.equal(error, reason);
    assert.ok(performance.now() - started < 2000);
  });

  test("an abort in a wait stops the call at once with the reason", async () => {
    const s = await serve((req, res) => problem(res, 503, "overloaded", {}, { "retry-after": "5" }));
    const controller = new AbortController();
    setTimeout(() => controller.abort("stop"), 200);
    const started = performance.now();
    const error = await rejection(client(s.url).charge(REQUEST, { signal: controller.signal }));
    assert.equal(error, "stop");
    assert.ok(performance.now() - started < 2000);
    assert.equal(s.requests.length, 1);
  });

  test("an aborted signal makes no attempt", async () => {
    const s = await serve((req, res) => json(res, 201, CHARGE));
    const error = await rejection(client(s.url).charge(REQUEST, { signal: AbortSignal.abort("before") }));
    assert.equal(error, "before");
    assert.equal(s.requests.length, 0);
  });
});

describe("refused before any attempt", () => {
  test("bad configuration", () => {
    const ok = { baseUrl: "http://127.0.0.1:1", secret: "sk_1" };
    for (const bad of [
      undefined,
      { ...ok, baseUrl: [] },
      { ...ok, baseUrl: "not a url" },
      { ...ok, baseUrl: "ftp://h" },
      { ...ok, baseUrl: "http://h:1/?q=1" },
      { ...ok, baseUrl: "http://h:1/#f" },
      { ...ok, baseUrl: "http://u:p@h:1" },
      { ...ok, baseUrl: [ok.baseUrl, 5] },
      { ...ok, secret: "" },
      { ...ok, secret: "sk 1" },
      { ...ok, secret: "sk\n1" },
      { ...ok, secret: undefined },
      { ...ok, retry: { maxAttemps: 2 } },
      { ...ok, fetch: "no" },
    ]) {
      assert.throws(() => new IdemClient(bad), TypeError, JSON.stringify(bad));
    }
    assert.throws(() => new IdemClient({ ...ok, retry: { maxAttempts: 0 } }), RangeError);
    assert.throws(() => new IdemClient({ ...ok, retry: { deadlineMs: -1 } }), RangeError);
    const c = new IdemClient({ ...ok, retry: { maxAttempts: 2 } });
    assert.equal(c.policy.maxAttempts, 2);
    assert.equal(c.policy.deadlineMs, 60000);
  });

  test("a key outside printable ASCII, or a bad request, makes no attempt", async () => {
    const s = await serve((req, res) => json(res, 201, CHARGE));
    const c = client(s.url);
    await assert.rejects(c.charge(REQUEST, { idempotencyKey: "chave-é" }), RangeError);
    await assert.rejects(c.charge(REQUEST, { idempotencyKey: "a\nb" }), RangeError);
    await assert.rejects(c.charge(REQUEST, { idempotencyKey: 5 }), TypeError);
    await assert.rejects(c.charge({ order_id: 2 ** 60, amount_cents: 1 }), RangeError);
    await assert.rejects(c.charge({ order_id: 1, amount_cents: 1, metadata: {} }), TypeError);
    await assert.rejects(c.charge(REQUEST, { signal: {} }), TypeError);
    await assert.rejects(c.charge(REQUEST, null), TypeError);
    assert.equal(s.requests.length, 0);
  });

  test("a custom fetch is used, called without a receiver", async () => {
    const seen = [];
    const fake = function (url, init) {
      seen.push([this, url, init.redirect, init.method]);
      return Promise.resolve(new Response(JSON.stringify(CHARGE), { status: 201 }));
    };
    const result = await new IdemClient({ baseUrl: "http://idem.test", secret: "sk_1", fetch: fake }).charge(REQUEST);
    assert.equal(result.charge.id, CHARGE.id);
    assert.deepEqual(seen, [[undefined, "http://idem.test/v1/charges", "manual", "POST"]]);
  });
});

describe("refunds", () => {
  test("a 503 is retried with the same key and the same bytes, to the charge's refunds", async () => {
    const s = await serve((req, res, n) =>
      n === 0
        ? problem(res, 503, "outcome-unknown", { refund_id: REFUND.id }, { "retry-after": "0" })
        : json(res, 201, REFUND, { "idempotency-ttl": "86399", location: `/v1/refunds/${REFUND.id}` }),
    );
    const result = await client(s.url).refund(CHARGE.id, {
      amountCents: 5000,
      reason: "requested_by_customer",
      description: "two coffees",
      idempotencyKey: 'r"1',
    });
    assert.deepEqual([result.status, result.replayed, result.idempotencyTtl, result.key], [201, false, 86399, 'r"1']);
    assert.deepEqual(result.refund, REFUND);
    assert.deepEqual(result.attempts.map((a) => a.status), [503, 201]);
    assert.equal(s.requests.length, 2);
    for (const r of s.requests) {
      assert.equal(r.method, "POST");
      assert.equal(r.url, REFUNDS_URL);
      assert.equal(r.headers["idempotency-key"], '"r\\"1"');
      assert.equal(r.headers["content-type"], "application/json");
      assert.equal(r.headers.authorization, "Bearer sk_test_1");
      assert.equal(
        r.body.toString("utf8"),
        '{"amount_cents":5000,"reason":"requested_by_customer","description":"two coffees"}',
      );
    }
  });

  test("422 refund-exceeds-captured: RefundExceedsCapturedError with what is left, never retried", async () => {
    const s = await serve((req, res, n) =>
      n === 0 ? problem(res, 422, "refund-exceeds-captured", { remaining_cents: 20000 }) : json(res, 201, REFUND),
    );
    const error = await rejection(client(s.url).refund(CHARGE.id, { amountCents: 30000, idempotencyKey: "r-2" }));
    assert.ok(error instanceof RefundExceedsCapturedError && error instanceof IdemError);
    assert.equal(error.name, "RefundExceedsCapturedError");
    assert.deepEqual([error.key, error.chargeId, error.remainingCents, error.attempts.length], ["r-2", CHARGE.id, 20000, 1]);
    assert.equal(s.requests.length, 1, "a refund above what is left was sent again");
  });

  test("a lost answer is retried and the stored refund replayed; no amount sends {}", async () => {
    const s = await serve((req, res, n) => {
      if (n === 0) {
        res.writeHead(201, { "content-type": "application/json", "content-length": "500" });
        res.write(JSON.stringify(REFUND).slice(0, 40));
        setTimeout(() => req.socket.destroy(), 20);
        return undefined;
      }
      return json(res, 201, REFUND, { "idempotent-replayed": "true", "idempotency-ttl": "86398" });
    });
    const result = await client(s.url).refund(CHARGE.id);
    assert.deepEqual([result.replayed, result.idempotencyTtl], [true, 86398]);
    assert.deepEqual(result.attempts.map((a) => a.outcome), ["connection-failed", "answer"]);
    assert.deepEqual(s.requests.map((r) => r.body.toString("utf8")), ["{}", "{}"]);
    assert.deepEqual(
      s.requests.map((r) => r.headers["idempotency-key"]),
      [`"${result.key}"`, `"${result.key}"`],
    );
  });

  test("its typed errors: refund-failed, not refundable, a reused or expired key, no such charge", async () => {
    const refused = { ...REFUND, status: "failed", failure_reason: "exceeds_capture" };
    const s = await serve((req, res, n) => {
      if (n === 0) return problem(res, 422, "refund-failed", { refund: refused }, { "idempotency-ttl": "5", "idempotent-replayed": "true" });
      if (n === 1) return problem(res, 422, "charge-not-refundable");
      if (n === 2) return problem(res, 422, "idempotency-key-reused", { differing_fields: ["operation"], charge_id: "ch_1" });
      if (n === 3) return problem(res, 410, "key-expired", { refund_id: "re_2" });
      return problem(res, 404, "not-found");
    });
    const c = client(s.url);
    const failed = await rejection(c.refund(CHARGE.id, { idempotencyKey: "k" }));
    assert.ok(failed instanceof RefundFailedError);
    assert.deepEqual(failed.refund, refused);
    assert.deepEqual([failed.replayed, failed.idempotencyTtl, failed.attempts.length], [true, 5, 1]);
    assert.match(failed.message, /exceeds_capture/);
    const notRefundable = await rejection(c.refund(CHARGE.id, { idempotencyKey: "k" }));
    assert.ok(notRefundable instanceof ChargeNotRefundableError);
    assert.equal(notRefundable.chargeId, CHARGE.id);
    const reused = await rejection(c.refund(CHARGE.id, { idempotencyKey: "k" }));
    assert.ok(reused instanceof KeyReusedError);
    assert.deepEqual([reused.chargeId, reused.refundId, reused.differingFields], ["ch_1", null, ["operation"]]);
    const expired = await rejection(c.refund(CHARGE.id, { idempotencyKey: "k" }));
    assert.ok(expired instanceof KeyExpiredError);
    assert.deepEqual([expired.refundId, expired.chargeId], ["re_2", null]);
    const missing = await rejection(c.refund("ch_nope/../x", { idempotencyKey: "k" }));
    assert.ok(missing instanceof ApiError);
    assert.equal(missing.status, 404);
    assert.equal(s.requests.length, 5);
    assert.equal(s.requests[4].url, "/v1/charges/ch_nope%2F..%2Fx/refunds");
  });

  test("a give-up says the refund may have happened", async () => {
    const s = await serve((req, res) => problem(res, 503, "outcome-unknown", { refund_id: REFUND.id }));
    const error = await rejection(client(s.url, { ...FAST, maxAttempts: 2 }).refund(CHARGE.id, { idempotencyKey: "r-3" }));
    assert.ok(error instanceof GaveUpError);
    assert.deepEqual([error.key, error.attempts.length], ["r-3", 2]);
    assert.match(error.message, /the refund may have happened/);
  });

  test("an unknown option, a bad charge id, key or amount makes no attempt", async () => {
    const s = await serve((req, res) => json(res, 201, REFUND));
    const c = client(s.url);
    await assert.rejects(c.refund(CHARGE.id, { amount_cents: 5000 }), TypeError);
    await assert.rejects(c.refund("", {}), TypeError);
    await assert.rejects(c.refund(undefined, {}), TypeError);
    await assert.rejects(c.refund(CHARGE.id, { idempotencyKey: "chave-é" }), RangeError);
    await assert.rejects(c.refund(CHARGE.id, { amountCents: 2 ** 60 }), RangeError);
    await assert.rejects(c.refund(CHARGE.id, { amountCents: "5000" }), TypeError);
    await assert.rejects(c.refund(CHARGE.id, { signal: {} }), TypeError);
    await assert.rejects(c.refund(CHARGE.id, null), TypeError);
    assert.equal(s.requests.length, 0);
  });
});

describe("two-step payments", () => {
  const AUTHORIZED = { ...CHARGE, status: "authorized", amount_captured_cents: 0, amount_capturable_cents: 25000 };
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

  test("authorize, capture and void: each one key on every attempt, its own path and bytes", async () => {
    const s = await serve((req, res, n) => {
      if (n === 0) return problem(res, 503, "outcome-unknown", {}, { "retry-after": "0" });
      if (n === 1) return json(res, 201, AUTHORIZED, { "idempotency-ttl": "86399" });
      if (n === 2) return problem(res, 409, "request-in-flight", {}, { "retry-after": "0" });
      if (n === 3) return json(res, 201, CAPTURE, { "idempotent-replayed": "true" });
      if (n === 4) return problem(res, 409, "capture-pending");
      if (n === 5) return problem(res, 409, "authorization-closed");
      return json(res, 201, VOID, { "idempotency-ttl": "7" });
    });
    const c = client(s.url);
    const held = await c.authorize(REQUEST, { idempotencyKey: "a-1" });
    assert.deepEqual([held.charge.status, held.charge.amount_capturable_cents, held.key], ["authorized", 25000, "a-1"]);
    const captured = await c.capture(CHARGE.id, { amountCents: 10000, final: false });
    assert.deepEqual(captured.capture, CAPTURE);
    assert.deepEqual([captured.replayed, captured.attempts.length], [true, 2]);
    const voided = await c.void(CHARGE.id, { idempotencyKey: "v-1" });
    assert.deepEqual([voided.void, voided.idempotencyTtl], [VOID, 7]);
    assert.deepEqual(voided.attempts.map((a) => a.status), [409, 409, 201]);
    const sent = s.requests.map((r) => [r.url, r.headers["idempotency-key"], r.body.toString("utf8")]);
    const authorization = '{"order_id":42,"amount_cents":25000,"currency":"BRL","capture":false}';
    const part = '{"amount_cents":10000,"final":false}';
    assert.deepEqual(sent, [
      ["/v1/charges", '"a-1"', authorization],
      ["/v1/charges", '"a-1"', authorization],
      [`/v1/charges/${CHARGE.id}/captures`, `"${captured.key}"`, part],
      [`/v1/charges/${CHARGE.id}/captures`, `"${captured.key}"`, part],
      [`/v1/charges/${CHARGE.id}/void`, '"v-1"', "{}"],
      [`/v1/charges/${CHARGE.id}/void`, '"v-1"', "{}"],
      [`/v1/charges/${CHARGE.id}/void`, '"v-1"', "{}"],
    ]);
  });

  test("a conflict that never settles gives up with the key, in the step's words", async () => {
    const s = await serve((req, res) => problem(res, 409, "authorization-closed"));
    const error = await rejection(client(s.url, { ...FAST, maxAttempts: 3 }).capture(CHARGE.id, { idempotencyKey: "c-9" }));
    assert.ok(error instanceof GaveUpError);
    assert.deepEqual([error.key, error.attempts.length], ["c-9", 3]);
    assert.match(error.message, /the capture may have happened\): capture again with the same key/);
    assert.equal(s.requests[0].body.toString("utf8"), '{"final":true}');
  });

  test("its typed errors, none retried", async () => {
    const failedCapture = { ...CAPTURE, status: "failed", failure_reason: "exceeds_authorization" };
    const failedVoid = { ...VOID, status: "failed", failure_reason: "authorization_captured" };
    const s = await serve((req, res, n) => {
      if (n === 0) return problem(res, 422, "capture-exceeds-authorization", { remaining_cents: 15000 });
      if (n === 1) return problem(res, 422, "charge-not-authorized");
      if (n === 2) return problem(res, 422, "capture-failed", { capture: failedCapture }, { "idempotency-ttl": "5" });
      if (n === 3) return problem(res, 422, "void-failed", { void: failedVoid });
      if (n === 4) return problem(res, 422, "idempotency-key-reused", { differing_fields: ["amount_cents"], capture_id: "cp_k" });
      if (n === 5) return problem(res, 410, "key-expired", { void_id: "vd_k" });
      return json(res, 201, VOID);
    });
    const c = client(s.url);
    const exceeds = await rejection(c.capture(CHARGE.id, { amountCents: 30000 }));
    assert.ok(exceeds instanceof CaptureExceedsAuthorizationError && exceeds instanceof IdemError);
    assert.deepEqual([exceeds.chargeId, exceeds.remainingCents, exceeds.attempts.length], [CHARGE.id, 15000, 1]);
    const notAuthorized = await rejection(c.void(CHARGE.id));
    assert.ok(notAuthorized instanceof ChargeNotAuthorizedError);
    assert.match(notAuthorized.message, /cannot be voided/);
    const failed = await rejection(c.capture(CHARGE.id));
    assert.ok(failed instanceof CaptureFailedError);
    assert.deepEqual([failed.capture, failed.idempotencyTtl, failed.replayed], [failedCapture, 5, false]);
    const voidFailed = await rejection(c.void(CHARGE.id));
    assert.ok(voidFailed instanceof VoidFailedError);
    assert.deepEqual(voidFailed.void, failedVoid);
    const reused = await rejection(c.capture(CHARGE.id, { amountCents: 1 }));
    assert.ok(reused instanceof KeyReusedError);
    assert.deepEqual([reused.captureId, reused.voidId, reused.differingFields], ["cp_k", null, ["amount_cents"]]);
    assert.match(reused.message, /which made capture cp_k.*a new capture/);
    const expired = await rejection(c.void(CHARGE.id));
    assert.ok(expired instanceof KeyExpiredError);
    assert.deepEqual([expired.voidId, expired.captureId], ["vd_k", null]);
    assert.match(expired.message, /\(void vd_k\); nothing was voided again/);
    assert.equal(s.requests.length, 6, "a refusal was sent again");
  });

  test("an unknown option, a bad charge id, key, amount or final makes no attempt", async () => {
    const s = await serve((req, res) => json(res, 201, CAPTURE));
    const c = client(s.url);
    await assert.rejects(c.capture(CHARGE.id, { amount_cents: 5000 }), TypeError);
    await assert.rejects(c.capture(CHARGE.id, { final: "false" }), TypeError);
    await assert.rejects(c.capture(CHARGE.id, { amountCents: 2 ** 60 }), RangeError);
    await assert.rejects(c.capture("", {}), TypeError);
    await assert.rejects(c.void(CHARGE.id, { amountCents: 1 }), TypeError);
    await assert.rejects(c.void(undefined), TypeError);
    await assert.rejects(c.void(CHARGE.id, { idempotencyKey: "chave-é" }), RangeError);
    await assert.rejects(c.authorize({ ...REQUEST, capture: false }), TypeError);
    await assert.rejects(c.authorize(REQUEST, null), TypeError);
    assert.equal(s.requests.length, 0);
  });
});
