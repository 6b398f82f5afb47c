/**
 * Processes in a sandbox: `sb.process.runCode(code)`, `sb.process.exec(...)`,
 * and the SandboxProcess they give: `wait(timeout)`, `kill()`, `exitCode`,
 * `stdout` / `stderr` / `logs` streams and `stdin`.
 */

import { ConflictError, SandboxProcessError } from "./errors.js";
import { OutputReader, type ProcessLogs, type ProcessStream } from "./output.js";
import type { Transport } from "./transport.js";
import { processInfo, type ProcessInfo, type WireProcess } from "./types.js";

/** The daemon answers one wait for at most an hour; longer waits loop. */
const WAIT_SLICE_SECONDS = 300;

export interface ProcessOptions {
  /** Working directory inside the sandbox. */
  cwd?: string;
  /** Extra environment of this process. */
  env?: Record<string, string>;
  /** Seconds after which the daemon kills the whole process tree. */
  timeout?: number;
  /**
   * Keep stdin open for `proc.stdin.write()`; otherwise it is /dev/null
   * (end of file at once). Default: open for `exec` and non-blocking
   * `runCode`, closed for blocking `runCode`.
   */
  stdin?: boolean;
  /** Numeric uid (and gid) inside the sandbox; default 0. */
  uid?: number;
  gid?: number;
  /** Supplementary group ids (the primary is `gid`); not with `runCode`. */
  groups?: number[];
  /** The capabilities it keeps of the sandbox's (`[]` for none); default all of them. */
  capabilities?: string[];
  /** An OCI `linux.seccomp` profile loaded on top of the sandbox's own filter. */
  seccomp?: Record<string, unknown>;
  /** Its `oom_score_adj`, 0 to 1000; default 0. */
  oomScoreAdj?: number;
}

export interface RunCodeOptions extends ProcessOptions {
  /** Wait for the exit and return its result (default), or return the running process. */
  blocking?: boolean;
  /** `python` (default), `bash`, `sh` or `node`. */
  language?: string;
}

/** What a blocking `runCode` returns (Beam's SandboxProcessResponse). */
export interface ProcessResult {
  /** The process id inside the sandbox. */
  pid: number;
  /** Its exit status, or 128 + N when signal N ended it. */
  exitCode: number;
  /** The daemon killed it because `timeout` passed. */
  timedOut: boolean;
  stdout: string;
  stderr: string;
  /** stdout, then stderr (Beam's `result`). */
  result: string;
  /** The finished process. */
  process: SandboxProcess;
}

function body(options: ProcessOptions, stdinDefault: boolean): Record<string, unknown> {
  const b: Record<string, unknown> = {};
  if (options.cwd !== undefined) b.cwd = options.cwd;
  if (options.env !== undefined) b.env = options.env;
  if (options.timeout !== undefined) b.timeout_seconds = options.timeout;
  if (options.stdin ?? stdinDefault) b.stdin = true;
  if (options.uid !== undefined) b.uid = options.uid;
  if (options.gid !== undefined) b.gid = options.gid;
  if (options.groups !== undefined) b.groups = options.groups;
  if (options.capabilities !== undefined) b.capabilities = options.capabilities;
  if (options.seccomp !== undefined) b.seccomp = options.seccomp;
  if (options.oomScoreAdj !== undefined) b.oom_score_adj = options.oomScoreAdj;
  return b;
}

/** Exit status as Beam reports it: -1 while running, 128 + N after signal N. */
export function exitCodeOf(info: ProcessInfo): number {
  if (info.state !== "exited") return -1;
  if (info.exitCode !== null) return info.exitCode;
  return info.signal !== null ? 128 + info.signal : -1;
}

/** stdin of a process (open unless it was started with `{ stdin: false }`). */
export class ProcessStdin {
  /** @internal */
  constructor(
    private readonly transport: Transport,
    private readonly path: string,
  ) {}

  /** Writes `data` (text as UTF-8). */
  async write(data: string | Uint8Array): Promise<void> {
    await this.transport.empty("POST", this.path, { body: typeof data === "string" ? Buffer.from(data, "utf8") : data });
  }

  /** Closes stdin: the process reads end of file. */
  async close(): Promise<void> {
    await this.transport.empty("DELETE", this.path);
  }
}

export class SandboxProcess {
  /** The daemon's id of this process (what its routes use). */
  readonly id: number;
  readonly sandboxId: string;
  readonly stdin: ProcessStdin;
  private current: ProcessInfo;
  private readonly base: string;
  private readonly reader: OutputReader;

  /** @internal */
  constructor(
    private readonly transport: Transport,
    wire: WireProcess,
  ) {
    this.current = processInfo(wire);
    this.id = wire.id;
    this.sandboxId = wire.sandbox_id;
    this.base = `/v1/sandboxes/${encodeURIComponent(wire.sandbox_id)}/processes/${wire.id}`;
    this.stdin = new ProcessStdin(transport, `${this.base}/stdin`);
    this.reader = new OutputReader(transport, `${this.base}/output`, (p) => this.update(p));
  }

  /** @internal */
  update(wire: WireProcess): void {
    // An exited view is final; a later "running" one cannot undo it.
    if (this.current.state === "exited" && wire.state !== "exited") return;
    this.current = processInfo(wire);
  }

  /** @internal Starts reading the output now, so none is lost to the daemon's bounded buffer. */
  startOutput(): void {
    this.reader.start();
  }

  /** @internal Awaits the exit the output stream reports. */
  async exitedViaOutput(): Promise<ProcessInfo> {
    this.reader.start();
    this.reader.hold(1);
    try {
      this.update(await this.reader.exited);
    } finally {
      this.reader.hold(-1);
    }
    return this.info;
  }

  /** The process id inside the sandbox (what `ps` shows there). */
  get pid(): number {
    return this.current.pid;
  }

  get args(): string[] {
    return [...this.current.argv];
  }

  get stdout(): ProcessStream {
    return this.reader.stdout;
  }

  get stderr(): ProcessStream {
    return this.reader.stderr;
  }

  /** stdout and stderr line by line, in the order the lines were completed. */
  get logs(): ProcessLogs {
    return this.reader.logs;
  }

  /** -1 while it runs, then its exit status, or 128 + N when signal N ended it (137: SIGKILL). */
  get exitCode(): number {
    return exitCodeOf(this.current);
  }

  /** The signal that ended it, if one did. */
  get signal(): number | null {
    return this.current.signal;
  }

  /** The daemon killed it because its `timeout` passed. */
  get timedOut(): boolean {
    return this.current.timedOut;
  }

  get oomKilled(): boolean {
    return this.current.oomKilled;
  }

  /** The daemon's last view of the process (`refresh()` fetches a new one). */
  get info(): ProcessInfo {
    return { ...this.current, argv: [...this.current.argv] };
  }

  /** Fetches the daemon's view of the process. */
  async refresh(): Promise<ProcessInfo> {
    this.update(await this.transport.json<WireProcess>("GET", this.base));
    return this.info;
  }

  /** `[exitCode, "running" | "exited"]`, fetched now (Beam's `status()`). */
  async status(): Promise<[number, "running" | "exited"]> {
    const info = await this.refresh();
    return [exitCodeOf(info), info.state];
  }

  async isRunning(): Promise<boolean> {
    return (await this.status())[1] === "running";
  }

  /**
   * Waits for the exit and returns the exit code. With `timeout` (seconds)
   * and the process still running then, rejects with SandboxProcessError
   * and leaves the process running (`kill()` ends it).
   */
  async wait(timeout?: number): Promise<number> {
    if (this.current.state === "exited") return this.exitCode;
    const deadline = timeout === undefined ? undefined : Date.now() + Math.max(0, timeout) * 1000;
    for (;;) {
      const left = deadline === undefined ? WAIT_SLICE_SECONDS : Math.max(0, (deadline - Date.now()) / 1000);
      const slice = Math.min(WAIT_SLICE_SECONDS, left);
      const wire = await this.transport.json<WireProcess>("GET", `${this.base}/wait`, {
        query: { timeout_seconds: slice.toFixed(3) },
      });
      this.update(wire);
      if (wire.state === "exited") return this.exitCode;
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new SandboxProcessError(
          `process ${this.id} (pid ${this.pid}) in sandbox ${this.sandboxId} is still running after ${timeout} s; it keeps running (kill() ends it)`,
          { code: "process_timeout", processId: this.id },
        );
      }
    }
  }

  /** Kills the process and everything it started (its whole tree). Already exited is fine. */
  async kill(): Promise<void> {
    try {
      await this.transport.empty("POST", `${this.base}/kill`);
    } catch (error) {
      if (error instanceof ConflictError && error.code === "process_state") return;
      throw error;
    }
  }

  /** Sends a signal (15, "TERM", "SIGINT") to the process. */
  async sendSignal(signal: number | string): Promise<void> {
    await this.transport.empty("POST", `${this.base}/signal`, { json: { signal } });
  }
}

/** `sb.process`. */
export class SandboxProcessManager {
  /** The processes started or seen through this manager, by pid. */
  readonly processes = new Map<number, SandboxProcess>();
  private readonly base: string;

  /** @internal */
  constructor(
    private readonly transport: Transport,
    readonly sandboxId: string,
  ) {
    this.base = `/v1/sandboxes/${encodeURIComponent(sandboxId)}/processes`;
  }

  private async start(request: Record<string, unknown>): Promise<SandboxProcess> {
    const wire = await this.transport.json<WireProcess>("POST", this.base, { json: request });
    const process = new SandboxProcess(this.transport, wire);
    process.startOutput();
    this.processes.set(process.pid, process);
    return process;
  }

  /**
   * Runs `code` (Python unless `language` says otherwise). Blocking (the
   * default): waits for the exit and resolves with its output. With
   * `blocking: false`: resolves with the running SandboxProcess.
   */
  runCode(code: string, options: RunCodeOptions & { blocking: false }): Promise<SandboxProcess>;
  runCode(code: string, options?: RunCodeOptions & { blocking?: true }): Promise<ProcessResult>;
  runCode(code: string, options?: RunCodeOptions): Promise<ProcessResult | SandboxProcess>;
  async runCode(code: string, options: RunCodeOptions = {}): Promise<ProcessResult | SandboxProcess> {
    const blocking = options.blocking ?? true;
    const request = {
      ...body(options, !blocking),
      code,
      ...(options.language !== undefined ? { language: options.language } : {}),
    };
    const process = await this.start(request);
    if (!blocking) return process;
    const [stdout, stderr] = await Promise.all([process.stdout.read(), process.stderr.read()]);
    const info = await process.exitedViaOutput();
    return {
      pid: process.pid,
      exitCode: exitCodeOf(info),
      timedOut: info.timedOut,
      stdout,
      stderr,
      result: stdout + stderr,
      process,
    };
  }

  /**
   * Starts a program (argv, no shell) and resolves with the running
   * process, Beam-style: `exec("python3", "-c", "print(1)")` or
   * `exec(["ls", "-l"])`, options last: `exec("ls", "-l", { cwd: "/tmp" })`.
   */
  async exec(...args: Array<string | string[] | ProcessOptions>): Promise<SandboxProcess> {
    let options: ProcessOptions = {};
    const last = args[args.length - 1];
    if (last !== undefined && typeof last === "object" && !Array.isArray(last)) {
      options = last;
      args = args.slice(0, -1);
    }
    if (args.length === 1 && Array.isArray(args[0])) args = args[0];
    const argv = args.map((a) => {
      if (typeof a !== "string") throw new TypeError("exec: give the program and its arguments as strings, options last");
      return a;
    });
    if (argv.length === 0 || argv[0] === "") throw new TypeError('exec needs a program to run, e.g. exec("ls", "-la")');
    return this.start({ ...body(options, true), argv });
  }

  /** Every process the API started in this sandbox, by pid (inside the sandbox). */
  async listProcesses(): Promise<Map<number, SandboxProcess>> {
    const list = await this.transport.json<{ processes: WireProcess[] }>("GET", this.base);
    const out = new Map<number, SandboxProcess>();
    for (const wire of list.processes) {
      let process = [...this.processes.values()].find((p) => p.id === wire.id);
      if (process !== undefined) {
        process.update(wire);
      } else {
        process = new SandboxProcess(this.transport, wire);
        this.processes.set(process.pid, process);
      }
      out.set(process.pid, process);
    }
    return out;
  }

  /** The process with this pid (inside the sandbox). */
  async getProcess(pid: number): Promise<SandboxProcess> {
    const process = (await this.listProcesses()).get(pid);
    if (process === undefined) {
      throw new SandboxProcessError(`no process with pid ${pid} in sandbox ${this.sandboxId}`, {
        code: "process_not_found",
      });
    }
    return process;
  }
}
