/**
 * The shapes of the idem charge, refund and two-step API as a client sees them. Wire field names
 * stay as the API spells them (snake_case); the client's own options are
 * camelCase.
 */

/** What a call makes: a charge, a refund, or a step of a two-step payment. */
export type Operation = "charge" | "refund" | "authorize" | "capture" | "void";

/** The body of `POST /v1/charges` (docs/contract/api.md). */
export interface ChargeRequest {
  /**
   * The merchant's order this charge pays for: an integer from 1 to 2^63 - 1.
   * A `number` must be a safe integer; larger ids go as a `bigint`.
   */
  order_id: number | bigint;
  /** Minor units, 1 to 10,000,000,000 (a safe integer, or a `bigint`). */
  amount_cents: number | bigint;
  /** ISO 4217 alpha-3, upper case. Left out (or `null`): the server reads `BRL`. */
  currency?: string | null;
  /** At most 500 characters, no control characters; kept with the charge. */
  description?: string | null;
}

/**
 * A charge's status. Only `processing` and `authorized` ever change;
 * `authorized` and `voided` are a two-step charge's.
 */
export type ChargeStatus = "processing" | "captured" | "declined" | "failed" | "authorized" | "voided";

/** The charge, as the `201` body or a `402`/`502` problem's `charge` holds it. */
export interface Charge {
  /** `ch_` and 24 letters and digits. */
  id: string;
  /**
   * The order id. Parsed as a JSON number: ids above 2^53 lose precision here
   * (the exact bytes are in {@link ChargeResult.body}).
   */
  order_id: number;
  amount_cents: number;
  currency: string;
  status: ChargeStatus;
  /** What idem sends the acquirer for this charge, the same on every call. */
  acquirer_reference: string;
  /** The acquirer's reason when `declined`, else `null`. */
  decline_reason: string | null;
  /** When the charge was claimed, UTC, to the second (RFC 3339). */
  created_at: string;
  /** A two-step charge's (absent on a one-step charge): the sum of its captures made. */
  amount_captured_cents?: number;
  /**
   * A two-step charge's: what a capture may still take (the authorized amount
   * less the captures made or pending; 0 once the authorization is closed).
   */
  amount_capturable_cents?: number;
}

/**
 * An `application/problem+json` document (RFC 9457). Branch on `type`
 * (`urn:idem:problem:<kind>`), never on `title` or `detail`.
 */
export interface Problem {
  type: string;
  title?: string;
  status?: number;
  detail?: string;
  /** The body field at fault (`invalid-body`). */
  field?: string;
  /** A reused key's fields that differ (`idempotency-key-reused`). */
  differing_fields?: string[];
  /** The charge (`charge-declined`, `acquirer-rejected`). */
  charge?: Charge;
  /** The charge a key made (`key-expired`, `idempotency-key-reused`, `charge-under-review`). */
  charge_id?: string;
  /** The refund (`refund-failed`). */
  refund?: Refund;
  /** The refund a key made (`key-expired`, `idempotency-key-reused`, `outcome-unknown`, `refund-under-review`). */
  refund_id?: string;
  /** The capture (`capture-failed`). */
  capture?: Capture;
  /** The capture a key made (`key-expired`, `idempotency-key-reused`, `outcome-unknown`, `step-under-review`). */
  capture_id?: string;
  /** The void (`void-failed`). */
  void?: Void;
  /** The void a key made, as `capture_id`. */
  void_id?: string;
  /**
   * What the charge has left to refund (`refund-exceeds-captured`), or the
   * authorization to capture (`capture-exceeds-authorization`).
   */
  remaining_cents?: number;
  [extension: string]: unknown;
}

/** How one HTTP attempt ended. */
export type AttemptOutcome =
  /** The server answered and its whole body was read. */
  | "answer"
  /** No complete answer within the attempt's timeout: the outcome is unknown. */
  | "timeout"
  /** Refused, reset, or closed before the whole answer was read: the outcome may be unknown. */
  | "connection-failed";

/** One HTTP attempt of a call. */
export interface Attempt {
  /** The base URL the attempt went to, exactly as given to the client. */
  endpoint: string;
  outcome: AttemptOutcome;
  /** The answer's HTTP status when `outcome` is `"answer"`, else `null`. */
  status: number | null;
  /** What went wrong when there was no complete answer, else `null`. */
  error: string | null;
  /** When the attempt was sent, in milliseconds since the call started. */
  startedMs: number;
  /** From sending to the end of the attempt (the wait before it not included). */
  elapsedMs: number;
}

/**
 * A stored outcome: `201` (captured; for an authorization, authorized), `402`
 * (declined) or `502` `acquirer-rejected` (failed, no money moved). Branch on
 * `charge.status`.
 */
export interface ChargeResult {
  /** The final answer's HTTP status: `201`, `402` or `502`. */
  status: number;
  /** The charge: the `201` body, or the problem's `charge`. */
  charge: Charge;
  /** The problem document of a `402` or `502`; `null` for a `201`. */
  problem: Problem | null;
  /** The idempotency key every attempt carried (unquoted). */
  key: string;
  /** The answer carried `Idempotent-Replayed: true`: an earlier attempt (or call) stored it. */
  replayed: boolean;
  /** `Idempotency-TTL`: how many more seconds the key is honoured, or `null` when absent. */
  idempotencyTtl: number | null;
  /** The answer's exact bytes, so a replay can be compared byte for byte. */
  body: Uint8Array;
  /** Every attempt in order, the final one last. */
  attempts: Attempt[];
}

/** The reasons idem takes for a refund (any other is `400` `invalid-body`). */
export type RefundReason = "requested_by_customer" | "duplicate" | "fraudulent" | "other";

/** The body of `POST /v1/charges/{id}/refunds` (docs/contract/api.md); every field optional. */
export interface RefundRequest {
  /** Minor units, 1 to 10,000,000,000 (a safe integer, or a `bigint`). Left out: all the charge has left. */
  amount_cents?: number | bigint | null;
  reason?: RefundReason | null;
  /** At most 500 characters, no control characters. */
  description?: string | null;
}

/** A refund's status. Only `pending` ever changes. */
export type RefundStatus = "pending" | "succeeded" | "failed";

/** The refund, as the `201` body or a `refund-failed` problem's `refund` holds it. */
export interface Refund {
  /** `re_` and 24 letters and digits. */
  id: string;
  charge_id: string;
  amount_cents: number;
  /** The charge's currency. */
  currency: string;
  status: RefundStatus;
  reason: RefundReason | null;
  description: string | null;
  /** The refund's own reference at the acquirer, the same on every call. */
  acquirer_reference: string;
  /** The acquirer's reason when `failed`, else `null`. */
  failure_reason: string | null;
  /** When the refund was claimed, UTC, to the second (RFC 3339). */
  created_at: string;
}

/**
 * A refund the acquirer paid back (`201`). A refund it refused for good is a
 * {@link RefundFailedError}, also a stored outcome.
 */
export interface RefundResult {
  /** The final answer's HTTP status: `201`. */
  status: number;
  refund: Refund;
  /** The idempotency key every attempt carried (unquoted). */
  key: string;
  /** The answer carried `Idempotent-Replayed: true`: an earlier attempt (or call) stored it. */
  replayed: boolean;
  /** `Idempotency-TTL`: how many more seconds the key is honoured, or `null` when absent. */
  idempotencyTtl: number | null;
  /** The answer's exact bytes, so a replay can be compared byte for byte. */
  body: Uint8Array;
  /** Every attempt in order, the final one last. */
  attempts: Attempt[];
}

/** The body of `POST /v1/charges/{id}/captures` (docs/contract/api.md); every field optional. */
export interface CaptureRequest {
  /** Minor units, 1 to 10,000,000,000 (a safe integer, or a `bigint`). Left out: all the authorization has left. */
  amount_cents?: number | bigint | null;
  /** `true` (the default): the capture closes the authorization and releases the rest; `false` leaves it capturable. */
  final?: boolean | null;
}

/** A capture's or a void's status. Only `pending` ever changes. */
export type StepStatus = "pending" | "succeeded" | "failed";

/** A capture of an authorized charge, as the `201` body or a `capture-failed` problem's `capture` holds it. */
export interface Capture {
  /** `cp_` and 24 letters and digits. */
  id: string;
  charge_id: string;
  amount_cents: number;
  /** The charge's currency. */
  currency: string;
  /** It closed the authorization (what it left was released). */
  final: boolean;
  status: StepStatus;
  /** The capture's own reference at the acquirer, the same on every call. */
  acquirer_reference: string;
  /** The acquirer's reason when `failed`, else `null`. */
  failure_reason: string | null;
  /** When the capture was claimed, UTC, to the second (RFC 3339). */
  created_at: string;
}

/** A void of an authorized charge, as the `201` body or a `void-failed` problem's `void` holds it. */
export interface Void {
  /** `vd_` and 24 letters and digits. */
  id: string;
  charge_id: string;
  /** What it released: the authorization's amount less its captures. */
  amount_cents: number;
  currency: string;
  status: StepStatus;
  /** The void's own reference at the acquirer, the same on every call. */
  acquirer_reference: string;
  /** The acquirer's reason when `failed`, else `null`. */
  failure_reason: string | null;
  /** When the void was claimed, UTC, to the second (RFC 3339). */
  created_at: string;
}

/**
 * A capture the acquirer made (`201`). One it refused for good is a
 * {@link CaptureFailedError}, also a stored outcome.
 */
export interface CaptureResult {
  /** The final answer's HTTP status: `201`. */
  status: number;
  capture: Capture;
  /** The idempotency key every attempt carried (unquoted). */
  key: string;
  /** The answer carried `Idempotent-Replayed: true`: an earlier attempt (or call) stored it. */
  replayed: boolean;
  /** `Idempotency-TTL`: how many more seconds the key is honoured, or `null` when absent. */
  idempotencyTtl: number | null;
  /** The answer's exact bytes, so a replay can be compared byte for byte. */
  body: Uint8Array;
  /** Every attempt in order, the final one last. */
  attempts: Attempt[];
}

/**
 * A void the acquirer made (`201`): the authorization is released. One it
 * refused for good is a {@link VoidFailedError}.
 */
export interface VoidResult {
  /** The final answer's HTTP status: `201`. */
  status: number;
  void: Void;
  /** The idempotency key every attempt carried (unquoted). */
  key: string;
  /** The answer carried `Idempotent-Replayed: true`: an earlier attempt (or call) stored it. */
  replayed: boolean;
  /** `Idempotency-TTL`: how many more seconds the key is honoured, or `null` when absent. */
  idempotencyTtl: number | null;
  /** The answer's exact bytes, so a replay can be compared byte for byte. */
  body: Uint8Array;
  /** Every attempt in order, the final one last. */
  attempts: Attempt[];
}
