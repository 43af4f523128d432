// The conformance suite (clients/conformance/scenarios.json) against one
// `idem-lab conformance-env`: one test per scenario, then the whole suite with
// a client that makes a new key on every retry, which the suite must fail.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { IdemClient, newKey } from "../dist/index.js";
import { loadSuite, runScenario } from "./support/conformance.js";
import { startEnv } from "./support/env.js";

const suite = loadSuite();
const TIMEOUT_MS = 120_000;
let env;

before(async () => {
  env = await startEnv();
});

after(async () => {
  await env?.stop();
});

function report(run) {
  return `${run.failures.length} failure(s):\n${run.failures.map((f) => `  ${f.message}`).join("\n")}`;
}

for (const scenario of suite.scenarios) {
  test(`conformance: ${scenario.name}`, { timeout: TIMEOUT_MS }, async () => {
    assert.ok(env, "the conformance environment did not start");
    const run = await runScenario({ env: env.info, suite, scenario });
    if (run.failures.length > 0) {
      assert.fail(`${report(run)}\n  conformance-env's stderr, last lines:\n${env.stderrTail().split("\n").slice(-20).join("\n")}`);
    }
  });
}

/**
 * The broken client the suite must catch: its first attempt carries the
 * call's key, every retry a new one (so a retry is a new intent to idem).
 */
class NewKeyPerRetryClient extends IdemClient {
  send(request) {
    if (request.number === 0) {
      return super.send(request);
    }
    return super.send({ ...request, headers: { ...request.headers, "idempotency-key": `"${newKey()}"` } });
  }
}

test("the suite fails a client that makes a new key on every retry", { timeout: TIMEOUT_MS * 4 }, async () => {
  assert.ok(env, "the conformance environment did not start");
  const runs = new Map();
  for (const scenario of suite.scenarios) {
    runs.set(scenario.name, await runScenario({ env: env.info, suite, scenario, ClientClass: NewKeyPerRetryClient }));
  }
  const summary = [...runs.values()].map((run) => `${run.name}: ${report(run)}`).join("\n");

  assert.deepEqual(runs.get("first-try").failures, [], `a single attempt is not a retry: first-try must pass\n${summary}`);
  const charging = ["unknown-outcome-then-settled", "timeout-then-retry", "server-goes-away-mid-retry", "refund-answer-lost"];
  const capturing = ["capture-timeout-then-retry", "two-step-answers-lost"];
  // Retried 409s that another step settles: no second effect, but requests
  // that carried no call's key, which this runner checks.
  const conflicting = ["void-waits-for-pending-capture", "capture-meets-pending-void"];
  for (const name of charging) {
    const run = runs.get(name);
    assert.ok(run, `the suite has no scenario ${name}`);
    const doubled = run.failures.find((f) => f.field === "captures" && f.got >= 2);
    assert.ok(doubled, `${name} must fail on a double capture with a new key per retry\n${summary}`);
  }
  // The refund's own retry, under a new key, is a second refund of the capture.
  const refunded = runs.get("refund-answer-lost").failures.find((f) => f.field === "refunds" && f.got >= 2);
  assert.ok(refunded, `refund-answer-lost must fail on a double refund with a new key per retry\n${summary}`);
  // A capture of an authorization retried under a new key takes from it twice.
  for (const name of capturing) {
    const run = runs.get(name);
    assert.ok(run, `the suite has no scenario ${name}`);
    const doubled = run.failures.find((f) => f.field === "authorization_captures" && f.got >= 2);
    assert.ok(doubled, `${name} must fail on a second capture of the authorization with a new key per retry\n${summary}`);
  }
  for (const name of conflicting) {
    const run = runs.get(name);
    assert.ok(run?.failures.some((f) => f.field === "key"), `${name} must fail on requests without their call's key\n${summary}`);
  }
  const failing = [...runs.values()].filter((run) => run.failures.length > 0).map((run) => run.name);
  const retrying = [...charging, ...capturing, ...conflicting];
  assert.deepEqual(failing.sort(), retrying.sort(), `exactly the retrying scenarios must fail\n${summary}`);
});
