/**
 * TLS certificate pinning. The daemon's remote API usually serves a
 * self-signed certificate; the client then accepts exactly the certificate
 * whose SHA-256 (of its DER encoding) it was given, on every connection.
 *
 * How it holds: the agent's `createConnection` takes the asynchronous
 * callback form, so Node's HTTP client gets the socket only after the
 * handshake finished AND the fingerprint matched. Until then no request owns
 * the socket, so not one byte of the request (its token included) can be
 * written to a server with another certificate. Each connection makes a
 * full handshake (no session cache) and is checked on its own.
 */

import { createHash, timingSafeEqual } from "node:crypto";
import * as https from "node:https";
import type { Duplex } from "node:stream";
import * as tls from "node:tls";

import { SandboxConnectionError, TLSFingerprintError } from "./errors.js";

/** Lowercase hex SHA-256 of the DER certificate the peer presented, or undefined. */
export function peerFingerprint(socket: tls.TLSSocket): string | undefined {
  const cert = socket.getPeerCertificate();
  if (!cert || !cert.raw || cert.raw.length === 0) return undefined;
  return createHash("sha256").update(cert.raw).digest("hex");
}

function same(a: string, b: string): boolean {
  const x = Buffer.from(a, "utf8");
  const y = Buffer.from(b, "utf8");
  return x.length === y.length && timingSafeEqual(x, y);
}

export interface PinnedAgentOptions extends https.AgentOptions {
  /** 64 lowercase hex digits. */
  fingerprint: string;
  /** SNI name to send, if any (never an IP address). */
  servername?: string;
  /** Handshake deadline in milliseconds (default 30 s). */
  handshakeTimeoutMs?: number;
}

type Callback = (err: Error | null, stream: Duplex) => void;

export class PinnedAgent extends https.Agent {
  readonly fingerprint: string;
  private readonly pinServername: string | undefined;
  private readonly handshakeTimeoutMs: number;

  constructor(options: PinnedAgentOptions) {
    const { fingerprint, servername, handshakeTimeoutMs, ...agentOptions } = options;
    super(agentOptions);
    this.fingerprint = fingerprint;
    this.pinServername = servername;
    this.handshakeTimeoutMs = handshakeTimeoutMs ?? 30_000;
  }

  /**
   * Node calls this as `createConnection(options, callback)`; returning
   * nothing makes it wait for the callback.
   */
  override createConnection(options: https.RequestOptions, callback?: Callback): undefined {
    if (callback === undefined) {
      throw new TypeError("PinnedAgent.createConnection needs its callback (Node's HTTP client passes one)");
    }
    const where = `${options.host ?? "?"}:${options.port ?? "?"}`;
    const socket = tls.connect({
      host: options.host ?? undefined,
      port: options.port === undefined || options.port === null ? undefined : Number(options.port),
      servername: this.pinServername ?? "",
      // The chain of a self-signed certificate cannot verify; the pin below
      // decides instead, before the socket is handed out.
      rejectUnauthorized: false,
      ALPNProtocols: ["http/1.1"],
    });
    let settled = false;
    const settle = (err: Error | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.removeListener("error", onError);
      socket.removeListener("secureConnect", onSecure);
      if (err) {
        // Late errors of a refused socket must not crash the process.
        socket.on("error", () => {});
        socket.destroy();
        callback(err, socket);
      } else {
        callback(null, socket);
      }
    };
    const onError = (cause: Error) =>
      settle(new SandboxConnectionError(`TLS connection to ${where} failed: ${cause.message}`, { code: "connection_failed", cause }));
    const onSecure = () => {
      const got = peerFingerprint(socket);
      if (got === undefined || !same(got, this.fingerprint)) {
        settle(
          new TLSFingerprintError(
            `the server at ${where} presented a certificate with SHA-256 ${got ?? "(none)"}, not the pinned ${this.fingerprint}; nothing was sent`,
            { code: "tls_fingerprint_mismatch" },
          ),
        );
        return;
      }
      settle(null);
    };
    const timer = setTimeout(
      () => settle(new SandboxConnectionError(`TLS handshake with ${where} took over ${this.handshakeTimeoutMs} ms`, { code: "connection_timeout" })),
      this.handshakeTimeoutMs,
    );
    timer.unref();
    socket.once("error", onError);
    socket.once("secureConnect", onSecure);
    return undefined;
  }
}
