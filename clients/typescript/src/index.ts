/**
 * `idem-client`: a client for idem's charge API that retries right.
 *
 * One call to {@link IdemClient.charge} is one payment intent: one
 * idempotency key and the same body bytes on every attempt, so however often
 * it retries, the server charges at most once.
 */

export { IdemClient, newKey } from "./client.js";
export type { AttemptReply, AttemptRequest, ChargeOptions, IdemClientOptions } from "./client.js";
export { ApiError, GaveUpError, IdemError, KeyExpiredError, KeyReusedError } from "./errors.js";
export { DEFAULT_RETRY_POLICY, PROBLEM_TYPES } from "./policy.js";
export type { RetryPolicy } from "./policy.js";
export type {
  Attempt,
  AttemptOutcome,
  Charge,
  ChargeRequest,
  ChargeResult,
  ChargeStatus,
  Problem,
} from "./types.js";
