/**
 * Preview URLs (exposed ports, docs/preview-urls.md): the `PreviewUrl` an
 * instance hands out, the tokens it was given, and the errors of a daemon
 * without preview URLs.
 *
 * The daemon shows a port's token once, in the answer that made it
 * (expose, rotate, a create with `ports`), and keeps only its hash; so the
 * instance that got it keeps it and hands it out with the port's URL from
 * then on (`ports()`, `previewUrl(port)`).
 */

import { BadRequestError, ConfigurationError, FeatureUnavailableError, NotFoundError, isMissingRoute } from "./errors.js";

export type PortAuth = "token" | "none";
export type PortProtocol = "http" | "tcp";

/** The daemon's `PortUrl`. */
export interface WirePort {
  port: number;
  protocol?: PortProtocol;
  auth?: PortAuth;
  url?: string;
  path_url?: string;
  address?: string;
  token?: string;
}

/** The daemon's `PortList`. */
export interface WirePortList {
  ports?: WirePort[];
  listening?: Array<{ port: number; address: string; exposed: boolean }>;
}

/** A TCP socket something in the sandbox listens on (`listeningPorts()`). */
export interface ListeningPort {
  port: number;
  /** What it is bound to: `0.0.0.0`, `::`, `127.0.0.1`... (the ingress reaches either). */
  address: string;
  exposed: boolean;
}

/** An exposed port without its token (`SandboxInfo.ports`). */
export interface PortInfo {
  port: number;
  protocol: PortProtocol;
  auth: PortAuth;
  url: string | undefined;
  pathUrl: string | undefined;
  address: string | undefined;
}

const inspectCustom = Symbol.for("nodejs.util.inspect.custom");

/**
 * An exposed port of a sandbox. `String(url)` (and a template string) is
 * the URL to hand out, as Beam's `expose_port` returns it: `url`
 * (host-name routing, `<id>-<port>.<ingress_domain>`) when the daemon has
 * an `ingress_domain`, else `pathUrl` (`/<id>/<port>/` on the ingress),
 * else `address` (a raw TCP port's `host:port`); `href` is the same.
 *
 * `token` is the secret a token URL needs, known only to the instance that
 * exposed the port, created the sandbox with it, or rotated its token
 * (undefined otherwise and for public ports). Send it as `headers`, or give
 * a browser `withToken()`. `console.log` does not show it.
 */
export class PreviewUrl {
  readonly port: number;
  readonly protocol: PortProtocol;
  readonly auth: PortAuth;
  /** Host-name routing; undefined without `ingress_domain` and for raw TCP. */
  readonly url: string | undefined;
  /** Path routing; undefined for raw TCP. */
  readonly pathUrl: string | undefined;
  /** A raw TCP port's `host:port`. */
  readonly address: string | undefined;
  readonly token: string | undefined;

  constructor(wire: WirePort, token?: string) {
    this.port = wire.port;
    this.protocol = wire.protocol ?? "http";
    this.auth = wire.auth ?? "token";
    this.url = wire.url || undefined;
    this.pathUrl = wire.path_url || undefined;
    this.address = wire.address || undefined;
    this.token = wire.token || token || undefined;
  }

  /** The URL to hand out (as `toString()`). */
  get href(): string {
    return this.url ?? this.pathUrl ?? this.address ?? "";
  }

  toString(): string {
    return this.href;
  }

  /** The header that carries the token, or `{}` when there is none to send. */
  get headers(): Record<string, string> {
    return this.token ? { "X-Sandbox-Token": this.token } : {};
  }

  /**
   * The host-name URL with `?sandbox_token=TOKEN`, for a browser: the
   * ingress answers it with a redirect to the plain URL and a cookie
   * holding the token. The URL itself without a token. Whoever has it can
   * use the URL. Throws ConfigurationError when there is only a path URL:
   * every sandbox shares its origin, so the ingress takes the token there
   * in a header only (give the daemon an `ingress_domain`).
   */
  withToken(): string {
    if (!this.token || this.protocol !== "http") return this.href;
    if (!this.url) {
      throw new ConfigurationError(
        "path URLs take their token in a header only (X-Sandbox-Token or Authorization: Bearer); a browser URL needs the daemon's ingress_domain",
        { code: "no_host_url", field: "port" },
      );
    }
    const sep = this.url.includes("?") ? "&" : "?";
    return `${this.url}${sep}sandbox_token=${encodeURIComponent(this.token)}`;
  }

  /** The daemon's `PortUrl` again, token included when known. */
  toWire(): WirePort {
    const out: WirePort = { port: this.port, protocol: this.protocol, auth: this.auth };
    if (this.url !== undefined) out.url = this.url;
    if (this.pathUrl !== undefined) out.path_url = this.pathUrl;
    if (this.address !== undefined) out.address = this.address;
    if (this.token !== undefined) out.token = this.token;
    return out;
  }

  /** @internal How `console.log` shows it: without the token. */
  [inspectCustom](): string {
    const token = this.token ? "'…'" : "undefined";
    return `PreviewUrl { href: '${this.href}', port: ${this.port}, protocol: '${this.protocol}', auth: '${this.auth}', token: ${token} }`;
  }
}

export function portInfo(w: WirePort): PortInfo {
  return {
    port: w.port,
    protocol: w.protocol ?? "http",
    auth: w.auth ?? "token",
    url: w.url || undefined,
    pathUrl: w.path_url || undefined,
    address: w.address || undefined,
  };
}

/** The tokens an instance was given, by port. */
export class PortTokens {
  private readonly tokens = new Map<number, string>();

  /** An answer that may carry a new token (expose, rotate, create). */
  granted(wire: WirePort): PreviewUrl {
    const url = new PreviewUrl(wire, this.tokens.get(wire.port));
    if (wire.token) this.tokens.set(wire.port, wire.token);
    else if (url.auth !== "token") this.tokens.delete(wire.port);
    return url;
  }

  /** A whole listing: each port with its token; tokens of ports gone are dropped. */
  listed(ports: WirePort[] | undefined): PreviewUrl[] {
    const out = (ports ?? []).map((p) => this.granted(p));
    const live = new Set(out.filter((u) => u.auth === "token").map((u) => u.port));
    for (const port of [...this.tokens.keys()]) if (!live.has(port)) this.tokens.delete(port);
    return out;
  }

  forget(port: number): void {
    this.tokens.delete(port);
  }
}

export const PREVIEW_URLS_MISSING =
  "preview URLs (exposePort / listUrls / ports) need a sandboxd with preview URLs (POST/GET /v1/sandboxes/{id}/ports, docs/preview-urls.md); this daemon has no such route: upgrade it";

/**
 * The error of a preview-URL call: a daemon without the routes, or with its
 * ingress off (400 `ingress_disabled`, keeping the daemon's code, message
 * and status), is a FeatureUnavailableError; other errors stay as they are.
 */
export function portsError(error: unknown, field?: string): unknown {
  if (isMissingRoute(error)) {
    return new FeatureUnavailableError(PREVIEW_URLS_MISSING, {
      status: error.status,
      code: "feature_unavailable",
      field,
      method: error.method,
      path: error.path,
      cause: error,
    });
  }
  if (error instanceof BadRequestError && error.code === "ingress_disabled") {
    return new FeatureUnavailableError(error.message, {
      status: error.status,
      code: error.code,
      field: error.field ?? field,
      method: error.method,
      path: error.path,
      cause: error,
    });
  }
  return error;
}

/** A create's error with `ports`: the field refused (no preview URLs) or the ingress off. */
export function createPortsError(error: unknown): unknown {
  if (error instanceof BadRequestError && /unknown field `ports`/.test(error.message)) {
    return new FeatureUnavailableError(PREVIEW_URLS_MISSING, {
      status: error.status,
      code: "feature_unavailable",
      field: "ports",
      method: error.method,
      path: error.path,
      cause: error,
    });
  }
  return portsError(error, "ports");
}

export function checkedPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new ConfigurationError(`port ${String(port)} must be a whole number in 1..65535`, { code: "invalid_port", field: "port" });
  }
  return port;
}

export function exposeBody(port: number, auth: PortAuth, protocol: PortProtocol): Record<string, unknown> {
  if (auth !== "token" && auth !== "none") {
    throw new ConfigurationError(`auth must be "token" (the URL needs its token) or "none" (public), not ${JSON.stringify(auth)}`, {
      code: "invalid_auth",
      field: "auth",
    });
  }
  if (protocol !== "http" && protocol !== "tcp") {
    throw new ConfigurationError(`protocol must be "http" or "tcp" (a raw TCP port), not ${JSON.stringify(protocol)}`, {
      code: "invalid_protocol",
      field: "protocol",
    });
  }
  return { port: checkedPort(port), auth, protocol };
}

export function notExposed(sandboxId: string, port: number, path: string): NotFoundError {
  return new NotFoundError(`port ${port} of sandbox ${sandboxId} is not exposed; exposePort(${port}) exposes it`, {
    status: 404,
    code: "port_not_exposed",
    method: "GET",
    path,
  });
}
