/**
 * Creates that are safe to retry. Every create carries a fresh
 * `idempotency_key`; the same body and key go again when the connection
 * fails (the daemon restarting, a reset mid-request) for up to 30 s, and
 * while the daemon answers 409 `create_in_progress` (the first attempt is
 * still running). A retried key returns the first attempt's result, so no
 * sandbox is made twice or left unclaimed.
 */

import { randomUUID } from "node:crypto";

import { ConflictError, SandboxConnectionError, TLSFingerprintError } from "./errors.js";
import type { Transport } from "./transport.js";
import type { WireSandbox } from "./types.js";

export interface RetryPolicy {
  /** How long connection errors are retried (default 30 s). */
  connectionRetryMs?: number;
  /** How long a create still in progress is waited on (default 10 min). */
  inProgressWaitMs?: number;
  /** Called before each retry (tests, logging). */
  onRetry?: (error: Error, attempt: number) => void;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export function newIdempotencyKey(): string {
  return `ts-${randomUUID()}`;
}

/** `POST /v1/sandboxes` with `body` (its key added when missing), retried as above. */
export async function createSandbox(
  transport: Transport,
  body: Record<string, unknown>,
  policy: RetryPolicy = {},
): Promise<WireSandbox> {
  const request = { ...body, idempotency_key: body.idempotency_key ?? newIdempotencyKey() };
  const connectionRetryMs = policy.connectionRetryMs ?? 30_000;
  const inProgressWaitMs = policy.inProgressWaitMs ?? 600_000;
  const started = Date.now();
  let failingSince: number | undefined;
  let delay = 50;
  for (let attempt = 1; ; attempt++) {
    try {
      return await transport.json<WireSandbox>("POST", "/v1/sandboxes", { json: request });
    } catch (error) {
      const now = Date.now();
      let again = false;
      if (error instanceof SandboxConnectionError && !(error instanceof TLSFingerprintError)) {
        failingSince ??= now;
        again = now - failingSince < connectionRetryMs;
      } else if (error instanceof ConflictError && error.code === "create_in_progress") {
        failingSince = undefined;
        again = now - started < inProgressWaitMs;
      }
      if (!again) throw error;
      policy.onRetry?.(error as Error, attempt);
      await sleep(delay);
      delay = Math.min(delay * 2, 1000);
    }
  }
}
