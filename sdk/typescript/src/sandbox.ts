/**
 * `Sandbox` (what to create, Beam-style) and `SandboxInstance` (a running
 * sandbox: `process`, `fs`, TTL, network, ports, snapshots, terminate).
 */

import type { ConnectionOptions } from "./config.js";
import { createSandbox, type RetryPolicy } from "./create.js";
import { ConfigurationError, NotFoundError } from "./errors.js";
import { SandboxFileSystem } from "./fs.js";
import { imageField, type Image } from "./image.js";
import {
  PortTokens,
  PreviewUrl,
  checkedPort,
  createPortsError,
  exposeBody,
  notExposed,
  portsError,
  type ListeningPort,
  type PortAuth,
  type PortProtocol,
  type WirePort,
  type WirePortList,
} from "./ports.js";
import { SandboxProcessManager } from "./process.js";
import { transportFor, type Transport } from "./transport.js";
import { sandboxInfo, snapshotInfo, type SandboxInfo, type SnapshotInfo, type WireSandbox, type WireSnapshot } from "./types.js";
import { parseCpu, parseMemory } from "./units.js";

export interface SandboxOptions extends ConnectionOptions {
  /** CPU cores: `1`, `0.5`, `"500m"`. */
  cpu?: number | string;
  /** MiB as a number, or `"512Mi"`, `"1Gi"`. */
  memory?: number | string;
  /** Size limit of the writable layer: MiB as a number, or `"10Gi"`. */
  disk?: number | string;
  /** Most tasks (processes and threads). */
  pids?: number;
  /**
   * CPU weight against other sandboxes when the CPUs are contended, in
   * cgroup v1 shares (2 to 262144; 1024 is the default). A sandbox with a
   * weight other than 1024 is never a pool claim.
   */
  cpuShares?: number;
  /** A name (`python`), an OCI reference, a filesystem snapshot id, or an Image. */
  image?: string | Image;
  /** GPU model as users write it (`"H100"`, `"RTX4090"`, `"any"`). */
  gpu?: string;
  gpuCount?: number;
  /** true: nothing leaves the sandbox; false: open egress. */
  blockNetwork?: boolean;
  /** Hosts, `*.wildcards`, addresses and CIDRs the sandbox may reach (only those). */
  allowList?: string[];
  /** Names of brokered secrets to bind. */
  secrets?: string[];
  /** Environment of every process. */
  env?: Record<string, string>;
  /**
   * Ports to expose as preview URLs (HTTP, token auth) once it is ready;
   * the instance holds their tokens (`previewUrl(port)`, `ports()`).
   */
  ports?: number[];
  /** Lifetime in seconds from now (the daemon's TTL); -1 = none. */
  keepWarmSeconds?: number;
  /** A KVM microVM instead of a container. */
  useVm?: boolean;
  labels?: Record<string, string>;
  /** Retry bounds of the idempotent create. */
  retry?: RetryPolicy;
}

export interface NetworkPermissions {
  blockNetwork?: boolean;
  allowList?: string[];
}

export interface ExposePortOptions {
  /** `token` (default: the URL needs its token) or `none` (public: anyone who can reach the ingress). */
  auth?: PortAuth;
  /** `http` (default) or `tcp` (a raw TCP port of the host: `address`). */
  protocol?: PortProtocol;
}

/** What to create. `await new Sandbox({...}).create()` makes it. */
export class Sandbox {
  readonly options: SandboxOptions;

  constructor(options: SandboxOptions = {}) {
    this.options = { ...options };
  }

  private transport(): Transport {
    return transportFor(this.options);
  }

  /** The `POST /v1/sandboxes` body these options make (without the idempotency key). */
  toCreateRequest(): Record<string, unknown> {
    const o = this.options;
    const body: Record<string, unknown> = {};
    const image = imageField(o.image);
    if (image !== undefined) body.image = image;
    if (o.useVm) body.runtime = "vm";
    if (o.cpu !== undefined) body.cpu = parseCpu(o.cpu);
    if (o.memory !== undefined) body.memory_mib = parseMemory(o.memory);
    if (o.disk !== undefined) body.disk_mib = parseMemory(o.disk);
    if (o.pids !== undefined) body.pids = o.pids;
    if (o.cpuShares !== undefined) body.cpu_shares = o.cpuShares;
    if (o.gpu !== undefined) body.gpu = o.gpu;
    if (o.gpuCount !== undefined) body.gpu_count = o.gpuCount;
    Object.assign(body, this.commonFields());
    return body;
  }

  /** Fields a fork may carry too. */
  private commonFields(): Record<string, unknown> {
    const o = this.options;
    const body: Record<string, unknown> = {};
    if (o.keepWarmSeconds !== undefined) body.ttl_seconds = o.keepWarmSeconds;
    if (o.blockNetwork !== undefined) body.block_network = o.blockNetwork;
    if (o.allowList !== undefined) body.allow_list = [...o.allowList];
    if (o.secrets !== undefined && o.secrets.length > 0) body.secrets = [...o.secrets];
    if (o.env !== undefined && Object.keys(o.env).length > 0) body.env = { ...o.env };
    if (o.labels !== undefined && Object.keys(o.labels).length > 0) body.labels = { ...o.labels };
    if (o.ports !== undefined && o.ports.length > 0) body.ports = [...o.ports];
    return body;
  }

  private async make(body: Record<string, unknown>): Promise<SandboxInstance> {
    const transport = this.transport();
    let wire: WireSandbox;
    try {
      wire = await createSandbox(transport, body, this.options.retry);
    } catch (error) {
      throw body.ports !== undefined ? createPortsError(error) : error;
    }
    return new SandboxInstance(transport, wire);
  }

  /** Creates the sandbox; resolves when it is ready. */
  async create(): Promise<SandboxInstance> {
    return this.make(this.toCreateRequest());
  }

  /**
   * A fork of a memory snapshot (`snapshotMemory()`): it starts with the
   * snapshot's processes running where they stood. Image, limits and GPUs
   * come from the snapshot; TTL, network, env, labels and secrets from here.
   */
  async createFromMemorySnapshot(snapshotId: string): Promise<SandboxInstance> {
    return this.make({ from_snapshot: snapshotId, ...this.commonFields() });
  }

  /** A sandbox that already exists. */
  static async connect(id: string, options: ConnectionOptions = {}): Promise<SandboxInstance> {
    const transport = transportFor(options);
    const wire = await transport.json<WireSandbox>("GET", `/v1/sandboxes/${encodeURIComponent(id)}`);
    return new SandboxInstance(transport, wire);
  }

  /** Sandboxes of the daemon, optionally those with all of `labels`. */
  static async list(options: ConnectionOptions & { labels?: Record<string, string> } = {}): Promise<SandboxInfo[]> {
    const transport = transportFor(options);
    const query = new URLSearchParams();
    for (const [k, v] of Object.entries(options.labels ?? {})) query.append("label", `${k}=${v}`);
    const qs = query.toString();
    const list = await transport.json<{ sandboxes: WireSandbox[] }>("GET", `/v1/sandboxes${qs ? `?${qs}` : ""}`);
    return list.sandboxes.map(sandboxInfo);
  }
}

const asyncDispose: symbol =
  (Symbol as unknown as { asyncDispose?: symbol }).asyncDispose ?? Symbol.for("nodejs.asyncDispose");

/** A running sandbox. */
export class SandboxInstance {
  readonly id: string;
  readonly process: SandboxProcessManager;
  readonly fs: SandboxFileSystem;
  /** The sandbox as last seen (`refresh()` updates it). */
  info: SandboxInfo;
  private readonly transport: Transport;
  private readonly base: string;
  /** Tokens of its ports: a create's answer carries them, nothing else will. */
  private readonly portTokens = new PortTokens();

  /** @internal */
  constructor(transport: Transport, wire: WireSandbox) {
    this.transport = transport;
    this.id = wire.id;
    this.info = sandboxInfo(wire);
    this.portTokens.listed(wire.ports);
    this.base = `/v1/sandboxes/${encodeURIComponent(wire.id)}`;
    this.process = new SandboxProcessManager(transport, wire.id);
    this.fs = new SandboxFileSystem(transport, wire.id);
  }

  sandboxId(): string {
    return this.id;
  }

  /** Beam's name for the id. */
  get containerId(): string {
    return this.id;
  }

  /** Fetches the sandbox's state. */
  async refresh(): Promise<SandboxInfo> {
    const wire = await this.transport.json<WireSandbox>("GET", this.base);
    this.info = sandboxInfo(wire);
    this.portTokens.listed(wire.ports);
    return this.info;
  }

  /** The TTL, counted from now; -1 = none. */
  async updateTtl(ttlSeconds: number): Promise<SandboxInfo> {
    this.info = sandboxInfo(await this.transport.json<WireSandbox>("PUT", `${this.base}/ttl`, { json: { ttl_seconds: ttlSeconds } }));
    return this.info;
  }

  /**
   * The egress policy from now on: `{ blockNetwork: true }`, `{ blockNetwork:
   * false }` (open), `{ allowList: [...] }`, or `{}` (the daemon's default).
   */
  async updateNetworkPermissions(permissions: NetworkPermissions = {}): Promise<SandboxInfo> {
    const body: Record<string, unknown> = {};
    if (permissions.allowList !== undefined) {
      if (permissions.blockNetwork === true) {
        throw new ConfigurationError("give blockNetwork: true or an allowList, not both", {
          code: "invalid_network",
          field: "allowList",
        });
      }
      body.allow_list = [...permissions.allowList];
    } else if (permissions.blockNetwork !== undefined) {
      body.block_network = permissions.blockNetwork;
    }
    this.info = sandboxInfo(await this.transport.json<WireSandbox>("PATCH", `${this.base}/network`, { json: body }));
    return this.info;
  }

  // Preview URLs (docs/preview-urls.md).

  private async portCall<T>(method: string, path: string, options: Parameters<Transport["json"]>[2] = {}): Promise<T> {
    try {
      return await this.transport.json<T>(method, path, options);
    } catch (error) {
      throw portsError(error);
    }
  }

  private portPath(port: number): string {
    return `${this.base}/ports/${checkedPort(port)}`;
  }

  /**
   * Exposes `port` of the sandbox through the daemon's ingress; resolves
   * with its URL (Beam's `expose_port`; `String(url)` is the URL). `auth:
   * "token"` (default): the URL needs `url.token` (as `X-Sandbox-Token` or
   * `Authorization: Bearer`); `"none"`: public. `protocol: "tcp"`: a raw TCP
   * port of the host (`address`). The app may listen on 127.0.0.1 or
   * 0.0.0.0, before or after (until it does the URL answers 502). Exposed
   * already: ConflictError `port_already_exposed`; a daemon without preview
   * URLs or with its ingress off: FeatureUnavailableError.
   */
  async exposePort(port: number, options: ExposePortOptions = {}): Promise<PreviewUrl> {
    const json = exposeBody(port, options.auth ?? "token", options.protocol ?? "http");
    return this.portTokens.granted(await this.portCall<WirePort>("POST", `${this.base}/ports`, { json }));
  }

  /** The exposed ports, each with the token this instance holds for it. */
  async ports(): Promise<PreviewUrl[]> {
    const list = await this.portCall<WirePortList>("GET", `${this.base}/ports`);
    return this.portTokens.listed(list?.ports);
  }

  /** `{port: url}` of the exposed ports (Beam's `list_urls`); `ports()` has their tokens. */
  async listUrls(): Promise<Record<number, string>> {
    const urls: Record<number, string> = {};
    for (const p of await this.ports()) urls[p.port] = p.href;
    return urls;
  }

  /**
   * The URL of an exposed port with the token this instance holds (from the
   * create, `exposePort` or `rotatePortToken`); NotFoundError
   * `port_not_exposed` when it is not exposed.
   */
  async previewUrl(port: number): Promise<PreviewUrl> {
    checkedPort(port);
    const found = (await this.ports()).find((p) => p.port === port);
    if (found === undefined) throw notExposed(this.id, port, `${this.base}/ports`);
    return found;
  }

  /** The TCP ports something in the sandbox listens on now, exposed or not. */
  async listeningPorts(): Promise<ListeningPort[]> {
    const list = await this.portCall<WirePortList>("GET", `${this.base}/ports`, { query: { listening: "true" } });
    this.portTokens.listed(list?.ports);
    return (list?.listening ?? []).map((l) => ({ port: l.port, address: l.address, exposed: l.exposed }));
  }

  /**
   * Stops exposing `port`: its URLs answer 404 and connections through them
   * end at once. True when it was unexposed now, false when it was not exposed.
   */
  async unexposePort(port: number): Promise<boolean> {
    const path = this.portPath(port);
    try {
      await this.portCall<void>("DELETE", path);
      return true;
    } catch (error) {
      if (error instanceof NotFoundError && error.code === "port_not_exposed") return false;
      throw error;
    } finally {
      this.portTokens.forget(port);
    }
  }

  /**
   * A new token for an exposed port; the old one stops working at once.
   * Resolves with the URL and its new `token`. A public port: ConflictError
   * `port_public`.
   */
  async rotatePortToken(port: number): Promise<PreviewUrl> {
    return this.portTokens.granted(await this.portCall<WirePort>("POST", `${this.portPath(port)}/token`));
  }

  private async snapshot(kind: "memory" | "filesystem"): Promise<SnapshotInfo> {
    return snapshotInfo(await this.transport.json<WireSnapshot>("POST", `${this.base}/snapshots`, { json: { kind } }));
  }

  /** Snapshots processes, memory and files; returns the snapshot id for `createFromMemorySnapshot`. */
  async snapshotMemory(): Promise<string> {
    return (await this.snapshot("memory")).id;
  }

  /** Snapshots the files only; returns an image id to create sandboxes from (`image: id`). */
  async createImageFromFilesystem(): Promise<string> {
    return (await this.snapshot("filesystem")).id;
  }

  /** Deletes the sandbox. True when it was deleted now, false when it was already gone. */
  async terminate(): Promise<boolean> {
    try {
      await this.transport.empty("DELETE", this.base);
      return true;
    } catch (error) {
      if (error instanceof NotFoundError) return false;
      throw error;
    }
  }

  /** `await using sb = await new Sandbox().create()` terminates it at the end of the block. */
  async [asyncDispose](): Promise<void> {
    await this.terminate();
  }
}
