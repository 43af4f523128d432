/**
 * Every decision the client makes, as pure functions: how a request is
 * encoded and its key quoted, what an answer means (a result, a typed error,
 * or a retry), how long to wait, whether the deadline allows another attempt,
 * what `Prefer: wait` to send, and the words of a give-up. The attempt loop in
 * `client.ts` only carries these out with `fetch` and timers.
 *
 * Invariant: a wait is never shorter than the server's `Retry-After`, never
 * longer than `maxDelayMs` unless the server asked for more, and no wait or
 * attempt runs past the call's deadline.
 */

import { OPERATION_WORDS } from "./errors.js";
import type {
  Attempt,
  Capture,
  CaptureRequest,
  Charge,
  ChargeRequest,
  Operation,
  Problem,
  Refund,
  RefundRequest,
  Void,
} from "./types.js";

/** How hard one call tries before giving up. */
export interface RetryPolicy {
  /** Total attempts, the first included (an integer, at least 1). */
  maxAttempts: number;
  /** Bound on all attempts and waits of a call; the last attempt's timeout is shortened to fit. */
  deadlineMs: number;
  /** One attempt, from connecting to the last byte of the answer's body. */
  attemptTimeoutMs: number;
  /** Backoff base: the wait before retry `n` (0-based) is drawn from `[0, min(maxDelayMs, baseDelayMs * 2^n)]`. */
  baseDelayMs: number;
  /** Backoff cap (the server's `Retry-After` may still ask for more). */
  maxDelayMs: number;
  /**
   * `Prefer: wait=N`: how long the server may hold a duplicate of an attempt
   * still in flight before answering `409`. Shortened to leave a second of the
   * attempt's timeout; not sent below 1.
   */
  preferWaitSecs: number;
}

/** The defaults every idem client shares (clients/README.md). */
export const DEFAULT_RETRY_POLICY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 8,
  deadlineMs: 60_000,
  attemptTimeoutMs: 10_000,
  baseDelayMs: 100,
  maxDelayMs: 5_000,
  preferWaitSecs: 5,
});

/** The longest delay a timer takes without firing at once (2^31 - 1 ms, about 24.8 days). */
export const MAX_TIMER_MS = 2_147_483_647;

/** The problem types the client branches on. */
export const PROBLEM_TYPES = Object.freeze({
  chargeDeclined: "urn:idem:problem:charge-declined",
  acquirerRejected: "urn:idem:problem:acquirer-rejected",
  keyReused: "urn:idem:problem:idempotency-key-reused",
  keyExpired: "urn:idem:problem:key-expired",
  refundFailed: "urn:idem:problem:refund-failed",
  refundExceedsCaptured: "urn:idem:problem:refund-exceeds-captured",
  chargeNotRefundable: "urn:idem:problem:charge-not-refundable",
  captureFailed: "urn:idem:problem:capture-failed",
  voidFailed: "urn:idem:problem:void-failed",
  captureExceedsAuthorization: "urn:idem:problem:capture-exceeds-authorization",
  chargeNotAuthorized: "urn:idem:problem:charge-not-authorized",
  /** A `409`, retried: a final capture or a void of the authorization is pending at the acquirer. */
  authorizationClosed: "urn:idem:problem:authorization-closed",
  /** A `409` to a void, retried: captures of the authorization are pending at the acquirer. */
  capturePending: "urn:idem:problem:capture-pending",
});

// ---------------------------------------------------------------------------
// Configuration

/**
 * The defaults with `overrides` over them, checked: an unknown field or a
 * value that is not a number is a `TypeError`, a number out of range a
 * `RangeError`. `undefined` fields keep the default.
 */
export function resolvePolicy(overrides?: Partial<RetryPolicy>): RetryPolicy {
  const policy: RetryPolicy = { ...DEFAULT_RETRY_POLICY };
  if (overrides === undefined || overrides === null) {
    return policy;
  }
  if (typeof overrides !== "object") {
    throw new TypeError("retry must be an object of RetryPolicy fields");
  }
  for (const [name, value] of Object.entries(overrides)) {
    if (!Object.hasOwn(DEFAULT_RETRY_POLICY, name)) {
      const known = Object.keys(DEFAULT_RETRY_POLICY).join(", ");
      throw new TypeError(`retry.${name} is not a RetryPolicy field (${known})`);
    }
    if (value === undefined) {
      continue;
    }
    if (typeof value !== "number" || Number.isNaN(value)) {
      throw new TypeError(`retry.${name} must be a number, not ${describeValue(value)}`);
    }
    policy[name as keyof RetryPolicy] = value;
  }
  const { maxAttempts, deadlineMs, attemptTimeoutMs, baseDelayMs, maxDelayMs, preferWaitSecs } =
    policy;
  if (!Number.isSafeInteger(maxAttempts) || maxAttempts < 1) {
    throw new RangeError(`retry.maxAttempts must be an integer of at least 1, not ${maxAttempts}`);
  }
  for (const [name, value] of [
    ["deadlineMs", deadlineMs],
    ["attemptTimeoutMs", attemptTimeoutMs],
  ] as const) {
    if (!(value > 0 && value <= MAX_TIMER_MS)) {
      throw new RangeError(`retry.${name} must be above 0 and at most ${MAX_TIMER_MS}, not ${value}`);
    }
  }
  for (const [name, value] of [
    ["baseDelayMs", baseDelayMs],
    ["maxDelayMs", maxDelayMs],
  ] as const) {
    if (!(value >= 0 && value <= MAX_TIMER_MS)) {
      throw new RangeError(`retry.${name} must be from 0 to ${MAX_TIMER_MS}, not ${value}`);
    }
  }
  if (!Number.isSafeInteger(preferWaitSecs) || preferWaitSecs < 0) {
    throw new RangeError(
      `retry.preferWaitSecs must be a whole number of seconds, 0 or more, not ${preferWaitSecs}`,
    );
  }
  return policy;
}

function describeValue(value: unknown): string {
  if (typeof value === "string") {
    return JSON.stringify(value);
  }
  if (typeof value === "number" || typeof value === "bigint" || typeof value === "boolean") {
    return `${typeof value} ${String(value)}`;
  }
  return value === null ? "null" : typeof value;
}

// ---------------------------------------------------------------------------
// The key and the body

/** Whether every character of `text` is printable ASCII (0x20 to 0x7E). */
export function isPrintableAscii(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code < 0x20 || code > 0x7e) {
      return false;
    }
  }
  return true;
}

/**
 * The key as an IETF Structured Field string (RFC 8941): `"` + the key with
 * `\` and `"` escaped + `"`. Such a string holds only printable ASCII, so a key
 * with any other character is a `RangeError` (and a key that is not a string a
 * `TypeError`): no attempt is made with it. Whether the key is one idem
 * accepts (1 to 255 visible characters) is the server's to say (`400`).
 */
export function quoteKey(key: string): string {
  if (typeof key !== "string") {
    throw new TypeError(`an idempotency key must be a string, not ${describeValue(key)}`);
  }
  if (!isPrintableAscii(key)) {
    throw new RangeError(
      `the idempotency key ${JSON.stringify(key)} has a character outside printable ASCII, so it cannot be sent`,
    );
  }
  return `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

const REQUEST_FIELDS: ReadonlySet<string> = new Set([
  "order_id",
  "amount_cents",
  "currency",
  "description",
]);

/**
 * The JSON text of `POST /v1/charges`, in the contract's field order, with
 * `currency` and `description` left out when absent; an authorization
 * (`capture` false) ends with `"capture":false`, a charge leaves it out.
 * Refused before any attempt (the server would refuse it, or it would not say
 * what the caller meant): an unknown field or a value of the wrong type
 * (`TypeError`), an integer field that is not a safe integer or a `bigint`
 * (`RangeError`: above 2^53 a `number` no longer holds the integer the caller
 * wrote).
 */
export function encodeChargeRequest(request: ChargeRequest, capture = true): string {
  if (request === null || typeof request !== "object" || Array.isArray(request)) {
    throw new TypeError("a charge request must be an object: { order_id, amount_cents, currency?, description? }");
  }
  for (const name of Object.keys(request)) {
    if (!REQUEST_FIELDS.has(name)) {
      throw new TypeError(
        `a charge request has no field ${JSON.stringify(name)} (order_id, amount_cents, currency, description)`,
      );
    }
  }
  const parts = [
    `"order_id":${encodeInteger("order_id", request.order_id)}`,
    `"amount_cents":${encodeInteger("amount_cents", request.amount_cents)}`,
  ];
  for (const name of ["currency", "description"] as const) {
    const value = request[name];
    if (value === undefined || value === null) {
      continue;
    }
    if (typeof value !== "string") {
      throw new TypeError(`${name} must be a string, not ${describeValue(value)}`);
    }
    parts.push(`${JSON.stringify(name)}:${JSON.stringify(value)}`);
  }
  if (!capture) {
    parts.push(`"capture":false`);
  }
  return `{${parts.join(",")}}`;
}

const REFUND_FIELDS: ReadonlySet<string> = new Set(["amount_cents", "reason", "description"]);

/**
 * The JSON text of `POST /v1/charges/{id}/refunds`, in the contract's field
 * order, every field left out when absent (`{}`: refund all the charge has
 * left). Refused before any attempt as {@link encodeChargeRequest} refuses.
 * Ranges and the reasons idem takes are the server's to judge (`400`).
 */
export function encodeRefundRequest(request: RefundRequest): string {
  if (request === null || typeof request !== "object" || Array.isArray(request)) {
    throw new TypeError("a refund request must be an object: { amount_cents?, reason?, description? }");
  }
  for (const name of Object.keys(request)) {
    if (!REFUND_FIELDS.has(name)) {
      throw new TypeError(
        `a refund request has no field ${JSON.stringify(name)} (amount_cents, reason, description)`,
      );
    }
  }
  const parts: string[] = [];
  if (request.amount_cents !== undefined && request.amount_cents !== null) {
    parts.push(`"amount_cents":${encodeInteger("amount_cents", request.amount_cents)}`);
  }
  for (const name of ["reason", "description"] as const) {
    const value = request[name];
    if (value === undefined || value === null) {
      continue;
    }
    if (typeof value !== "string") {
      throw new TypeError(`${name} must be a string, not ${describeValue(value)}`);
    }
    parts.push(`${JSON.stringify(name)}:${JSON.stringify(value)}`);
  }
  return `{${parts.join(",")}}`;
}

const CAPTURE_FIELDS: ReadonlySet<string> = new Set(["amount_cents", "final"]);

/**
 * The JSON text of `POST /v1/charges/{id}/captures`: `amount_cents` left out
 * when absent (all the authorization has left), `final` always sent (`true`
 * unless given `false`: the capture closes the authorization and releases the
 * rest). Refused before any attempt as {@link encodeChargeRequest} refuses.
 */
export function encodeCaptureRequest(request: CaptureRequest): string {
  if (request === null || typeof request !== "object" || Array.isArray(request)) {
    throw new TypeError("a capture request must be an object: { amount_cents?, final? }");
  }
  for (const name of Object.keys(request)) {
    if (!CAPTURE_FIELDS.has(name)) {
      throw new TypeError(`a capture request has no field ${JSON.stringify(name)} (amount_cents, final)`);
    }
  }
  const parts: string[] = [];
  if (request.amount_cents !== undefined && request.amount_cents !== null) {
    parts.push(`"amount_cents":${encodeInteger("amount_cents", request.amount_cents)}`);
  }
  const final = request.final ?? true;
  if (typeof final !== "boolean") {
    throw new TypeError(`final must be a boolean, not ${describeValue(final)}`);
  }
  parts.push(`"final":${final}`);
  return `{${parts.join(",")}}`;
}

/** The body of `POST /v1/charges/{id}/void`: a void names no amount. */
export const VOID_BODY = "{}";

/**
 * `/v1/charges/{chargeId}/refunds`, the id percent-encoded so that no id,
 * however odd, names another route (idem answers `404` for one not of its
 * shape). An id that is not a non-empty string is a `TypeError`.
 */
export function refundsPath(chargeId: string): string {
  return chargePath(chargeId, "refunds");
}

/** `/v1/charges/{chargeId}/captures`, as {@link refundsPath}. */
export function capturesPath(chargeId: string): string {
  return chargePath(chargeId, "captures");
}

/** `/v1/charges/{chargeId}/void`, as {@link refundsPath}. */
export function voidPath(chargeId: string): string {
  return chargePath(chargeId, "void");
}

function chargePath(chargeId: string, operation: string): string {
  if (typeof chargeId !== "string" || chargeId === "") {
    throw new TypeError(`a charge id must be a non-empty string, not ${describeValue(chargeId)}`);
  }
  return `/v1/charges/${encodeURIComponent(chargeId)}/${operation}`;
}

function encodeInteger(name: string, value: unknown): string {
  if (typeof value === "bigint") {
    return value.toString();
  }
  if (typeof value !== "number") {
    throw new TypeError(`${name} must be an integer (a number or a bigint), not ${describeValue(value)}`);
  }
  if (!Number.isSafeInteger(value)) {
    throw new RangeError(
      `${name} must be a safe integer (a bigint above 2^53 - 1), not ${String(value)}`,
    );
  }
  return String(value);
}

// ---------------------------------------------------------------------------
// Headers

/**
 * A header of whole seconds (`Retry-After`, `Idempotency-TTL`) in seconds, or
 * `null` when absent or not digits alone (the HTTP-date form of `Retry-After`
 * is not one the server sends, and is ignored: the backoff still applies).
 */
export function parseSeconds(value: string | null | undefined): number | null {
  if (value === null || value === undefined) {
    return null;
  }
  const text = value.trim();
  if (!/^[0-9]+$/.test(text)) {
    return null;
  }
  return Number(text);
}

/** `Retry-After` in milliseconds, or `null` (see {@link parseSeconds}). */
export function parseRetryAfterMs(value: string | null | undefined): number | null {
  const seconds = parseSeconds(value);
  return seconds === null ? null : seconds * 1000;
}

/** `Idempotent-Replayed: true`, in any case, around whitespace. */
export function isReplayed(value: string | null | undefined): boolean {
  return value !== null && value !== undefined && value.trim().toLowerCase() === "true";
}

/**
 * The N of `Prefer: wait=N`: the configured wait, at most one second less
 * than the attempt's timeout in whole seconds, so the server answers (with a
 * `409` at worst) before the client stops listening; `null` (not sent) below 1.
 */
export function preferWaitSecs(configuredSecs: number, attemptTimeoutMs: number): number | null {
  const wait = Math.min(Math.floor(configuredSecs), Math.floor(attemptTimeoutMs / 1000) - 1);
  return wait >= 1 ? wait : null;
}

// ---------------------------------------------------------------------------
// Backoff and the deadline

/** `min(maxDelayMs, baseDelayMs * 2^retry)`, for any `retry`. */
export function backoffCeilingMs(policy: Pick<RetryPolicy, "baseDelayMs" | "maxDelayMs">, retry: number): number {
  if (policy.baseDelayMs <= 0 || policy.maxDelayMs <= 0) {
    return 0;
  }
  return Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** Math.max(0, retry));
}

/**
 * The wait before retry number `retry` (0-based), in whole milliseconds:
 * exponential backoff with FULL jitter, uniform in
 * `[0, min(maxDelayMs, baseDelayMs * 2^retry)]`, but never less than the
 * server's `Retry-After` when it gave one. Full jitter spreads the retries of
 * many clients that failed together over the whole window, so they do not
 * come back in lockstep. `random` is `Math.random` unless a test fixes it.
 */
export function backoffDelayMs(
  policy: Pick<RetryPolicy, "baseDelayMs" | "maxDelayMs">,
  retry: number,
  retryAfterMs: number | null,
  random: () => number = Math.random,
): number {
  const ceiling = Math.floor(backoffCeilingMs(policy, retry));
  const jittered = Math.min(ceiling, Math.floor(random() * (ceiling + 1)));
  return retryAfterMs === null ? jittered : Math.max(jittered, retryAfterMs);
}

/** What to do before attempt number `attemptsMade` (0-based). */
export type AttemptPlan =
  | {
      action: "send";
      /** The attempt's timeout: the policy's, shortened to what is left of the deadline. */
      timeoutMs: number;
      /** The `Prefer: wait` to send, or `null` for none. */
      preferWaitSecs: number | null;
    }
  | { action: "give-up"; reason: string };

/** Whether another attempt fits in the deadline, and with which timeout. */
export function planAttempt(policy: RetryPolicy, elapsedMs: number): AttemptPlan {
  const remaining = policy.deadlineMs - elapsedMs;
  if (remaining <= 0) {
    return { action: "give-up", reason: `the deadline (${policy.deadlineMs} ms) is spent` };
  }
  const timeoutMs = Math.min(policy.attemptTimeoutMs, remaining);
  return { action: "send", timeoutMs, preferWaitSecs: preferWaitSecs(policy.preferWaitSecs, timeoutMs) };
}

/** What to do after a retryable attempt. */
export type RetryPlan = { action: "wait"; delayMs: number } | { action: "give-up"; reason: string };

/**
 * After `attemptsMade` attempts (at least 1), the last of which may be retried:
 * the wait before the next, or why there is no next. A wait that would reach
 * the deadline is not started.
 */
export function planRetry(
  policy: RetryPolicy,
  attemptsMade: number,
  elapsedMs: number,
  retryAfterMs: number | null,
  random: () => number = Math.random,
): RetryPlan {
  if (attemptsMade >= policy.maxAttempts) {
    return { action: "give-up", reason: `max attempts (${policy.maxAttempts}) reached` };
  }
  const delayMs = backoffDelayMs(policy, attemptsMade - 1, retryAfterMs, random);
  const remaining = policy.deadlineMs - elapsedMs;
  if (delayMs >= remaining) {
    return {
      action: "give-up",
      reason: `the next wait (${formatMs(delayMs)}) would pass the deadline (${policy.deadlineMs} ms)`,
    };
  }
  return { action: "wait", delayMs };
}

function formatMs(ms: number): string {
  return Number.isFinite(ms) ? `${Math.round(ms)} ms` : "forever";
}

// ---------------------------------------------------------------------------
// What an answer means

/** What a status, with its problem type, means for a call. */
export type AnswerKind = "result" | "retry" | "key-reused" | "key-expired" | "api-error";

/**
 * `201`, `402` and `502` `acquirer-rejected` are stored outcomes (results).
 * `409`, `429`, `503`, `504` and any other `502` (a gateway's says nothing
 * about the charge) may turn out otherwise on a retry. `422`
 * `idempotency-key-reused` and `410` `key-expired` are typed errors. Anything
 * else (`400`, `401`, `413`, `415`, `500`, a `3xx`, ...) is the final word.
 *
 * Every `409` is retried, whatever its type: `request-in-flight` (this key's
 * first attempt is at the acquirer), and, to a capture or a void,
 * `authorization-closed` (a final capture or a void of the authorization is
 * pending at the acquirer) and `capture-pending` (to a void: captures are).
 * None stores anything under the key, and each is settled by another
 * attempt's or step's outcome, which a retry then meets: this intent's own
 * outcome, or a final refusal (`422` `charge-not-authorized`). idem answers
 * `409` exactly for what a retry may change (`422` for what it cannot), so
 * the client follows the status, not a list of types.
 */
export function classifyStatus(status: number, problemType: string | null): AnswerKind {
  switch (status) {
    case 201:
    case 402:
      return "result";
    case 502:
      return problemType === PROBLEM_TYPES.acquirerRejected ? "result" : "retry";
    case 409:
    case 429:
    case 503:
    case 504:
      return "retry";
    case 422:
      return problemType === PROBLEM_TYPES.keyReused ? "key-reused" : "api-error";
    case 410:
      return problemType === PROBLEM_TYPES.keyExpired ? "key-expired" : "api-error";
    default:
      return "api-error";
  }
}

/** The decision for one complete answer, with what was read from it. */
export type Decision =
  | { kind: "result"; charge: Charge; problem: Problem | null }
  | { kind: "retry"; retryAfterMs: number | null; problem: Problem | null }
  | {
      kind: "key-reused";
      problem: Problem;
      chargeId: string | null;
      refundId: string | null;
      differingFields: string[];
    }
  | { kind: "key-expired"; problem: Problem; chargeId: string | null; refundId: string | null }
  | { kind: "api-error"; problem: Problem | null; reason: string | null };

/** One complete answer, as {@link decide} needs it. */
export interface Answer {
  status: number;
  /** The body, decoded as UTF-8. */
  bodyText: string;
  /** The `Retry-After` header's value, or `null`. */
  retryAfter: string | null;
}

/**
 * What a complete answer means. A `201`, `402` or `502` `acquirer-rejected`
 * whose body holds no charge is not taken for a result: it is an API error
 * saying so (no idem answer looks like that).
 */
export function decide(answer: Answer): Decision {
  const problem = parseProblem(answer.bodyText);
  const kind = classifyStatus(answer.status, problem?.type ?? null);
  switch (kind) {
    case "result": {
      const charge = answer.status === 201 ? parseCharge(parseJson(answer.bodyText)) : parseCharge(problem?.charge);
      if (charge === null) {
        const where = answer.status === 201 ? "its body" : "its problem document";
        return {
          kind: "api-error",
          problem,
          reason: `a ${answer.status} answer, but ${where} holds no charge`,
        };
      }
      return { kind: "result", charge, problem: answer.status === 201 ? null : problem };
    }
    case "retry":
      return { kind: "retry", retryAfterMs: parseRetryAfterMs(answer.retryAfter), problem };
    case "key-reused": {
      const p = problem as Problem;
      return {
        kind: "key-reused",
        problem: p,
        chargeId: chargeIdOf(p),
        refundId: refundIdOf(p),
        differingFields: differingFieldsOf(p),
      };
    }
    case "key-expired": {
      const p = problem as Problem;
      return { kind: "key-expired", problem: p, chargeId: chargeIdOf(p), refundId: refundIdOf(p) };
    }
    case "api-error":
      return { kind: "api-error", problem, reason: null };
  }
}

/** What a status, with its problem type, means for a refund. */
export type RefundAnswerKind =
  | "result"
  | "retry"
  | "key-reused"
  | "key-expired"
  | "refund-failed"
  | "refund-exceeds"
  | "not-refundable"
  | "api-error";

/**
 * As {@link classifyStatus}, for a refund: a `201` is the only result; the
 * refund `422`s (`refund-failed`, `refund-exceeds-captured`,
 * `charge-not-refundable`) are final; every `502` is retried (idem has no
 * stored `502` for a refund, so one is a gateway's); a `402` is not a refund's
 * answer (an API error).
 */
export function classifyRefundStatus(status: number, problemType: string | null): RefundAnswerKind {
  switch (status) {
    case 201:
      return "result";
    case 402:
      return "api-error";
    case 502:
      return "retry";
    case 422:
      switch (problemType) {
        case PROBLEM_TYPES.refundFailed:
          return "refund-failed";
        case PROBLEM_TYPES.refundExceedsCaptured:
          return "refund-exceeds";
        case PROBLEM_TYPES.chargeNotRefundable:
          return "not-refundable";
      }
      return classifyStatus(status, problemType) as RefundAnswerKind;
    default:
      return classifyStatus(status, problemType) as RefundAnswerKind;
  }
}

/** The decision for one complete answer to a refund, with what was read from it. */
export type RefundDecision =
  | { kind: "result"; refund: Refund }
  | { kind: "retry"; retryAfterMs: number | null; problem: Problem | null }
  | {
      kind: "key-reused";
      problem: Problem;
      chargeId: string | null;
      refundId: string | null;
      differingFields: string[];
    }
  | { kind: "key-expired"; problem: Problem; chargeId: string | null; refundId: string | null }
  | { kind: "refund-failed"; problem: Problem; refund: Refund }
  | { kind: "refund-exceeds"; problem: Problem; remainingCents: number | null }
  | { kind: "not-refundable"; problem: Problem }
  | { kind: "api-error"; problem: Problem | null; reason: string | null };

/**
 * What a complete answer to a refund means. A `201`, or a `refund-failed`
 * problem, that holds no refund is not taken for one: it is an API error
 * saying so.
 */
export function decideRefund(answer: Answer): RefundDecision {
  const problem = parseProblem(answer.bodyText);
  const kind = classifyRefundStatus(answer.status, problem?.type ?? null);
  switch (kind) {
    case "result": {
      const refund = parseRefund(parseJson(answer.bodyText));
      return refund === null
        ? { kind: "api-error", problem, reason: "a 201 answer, but its body holds no refund" }
        : { kind: "result", refund };
    }
    case "refund-failed": {
      const p = problem as Problem;
      const refund = parseRefund(p.refund);
      return refund === null
        ? { kind: "api-error", problem, reason: "a refund-failed answer, but its problem document holds no refund" }
        : { kind: "refund-failed", problem: p, refund };
    }
    case "refund-exceeds": {
      const p = problem as Problem;
      const remaining = Number.isSafeInteger(p.remaining_cents) ? (p.remaining_cents as number) : null;
      return { kind: "refund-exceeds", problem: p, remainingCents: remaining };
    }
    case "not-refundable":
      return { kind: "not-refundable", problem: problem as Problem };
    case "retry":
      return { kind: "retry", retryAfterMs: parseRetryAfterMs(answer.retryAfter), problem };
    case "key-reused": {
      const p = problem as Problem;
      return {
        kind: "key-reused",
        problem: p,
        chargeId: chargeIdOf(p),
        refundId: refundIdOf(p),
        differingFields: differingFieldsOf(p),
      };
    }
    case "key-expired": {
      const p = problem as Problem;
      return { kind: "key-expired", problem: p, chargeId: chargeIdOf(p), refundId: refundIdOf(p) };
    }
    case "api-error":
      return { kind: "api-error", problem, reason: null };
  }
}

/** What a status, with its problem type, means for a capture or a void. */
export type StepAnswerKind =
  | "result"
  | "retry"
  | "key-reused"
  | "key-expired"
  | "step-failed"
  | "capture-exceeds"
  | "not-authorized"
  | "api-error";

/**
 * As {@link classifyRefundStatus}, for a capture: a `201` is the only result;
 * the capture `422`s (`capture-failed`, `capture-exceeds-authorization`,
 * `charge-not-authorized`) are final; every `409`, `authorization-closed`
 * included, is retried.
 */
export function classifyCaptureStatus(status: number, problemType: string | null): StepAnswerKind {
  if (status === 422) {
    switch (problemType) {
      case PROBLEM_TYPES.captureFailed:
        return "step-failed";
      case PROBLEM_TYPES.captureExceedsAuthorization:
        return "capture-exceeds";
      case PROBLEM_TYPES.chargeNotAuthorized:
        return "not-authorized";
    }
  }
  return classifyStepStatus(status, problemType);
}

/**
 * As {@link classifyCaptureStatus}, for a void: its `422`s (`void-failed`,
 * `charge-not-authorized`) are final; `capture-pending` and
 * `authorization-closed` (`409`) are retried.
 */
export function classifyVoidStatus(status: number, problemType: string | null): StepAnswerKind {
  if (status === 422) {
    switch (problemType) {
      case PROBLEM_TYPES.voidFailed:
        return "step-failed";
      case PROBLEM_TYPES.chargeNotAuthorized:
        return "not-authorized";
    }
  }
  return classifyStepStatus(status, problemType);
}

function classifyStepStatus(status: number, problemType: string | null): StepAnswerKind {
  switch (status) {
    case 201:
      return "result";
    case 402:
      return "api-error";
    case 502:
      return "retry";
    default:
      return classifyStatus(status, problemType) as StepAnswerKind;
  }
}

/** The decision for one complete answer to a capture (`T` = {@link Capture}) or a void. */
export type StepDecision<T> =
  | { kind: "result"; step: T }
  | { kind: "retry"; retryAfterMs: number | null; problem: Problem | null }
  | {
      kind: "key-reused";
      problem: Problem;
      chargeId: string | null;
      refundId: string | null;
      differingFields: string[];
    }
  | { kind: "key-expired"; problem: Problem; chargeId: string | null; refundId: string | null }
  | { kind: "step-failed"; problem: Problem; step: T }
  | { kind: "capture-exceeds"; problem: Problem; remainingCents: number | null }
  | { kind: "not-authorized"; problem: Problem }
  | { kind: "api-error"; problem: Problem | null; reason: string | null };

/**
 * What a complete answer to a capture means. A `201`, or a `capture-failed`
 * problem, that holds no capture is not taken for one: it is an API error.
 */
export function decideCapture(answer: Answer): StepDecision<Capture> {
  return decideStep(answer, classifyCaptureStatus, parseCapture, "capture");
}

/** What a complete answer to a void means, as {@link decideCapture}. */
export function decideVoid(answer: Answer): StepDecision<Void> {
  return decideStep(answer, classifyVoidStatus, parseVoid, "void");
}

function decideStep<T>(
  answer: Answer,
  classify: (status: number, problemType: string | null) => StepAnswerKind,
  parse: (value: unknown) => T | null,
  noun: "capture" | "void",
): StepDecision<T> {
  const problem = parseProblem(answer.bodyText);
  switch (classify(answer.status, problem?.type ?? null)) {
    case "result": {
      const step = parse(parseJson(answer.bodyText));
      return step === null
        ? { kind: "api-error", problem, reason: `a 201 answer, but its body holds no ${noun}` }
        : { kind: "result", step };
    }
    case "step-failed": {
      const p = problem as Problem;
      const step = parse(p[noun]);
      return step === null
        ? { kind: "api-error", problem, reason: `a ${noun}-failed answer, but its problem document holds no ${noun}` }
        : { kind: "step-failed", problem: p, step };
    }
    case "capture-exceeds": {
      const p = problem as Problem;
      const remaining = Number.isSafeInteger(p.remaining_cents) ? (p.remaining_cents as number) : null;
      return { kind: "capture-exceeds", problem: p, remainingCents: remaining };
    }
    case "not-authorized":
      return { kind: "not-authorized", problem: problem as Problem };
    case "retry":
      return { kind: "retry", retryAfterMs: parseRetryAfterMs(answer.retryAfter), problem };
    case "key-reused": {
      const p = problem as Problem;
      return {
        kind: "key-reused",
        problem: p,
        chargeId: chargeIdOf(p),
        refundId: refundIdOf(p),
        differingFields: differingFieldsOf(p),
      };
    }
    case "key-expired": {
      const p = problem as Problem;
      return { kind: "key-expired", problem: p, chargeId: chargeIdOf(p), refundId: refundIdOf(p) };
    }
    case "api-error":
      return { kind: "api-error", problem, reason: null };
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** A problem document: a JSON object with a string `type`; else `null`. */
export function parseProblem(bodyText: string): Problem | null {
  const value = parseJson(bodyText);
  return isObject(value) && typeof value.type === "string" ? (value as Problem) : null;
}

/** A charge: an object with a string `id` and `status`; else `null`. Unknown fields are kept. */
export function parseCharge(value: unknown): Charge | null {
  return isObject(value) && typeof value.id === "string" && typeof value.status === "string"
    ? (value as unknown as Charge)
    : null;
}

/**
 * A refund: an object with a string `id`, `charge_id` and `status` and a
 * numeric `amount_cents`; else `null`. Unknown fields are kept.
 */
export function parseRefund(value: unknown): Refund | null {
  return isObject(value) &&
    typeof value.id === "string" &&
    typeof value.charge_id === "string" &&
    typeof value.status === "string" &&
    typeof value.amount_cents === "number"
    ? (value as unknown as Refund)
    : null;
}

/**
 * A capture: an object with a string `id`, `charge_id` and `status`, a
 * numeric `amount_cents` and a boolean `final`; else `null`. Unknown fields
 * are kept.
 */
export function parseCapture(value: unknown): Capture | null {
  return isObject(value) &&
    typeof value.id === "string" &&
    typeof value.charge_id === "string" &&
    typeof value.status === "string" &&
    typeof value.amount_cents === "number" &&
    typeof value.final === "boolean"
    ? (value as unknown as Capture)
    : null;
}

/** A void: as a capture, without `final`; else `null`. Unknown fields are kept. */
export function parseVoid(value: unknown): Void | null {
  return isObject(value) &&
    typeof value.id === "string" &&
    typeof value.charge_id === "string" &&
    typeof value.status === "string" &&
    typeof value.amount_cents === "number"
    ? (value as unknown as Void)
    : null;
}

function chargeIdOf(problem: Problem): string | null {
  return typeof problem.charge_id === "string" ? problem.charge_id : null;
}

function refundIdOf(problem: Problem): string | null {
  return typeof problem.refund_id === "string" ? problem.refund_id : null;
}

function differingFieldsOf(problem: Problem): string[] {
  const fields = problem.differing_fields;
  return Array.isArray(fields) ? fields.filter((f): f is string => typeof f === "string") : [];
}

// ---------------------------------------------------------------------------
// Words

/** An error and its causes, `: `-separated (`fetch failed` alone hides whether the port was closed or the peer reset). */
export function errorChain(error: unknown): string {
  const parts: string[] = [];
  const seen = new Set<unknown>();
  let current: unknown = error;
  while (current !== undefined && current !== null && !seen.has(current) && parts.length < 8) {
    seen.add(current);
    parts.push(describeError(current));
    current = current instanceof Error ? current.cause : undefined;
  }
  return parts.filter((p) => p !== "").join(": ") || "unknown error";
}

function describeError(error: unknown): string {
  if (!(error instanceof Error)) {
    return String(error);
  }
  const code = (error as { code?: unknown }).code;
  let text = error.message;
  if (error instanceof AggregateError && error.errors.length > 0) {
    const inner = error.errors.map((e) => describeError(e)).join("; ");
    text = text === "" ? inner : `${text} (${inner})`;
  }
  if (text === "" && typeof code === "string") {
    text = code;
  }
  return text;
}

/** An attempt's outcome in words: `status 503`, `timed out after 1000 ms`, `connection failed: ...`. */
export function describeAttempt(attempt: Pick<Attempt, "outcome" | "status" | "error">): string {
  switch (attempt.outcome) {
    case "answer":
      return `status ${attempt.status ?? "?"}`;
    case "timeout":
      return attempt.error ?? "timed out";
    case "connection-failed":
      return `connection failed: ${attempt.error ?? "unknown error"}`;
  }
}

/** The last attempt's outcome and why no other attempt was made. */
export function giveUpSummary(attempts: readonly Attempt[], reason: string): string {
  const last = attempts[attempts.length - 1];
  return last === undefined ? reason : `${describeAttempt(last)} from ${last.endpoint}; ${reason}`;
}

/**
 * The message of a give-up: the charge (or refund, authorization, capture,
 * void: `operation`) may have happened, and the same key tells.
 */
export function gaveUpMessage(
  key: string,
  attemptCount: number,
  last: string,
  operation: Operation = "charge",
): string {
  const attempts = attemptCount === 1 ? "1 attempt" : `${attemptCount} attempts`;
  const { noun, verb, doing } = OPERATION_WORDS[operation];
  return (
    `gave up on idempotency key ${JSON.stringify(key)} after ${attempts}: ${last}. ` +
    `The outcome may be unknown (the ${noun} may have happened): ${verb} again with the same key ` +
    `to learn it without ${doing} twice`
  );
}
