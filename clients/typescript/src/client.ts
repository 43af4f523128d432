/**
 * The attempt loop: one call, one key, one body, as many attempts as the
 * policy allows. Every decision is taken by the pure functions of
 * `policy.ts`; this module only sends, reads, waits and records. A charge, an
 * authorization, a refund, a capture and a void run the same loop; they
 * differ only in their path, their body and what their final answers mean.
 *
 * Invariants: every attempt of a call carries the same `Idempotency-Key` and
 * the very same body bytes; attempt `i` goes to `baseUrl[i % n]`; no wait and
 * no attempt runs past the deadline; a caller's `AbortSignal` stops it all at
 * once with the signal's reason.
 */

import {
  ApiError,
  CaptureExceedsAuthorizationError,
  CaptureFailedError,
  ChargeNotAuthorizedError,
  ChargeNotRefundableError,
  GaveUpError,
  KeyExpiredError,
  KeyReusedError,
  RefundExceedsCapturedError,
  RefundFailedError,
  VoidFailedError,
} from "./errors.js";
import {
  VOID_BODY,
  capturesPath,
  decide,
  decideCapture,
  decideRefund,
  decideVoid,
  encodeCaptureRequest,
  encodeChargeRequest,
  encodeRefundRequest,
  errorChain,
  gaveUpMessage,
  giveUpSummary,
  isReplayed,
  parseSeconds,
  planAttempt,
  planRetry,
  quoteKey,
  refundsPath,
  resolvePolicy,
  voidPath,
  type Answer,
  type RetryPolicy,
  type StepDecision,
} from "./policy.js";
import type {
  Attempt,
  AttemptOutcome,
  Capture,
  CaptureResult,
  ChargeRequest,
  ChargeResult,
  Operation,
  Problem,
  RefundReason,
  RefundResult,
  Void,
  VoidResult,
} from "./types.js";

/** Where charges are created, relative to a base URL. */
const CHARGES_PATH = "/v1/charges";

/** How an {@link IdemClient} is set up. */
export interface IdemClientOptions {
  /**
   * The base URL of idem (`https://idem.example.com`), or of several
   * instances: attempt `i` goes to `baseUrl[i % n]`, so a retry lands on the
   * next one. No query or fragment.
   */
  baseUrl: string | readonly string[];
  /** The merchant's secret, sent as `Authorization: Bearer <secret>`. */
  secret: string;
  /** Fields of {@link RetryPolicy} to change from the defaults. */
  retry?: Partial<RetryPolicy>;
  /** The `fetch` to use instead of the global one (a test double, an instrumented fetch). */
  fetch?: typeof fetch;
}

/** Per-call options of {@link IdemClient.charge}. */
export interface ChargeOptions {
  /**
   * The payment intent's key. Leave it out and the client makes one
   * ({@link newKey}); better, make it with `newKey()` and store it beside the
   * order before charging, so that a process that dies and comes back
   * finishes the same intent instead of starting another.
   */
  idempotencyKey?: string;
  /** Stops the call at once, in a wait or mid-attempt; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** What {@link IdemClient.refund} refunds, and its per-call options. */
export interface RefundOptions {
  /**
   * Minor units, 1 to 10,000,000,000 (a safe integer, or a `bigint`). Left
   * out: all the charge has left to refund when idem claims the refund.
   */
  amountCents?: number | bigint;
  reason?: RefundReason;
  /** At most 500 characters, no control characters; kept with the refund. */
  description?: string;
  /**
   * The refund intent's key. Leave it out and the client makes one
   * ({@link newKey}); better, make it with `newKey()` and store it before
   * refunding, so that a process that dies and comes back finishes the same
   * refund instead of making another.
   */
  idempotencyKey?: string;
  /** Stops the call at once, in a wait or mid-attempt; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

const REFUND_OPTIONS: ReadonlySet<string> = new Set(["amountCents", "reason", "description", "idempotencyKey", "signal"]);

/** What {@link IdemClient.capture} captures, and its per-call options. */
export interface CaptureOptions {
  /**
   * Minor units, 1 to 10,000,000,000 (a safe integer, or a `bigint`). Left
   * out: all the authorization has left when idem claims the capture.
   */
  amountCents?: number | bigint;
  /**
   * `true` (the default): this capture closes the authorization and releases
   * what remains; `false` leaves the rest capturable by later captures.
   */
  final?: boolean;
  /**
   * The capture intent's key. Leave it out and the client makes one
   * ({@link newKey}); better, make it with `newKey()` and store it before
   * capturing (beside the shipment, say), so that a process that dies and
   * comes back finishes the same capture instead of making another.
   */
  idempotencyKey?: string;
  /** Stops the call at once, in a wait or mid-attempt; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** The per-call options of {@link IdemClient.void}. */
export interface VoidOptions {
  /** The void intent's key, as a capture's. */
  idempotencyKey?: string;
  /** Stops the call at once, in a wait or mid-attempt; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

const CAPTURE_OPTIONS: ReadonlySet<string> = new Set(["amountCents", "final", "idempotencyKey", "signal"]);
const VOID_OPTIONS: ReadonlySet<string> = new Set(["idempotencyKey", "signal"]);

/**
 * One HTTP exchange, as the loop hands it to {@link IdemClient.send}. For
 * subclasses that instrument attempts; not needed to use the client.
 */
export interface AttemptRequest {
  /** The attempt's number within the call, from 0. */
  number: number;
  /** The base URL, as given. */
  endpoint: string;
  /** The full URL posted to: `/v1/charges`, or `/v1/charges/{id}/refunds` (`captures`, `void`). */
  url: string;
  /** Every request header, by name. */
  headers: Record<string, string>;
  /** The call's body: the same bytes on every attempt. */
  body: Uint8Array;
  /** Aborted when the attempt times out or the caller aborts. */
  signal: AbortSignal;
}

/** A complete answer to one {@link AttemptRequest}: the whole body was read. */
export interface AttemptReply {
  status: number;
  /** `"opaqueredirect"` for a redirect a browser hides (status 0). */
  type: string;
  headers: Headers;
  body: Uint8Array;
}

/**
 * A new idempotency key: a random UUID v4 (`crypto.randomUUID()`). One per
 * payment intent, made before its first attempt and stored beside the order.
 */
export function newKey(): string {
  const webCrypto = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (typeof webCrypto?.randomUUID !== "function") {
    throw new TypeError(
      "newKey() needs the global crypto.randomUUID (Node 19+, or Node 18 with --experimental-global-webcrypto, " +
        "or a browser in a secure context); or pass your own idempotencyKey",
    );
  }
  return webCrypto.randomUUID();
}

interface Endpoint {
  /** As the caller gave it, for {@link Attempt.endpoint}. */
  base: string;
  /** `base` without its trailing `/`: a path is appended to it. */
  root: string;
}

/** How a call goes on after an answer: retried (after at least `retryAfterMs`), or over with `result`. */
type Next<R> = { retryAfterMs: number | null } | { result: R };

/**
 * One call's operation: where it posts, and what an answer means for it
 * (`conclude` returns how the call goes on, or throws the call's error).
 */
interface Call<R> {
  operation: Operation;
  path: string;
  key: string;
  /** `key`, quoted: checked before the call begins. */
  keyHeader: string;
  body: Uint8Array;
  signal: AbortSignal | undefined;
  conclude(reply: AttemptReply, bodyText: string, attempts: Attempt[]): Next<R>;
}

/** An attempt that got no complete answer. */
interface Lost {
  outcome: Exclude<AttemptOutcome, "answer">;
  error: string;
}

/** The reason an attempt's own controller is aborted with when its time is up. */
class AttemptTimeout extends Error {}

/**
 * A client of idem's `POST /v1/charges` and `POST /v1/charges/{id}/refunds`,
 * and of the two-step payment's authorize (`POST /v1/charges` with
 * `"capture": false`), `POST /v1/charges/{id}/captures` and
 * `POST /v1/charges/{id}/void`, for one merchant, that retries the way the
 * contract says: one key per call, the same bytes on every attempt,
 * full-jitter backoff never shorter than `Retry-After`, within a deadline.
 * Calls may run concurrently on one client.
 */
export class IdemClient {
  /** The policy in force: the defaults with the `retry` option over them. */
  readonly policy: Readonly<RetryPolicy>;
  readonly #endpoints: readonly Endpoint[];
  readonly #authorization: string;
  readonly #fetch: typeof fetch;

  /**
   * Checks everything up front: a `TypeError` for a missing or malformed
   * option (no base URL, one that is not `http(s)://` or has a query, a
   * secret that cannot be a bearer token, an unknown retry field, no `fetch`),
   * a `RangeError` for a retry number out of range.
   */
  constructor(options: IdemClientOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError("new IdemClient({ baseUrl, secret, retry?, fetch? }): options must be an object");
    }
    this.#endpoints = parseEndpoints(options.baseUrl);
    this.#authorization = `Bearer ${checkSecret(options.secret)}`;
    this.policy = Object.freeze(resolvePolicy(options.retry));
    const chosen = options.fetch ?? (globalThis.fetch as typeof fetch | undefined);
    if (typeof chosen !== "function") {
      throw new TypeError("no fetch: this runtime has no global fetch; pass options.fetch");
    }
    // Called without a receiver: a browser's fetch refuses any `this` but the global one.
    this.#fetch = options.fetch === undefined ? chosen.bind(globalThis) : chosen;
  }

  /**
   * One payment intent: sends the charge with one idempotency key until a
   * final answer, the policy's attempts or its deadline.
   *
   * Resolves with a {@link ChargeResult} for a stored outcome: captured
   * (`201`), declined (`402`) or failed (`502` `acquirer-rejected`, no money
   * moved); branch on `result.charge.status`. Rejects with
   * {@link KeyReusedError} (`422`), {@link KeyExpiredError} (`410`),
   * {@link ApiError} (any other final answer) or {@link GaveUpError} (no final
   * answer: the charge may have happened; charge again with the same key).
   * A key or request that cannot be sent is a `TypeError` or `RangeError`
   * before any attempt; an aborted `signal` rejects with its reason.
   */
  async charge(request: ChargeRequest, options: ChargeOptions = {}): Promise<ChargeResult> {
    return this.#charge(request, options, "charge");
  }

  /**
   * One authorization intent, the first step of a two-step payment: holds
   * `request.amount_cents` on the card, to capture later
   * ({@link IdemClient.capture}) or release ({@link IdemClient.void}). It is
   * `POST /v1/charges` with `"capture": false`, retried exactly as
   * {@link IdemClient.charge} is under one key.
   *
   * Resolves with a {@link ChargeResult}: authorized (`201`,
   * `result.charge.status === "authorized"`, with `amount_capturable_cents`),
   * declined (`402`) or failed (`502`); rejects as `charge` does.
   */
  async authorize(request: ChargeRequest, options: ChargeOptions = {}): Promise<ChargeResult> {
    return this.#charge(request, options, "authorize");
  }

  async #charge(
    request: ChargeRequest,
    options: ChargeOptions,
    operation: "charge" | "authorize",
  ): Promise<ChargeResult> {
    if (options === null || typeof options !== "object") {
      throw new TypeError(`${operation}(request, { idempotencyKey?, signal? }): options must be an object`);
    }
    const { idempotencyKey, signal } = options;
    checkSignal(signal, `${operation}(request, { signal })`);
    const key = idempotencyKey === undefined ? newKey() : idempotencyKey;
    const keyHeader = quoteKey(key);
    // Encoded once: every attempt carries the very same bytes.
    const body = new TextEncoder().encode(encodeChargeRequest(request, operation === "charge"));
    return this.#call<ChargeResult>({
      operation,
      path: CHARGES_PATH,
      key,
      keyHeader,
      body,
      signal,
      conclude: (reply, bodyText, attempts) => {
        const decision = decide({ status: reply.status, bodyText, retryAfter: reply.headers.get("retry-after") });
        switch (decision.kind) {
          case "result":
            return {
              result: {
                status: reply.status,
                charge: decision.charge,
                problem: decision.problem,
                key,
                replayed: isReplayed(reply.headers.get("idempotent-replayed")),
                idempotencyTtl: parseSeconds(reply.headers.get("idempotency-ttl")),
                body: reply.body,
                attempts,
              },
            };
          case "retry":
            return { retryAfterMs: decision.retryAfterMs };
          case "key-reused":
            throw new KeyReusedError(
              key,
              attempts,
              decision.problem,
              decision.chargeId,
              decision.differingFields,
              decision.refundId,
              operation,
            );
          case "key-expired":
            throw new KeyExpiredError(key, attempts, decision.problem, decision.chargeId, decision.refundId);
          case "api-error":
            throw apiError(key, attempts, reply, bodyText, decision.problem, decision.reason);
        }
      },
    });
  }

  /**
   * One refund intent: refunds `amountCents` of charge `chargeId` (left out:
   * all it has left), with one idempotency key until a final answer, the
   * policy's attempts or its deadline: the same retries as {@link charge}.
   *
   * Resolves with a {@link RefundResult} when the acquirer paid the refund
   * back (`201`). Rejects with {@link RefundFailedError} (`422`: the acquirer
   * refused it for good, the key's stored outcome),
   * {@link RefundExceedsCapturedError} (`422`: more than the charge has
   * left), {@link ChargeNotRefundableError} (`422`: the charge is not
   * captured), {@link KeyReusedError} (`422`), {@link KeyExpiredError}
   * (`410`), {@link ApiError} (any other final answer, `404` for no such
   * charge) or {@link GaveUpError} (no final answer: the refund may have
   * happened; refund again with the same key). An unknown option, a key or
   * amount that cannot be sent is a `TypeError` or `RangeError` before any
   * attempt; an aborted `signal` rejects with its reason.
   */
  async refund(chargeId: string, options: RefundOptions = {}): Promise<RefundResult> {
    if (options === null || typeof options !== "object") {
      throw new TypeError(
        "refund(chargeId, { amountCents?, reason?, description?, idempotencyKey?, signal? }): options must be an object",
      );
    }
    for (const name of Object.keys(options)) {
      // A misspelt amountCents must not refund all the charge has left.
      if (!REFUND_OPTIONS.has(name)) {
        throw new TypeError(
          `refund(chargeId, options): no option ${JSON.stringify(name)} (amountCents, reason, description, idempotencyKey, signal)`,
        );
      }
    }
    const { amountCents, reason, description, idempotencyKey: givenKey, signal } = options;
    checkSignal(signal, "refund(chargeId, { signal })");
    const path = refundsPath(chargeId);
    const key = givenKey === undefined ? newKey() : givenKey;
    const keyHeader = quoteKey(key);
    // Encoded once: every attempt carries the very same bytes.
    const body = new TextEncoder().encode(encodeRefundRequest({ amount_cents: amountCents, reason, description }));
    return this.#call<RefundResult>({
      operation: "refund",
      path,
      key,
      keyHeader,
      body,
      signal,
      conclude: (reply, bodyText, attempts) => {
        const retryAfter = reply.headers.get("retry-after");
        const decision = decideRefund({ status: reply.status, bodyText, retryAfter });
        const replayed = isReplayed(reply.headers.get("idempotent-replayed"));
        const idempotencyTtl = parseSeconds(reply.headers.get("idempotency-ttl"));
        switch (decision.kind) {
          case "result":
            return {
              result: {
                status: reply.status,
                refund: decision.refund,
                key,
                replayed,
                idempotencyTtl,
                body: reply.body,
                attempts,
              },
            };
          case "retry":
            return { retryAfterMs: decision.retryAfterMs };
          case "refund-failed":
            throw new RefundFailedError(
              key,
              attempts,
              decision.problem,
              decision.refund,
              replayed,
              idempotencyTtl,
              reply.body,
            );
          case "refund-exceeds":
            throw new RefundExceedsCapturedError(key, attempts, decision.problem, chargeId, decision.remainingCents);
          case "not-refundable":
            throw new ChargeNotRefundableError(key, attempts, decision.problem, chargeId);
          case "key-reused":
            throw new KeyReusedError(
              key,
              attempts,
              decision.problem,
              decision.chargeId,
              decision.differingFields,
              decision.refundId,
              "refund",
            );
          case "key-expired":
            throw new KeyExpiredError(key, attempts, decision.problem, decision.chargeId, decision.refundId);
          case "api-error":
            throw apiError(key, attempts, reply, bodyText, decision.problem, decision.reason);
        }
      },
    });
  }

  /**
   * One capture intent of the authorized charge `chargeId`: captures
   * `amountCents` (left out: all the authorization has left), closing the
   * authorization unless `final` is `false`, with one idempotency key until a
   * final answer, the policy's attempts or its deadline: the same retries as
   * {@link charge}. A `409` `authorization-closed` (a final capture or a void
   * of the charge is pending at the acquirer) is retried too: nothing is
   * stored under the key, and once that step settles a retry gets this
   * capture or a final refusal.
   *
   * Resolves with a {@link CaptureResult} (`201`). Rejects with
   * {@link CaptureFailedError} (`422`: the acquirer refused it for good, the
   * key's stored outcome), {@link CaptureExceedsAuthorizationError} (`422`:
   * more than the authorization has left), {@link ChargeNotAuthorizedError}
   * (`422`: not an open authorization), {@link KeyReusedError},
   * {@link KeyExpiredError}, {@link ApiError} (`404`: no such charge) or
   * {@link GaveUpError}. An unknown option, a key or amount that cannot be
   * sent is a `TypeError` or `RangeError` before any attempt.
   */
  async capture(chargeId: string, options: CaptureOptions = {}): Promise<CaptureResult> {
    checkOptions(options, CAPTURE_OPTIONS, "capture(chargeId, { amountCents?, final?, idempotencyKey?, signal? })");
    const { amountCents, final, idempotencyKey, signal } = options;
    checkSignal(signal, "capture(chargeId, { signal })");
    const path = capturesPath(chargeId);
    const key = idempotencyKey === undefined ? newKey() : idempotencyKey;
    const keyHeader = quoteKey(key);
    // Encoded once: every attempt carries the very same bytes.
    const body = new TextEncoder().encode(encodeCaptureRequest({ amount_cents: amountCents, final }));
    return this.#step<Capture, CaptureResult>(
      { operation: "capture", path, key, keyHeader, body, signal },
      chargeId,
      decideCapture,
      (reply, capture, attempts) => ({ ...stepResult(reply, key, attempts), capture }),
      (attempts, problem, capture, reply) =>
        new CaptureFailedError(key, attempts, problem, capture, ...storedOf(reply)),
    );
  }

  /**
   * One void intent of the authorized charge `chargeId`: releases what its
   * authorization still holds (after partial captures, the rest), with one
   * idempotency key, retried as {@link charge} is. A `409` `capture-pending`
   * (captures of the charge are pending at the acquirer) or
   * `authorization-closed` is retried too: nothing is stored under the key,
   * and once the other step settles a retry gets this void or a final
   * refusal.
   *
   * Resolves with a {@link VoidResult} (`201`; `void.amount_cents` is what
   * it released). Rejects with {@link VoidFailedError} (the acquirer refused
   * it for good, the key's stored outcome), {@link ChargeNotAuthorizedError},
   * {@link KeyReusedError}, {@link KeyExpiredError}, {@link ApiError} or
   * {@link GaveUpError}.
   */
  async void(chargeId: string, options: VoidOptions = {}): Promise<VoidResult> {
    checkOptions(options, VOID_OPTIONS, "void(chargeId, { idempotencyKey?, signal? })");
    const { idempotencyKey, signal } = options;
    checkSignal(signal, "void(chargeId, { signal })");
    const path = voidPath(chargeId);
    const key = idempotencyKey === undefined ? newKey() : idempotencyKey;
    const keyHeader = quoteKey(key);
    const body = new TextEncoder().encode(VOID_BODY);
    return this.#step<Void, VoidResult>(
      { operation: "void", path, key, keyHeader, body, signal },
      chargeId,
      decideVoid,
      (reply, made, attempts) => ({ ...stepResult(reply, key, attempts), void: made }),
      (attempts, problem, made, reply) => new VoidFailedError(key, attempts, problem, made, ...storedOf(reply)),
    );
  }

  /** A capture's or a void's call: the loop, and what its answers mean. */
  #step<T, R>(
    call: Omit<Call<R>, "conclude">,
    chargeId: string,
    decideStep: (answer: Answer) => StepDecision<T>,
    result: (reply: AttemptReply, step: T, attempts: Attempt[]) => R,
    failed: (attempts: Attempt[], problem: Problem, step: T, reply: AttemptReply) => Error,
  ): Promise<R> {
    const { key, operation } = call;
    return this.#call<R>({
      ...call,
      conclude: (reply, bodyText, attempts) => {
        const decision = decideStep({ status: reply.status, bodyText, retryAfter: reply.headers.get("retry-after") });
        switch (decision.kind) {
          case "result":
            return { result: result(reply, decision.step, attempts) };
          case "retry":
            return { retryAfterMs: decision.retryAfterMs };
          case "step-failed":
            throw failed(attempts, decision.problem, decision.step, reply);
          case "capture-exceeds":
            throw new CaptureExceedsAuthorizationError(
              key,
              attempts,
              decision.problem,
              chargeId,
              decision.remainingCents,
            );
          case "not-authorized":
            throw new ChargeNotAuthorizedError(key, attempts, decision.problem, chargeId, operation);
          case "key-reused":
            throw new KeyReusedError(
              key,
              attempts,
              decision.problem,
              decision.chargeId,
              decision.differingFields,
              decision.refundId,
              operation,
            );
          case "key-expired":
            throw new KeyExpiredError(key, attempts, decision.problem, decision.chargeId, decision.refundId);
          case "api-error":
            throw apiError(key, attempts, reply, bodyText, decision.problem, decision.reason);
        }
      },
    });
  }

  /** The loop every call runs: attempts, waits and the deadline, until `call.conclude` ends it. */
  async #call<R>(call: Call<R>): Promise<R> {
    const { key, keyHeader, body, signal } = call;
    if (signal?.aborted) {
      throw signal.reason;
    }

    const policy = this.policy;
    const started = now();
    const elapsed = () => now() - started;
    const attempts: Attempt[] = [];
    let retryAfterMs: number | null = null;

    for (let number = 0; ; number++) {
      if (number > 0) {
        const retry = planRetry(policy, number, elapsed(), retryAfterMs);
        if (retry.action === "give-up") {
          throw gaveUp(key, attempts, retry.reason, call.operation);
        }
        await sleep(retry.delayMs, signal);
      }
      const plan = planAttempt(policy, elapsed());
      if (plan.action === "give-up") {
        throw gaveUp(key, attempts, plan.reason, call.operation);
      }

      const endpoint = this.#endpoints[number % this.#endpoints.length] as Endpoint;
      const headers: Record<string, string> = {
        authorization: this.#authorization,
        "content-type": "application/json",
        "idempotency-key": keyHeader,
      };
      if (plan.preferWaitSecs !== null) {
        headers.prefer = `wait=${plan.preferWaitSecs}`;
      }
      const startedMs = elapsed();
      const exchange = await this.#exchange(
        { number, endpoint: endpoint.base, url: `${endpoint.root}${call.path}`, headers, body },
        plan.timeoutMs,
        signal,
      );
      const attempt: Attempt = {
        endpoint: endpoint.base,
        outcome: "outcome" in exchange ? exchange.outcome : "answer",
        status: "outcome" in exchange ? null : exchange.status,
        error: "outcome" in exchange ? exchange.error : null,
        startedMs,
        elapsedMs: elapsed() - startedMs,
      };
      attempts.push(attempt);
      if ("outcome" in exchange) {
        retryAfterMs = null;
        continue;
      }

      const next = call.conclude(exchange, new TextDecoder().decode(exchange.body), attempts);
      if ("result" in next) {
        return next.result;
      }
      retryAfterMs = next.retryAfterMs;
    }
  }

  /**
   * Sends one attempt and reads its whole answer. The loop bounds it with the
   * attempt's timeout and the caller's signal (both abort `request.signal`).
   * Redirects are not followed: a redirected `POST` loses its body or its
   * credentials, so a `3xx` is a final answer.
   *
   * A seam for subclasses that instrument attempts (tests, tracing); the
   * loop's behaviour does not depend on overriding it.
   */
  protected async send(request: AttemptRequest): Promise<AttemptReply> {
    const doFetch = this.#fetch;
    const response = await doFetch(request.url, {
      method: "POST",
      headers: request.headers,
      // Typed plainly as Uint8Array in the API (so older TypeScript reads the declarations).
      body: request.body as Uint8Array<ArrayBuffer>,
      redirect: "manual",
      signal: request.signal,
    });
    // A body cut off half way rejects here: a lost answer, not a final one.
    const body = new Uint8Array(await response.arrayBuffer());
    return { status: response.status, type: response.type, headers: response.headers, body };
  }

  /** {@link send} within `timeoutMs`, stopped at once by the caller's signal. */
  async #exchange(
    request: Omit<AttemptRequest, "signal">,
    timeoutMs: number,
    callerSignal: AbortSignal | undefined,
  ): Promise<AttemptReply | Lost> {
    const controller = new AbortController();
    const timeout = new AttemptTimeout(`timed out after ${Math.round(timeoutMs)} ms`);
    const timer = setTimeout(() => controller.abort(timeout), timeoutMs);
    const onCallerAbort = () => controller.abort(callerSignal?.reason);
    callerSignal?.addEventListener("abort", onCallerAbort, { once: true });
    try {
      // Raced against the signal too, so that a `fetch` that does not honour
      // it still cannot hold the attempt past its time.
      return await untilAborted(this.send({ ...request, signal: controller.signal }), controller.signal);
    } catch (error) {
      if (callerSignal?.aborted) {
        throw callerSignal.reason;
      }
      if (controller.signal.reason === timeout) {
        return { outcome: "timeout", error: timeout.message };
      }
      return { outcome: "connection-failed", error: errorChain(error) };
    } finally {
      clearTimeout(timer);
      callerSignal?.removeEventListener("abort", onCallerAbort);
    }
  }
}

/** A capture's or a void's result, but the step itself. */
function stepResult(
  reply: AttemptReply,
  key: string,
  attempts: Attempt[],
): Omit<CaptureResult, "capture"> {
  const [replayed, idempotencyTtl, body] = storedOf(reply);
  return { status: reply.status, key, replayed, idempotencyTtl, body, attempts };
}

/** What a stored outcome's answer says of itself: replayed, its TTL, its bytes. */
function storedOf(reply: AttemptReply): [boolean, number | null, Uint8Array] {
  return [
    isReplayed(reply.headers.get("idempotent-replayed")),
    parseSeconds(reply.headers.get("idempotency-ttl")),
    reply.body,
  ];
}

/** Options must be an object of known names: a misspelt amount must never capture all that is left. */
function checkOptions(options: unknown, known: ReadonlySet<string>, where: string): void {
  if (options === null || typeof options !== "object") {
    throw new TypeError(`${where}: options must be an object`);
  }
  for (const name of Object.keys(options)) {
    if (!known.has(name)) {
      throw new TypeError(`${where}: no option ${JSON.stringify(name)}`);
    }
  }
}

function gaveUp(key: string, attempts: Attempt[], reason: string, operation: Operation): GaveUpError {
  const last = giveUpSummary(attempts, reason);
  return new GaveUpError(gaveUpMessage(key, attempts.length, last, operation), key, attempts, last);
}

function apiError(
  key: string,
  attempts: Attempt[],
  reply: AttemptReply,
  bodyText: string,
  problem: Problem | null,
  reason: string | null,
): ApiError {
  const why = reply.type === "opaqueredirect" ? "a redirect, not followed" : reason;
  return new ApiError(key, attempts, reply.status, problem, bodyText, why);
}

function checkSignal(signal: unknown, where: string): void {
  if (
    signal !== undefined &&
    (signal === null ||
      typeof (signal as AbortSignal).aborted !== "boolean" ||
      typeof (signal as AbortSignal).addEventListener !== "function")
  ) {
    throw new TypeError(`${where}: signal must be an AbortSignal`);
  }
}

function parseEndpoints(baseUrl: unknown): Endpoint[] {
  const list: unknown[] = typeof baseUrl === "string" ? [baseUrl] : Array.isArray(baseUrl) ? baseUrl : [];
  if (list.length === 0) {
    throw new TypeError("baseUrl must be a URL or a non-empty array of URLs");
  }
  return list.map((base) => {
    if (typeof base !== "string") {
      throw new TypeError(`baseUrl: ${String(base)} is not a string`);
    }
    let url: URL;
    try {
      url = new URL(base);
    } catch {
      throw new TypeError(`baseUrl ${JSON.stringify(base)} is not a URL`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`baseUrl ${JSON.stringify(base)}: only http:// and https:// are supported`);
    }
    if (url.search !== "" || url.hash !== "" || base.includes("?") || base.includes("#")) {
      throw new TypeError(`baseUrl ${JSON.stringify(base)}: a base URL takes no query or fragment`);
    }
    if (url.username !== "" || url.password !== "") {
      throw new TypeError(`baseUrl ${JSON.stringify(base)}: credentials go in secret, not in the URL`);
    }
    return { base, root: url.href.replace(/\/+$/, "") };
  });
}

function checkSecret(secret: unknown): string {
  if (typeof secret !== "string" || !/^[\x21-\x7e]+$/.test(secret)) {
    throw new TypeError("secret must be a non-empty string of visible ASCII characters (a bearer token)");
  }
  return secret;
}

function now(): number {
  return performance.now();
}

/** `promise`, or a rejection with `signal.reason` as soon as `signal` aborts. */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    if (signal.aborted) {
      onAbort();
    } else {
      signal.addEventListener("abort", onAbort, { once: true });
    }
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

/** Waits `ms`, or rejects with `signal.reason` as soon as it aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
