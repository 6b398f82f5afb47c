/**
 * Typed errors. Every error the daemon sends has the shape
 * `{"error": {"code", "message", "resource"?, "field"?}}`; its HTTP status
 * picks the class, and the class carries the daemon's code, message, field
 * and resource as they came.
 */

export interface ErrorInit {
  /** HTTP status, absent when no response came (connection errors). */
  status?: number;
  /** The daemon's error code (`sandbox_not_found`, `invalid_json`, ...). */
  code: string;
  /** The request field at fault, where one is. */
  field?: string;
  /** The resource that ran out (503: cpu, memory, disk, gpu, sandboxes). */
  resource?: string;
  cause?: unknown;
}

/** Base class of every error this SDK throws. */
export class SandboxdError extends Error {
  readonly status: number | undefined;
  readonly code: string;
  readonly field: string | undefined;
  readonly resource: string | undefined;

  constructor(message: string, init: ErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.field = init.field;
    this.resource = init.resource;
  }
}

/**
 * The daemon answered with an error status. `method` and `path` say which
 * request it was.
 */
export class APIError extends SandboxdError {
  declare readonly status: number;
  readonly method: string | undefined;
  readonly path: string | undefined;

  constructor(message: string, init: ErrorInit & { status: number; method?: string; path?: string }) {
    super(message, init);
    this.method = init.method;
    this.path = init.path;
  }
}

/** 400: the request is malformed or impossible; `field` names the culprit. */
export class BadRequestError extends APIError {}

/** 401: the remote API wants a valid bearer token (`SANDBOXD_TOKEN`). */
export class AuthenticationError extends APIError {}

/** 403: the token may not do this. */
export class PermissionDeniedError extends APIError {}

/** 404: unknown sandbox, process, snapshot, image or file. */
export class NotFoundError extends APIError {}

/** 409: the request conflicts with the object's state (an exited process, a reused idempotency key). */
export class ConflictError extends APIError {}

/** 413: an upload over the daemon's `max_upload_mib`. */
export class PayloadTooLargeError extends APIError {}

/** 503: the host cannot take it now; `resource` says what ran out (cpu, memory, disk, gpu, sandboxes). */
export class CapacityError extends APIError {}

/** Any other error status (a 500 is a bug in the daemon). */
export class ServerError extends APIError {}

/**
 * This daemon cannot do it: it has no route for it (a sandboxd older than
 * the feature; `code` `feature_unavailable`), or the feature is off in its
 * configuration (preview URLs without `ingress_listen`, raw TCP ports
 * without `ingress_tcp_ports`: `status` 400, `code` `ingress_disabled`, the
 * daemon's message).
 */
export class FeatureUnavailableError extends APIError {}

/** The daemon could not be reached, or the connection broke. */
export class SandboxConnectionError extends SandboxdError {}

/**
 * The server's TLS certificate is not the pinned one
 * (`SANDBOXD_TLS_FINGERPRINT`). Nothing was sent on that connection; never retried.
 */
export class TLSFingerprintError extends SandboxConnectionError {}

/** The options or environment describe no usable connection, or an option is malformed. */
export class ConfigurationError extends SandboxdError {}

/**
 * A process operation failed; also what `wait(timeout)` rejects with when
 * the process still runs at the timeout (as Beam's): the process is left
 * running, `kill()` ends it.
 */
export class SandboxProcessError extends SandboxdError {
  readonly processId: number | undefined;

  constructor(message: string, init: ErrorInit & { processId?: number }) {
    super(message, init);
    this.processId = init.processId;
  }
}

interface DaemonErrorBody {
  error?: { code?: unknown; message?: unknown; field?: unknown; resource?: unknown };
}

function str(value: unknown): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

/**
 * The field a 400 is about: the daemon's `field` member, or, from a daemon
 * that does not send it yet, the one its message names (`field \`x\``).
 */
function fieldOf(message: string, field: string | undefined): string | undefined {
  if (field !== undefined) return field;
  const named = /field `([^`]+)`/.exec(message);
  return named ? named[1] : undefined;
}

/** The typed error for a non-2xx response to `method path` with body `text`. */
export function errorFromResponse(status: number, text: string, method: string, path: string): APIError {
  const what = `${method} ${path}`;
  let detail: DaemonErrorBody["error"];
  try {
    const parsed = JSON.parse(text) as DaemonErrorBody;
    if (parsed && typeof parsed === "object" && parsed.error && typeof parsed.error === "object") {
      detail = parsed.error;
    }
  } catch {
    detail = undefined;
  }
  const fromDaemon = detail !== undefined && str(detail.code) !== undefined;
  const code = fromDaemon ? (str(detail?.code) as string) : `http_${status}`;
  const snippet = text.trim().slice(0, 200);
  const message = fromDaemon
    ? str(detail?.message) ?? code
    : `${what}: HTTP ${status}${snippet ? `: ${snippet}` : " with no error body"}`;
  const init = {
    status,
    method,
    path,
    code,
    field: fieldOf(message, fromDaemon ? str(detail?.field) : undefined),
    resource: fromDaemon ? str(detail?.resource) : undefined,
  };
  switch (status) {
    case 400:
      return new BadRequestError(message, init);
    case 401:
      return new AuthenticationError(message, init);
    case 403:
      return new PermissionDeniedError(message, init);
    case 404:
      return new NotFoundError(message, init);
    case 409:
      return new ConflictError(message, init);
    case 413:
      return new PayloadTooLargeError(message, init);
    case 503:
      return new CapacityError(message, init);
    default:
      return new ServerError(message, init);
  }
}

/**
 * True for a 404/405 that no daemon handler wrote (no error body, or a
 * router's generic `not_found`): the route does not exist. The daemon's own
 * 404s name what is missing (`sandbox_not_found`, `port_not_exposed`).
 */
export function isMissingRoute(error: unknown): error is APIError {
  return (
    error instanceof APIError &&
    (error.status === 405 || (error.status === 404 && (error.code === "http_404" || error.code === "not_found")))
  );
}
