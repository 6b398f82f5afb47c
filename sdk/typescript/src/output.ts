/**
 * A process's output. `GET .../processes/{id}/output` is NDJSON: base64
 * chunks of stdout and stderr in the order they arrived, each with its
 * stream's byte offset, `dropped` when the daemon's bounded buffer lost
 * bytes, and finally `exit` with the process. One reader per process
 * demultiplexes it into the two streams; when the connection ends before
 * the exit (a daemon restart ends streams) it resumes from its offsets.
 */

import type { IncomingMessage } from "node:http";

import { SandboxConnectionError, TLSFingerprintError } from "./errors.js";
import type { Transport } from "./transport.js";
import type { WireOutputEvent, WireProcess } from "./types.js";

export type StreamName = "stdout" | "stderr";

/** Bytes a stream with a reader may hold before the reader makes the daemon wait. */
const HIGH_WATER = 4 << 20;
/** Bytes a stream nobody reads keeps; older ones are dropped (and counted in droppedBytes). */
const UNREAD_CAP = 16 << 20;
/** How long the reader keeps trying to reach the daemon again. */
const RECONNECT_MS = 30_000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());

interface Chunk {
  data: Buffer;
  /** Arrival order across both streams. */
  seq: number;
}

/** What a stream can give a line reader now. */
type Probe = { kind: "line"; seq: number } | { kind: "wait" } | { kind: "end" };

interface StreamOwner {
  start(): void;
  /** Resolves at the next change of either stream (data, end, failure). */
  changed(): Promise<void>;
  drained(): void;
}

/**
 * stdout or stderr of a process: `for await (const line of stream)` yields
 * lines as they arrive (without their `\n`), `chunks()` raw Buffers,
 * `read()` / `readBytes()` the rest of the stream once the process exits.
 */
export class ProcessStream implements AsyncIterable<string> {
  readonly name: StreamName;
  /** Bytes lost: the daemon's buffer overflowed, or over 16 MiB waited here unread. */
  droppedBytes = 0;
  private queue: Chunk[] = [];
  private queued = 0;
  /** queue[0..clean) hold no newline. */
  private clean = 0;
  private ended = false;
  private failure: Error | undefined;
  private consumers = 0;
  private readonly owner: StreamOwner;

  /** @internal */
  constructor(name: StreamName, owner: StreamOwner) {
    this.name = name;
    this.owner = owner;
  }

  /** @internal */
  get buffered(): number {
    return this.queued;
  }

  /** @internal */
  get reading(): boolean {
    return this.consumers > 0;
  }

  /** @internal Why the stream ended early, if it did. */
  get error(): Error | undefined {
    return this.failure;
  }

  /** @internal */
  push(data: Buffer, seq: number): void {
    if (data.length === 0) return;
    this.queue.push({ data, seq });
    this.queued += data.length;
    if (this.consumers === 0) {
      while (this.queued > UNREAD_CAP && this.queue.length > 1) {
        const old = this.queue.shift() as Chunk;
        this.queued -= old.data.length;
        this.droppedBytes += old.data.length;
        this.clean = Math.max(0, this.clean - 1);
      }
    }
  }

  /** @internal */
  end(): void {
    this.ended = true;
  }

  /** @internal */
  fail(error: Error): void {
    if (this.ended) return;
    this.failure = error;
    this.ended = true;
  }

  private finish(): null {
    if (this.failure) throw this.failure;
    return null;
  }

  /** @internal Whether a line (or the end) can be taken now, and when it was completed. */
  probe(): Probe {
    for (let i = this.clean; i < this.queue.length; i++) {
      if (this.queue[i].data.indexOf(0x0a) !== -1) return { kind: "line", seq: this.queue[i].seq };
      this.clean = i + 1;
    }
    if (!this.ended) return { kind: "wait" };
    if (this.queue.length > 0) return { kind: "line", seq: this.queue[this.queue.length - 1].seq };
    return { kind: "end" };
  }

  /** @internal Takes the line probe() found: its text without `\n`/`\r\n`, and whether it had one. */
  takeLine(): { text: string; terminated: boolean } {
    const parts: Buffer[] = [];
    let terminated = false;
    while (this.queue.length > 0) {
      const chunk = this.queue[0];
      const at = chunk.data.indexOf(0x0a);
      if (at === -1) {
        parts.push(chunk.data);
        this.queue.shift();
        this.queued -= chunk.data.length;
        continue;
      }
      parts.push(chunk.data.subarray(0, at));
      const rest = chunk.data.subarray(at + 1);
      this.queued -= at + 1;
      if (rest.length > 0) chunk.data = rest;
      else this.queue.shift();
      terminated = true;
      break;
    }
    this.clean = 0;
    this.owner.drained();
    let line = Buffer.concat(parts);
    if (terminated && line.length > 0 && line[line.length - 1] === 0x0d) line = line.subarray(0, line.length - 1);
    return { text: line.toString("utf8"), terminated };
  }

  private takeChunk(): Buffer | undefined {
    const chunk = this.queue.shift();
    if (chunk === undefined) return undefined;
    this.queued -= chunk.data.length;
    this.clean = Math.max(0, this.clean - 1);
    this.owner.drained();
    return chunk.data;
  }

  /** The next chunk, or null at the end. */
  private async nextChunk(): Promise<Buffer | null> {
    this.owner.start();
    for (;;) {
      const chunk = this.takeChunk();
      if (chunk !== undefined) return chunk;
      if (this.ended) return this.finish();
      await this.owner.changed();
    }
  }

  /** @internal */
  enter(): void {
    this.consumers++;
  }

  /** @internal */
  leave(): void {
    this.consumers--;
    // A reader that stops may have been what held the daemon back.
    this.owner.drained();
  }

  /** Raw chunks as they arrive. */
  async *chunks(): AsyncGenerator<Buffer, void, undefined> {
    this.enter();
    try {
      for (;;) {
        const chunk = await this.nextChunk();
        if (chunk === null) return;
        yield chunk;
      }
    } finally {
      this.leave();
    }
  }

  /** Lines as they arrive, without the `\n` (or `\r\n`); a last unterminated line too. */
  async *lines(): AsyncGenerator<string, void, undefined> {
    this.owner.start();
    this.enter();
    try {
      for (;;) {
        const probe = this.probe();
        if (probe.kind === "line") yield this.takeLine().text;
        else if (probe.kind === "end") return void this.finish();
        else await this.owner.changed();
      }
    } finally {
      this.leave();
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<string> {
    return this.lines();
  }

  /** The rest of the stream, until the process exits. */
  async readBytes(): Promise<Buffer> {
    this.enter();
    try {
      const parts: Buffer[] = [];
      for (;;) {
        const chunk = await this.nextChunk();
        if (chunk === null) return Buffer.concat(parts);
        parts.push(chunk);
      }
    } finally {
      this.leave();
    }
  }

  /** The rest of the stream as UTF-8 text, until the process exits. */
  async read(): Promise<string> {
    return (await this.readBytes()).toString("utf8");
  }
}

/**
 * stdout and stderr together, line by line in the order the lines were
 * completed (Beam's `logs`). It takes lines from the same buffers as
 * `stdout` and `stderr`, so a line goes to one reader only.
 */
export class ProcessLogs implements AsyncIterable<string> {
  /** @internal */
  constructor(
    private readonly owner: StreamOwner,
    private readonly streams: readonly [ProcessStream, ProcessStream],
  ) {}

  /** `{ stream, line }` as lines complete. */
  async *withStream(): AsyncGenerator<{ stream: StreamName; line: string; terminated: boolean }, void, undefined> {
    this.owner.start();
    for (const s of this.streams) s.enter();
    try {
      for (;;) {
        let best: ProcessStream | undefined;
        let bestSeq = Infinity;
        let ended = 0;
        for (const s of this.streams) {
          const probe = s.probe();
          if (probe.kind === "line" && probe.seq < bestSeq) {
            best = s;
            bestSeq = probe.seq;
          } else if (probe.kind === "end") {
            ended++;
          }
        }
        if (best !== undefined) {
          const { text, terminated } = best.takeLine();
          yield { stream: best.name, line: text, terminated };
        } else if (ended === this.streams.length) {
          for (const s of this.streams) if (s.error !== undefined) throw s.error;
          return;
        } else {
          await this.owner.changed();
        }
      }
    } finally {
      for (const s of this.streams) s.leave();
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<string, void, undefined> {
    for await (const entry of this.withStream()) yield entry.line;
  }

  /** Every remaining line of both streams, in completion order, until the process exits. */
  async read(): Promise<string> {
    let out = "";
    for await (const entry of this.withStream()) out += entry.terminated ? `${entry.line}\n` : entry.line;
    return out;
  }
}

/** One process's output connection, demultiplexed. */
export class OutputReader implements StreamOwner {
  readonly stdout: ProcessStream;
  readonly stderr: ProcessStream;
  readonly logs: ProcessLogs;
  /** Resolves with the process as it exited. */
  readonly exited: Promise<WireProcess>;
  private resolveExit!: (p: WireProcess) => void;
  private rejectExit!: (e: Error) => void;
  private readonly offsets: Record<StreamName, number> = { stdout: 0, stderr: 0 };
  private seq = 0;
  private started = false;
  private waiters: Array<() => void> = [];
  private holds = 0;
  private keepAlive: NodeJS.Timeout | undefined;
  private relief: (() => void) | undefined;

  constructor(
    private readonly transport: Transport,
    private readonly path: string,
    private readonly onExit: (process: WireProcess) => void,
  ) {
    this.stdout = new ProcessStream("stdout", this);
    this.stderr = new ProcessStream("stderr", this);
    this.logs = new ProcessLogs(this, [this.stdout, this.stderr]);
    this.exited = new Promise<WireProcess>((resolve, reject) => {
      this.resolveExit = resolve;
      this.rejectExit = reject;
    });
    // Nobody may await it; its failure also reaches the streams.
    this.exited.catch(() => {});
  }

  start(): void {
    if (this.started) return;
    this.started = true;
    this.run().then(
      (process) => {
        this.stdout.end();
        this.stderr.end();
        this.wake();
        this.onExit(process);
        this.resolveExit(process);
      },
      (error: Error) => {
        this.stdout.fail(error);
        this.stderr.fail(error);
        this.wake();
        this.rejectExit(error);
      },
    );
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  /** Resolves at the next change; keeps Node's event loop alive meanwhile. */
  async changed(): Promise<void> {
    this.start();
    this.hold(1);
    try {
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    } finally {
      this.hold(-1);
    }
  }

  /** Counts those awaiting output: while any do, a timer keeps Node's event loop alive. */
  hold(delta: number): void {
    this.holds += delta;
    if (this.holds > 0 && this.keepAlive === undefined) {
      this.keepAlive = setInterval(() => {}, 1 << 30);
    } else if (this.holds === 0 && this.keepAlive !== undefined) {
      clearInterval(this.keepAlive);
      this.keepAlive = undefined;
    }
  }

  drained(): void {
    if (this.relief !== undefined && !this.pressured()) {
      const relief = this.relief;
      this.relief = undefined;
      relief();
    }
  }

  private pressured(): boolean {
    return [this.stdout, this.stderr].some((s) => s.reading && s.buffered > HIGH_WATER);
  }

  private stream(name: StreamName): ProcessStream {
    return name === "stdout" ? this.stdout : this.stderr;
  }

  /** Handles one event; returns the process at `exit`. */
  private handle(event: WireOutputEvent): WireProcess | undefined {
    switch (event.type) {
      case "stdout":
      case "stderr": {
        const full = Buffer.from(event.data, "base64");
        let data = full;
        const at = this.offsets[event.type];
        const stream = this.stream(event.type);
        if (event.offset < at) {
          // Already had these bytes (a resumed stream starts where it was asked).
          data = data.subarray(Math.min(data.length, at - event.offset));
        } else if (event.offset > at) {
          // The daemon's buffer lost the bytes between (its `dropped` event says so too).
          stream.droppedBytes += event.offset - at;
        }
        this.offsets[event.type] = Math.max(at, event.offset + full.length);
        if (data.length > 0) {
          stream.push(data, this.seq++);
          this.wake();
        }
        return undefined;
      }
      case "exit":
        return event.process;
      default:
        // `dropped`: counted when the next chunk's offset skips the bytes.
        return undefined;
    }
  }

  /** Reads one response: the process when its exit came, and whether any event did. */
  private async consume(res: IncomingMessage): Promise<{ exit: WireProcess | undefined; progressed: boolean }> {
    let pending: Buffer = Buffer.alloc(0);
    let progressed = false;
    try {
      for await (const chunk of res as AsyncIterable<Buffer>) {
        pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
        let newline: number;
        while ((newline = pending.indexOf(0x0a)) !== -1) {
          const line = pending.subarray(0, newline).toString("utf8").trim();
          pending = pending.subarray(newline + 1);
          if (line === "") continue;
          progressed = true;
          const exit = this.handle(JSON.parse(line) as WireOutputEvent);
          if (exit !== undefined) {
            res.resume();
            return { exit, progressed };
          }
        }
        while (this.pressured()) {
          await new Promise<void>((resolve) => (this.relief = resolve));
        }
      }
    } catch (error) {
      if (error instanceof SyntaxError) throw error;
      // The connection broke: resume from the offsets.
    }
    return { exit: undefined, progressed };
  }

  private async run(): Promise<WireProcess> {
    let troubleSince: number | undefined;
    let delay = 100;
    const retry = async (cause: Error) => {
      troubleSince ??= Date.now();
      if (Date.now() - troubleSince > RECONNECT_MS) throw cause;
      await sleep(delay);
      delay = Math.min(delay * 2, 1000);
    };
    for (;;) {
      let res: IncomingMessage;
      try {
        res = await this.transport.request("GET", this.path, {
          query: { stdout_offset: this.offsets.stdout, stderr_offset: this.offsets.stderr },
          headers: { accept: "application/x-ndjson" },
          unref: true,
        });
      } catch (error) {
        if (error instanceof SandboxConnectionError && !(error instanceof TLSFingerprintError)) {
          await retry(error);
          continue;
        }
        throw error;
      }
      const { exit, progressed } = await this.consume(res);
      if (exit !== undefined) return exit;
      if (progressed) {
        troubleSince = undefined;
        delay = 100;
      }
      await retry(
        new SandboxConnectionError(`the output stream of ${this.path} kept ending before the process exited`, {
          code: "stream_ended",
        }),
      );
    }
  }
}
