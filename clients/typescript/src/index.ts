/**
 * `idem-client`: a client for idem's charge and refund API that retries right.
 *
 * One call to {@link IdemClient.charge} is one payment intent: one
 * idempotency key and the same body bytes on every attempt, so however often
 * it retries, the server charges at most once. One call to
 * {@link IdemClient.refund} is one refund intent, retried the same way; so
 * are the steps of a two-step payment: {@link IdemClient.authorize} (hold the
 * amount), {@link IdemClient.capture} (take part or all of it) and
 * {@link IdemClient.void} (release the rest).
 */

export { IdemClient, newKey } from "./client.js";
export type {
  AttemptReply,
  AttemptRequest,
  CaptureOptions,
  ChargeOptions,
  IdemClientOptions,
  RefundOptions,
  VoidOptions,
} from "./client.js";
export {
  ApiError,
  CaptureExceedsAuthorizationError,
  CaptureFailedError,
  ChargeNotAuthorizedError,
  ChargeNotRefundableError,
  GaveUpError,
  IdemError,
  KeyExpiredError,
  KeyReusedError,
  RefundExceedsCapturedError,
  RefundFailedError,
  VoidFailedError,
} from "./errors.js";
export { DEFAULT_RETRY_POLICY, PROBLEM_TYPES } from "./policy.js";
export type { RetryPolicy } from "./policy.js";
export type {
  Attempt,
  AttemptOutcome,
  Capture,
  CaptureRequest,
  CaptureResult,
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
  StepStatus,
  Void,
  VoidResult,
} from "./types.js";
