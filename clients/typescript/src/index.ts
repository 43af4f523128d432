/**
 * `idem-client`: a client for idem's charge and refund API that retries right.
 *
 * One call to {@link IdemClient.charge} is one payment intent: one
 * idempotency key and the same body bytes on every attempt, so however often
 * it retries, the server charges at most once. One call to
 * {@link IdemClient.refund} is one refund intent, retried the same way.
 */

export { IdemClient, newKey } from "./client.js";
export type { AttemptReply, AttemptRequest, ChargeOptions, IdemClientOptions, RefundOptions } from "./client.js";
export {
  ApiError,
  ChargeNotRefundableError,
  GaveUpError,
  IdemError,
  KeyExpiredError,
  KeyReusedError,
  RefundExceedsCapturedError,
  RefundFailedError,
} from "./errors.js";
export { DEFAULT_RETRY_POLICY, PROBLEM_TYPES } from "./policy.js";
export type { RetryPolicy } from "./policy.js";
export type {
  Attempt,
  AttemptOutcome,
  Charge,
  ChargeRequest,
  ChargeResult,
  ChargeStatus,
  Operation,
  Problem,
  Refund,
  RefundReason,
  RefundRequest,
  RefundResult,
  RefundStatus,
} from "./types.js";
