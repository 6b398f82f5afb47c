/**
 * The daemon's JSON (snake_case, as api/openapi.json documents it) and the
 * camelCase views this SDK hands out.
 */

import { portInfo, type PortInfo, type WirePort } from "./ports.js";

// ---- wire types --------------------------------------------------------

export interface WireLimits {
  cpu: number;
  memory_mib: number;
  disk_mib: number;
  pids: number;
  cpu_shares?: number;
}

export interface WireNetwork {
  mode?: string;
  block_network?: boolean;
  allow_list?: string[];
}

export interface WireSandbox {
  id: string;
  state: string;
  runtime: string;
  image: string;
  image_digest: string;
  limits: WireLimits;
  ttl_seconds: number;
  expires_at: string | null;
  created_at: string;
  labels: Record<string, string>;
  oom_kills: number;
  failure: string | null;
  usage?: { cpu_seconds?: number; memory_gib_seconds?: number; egress_bytes?: number; ingress_bytes?: number };
  gpus?: string[];
  network?: WireNetwork | null;
  secrets?: string[];
  /** Exposed ports; tokens only in a create's answer. */
  ports?: WirePort[];
}

export interface WireProcess {
  id: number;
  sandbox_id: string;
  argv: string[];
  state: "running" | "exited";
  pid: number;
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  oom_killed: boolean;
  dropped_bytes: number;
  started_at: string;
  ended_at: string | null;
}

export interface WireFileInfo {
  name: string;
  kind: string;
  size: number;
  mode: number;
  uid: number;
  gid: number;
  mtime: number;
  link_target: string | null;
}

export interface WireSnapshot {
  id: string;
  kind: "memory" | "filesystem";
  sandbox: string;
  image: string;
  created_at: string;
  size_bytes: number;
}

export type WireOutputEvent =
  | { type: "stdout" | "stderr"; offset: number; data: string }
  | { type: "dropped"; stream: "stdout" | "stderr"; bytes: number }
  | { type: "exit"; process: WireProcess };

// ---- public views ------------------------------------------------------

export interface SandboxInfo {
  id: string;
  /** `creating`, `ready`, `failed`, ... */
  state: string;
  /** `container` or `vm`. */
  runtime: string;
  image: string;
  imageDigest: string;
  /** `cpuShares` only where the create asked for a CPU weight. */
  limits: { cpu: number; memoryMib: number; diskMib: number; pids: number; cpuShares?: number };
  /** -1 when the sandbox has no TTL. */
  ttlSeconds: number;
  expiresAt: string | null;
  createdAt: string;
  labels: Record<string, string>;
  oomKills: number;
  failure: string | null;
  /** `ingressBytes`: carried both ways through preview URLs. */
  usage: { cpuSeconds: number; memoryGibSeconds: number; egressBytes: number; ingressBytes: number };
  gpus: string[];
  network: { mode: string | undefined; blockNetwork: boolean | undefined; allowList: string[] } | null;
  secrets: string[];
  /** Exposed ports (preview URLs), without tokens: `SandboxInstance.ports()` has those it holds. */
  ports: PortInfo[];
}

export interface ProcessInfo {
  /** The daemon's id of the process (what its routes use). */
  id: number;
  sandboxId: string;
  argv: string[];
  state: "running" | "exited";
  /** The process id inside the sandbox. */
  pid: number;
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  oomKilled: boolean;
  droppedBytes: number;
  startedAt: string;
  endedAt: string | null;
}

export interface FileInfo {
  /** The path it was asked by (stat) or the entry's name (list). */
  name: string;
  /** `file`, `dir`, `symlink` or `other`. */
  kind: string;
  isDir: boolean;
  isFile: boolean;
  size: number;
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  mtime: number;
  linkTarget: string | null;
}

export interface SnapshotInfo {
  id: string;
  kind: "memory" | "filesystem";
  sandbox: string;
  image: string;
  createdAt: string;
  sizeBytes: number;
}

export function sandboxInfo(w: WireSandbox): SandboxInfo {
  return {
    id: w.id,
    state: w.state,
    runtime: w.runtime,
    image: w.image,
    imageDigest: w.image_digest,
    limits: {
      cpu: w.limits?.cpu,
      memoryMib: w.limits?.memory_mib,
      diskMib: w.limits?.disk_mib,
      pids: w.limits?.pids,
      ...(w.limits?.cpu_shares !== undefined ? { cpuShares: w.limits.cpu_shares } : {}),
    },
    ttlSeconds: w.ttl_seconds,
    expiresAt: w.expires_at ?? null,
    createdAt: w.created_at,
    labels: { ...(w.labels ?? {}) },
    oomKills: w.oom_kills ?? 0,
    failure: w.failure ?? null,
    usage: {
      cpuSeconds: w.usage?.cpu_seconds ?? 0,
      memoryGibSeconds: w.usage?.memory_gib_seconds ?? 0,
      egressBytes: w.usage?.egress_bytes ?? 0,
      ingressBytes: w.usage?.ingress_bytes ?? 0,
    },
    gpus: [...(w.gpus ?? [])],
    network: w.network
      ? { mode: w.network.mode, blockNetwork: w.network.block_network, allowList: [...(w.network.allow_list ?? [])] }
      : null,
    secrets: [...(w.secrets ?? [])],
    ports: (w.ports ?? []).map(portInfo),
  };
}

export function processInfo(w: WireProcess): ProcessInfo {
  return {
    id: w.id,
    sandboxId: w.sandbox_id,
    argv: [...w.argv],
    state: w.state,
    pid: w.pid,
    exitCode: w.exit_code,
    signal: w.signal,
    timedOut: w.timed_out,
    oomKilled: w.oom_killed,
    droppedBytes: w.dropped_bytes,
    startedAt: w.started_at,
    endedAt: w.ended_at,
  };
}

export function fileInfo(w: WireFileInfo): FileInfo {
  return {
    name: w.name,
    kind: w.kind,
    isDir: w.kind === "dir",
    isFile: w.kind === "file",
    size: w.size,
    mode: w.mode,
    uid: w.uid,
    gid: w.gid,
    mtime: w.mtime,
    linkTarget: w.link_target,
  };
}

export function snapshotInfo(w: WireSnapshot): SnapshotInfo {
  return {
    id: w.id,
    kind: w.kind,
    sandbox: w.sandbox,
    image: w.image,
    createdAt: w.created_at,
    sizeBytes: w.size_bytes,
  };
}
