/**
 * `sb.fs`: files in and out of a sandbox. Uploads and downloads stream in
 * both directions, so a large file is never held whole in memory (except by
 * `readBytes`, which returns it).
 */

import { createReadStream, createWriteStream } from "node:fs";
import { rm } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { pipeline } from "node:stream/promises";

import { SandboxConnectionError, SandboxdError } from "./errors.js";
import type { BodyInput, Transport } from "./transport.js";
import { fileInfo, type FileInfo, type WireFileInfo } from "./types.js";

export interface WriteOptions {
  /** File mode (default 0o644). */
  mode?: number;
}

export interface MkdirOptions {
  /** Make missing parents too (`mkdir -p`). */
  parents?: boolean;
  /** Directory mode (default 0o755). */
  mode?: number;
}

export class SandboxFileSystem {
  private readonly base: string;

  /** @internal */
  constructor(
    private readonly transport: Transport,
    readonly sandboxId: string,
  ) {
    this.base = `/v1/sandboxes/${encodeURIComponent(sandboxId)}/files`;
  }

  /** Writes `data` (bytes, text, or a stream / async iterable of chunks) to `path`. */
  async writeBytes(path: string, data: BodyInput, options: WriteOptions = {}): Promise<FileInfo> {
    const wire = await this.transport.json<WireFileInfo>("PUT", this.base, {
      query: { path, mode: options.mode },
      body: data,
    });
    return fileInfo(wire);
  }

  /** Uploads the local file `localPath` to `sandboxPath`, streaming it. */
  async uploadFile(localPath: string, sandboxPath: string, options: WriteOptions = {}): Promise<FileInfo> {
    return this.writeBytes(sandboxPath, createReadStream(localPath), options);
  }

  /** A readable stream of the file's bytes. */
  async openRead(path: string): Promise<IncomingMessage> {
    return this.transport.request("GET", this.base, { query: { path }, headers: { accept: "application/octet-stream" } });
  }

  /** The whole file. */
  async readBytes(path: string): Promise<Buffer> {
    const res = await this.openRead(path);
    const chunks: Buffer[] = [];
    try {
      for await (const chunk of res as AsyncIterable<Buffer>) chunks.push(chunk);
    } catch (cause) {
      throw new SandboxConnectionError(`reading ${path} from sandbox ${this.sandboxId} broke off: ${(cause as Error).message}`, {
        code: "download_interrupted",
        cause,
      });
    }
    const data = Buffer.concat(chunks);
    const expected = Number(res.headers["content-length"]);
    if (Number.isFinite(expected) && expected !== data.length) {
      throw new SandboxConnectionError(`reading ${path} from sandbox ${this.sandboxId}: got ${data.length} of ${expected} bytes`, {
        code: "download_interrupted",
      });
    }
    return data;
  }

  /** Downloads `sandboxPath` to the local file `localPath`, streaming it; no partial file is left on failure. */
  async downloadFile(sandboxPath: string, localPath: string): Promise<void> {
    const res = await this.openRead(sandboxPath);
    const expected = Number(res.headers["content-length"]);
    let received = 0;
    res.on("data", (chunk: Buffer) => {
      received += chunk.length;
    });
    try {
      await pipeline(res, createWriteStream(localPath));
      if (Number.isFinite(expected) && expected !== received) {
        throw new SandboxConnectionError(`downloading ${sandboxPath}: got ${received} of ${expected} bytes`, {
          code: "download_interrupted",
        });
      }
    } catch (cause) {
      await rm(localPath, { force: true });
      if (cause instanceof SandboxdError) throw cause;
      throw new SandboxConnectionError(`downloading ${sandboxPath} to ${localPath} failed: ${(cause as Error).message}`, {
        code: "download_interrupted",
        cause,
      });
    }
  }

  /** The entries of a directory. */
  async listFiles(path: string): Promise<FileInfo[]> {
    const list = await this.transport.json<{ path: string; entries: WireFileInfo[] }>("GET", `${this.base}/list`, {
      query: { path },
    });
    return list.entries.map(fileInfo);
  }

  /** What is at `path` (NotFoundError when nothing). */
  async statFile(path: string): Promise<FileInfo> {
    return fileInfo(await this.transport.json<WireFileInfo>("GET", `${this.base}/stat`, { query: { path } }));
  }

  async createDirectory(path: string, options: MkdirOptions = {}): Promise<FileInfo> {
    const wire = await this.transport.json<WireFileInfo>("POST", `${this.base}/mkdir`, {
      query: { path, parents: options.parents ? "true" : undefined, mode: options.mode },
    });
    return fileInfo(wire);
  }

  /** Removes a file, or a directory with `{ recursive: true }` (or when empty). */
  async deleteFile(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.transport.empty("DELETE", this.base, { query: { path, recursive: options.recursive ? "true" : undefined } });
  }
}
