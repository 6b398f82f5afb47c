/**
 * Where the daemon is: its Unix socket (the default), or the remote API over
 * TLS with a bearer token. Constructor options win over the environment,
 * field by field.
 *
 * | env | option | meaning |
 * |---|---|---|
 * | `SANDBOXD_SOCKET` | `socket` | Unix socket (default `/run/sandboxd/sandboxd.sock`) |
 * | `SANDBOXD_URL` | `url` | `https://host:port` of the remote API |
 * | `SANDBOXD_TOKEN` | `token` | bearer token for the remote API |
 * | `SANDBOXD_TLS_FINGERPRINT` | `tlsFingerprint` | SHA-256 of the server certificate to accept (and no other) |
 * | `SANDBOXD_CA_FILE` | `caFile` | CA bundle to verify the server with when not pinned |
 */

import { readFileSync } from "node:fs";
import { isIP } from "node:net";

import { ConfigurationError } from "./errors.js";

export const DEFAULT_SOCKET = "/run/sandboxd/sandboxd.sock";

export interface ConnectionOptions {
  /** Remote API base URL, `https://host:port`. Takes precedence over `SANDBOXD_SOCKET`. */
  url?: string;
  /** Bearer token (sent as `Authorization: Bearer ...`). */
  token?: string;
  /** Pinned SHA-256 of the server certificate: 64 hex digits, colons and a `sha256:` prefix allowed. */
  tlsFingerprint?: string;
  /** PEM CA bundle for normal verification (no pin). */
  caFile?: string;
  /** Unix socket path. Given explicitly, it wins over `SANDBOXD_URL`. */
  socket?: string;
}

export type Environment = Record<string, string | undefined>;

export interface UnixEndpoint {
  kind: "unix";
  socketPath: string;
}

export interface TlsEndpoint {
  kind: "tls";
  host: string;
  port: number;
  /** Path prefix of the URL, without a trailing slash ("" for none). */
  basePath: string;
  /** SNI name; absent for IP addresses. */
  servername: string | undefined;
  /** Lowercase hex SHA-256 of the one certificate accepted, or undefined for CA verification. */
  fingerprint: string | undefined;
  /** Extra CA certificates (PEM) for CA verification. */
  ca: Buffer | undefined;
  caFile: string | undefined;
}

export interface ResolvedConnection {
  endpoint: UnixEndpoint | TlsEndpoint;
  token: string | undefined;
}

function pick(option: string | undefined, env: string | undefined): string | undefined {
  if (option !== undefined && option !== "") return option;
  if (env !== undefined && env !== "") return env;
  return undefined;
}

/**
 * `AB:CD:...`, `abcd...`, `sha256:...` (any case) to 64 lowercase hex
 * digits; anything else is a ConfigurationError.
 */
export function normalizeFingerprint(value: string): string {
  const hex = value
    .trim()
    .replace(/^sha256:/i, "")
    .replace(/[:\s]/g, "")
    .toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(hex)) {
    throw new ConfigurationError(
      `TLS fingerprint ${JSON.stringify(value)} is not a SHA-256 fingerprint: give 64 hex digits (colons and a "sha256:" prefix are fine)`,
      { code: "invalid_fingerprint", field: "tlsFingerprint" },
    );
  }
  return hex;
}

function tlsEndpoint(url: string, fingerprint: string | undefined, caFile: string | undefined): TlsEndpoint {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new ConfigurationError(`SANDBOXD_URL ${JSON.stringify(url)} is not a URL; give https://host:port`, {
      code: "invalid_url",
      field: "url",
    });
  }
  if (parsed.protocol !== "https:") {
    throw new ConfigurationError(
      `SANDBOXD_URL ${JSON.stringify(url)} must be https:// (the remote API speaks TLS only; tokens never travel in clear text)`,
      { code: "invalid_url", field: "url" },
    );
  }
  if (parsed.username || parsed.password || parsed.search || parsed.hash) {
    throw new ConfigurationError(
      `SANDBOXD_URL ${JSON.stringify(url)} must be https://host:port[/prefix], without credentials, query or fragment`,
      { code: "invalid_url", field: "url" },
    );
  }
  const host = parsed.hostname.replace(/^\[(.*)\]$/, "$1");
  let ca: Buffer | undefined;
  if (caFile !== undefined) {
    try {
      ca = readFileSync(caFile);
    } catch (cause) {
      throw new ConfigurationError(`cannot read the CA file ${caFile}: ${(cause as Error).message}`, {
        code: "invalid_ca_file",
        field: "caFile",
        cause,
      });
    }
  }
  return {
    kind: "tls",
    host,
    port: parsed.port ? Number(parsed.port) : 443,
    basePath: parsed.pathname.replace(/\/+$/, ""),
    servername: isIP(host) ? undefined : host,
    fingerprint: fingerprint === undefined ? undefined : normalizeFingerprint(fingerprint),
    ca,
    caFile,
  };
}

/** The connection `options` and the environment describe. */
export function resolveConnection(options: ConnectionOptions = {}, env: Environment = process.env): ResolvedConnection {
  const token = pick(options.token, env.SANDBOXD_TOKEN);
  const explicitSocket = pick(options.socket, undefined);
  const url = explicitSocket === undefined ? pick(options.url, env.SANDBOXD_URL) : undefined;
  if (url !== undefined) {
    return {
      endpoint: tlsEndpoint(
        url,
        pick(options.tlsFingerprint, env.SANDBOXD_TLS_FINGERPRINT),
        pick(options.caFile, env.SANDBOXD_CA_FILE),
      ),
      token,
    };
  }
  return {
    endpoint: { kind: "unix", socketPath: explicitSocket ?? pick(undefined, env.SANDBOXD_SOCKET) ?? DEFAULT_SOCKET },
    token,
  };
}

/** A stable key for sharing one transport between equal connections. */
export function connectionKey(resolved: ResolvedConnection): string {
  const e = resolved.endpoint;
  const where =
    e.kind === "unix"
      ? ["unix", e.socketPath]
      : ["tls", e.host, String(e.port), e.basePath, e.fingerprint ?? "", e.caFile ?? ""];
  return JSON.stringify([...where, resolved.token ?? ""]);
}
