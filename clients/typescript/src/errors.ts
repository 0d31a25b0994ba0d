/**
 * Errors as exceptions. Every error answer of the server, `{"error": {"code", "message", ...}}`,
 * becomes an {@link ApiError} subclass chosen by its `code` (then by its status), carrying the
 * code and the fields the server named (`field`, `index`, `existingId`, `state`). A server that
 * cannot be reached gives {@link ConnectionFailed}.
 */

import type { components } from "./openapi.js";

type ErrorDetail = components["schemas"]["ErrorDetail"];

/** Base of every error this package throws. */
export class SundialError extends Error {
  override name = "SundialError";
}

/** The server could not be reached (refused, reset, timed out). Retrying later may work. */
export class ConnectionFailed extends SundialError {
  override name = "ConnectionFailed";
}

/** The server answered with an error status. */
export class ApiError extends SundialError {
  override name = "ApiError";
  /** Whether the same request may succeed later. */
  readonly retryable: boolean = false;
  readonly field?: string;
  readonly index?: number;
  readonly existingId?: string;
  readonly state?: string;

  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    detail: Partial<ErrorDetail> = {},
    /** The whole error body, or the text when it was not JSON. */
    readonly body?: unknown,
  ) {
    super(`${status} ${code}: ${message}`);
    this.field = detail.field ?? undefined;
    this.index = detail.index ?? undefined;
    this.existingId = detail.existing_id ?? undefined;
    this.state = detail.state ?? undefined;
    this.serverMessage = message;
  }

  /** The server's message, without the status and code. */
  readonly serverMessage: string;
  /** Seconds the server asked to wait before retrying (its `Retry-After`), if it said. */
  retryAfterSeconds?: number;
}

/** 400: the body was not JSON. */
export class Malformed extends ApiError { override name = "Malformed"; }
/** 401 `unauthenticated`: no token, or a bad, revoked or expired one. */
export class Unauthorized extends ApiError { override name = "Unauthorized"; }
/** 403: the token may not do this. */
export class Forbidden extends ApiError { override name = "Forbidden"; }
/** 404: no such task, schedule, workflow or route. */
export class NotFound extends ApiError { override name = "NotFound"; }
/** 405: the route exists, not with this method. */
export class MethodNotAllowed extends ApiError { override name = "MethodNotAllowed"; }
/** 409: valid, but in conflict with the current state. */
export class Conflict extends ApiError { override name = "Conflict"; }
/** 409 `wrong_state`: the task (or workflow) is in `state` and cannot do this. */
export class WrongState extends Conflict { override name = "WrongState"; }
/** 409 `stale_execution`: the execution id does not match the task's current attempt; stop working on it. */
export class StaleExecution extends Conflict { override name = "StaleExecution"; }
/**
 * 409 `already_exists`: a duplicate. A live task of the queue holds the key, a schedule with the
 * id exists, or a workflow with the id is running (or its id reuse policy refuses a new run).
 * `existingId` names the task holding the key, or the running workflow's run.
 */
export class AlreadyExists extends Conflict { override name = "AlreadyExists"; }
/** Other names for {@link AlreadyExists}, by what was duplicated. */
export const DuplicateKey = AlreadyExists;
export const AlreadyRunning = AlreadyExists;
/** 413: a body, payload, result or batch over its limit. */
export class TooLarge extends ApiError { override name = "TooLarge"; }
/** 422: well-formed but invalid; `field` (and `index` in a batch) name the culprit. */
export class Invalid extends ApiError { override name = "Invalid"; }
/** 429: too many requests (`too_many_polls`), or a create over its namespace's quota (`quota`);
 * retry later (`retryAfterSeconds`). */
export class RateLimited extends ApiError { override name = "RateLimited"; override readonly retryable = true; }
/** 500: the server failed. */
export class InternalError extends ApiError { override name = "InternalError"; }
/** 501: the server's store does not support this. */
export class Unsupported extends ApiError { override name = "Unsupported"; }
/** 503: the server cannot serve now (stopping, store closed, shard moving); retry later. */
export class Unavailable extends ApiError { override name = "Unavailable"; override readonly retryable = true; }
/** 503 `shutting_down`: the server is stopping. */
export class ShuttingDown extends Unavailable { override name = "ShuttingDown"; }

type ErrorClass = new (status: number, code: string, message: string, detail?: Partial<ErrorDetail>, body?: unknown) => ApiError;

const BY_CODE: Record<string, ErrorClass> = {
  malformed: Malformed,
  unauthenticated: Unauthorized,
  forbidden: Forbidden,
  not_found: NotFound,
  method_not_allowed: MethodNotAllowed,
  wrong_state: WrongState,
  stale_execution: StaleExecution,
  already_exists: AlreadyExists,
  too_large: TooLarge,
  invalid: Invalid,
  too_many_polls: RateLimited,
  quota: RateLimited,
  unavailable: Unavailable,
  shutting_down: ShuttingDown,
  internal: InternalError,
  unsupported: Unsupported,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: Malformed,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  405: MethodNotAllowed,
  409: Conflict,
  413: TooLarge,
  422: Invalid,
  429: RateLimited,
  500: InternalError,
  501: Unsupported,
  502: Unavailable,
  503: Unavailable,
  504: Unavailable,
};

/** The exception for an error answer (`body` parsed JSON, or text). */
export function errorFromResponse(status: number, body: unknown): ApiError {
  let detail: Partial<ErrorDetail> = {};
  if (body && typeof body === "object" && "error" in body) {
    const e = (body as { error: unknown }).error;
    if (e && typeof e === "object") detail = e as Partial<ErrorDetail>;
  }
  const code = detail.code || `http_${status}`;
  const message = detail.message || (typeof body === "string" && body ? body : `HTTP ${status}`);
  const cls = (detail.code && BY_CODE[detail.code]) || BY_STATUS[status] || ApiError;
  return new cls(status, code, message, detail, body);
}

/** Whether an error is worth retrying later (connection failures, 429, 5xx). */
export function isRetryable(e: unknown): boolean {
  if (e instanceof ConnectionFailed) return true;
  if (e instanceof ApiError) return e.retryable || e.status >= 500;
  return false;
}
