// A real sandboxd for the tests, started the way the Rust harness does
// (tests/common/mod.rs): its own state dir, run dir, socket, btrfs pool and
// cgroup parent under a fresh /var/tmp/sandboxd-test-XXXX, the shared image
// cache, and READY=1 awaited on $NOTIFY_SOCKET. stop() deletes what the test
// left through the daemon, SIGTERMs it, removes its cgroups, unmounts its
// pool and the folder, and reports anything that would have stayed behind.
//
// Env: SANDBOXD_BIN (daemon), SANDBOXD_AGENT (static agent),
// SANDBOXD_TEST_IMAGES_DIR (image cache, default /var/lib/sandboxd/images).

import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  rmdirSync,
  statSync,
} from "node:fs";
import * as http from "node:http";
import { createServer } from "node:net";
import { basename, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const REPO = fileURLToPath(new URL("../../../../", import.meta.url));

export const DAEMON = process.env.SANDBOXD_BIN || join(REPO, "target/release/sandboxd");
export const AGENT =
  process.env.SANDBOXD_AGENT || join(REPO, "target/x86_64-unknown-linux-gnu/release/sandbox-agent");
export const IMAGES = process.env.SANDBOXD_TEST_IMAGES_DIR || "/var/lib/sandboxd/images";

// sd_notify's socket is a Unix datagram socket, which Node cannot bind:
// a tiny Python receiver prints each datagram as a line.
const NOTIFY_PY = `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("BOUND", flush=True)
while True:
    print(s.recv(4096).decode("utf-8", "replace").replace("\\n", " "), flush=True)
`;

/** Raw request to a Unix socket (cleanup only; tests use the SDK). */
export function rawRequest(socketPath, method, path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, method, path, headers: { "content-type": "application/json" } }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let json;
        try {
          json = text ? JSON.parse(text) : undefined;
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode, text, json });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

/** A TCP port free right now on 127.0.0.1. */
export async function freePort() {
  const server = createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address();
  server.close();
  await once(server, "close");
  return port;
}

/** `count` consecutive TCP ports free right now on 127.0.0.1: [first, last]. */
export async function freePortRange(count) {
  for (let attempt = 0; attempt < 200; attempt++) {
    const first = await freePort();
    if (first + count > 65535) continue;
    const held = [];
    let ok = true;
    for (let port = first; port < first + count && ok; port++) {
      const server = createServer();
      // One promise for both outcomes: once(server, "listening") rejects on
      // "error", which would throw EADDRINUSE instead of trying another range.
      const listening = await new Promise((resolve) => {
        server.once("listening", () => resolve(true));
        server.once("error", () => resolve(false));
        server.listen(port, "127.0.0.1");
      });
      if (listening) held.push(server);
      else ok = false;
    }
    for (const server of held) {
      server.close();
      await once(server, "close");
    }
    if (ok) return [first, first + count - 1];
  }
  throw new Error(`no ${count} consecutive free ports on 127.0.0.1`);
}

export const INGRESS_DOMAIN = "sbx.test";

/**
 * Flags for an ingress on a free port of 127.0.0.1, host-name URLs under
 * sbx.test (no DNS: clients connect to the listener and send the Host), and
 * `tcpPorts` host ports for raw TCP exposures.
 */
export async function ingressArgs(tcpPorts = 4) {
  const args = ["--ingress-listen", `127.0.0.1:${await freePort()}`, "--ingress-domain", INGRESS_DOMAIN];
  if (tcpPorts > 0) {
    const [first, last] = await freePortRange(tcpPorts);
    args.push("--ingress-tcp-ports", `${first}-${last}`);
  }
  return args;
}

function cgroupHierarchies() {
  const root = "/sys/fs/cgroup";
  if (existsSync(join(root, "cgroup.controllers"))) return [root];
  try {
    return readdirSync(root)
      .map((n) => join(root, n))
      .filter((p) => {
        try {
          return statSync(p).isDirectory();
        } catch {
          return false;
        }
      });
  } catch {
    return [];
  }
}

function mountsUnder(dir) {
  const prefix = dir.endsWith("/") ? dir : `${dir}/`;
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((line) => line.split(" ")[4])
    .filter((mp) => mp && (mp === dir || mp.startsWith(prefix)))
    .map((mp) => mp.replace(/\\040/g, " "));
}

export class TestDaemon {
  constructor(extraArgs = [], env = {}) {
    this.dir = mkdtempSync("/var/tmp/sandboxd-test-");
    // Sandboxes' unprivileged ids must be able to search down to the run dir.
    chmodSync(this.dir, 0o711);
    this.name = basename(this.dir);
    this.socket = join(this.dir, "api.sock");
    this.stateDir = join(this.dir, "state");
    this.logPath = join(this.dir, "daemon.log");
    this.extraArgs = extraArgs;
    this.env = env;
    this.child = undefined;
  }

  /** `host:port` of its ingress listener, when it has one. */
  get ingress() {
    const i = this.extraArgs.indexOf("--ingress-listen");
    return i < 0 ? undefined : this.extraArgs[i + 1].split(",")[0];
  }

  args() {
    const defaults = [
      ["--state-dir", this.stateDir],
      ["--run-dir", join(this.dir, "run")],
      ["--socket", this.socket],
      ["--images-dir", IMAGES],
      ["--agent-path", AGENT],
      ["--disk-pool-gib", "64"],
      ["--cgroup-parent", `/${this.name}`],
    ].filter(([flag]) => !this.extraArgs.includes(flag));
    return [...defaults.flat(), ...this.extraArgs];
  }

  log() {
    try {
      return readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  /** Starts the daemon and resolves once it said READY=1. */
  async start() {
    const notifyPath = join(this.dir, `notify-${Date.now()}.sock`);
    const notify = spawn("python3", ["-c", NOTIFY_PY, notifyPath], { stdio: ["ignore", "pipe", "inherit"] });
    const lines = createInterface({ input: notify.stdout });
    const next = () =>
      new Promise((resolve, reject) => {
        const onLine = (line) => {
          cleanup();
          resolve(line);
        };
        const onExit = (code) => {
          cleanup();
          reject(new Error(`the notify receiver (python3) exited with ${code}`));
        };
        const cleanup = () => {
          lines.off("line", onLine);
          notify.off("exit", onExit);
        };
        lines.on("line", onLine);
        notify.on("exit", onExit);
      });
    try {
      const bound = await next();
      if (bound !== "BOUND") throw new Error(`notify receiver said ${bound}`);
      const log = openSync(this.logPath, "a");
      this.child = spawn(DAEMON, this.args(), {
        env: { ...process.env, NOTIFY_SOCKET: notifyPath, RUST_LOG: "info", ...this.env },
        stdio: ["ignore", log, log],
      });
      closeSync(log);
      this.exited = once(this.child, "exit");
      const child = this.child;
      const died = this.exited.then(([code, signal]) => {
        throw new Error(`sandboxd exited (${code ?? signal}) before it was ready:\n${this.log()}`);
      });
      died.catch(() => {});
      const ready = (async () => {
        for (;;) {
          const line = await next();
          if (line.startsWith("READY=1")) return;
        }
      })();
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`sandboxd not ready after 120 s:\n${this.log()}`)), 120_000);
      });
      try {
        await Promise.race([ready, died, timeout]);
      } finally {
        clearTimeout(timer);
      }
      if (child.exitCode !== null) throw new Error(`sandboxd exited:\n${this.log()}`);
    } finally {
      notify.kill("SIGTERM");
      if (notify.exitCode === null && notify.signalCode === null) await once(notify, "exit");
      rmSync(notifyPath, { force: true });
    }
    return this;
  }

  /** SIGTERMs the daemon (its sandboxes live on) and awaits its exit. */
  async stopProcess() {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    await this.exited;
    clearTimeout(timer);
  }

  /** Stops the daemon and starts it again on the same state. */
  async restart() {
    await this.stopProcess();
    await this.start();
  }

  /** Deletes everything and reports what would have stayed behind (empty when clean). */
  async stop() {
    const leftovers = [];
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      try {
        const list = await rawRequest(this.socket, "GET", "/v1/sandboxes");
        for (const sb of list.json?.sandboxes ?? []) {
          const res = await rawRequest(this.socket, "DELETE", `/v1/sandboxes/${sb.id}`);
          if (res.status !== 204 && res.status !== 404) leftovers.push(`sandbox ${sb.id}: delete answered ${res.status} ${res.text}`);
        }
        const snaps = await rawRequest(this.socket, "GET", "/v1/snapshots");
        for (const s of snaps.json?.snapshots ?? []) await rawRequest(this.socket, "DELETE", `/v1/snapshots/${s.id}`);
      } catch (error) {
        leftovers.push(`cleanup through the daemon failed: ${error.message}`);
      }
      await this.stopProcess();
    }
    for (const hierarchy of cgroupHierarchies()) {
      const group = join(hierarchy, this.name);
      for (const dir of [join(group, "supervisors"), group]) {
        try {
          rmdirSync(dir);
        } catch (error) {
          if (error.code !== "ENOENT") leftovers.push(`cgroup ${dir}: ${error.code}`);
        }
      }
    }
    const pool = join(this.stateDir, "disk");
    for (const mp of mountsUnder(this.dir).sort((a, b) => b.length - a.length)) {
      if (mp !== pool) leftovers.push(`mount ${mp}`);
      const r = spawnSync("umount", ["-l", mp], { encoding: "utf8" });
      if (r.status !== 0) leftovers.push(`umount ${mp}: ${r.stderr}`);
    }
    if (mountsUnder(this.dir).length === 0) {
      rmSync(this.dir, { recursive: true, force: true });
    } else {
      leftovers.push(`${this.dir} kept: still mounted`);
    }
    return leftovers;
  }
}

/** Starts a daemon with `extraArgs`. */
export async function startDaemon(extraArgs = [], env = {}) {
  const daemon = new TestDaemon(extraArgs, env);
  try {
    await daemon.start();
  } catch (error) {
    await daemon.stop();
    throw error;
  }
  return daemon;
}
