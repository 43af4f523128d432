/**
 * The errors a call can end in, each in the words of a caller deciding what
 * to do next. A charge's stored outcome (captured, declined, failed) is never
 * an error: it is a {@link ChargeResult} (so is an authorization's). A
 * refund's is a {@link RefundResult} when the acquirer paid it, and a
 * {@link RefundFailedError} when it refused it for good; a capture's and a
 * void's likewise ({@link CaptureFailedError}, {@link VoidFailedError}).
 */

import type { Attempt, Capture, Operation, Problem, Refund, Void } from "./types.js";

/** How messages name each operation: what it makes, what it does, what it did. */
export const OPERATION_WORDS: Readonly<Record<Operation, { noun: string; verb: string; done: string; doing: string }>> =
  Object.freeze({
    charge: { noun: "charge", verb: "charge", done: "charged", doing: "charging" },
    refund: { noun: "refund", verb: "refund", done: "refunded", doing: "refunding" },
    authorize: { noun: "authorization", verb: "authorize", done: "authorized", doing: "authorizing" },
    capture: { noun: "capture", verb: "capture", done: "captured", doing: "capturing" },
    void: { noun: "void", verb: "void", done: "voided", doing: "voiding" },
  });

/** What a key made, in words (`refund re_...`), from a problem's ids; `null` when it names none. */
function madeBy(problem: Problem, chargeId: string | null, refundId: string | null): string | null {
  const ids: [string, unknown][] = [
    ["refund", refundId],
    ["capture", problem.capture_id],
    ["void", problem.void_id],
    ["charge", chargeId],
  ];
  for (const [noun, id] of ids) {
    if (typeof id === "string") {
      return `${noun} ${id}`;
    }
  }
  return null;
}

function stringOf(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

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
 * key sent to a refund, a refund's to a charge, a capture's to a void...). It
 * stays bound to what it first made; a new intent needs a new key, the same
 * request the same key. Never retried; nothing was done by this call.
 */
export class KeyReusedError extends IdemError {
  /** The charge the key made, when the server names it (`charge_id`). */
  readonly chargeId: string | null;
  /** The request fields that differ from the key's first request, as the server lists them. */
  readonly differingFields: readonly string[];
  readonly problem: Problem;
  /** The refund the key made, when it made one (`refund_id`). */
  readonly refundId: string | null;
  /** The capture the key made, when it made one (`capture_id`). */
  readonly captureId: string | null;
  /** The void the key made, when it made one (`void_id`). */
  readonly voidId: string | null;

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
    const what = madeBy(problem, chargeId, refundId);
    const made = what === null ? "" : `, which made ${what}`;
    super(
      `idempotency key ${JSON.stringify(key)} was first used for another request${differing}${made}; ` +
        `send that same request to learn its outcome, or use a new key for a new ${OPERATION_WORDS[operation].noun}`,
      key,
      attempts,
    );
    this.name = "KeyReusedError";
    this.chargeId = chargeId;
    this.differingFields = differingFields;
    this.problem = problem;
    this.refundId = refundId;
    this.captureId = stringOf(problem.capture_id);
    this.voidId = stringOf(problem.void_id);
  }
}

/**
 * `410` `key-expired`: the key's time-to-live ran out after it stored the
 * outcome of this same request. A late retry: nothing was done again; look it
 * up by `chargeId` (`GET /v1/charges/{id}`) or, for a refund, `refundId`
 * (`GET /v1/refunds/{id}`), a capture `captureId` (`GET /v1/captures/{id}`),
 * a void `voidId` (`GET /v1/voids/{id}`). A new intent needs a new key.
 */
export class KeyExpiredError extends IdemError {
  /** The charge this request made under the key (`charge_id`). */
  readonly chargeId: string | null;
  readonly problem: Problem;
  /** The refund this request made under the key (`refund_id`), when it was a refund. */
  readonly refundId: string | null;
  /** The capture this request made under the key (`capture_id`), when it was a capture. */
  readonly captureId: string | null;
  /** The void this request made under the key (`void_id`), when it was a void. */
  readonly voidId: string | null;

  constructor(
    key: string,
    attempts: readonly Attempt[],
    problem: Problem,
    chargeId: string | null,
    refundId: string | null = null,
  ) {
    const what = madeBy(problem, chargeId, refundId);
    // The noun of what the key made: charge, refund, capture or void.
    const noun = (what === null ? "charge" : what.split(" ")[0]) as "charge" | "refund" | "capture" | "void";
    const done = OPERATION_WORDS[noun].done;
    const made = what === null ? "" : ` (${what})`;
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
    this.captureId = stringOf(problem.capture_id);
    this.voidId = stringOf(problem.void_id);
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
 * `422` `capture-failed`: the acquirer refused the capture for good. It is the
 * key's stored outcome (a retry with the key replays it); no money moved, and
 * its amount is the authorization's to capture again, with a new key.
 */
export class CaptureFailedError extends IdemError {
  /** The capture, `status: "failed"`, with the acquirer's `failure_reason`. */
  readonly capture: Capture;
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
    capture: Capture,
    replayed: boolean,
    idempotencyTtl: number | null,
    body: Uint8Array,
  ) {
    const why = capture.failure_reason === null ? "" : ` (${capture.failure_reason})`;
    super(
      `the acquirer refused capture ${capture.id} of charge ${capture.charge_id} for good${why}; no money moved. ` +
        `That is the stored outcome of idempotency key ${JSON.stringify(key)}: capturing again needs a new key`,
      key,
      attempts,
    );
    this.name = "CaptureFailedError";
    this.capture = capture;
    this.replayed = replayed;
    this.idempotencyTtl = idempotencyTtl;
    this.problem = problem;
    this.body = body;
  }
}

/**
 * `422` `void-failed`: the acquirer refused the void for good. It is the
 * key's stored outcome; the authorization is open again (capture it, or void
 * it with a new key).
 */
export class VoidFailedError extends IdemError {
  /** The void, `status: "failed"`, with the acquirer's `failure_reason`. */
  readonly void: Void;
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
    refused: Void,
    replayed: boolean,
    idempotencyTtl: number | null,
    body: Uint8Array,
  ) {
    const why = refused.failure_reason === null ? "" : ` (${refused.failure_reason})`;
    super(
      `the acquirer refused void ${refused.id} of charge ${refused.charge_id} for good${why}; the authorization ` +
        `is open again. That is the stored outcome of idempotency key ${JSON.stringify(key)}: ` +
        `voiding again needs a new key`,
      key,
      attempts,
    );
    this.name = "VoidFailedError";
    this.void = refused;
    this.replayed = replayed;
    this.idempotencyTtl = idempotencyTtl;
    this.problem = problem;
    this.body = body;
  }
}

/**
 * `422` `capture-exceeds-authorization`: more than the authorization has
 * left (captures made and pending count). Nothing was stored and the key is
 * still free: the same key with at most `remainingCents` is a capture. Never
 * retried: no retry changes what is left.
 */
export class CaptureExceedsAuthorizationError extends IdemError {
  /** The charge the call tried to capture. */
  readonly chargeId: string;
  /** What the authorization has left (`0`: nothing), or `null` when the server does not say. */
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
      `the authorization of charge ${chargeId} has less left to capture than asked${left}: nothing was captured ` +
        `or stored, and idempotency key ${JSON.stringify(key)} is still free`,
      key,
      attempts,
    );
    this.name = "CaptureExceedsAuthorizationError";
    this.chargeId = chargeId;
    this.remainingCents = remainingCents;
    this.problem = problem;
  }
}

/**
 * `422` `charge-not-authorized`: a capture or a void of a charge that is not
 * an open authorization (a one-step charge, one captured or voided already,
 * declined, failed, still `processing`, or awaiting review); `problem.detail`
 * names its status. Nothing was stored and the key is still free. Never
 * retried: no retry reopens an authorization.
 */
export class ChargeNotAuthorizedError extends IdemError {
  /** The charge the call tried to capture or void. */
  readonly chargeId: string;
  readonly problem: Problem;

  constructor(key: string, attempts: readonly Attempt[], problem: Problem, chargeId: string, operation: Operation) {
    const detail = typeof problem.detail === "string" ? `: ${problem.detail}` : "";
    super(
      `charge ${chargeId} is not an open authorization, so it cannot be ${OPERATION_WORDS[operation].done}${detail}, ` +
        `for idempotency key ${JSON.stringify(key)}`,
      key,
      attempts,
    );
    this.name = "ChargeNotAuthorizedError";
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
 * refund, authorization, capture, void) MAY HAVE HAPPENED (a timeout or a
 * `503` leaves the outcome unknown): send it again later with the same key
 * and the same request to learn the outcome without doing it twice. (A
 * capture or a void that gave up on `409` `authorization-closed` or
 * `capture-pending` did nothing yet: another step of the authorization was
 * still pending, and the same key later gets this one's answer.)
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
