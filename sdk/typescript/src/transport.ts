/**
 * HTTP/1.1 to the daemon with Node's own `http`/`https`: over the Unix
 * socket, or over TLS (pinned or CA-verified) with a bearer token. Non-2xx
 * answers become typed errors; connection failures become SandboxConnectionError.
 */

import * as http from "node:http";
import * as https from "node:https";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

import { connectionKey, resolveConnection, type ConnectionOptions, type ResolvedConnection } from "./config.js";
import { SandboxConnectionError, SandboxdError, errorFromResponse } from "./errors.js";
import { PinnedAgent } from "./pinning.js";

export const USER_AGENT = "sandboxd-typescript/0.1.0";

export type QueryValue = string | number | boolean | undefined | null;

export type BodyInput = Buffer | Uint8Array | string | Readable | AsyncIterable<Uint8Array>;

export interface RequestOptions {
  query?: Record<string, QueryValue>;
  /** A JSON body (serialised here). */
  json?: unknown;
  /** A raw body; a stream or async iterable is sent chunked, never held whole. */
  body?: BodyInput;
  contentType?: string;
  headers?: Record<string, string>;
  /** Let Node exit while this request is open (long output streams). */
  unref?: boolean;
}

/** A connection error on a kept-alive socket the server had closed: safe to send again. */
class StaleSocketError extends Error {
  constructor(readonly error: SandboxConnectionError) {
    super(error.message);
  }
}

function replayable(body: BodyInput | undefined): body is Buffer | Uint8Array | string | undefined {
  return body === undefined || typeof body === "string" || body instanceof Uint8Array;
}

/** Reads a whole (small) body, keeping at most `limit` bytes. */
export async function readBody(res: http.IncomingMessage, limit = 1 << 20): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let kept = 0;
  for await (const chunk of res as AsyncIterable<Buffer>) {
    if (kept < limit) {
      const part = chunk.subarray(0, limit - kept);
      chunks.push(part);
      kept += part.length;
    }
  }
  return Buffer.concat(chunks);
}

export class Transport {
  readonly resolved: ResolvedConnection;
  private readonly agent: http.Agent;

  constructor(resolved: ResolvedConnection) {
    this.resolved = resolved;
    const e = resolved.endpoint;
    if (e.kind === "unix") {
      this.agent = new http.Agent({ keepAlive: true });
    } else if (e.fingerprint !== undefined) {
      this.agent = new PinnedAgent({ keepAlive: true, fingerprint: e.fingerprint, servername: e.servername });
    } else {
      this.agent = new https.Agent({ keepAlive: true, ca: e.ca, maxCachedSessions: 0 });
    }
  }

  /** Where requests go, for messages. */
  describe(): string {
    const e = this.resolved.endpoint;
    return e.kind === "unix" ? `unix:${e.socketPath}` : `https://${e.host.includes(":") ? `[${e.host}]` : e.host}:${e.port}${e.basePath}`;
  }

  /** Closes kept-alive connections. */
  close(): void {
    this.agent.destroy();
  }

  private path(path: string, query: Record<string, QueryValue> | undefined): string {
    const base = this.resolved.endpoint.kind === "tls" ? this.resolved.endpoint.basePath : "";
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value !== undefined && value !== null) params.append(key, String(value));
    }
    const qs = params.toString();
    return `${base}${path}${qs ? `?${qs}` : ""}`;
  }

  private connectionError(cause: Error, what: string): SandboxConnectionError {
    if (cause instanceof SandboxConnectionError) return cause;
    const code = (cause as NodeJS.ErrnoException).code;
    const e = this.resolved.endpoint;
    const hint =
      e.kind === "unix" && (code === "ENOENT" || code === "ECONNREFUSED")
        ? " (is sandboxd running? set SANDBOXD_SOCKET, or SANDBOXD_URL for a remote daemon)"
        : "";
    return new SandboxConnectionError(`${what}: cannot reach sandboxd at ${this.describe()}: ${cause.message}${hint}`, {
      code: "connection_failed",
      cause,
    });
  }

  private once(method: string, path: string, options: RequestOptions, body: BodyInput | undefined): Promise<http.IncomingMessage> {
    const what = `${method} ${path}`;
    const headers: Record<string, string> = {
      "user-agent": USER_AGENT,
      accept: "application/json",
      ...options.headers,
    };
    if (this.resolved.token !== undefined) headers.authorization = `Bearer ${this.resolved.token}`;
    if (body !== undefined) headers["content-type"] = options.contentType ?? "application/octet-stream";
    const e = this.resolved.endpoint;
    const target =
      e.kind === "unix"
        ? { socketPath: e.socketPath, host: "sandboxd" }
        : { host: e.host, port: e.port, servername: e.servername };
    const send = e.kind === "unix" ? http.request : https.request;
    return new Promise((resolve, reject) => {
      let responded = false;
      let sourceError: Error | undefined;
      const req = send(
        { ...target, agent: this.agent, method, path: this.path(path, options.query), headers },
        (res) => {
          responded = true;
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) {
            resolve(res);
            return;
          }
          readBody(res).then(
            (text) => reject(errorFromResponse(status, text.toString("utf8"), method, path)),
            (cause: Error) => reject(this.connectionError(cause, what)),
          );
        },
      );
      if (options.unref) req.on("socket", (socket) => socket.unref());
      req.on("error", (cause: Error) => {
        if (responded) return;
        if (sourceError !== undefined) {
          reject(sourceError);
          return;
        }
        const error = this.connectionError(cause, what);
        reject(req.reusedSocket && !(cause instanceof SandboxdError) ? new StaleSocketError(error) : error);
      });
      if (body === undefined) {
        req.end();
      } else if (replayable(body)) {
        const buffer = typeof body === "string" ? Buffer.from(body, "utf8") : body;
        req.setHeader("content-length", String(buffer.length));
        req.end(buffer);
      } else {
        const source = body instanceof Readable ? body : Readable.from(body);
        source.once("error", (err: Error) => {
          sourceError = err;
        });
        pipeline(source, req).catch((err: Error) => {
          // A response that came first (a 413 mid-upload) has the say.
          if (!responded) req.destroy(sourceError ?? err);
        });
      }
    });
  }

  /** Sends one request; resolves with the (2xx) response for the caller to read. */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<http.IncomingMessage> {
    const body: BodyInput | undefined = options.json !== undefined ? JSON.stringify(options.json) : options.body;
    const opts = options.json !== undefined ? { ...options, contentType: "application/json" } : options;
    try {
      return await this.once(method, path, opts, body);
    } catch (error) {
      if (!(error instanceof StaleSocketError)) throw error;
      // The daemon had closed the idle kept-alive connection before it
      // read this request: send it again on a fresh one.
      if (!replayable(body)) throw error.error;
      try {
        return await this.once(method, path, opts, body);
      } catch (again) {
        throw again instanceof StaleSocketError ? again.error : again;
      }
    }
  }

  /** A request whose answer is JSON (or empty: `undefined`). */
  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, options);
    let text: string;
    try {
      text = (await readBody(res, 512 << 20)).toString("utf8");
    } catch (cause) {
      throw this.connectionError(cause as Error, `${method} ${path}`);
    }
    if (text.trim() === "") return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (cause) {
      throw new SandboxdError(`${method} ${path}: the daemon answered ${res.statusCode} with a body that is not JSON`, {
        status: res.statusCode,
        code: "invalid_response",
        cause,
      });
    }
  }

  /** A request whose answer body does not matter (204s). */
  async empty(method: string, path: string, options: RequestOptions = {}): Promise<void> {
    const res = await this.request(method, path, options);
    res.resume();
    await new Promise<void>((resolve) => {
      res.once("end", resolve);
      res.once("close", resolve);
    });
  }
}

const shared = new Map<string, Transport>();

/** The transport for `options`, shared between equal connections (keep-alive). */
export function transportFor(options: ConnectionOptions = {}): Transport {
  const resolved = resolveConnection(options);
  const key = connectionKey(resolved);
  let transport = shared.get(key);
  if (transport === undefined) {
    transport = new Transport(resolved);
    shared.set(key, transport);
  }
  return transport;
}

/** Closes every shared transport's idle connections. */
export function closeAllTransports(): void {
  for (const transport of shared.values()) transport.close();
  shared.clear();
}
