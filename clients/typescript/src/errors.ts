/**
 * The errors a call can end in, each in the words of a caller deciding what
 * to do next. A charge's stored outcome (captured, declined, failed) is never
 * an error: it is a {@link ChargeResult}. A refund's is a
 * {@link RefundResult} when the acquirer paid it, and a
 * {@link RefundFailedError} when it refused it for good.
 */

import type { Attempt, Operation, Problem, Refund } from "./types.js";

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
 * (`differingFields` says which fields differ; `["operation"]` for a charge's
 * key sent to a refund or a refund's to a charge). It stays bound to what it
 * first made; a new charge or refund needs a new key, the same request the
 * same key. Never retried; nothing was charged or refunded by this call.
 */
export class KeyReusedError extends IdemError {
  /** The charge the key made, when the server names it (`charge_id`). */
  readonly chargeId: string | null;
  /** The request fields that differ from the key's first request, as the server lists them. */
  readonly differingFields: readonly string[];
  readonly problem: Problem;
  /** The refund the key made, when it made one (`refund_id`). */
  readonly refundId: string | null;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    problem: Problem,
    chargeId: string | null,
    differingFields: readonly string[],
    refundId: string | null = null,
    operation: Operation = "charge",
  ) {
    const differing = differingFields.length > 0 ? ` (differing: ${differingFields.join(", ")})` : "";
    const made =
      refundId !== null
        ? `, which made refund ${refundId}`
        : chargeId !== null
          ? `, which made charge ${chargeId}`
          : "";
    super(
      `idempotency key ${JSON.stringify(key)} was first used for another request${differing}${made}; ` +
        `send that same request to learn its outcome, or use a new key for a new ${operation}`,
      key,
      attempts,
    );
    this.name = "KeyReusedError";
    this.chargeId = chargeId;
    this.differingFields = differingFields;
    this.problem = problem;
    this.refundId = refundId;
  }
}

/**
 * `410` `key-expired`: the key's time-to-live ran out after it stored the
 * outcome of this same request. A late retry: nothing was charged or refunded
 * again; look it up by `chargeId` (`GET /v1/charges/{id}`) or, for a refund,
 * `refundId` (`GET /v1/refunds/{id}`). A new charge or refund needs a new key.
 */
export class KeyExpiredError extends IdemError {
  /** The charge this request made under the key (`charge_id`). */
  readonly chargeId: string | null;
  readonly problem: Problem;
  /** The refund this request made under the key (`refund_id`), when it was a refund. */
  readonly refundId: string | null;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    problem: Problem,
    chargeId: string | null,
    refundId: string | null = null,
  ) {
    const [noun, id, done] =
      refundId !== null ? ["refund", refundId, "refunded"] : ["charge", chargeId, "charged"];
    const made = id === null ? "" : ` (${noun} ${id})`;
    super(
      `idempotency key ${JSON.stringify(key)} expired after storing this request's outcome${made}; ` +
        `nothing was ${done} again: look the ${noun} up, and use a new key only for a new ${noun}`,
      key,
      attempts,
    );
    this.name = "KeyExpiredError";
    this.chargeId = chargeId;
    this.problem = problem;
    this.refundId = refundId;
  }
}

/**
 * `422` `refund-failed`: the acquirer refused the refund for good. It is the
 * key's stored outcome (a retry with the key replays it); no money moved, and
 * the amount is the charge's to refund again, with a new key.
 */
export class RefundFailedError extends IdemError {
  /** The refund, `status: "failed"`, with the acquirer's `failure_reason`. */
  readonly refund: Refund;
  /** The answer carried `Idempotent-Replayed: true`. */
  readonly replayed: boolean;
  /** `Idempotency-TTL`: how many more seconds the key is honoured, or `null`. */
  readonly idempotencyTtl: number | null;
  readonly problem: Problem;
  /** The answer's exact bytes. */
  readonly body: Uint8Array;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    problem: Problem,
    refund: Refund,
    replayed: boolean,
    idempotencyTtl: number | null,
    body: Uint8Array,
  ) {
    const why = refund.failure_reason === null ? "" : ` (${refund.failure_reason})`;
    super(
      `the acquirer refused refund ${refund.id} of charge ${refund.charge_id} for good${why}; no money moved. ` +
        `That is the stored outcome of idempotency key ${JSON.stringify(key)}: refunding again needs a new key`,
      key,
      attempts,
    );
    this.name = "RefundFailedError";
    this.refund = refund;
    this.replayed = replayed;
    this.idempotencyTtl = idempotencyTtl;
    this.problem = problem;
    this.body = body;
  }
}

/**
 * `422` `refund-exceeds-captured`: more than the charge has left to refund
 * (succeeded and pending refunds count). Nothing was stored and the key is
 * still free: the same key with at most `remainingCents` is a refund. Never
 * retried: no retry changes what is left.
 */
export class RefundExceedsCapturedError extends IdemError {
  /** The charge the call tried to refund. */
  readonly chargeId: string;
  /** What the charge has left to refund (`0`: nothing), or `null` when the server does not say. */
  readonly remainingCents: number | null;
  readonly problem: Problem;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    problem: Problem,
    chargeId: string,
    remainingCents: number | null,
  ) {
    const left = remainingCents === null ? "" : ` (${remainingCents} cents left)`;
    super(
      `charge ${chargeId} has less left to refund than asked${left}: nothing was refunded or stored, ` +
        `and idempotency key ${JSON.stringify(key)} is still free`,
      key,
      attempts,
    );
    this.name = "RefundExceedsCapturedError";
    this.chargeId = chargeId;
    this.remainingCents = remainingCents;
    this.problem = problem;
  }
}

/**
 * `422` `charge-not-refundable`: the charge is not `captured` (still
 * `processing`, `declined`, `failed`) or awaits review; `problem.detail`
 * names its status. Nothing was stored and the key is still free: the same
 * request with the same key works once the charge is captured. Never retried.
 */
export class ChargeNotRefundableError extends IdemError {
  /** The charge the call tried to refund. */
  readonly chargeId: string;
  readonly problem: Problem;

  constructor(key: string, attempts: readonly Attempt[], problem: Problem, chargeId: string) {
    const detail = typeof problem.detail === "string" ? `: ${problem.detail}` : "";
    super(`charge ${chargeId} cannot be refunded${detail}, for idempotency key ${JSON.stringify(key)}`, key, attempts);
    this.name = "ChargeNotRefundableError";
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
 * No final answer within the policy's attempts or deadline. The charge (or
 * refund) MAY HAVE HAPPENED (a timeout or a `503` leaves the outcome
 * unknown): send it again later with the same key and the same request to
 * learn the outcome without charging or refunding twice.
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
