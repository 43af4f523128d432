/**
 * The errors a call can end in, each in the words of a caller deciding what
 * to do next. A stored outcome (captured, declined, failed) is never an error:
 * it is a {@link ChargeResult}.
 */

import type { Attempt, Problem } from "./types.js";

/**
 * Every error of a call that reached the point of sending: it carries the
 * idempotency key (the handle to come back with) and every attempt made.
 */
export class IdemError extends Error {
  /** The idempotency key every attempt carried (unquoted). */
  readonly key: string;
  /** Every attempt in order, the last one last. */
  readonly attempts: readonly Attempt[];

  constructor(message: string, key: string, attempts: readonly Attempt[], options?: { cause?: unknown }) {
    super(message, options);
    this.name = "IdemError";
    this.key = key;
    this.attempts = attempts;
  }
}

/**
 * `422` `idempotency-key-reused`: the key was first used for another request
 * (`differingFields` says which fields differ). It stays bound to its first
 * charge; a new charge needs a new key, the same request the same key. Never
 * retried; nothing was charged by this call.
 */
export class KeyReusedError extends IdemError {
  /** The charge the key made, when the server names it (`charge_id`). */
  readonly chargeId: string | null;
  /** The request fields that differ from the key's first request, as the server lists them. */
  readonly differingFields: readonly string[];
  readonly problem: Problem;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    problem: Problem,
    chargeId: string | null,
    differingFields: readonly string[],
  ) {
    const differing = differingFields.length > 0 ? ` (differing: ${differingFields.join(", ")})` : "";
    const charge = chargeId === null ? "" : `, which made charge ${chargeId}`;
    super(
      `idempotency key ${JSON.stringify(key)} was first used for another request${differing}${charge}; ` +
        "send that same request to learn its outcome, or use a new key for a new charge",
      key,
      attempts,
    );
    this.name = "KeyReusedError";
    this.chargeId = chargeId;
    this.differingFields = differingFields;
    this.problem = problem;
  }
}

/**
 * `410` `key-expired`: the key's time-to-live ran out after it stored the
 * outcome of this same request. A late retry: nothing was charged again; look
 * the charge up by `chargeId` (`GET /v1/charges/{id}`). A new charge needs a
 * new key.
 */
export class KeyExpiredError extends IdemError {
  /** The charge this request made under the key (`charge_id`). */
  readonly chargeId: string | null;
  readonly problem: Problem;

  constructor(key: string, attempts: readonly Attempt[], problem: Problem, chargeId: string | null) {
    const charge = chargeId === null ? "" : ` (charge ${chargeId})`;
    super(
      `idempotency key ${JSON.stringify(key)} expired after storing this request's outcome${charge}; ` +
        "nothing was charged again: look the charge up, and use a new key only for a new charge",
      key,
      attempts,
    );
    this.name = "KeyExpiredError";
    this.chargeId = chargeId;
    this.problem = problem;
  }
}

/**
 * Any other final answer: `400` (a bad request or key), `401`, `413`, `415`,
 * `500`, a `3xx` (redirects are not followed), ... Retrying the same request
 * does not change it; nothing was stored under the key, except after a `500`
 * (a bug), where retrying with the same key is safe.
 */
export class ApiError extends IdemError {
  /** The HTTP status (`0` for a redirect a browser hides). */
  readonly status: number;
  /** The problem document, or `null` when the body is not one. */
  readonly problem: Problem | null;
  /** The body as text (UTF-8). */
  readonly body: string;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    status: number,
    problem: Problem | null,
    body: string,
    reason: string | null = null,
  ) {
    let message = `idem answered ${status}`;
    if (problem !== null) {
      message += ` ${problem.type}`;
      if (typeof problem.detail === "string") {
        message += `: ${problem.detail}`;
      }
      if (typeof problem.field === "string") {
        message += ` (field ${problem.field})`;
      }
    }
    if (reason !== null) {
      message += ` (${reason})`;
    }
    super(`${message}, for idempotency key ${JSON.stringify(key)}`, key, attempts);
    this.name = "ApiError";
    this.status = status;
    this.problem = problem;
    this.body = body;
  }
}

/**
 * No final answer within the policy's attempts or deadline. The charge MAY
 * HAVE HAPPENED (a timeout or a `503` leaves the outcome unknown): charge
 * again later with the same key and the same request to learn the outcome
 * without charging twice.
 */
export class GaveUpError extends IdemError {
  /** The last attempt's outcome and why no further attempt was made. */
  readonly last: string;

  constructor(message: string, key: string, attempts: readonly Attempt[], last: string) {
    super(message, key, attempts);
    this.name = "GaveUpError";
    this.last = last;
  }
}
