// Files against a real daemon: a 50 MiB round trip streamed both ways
// (hashes compared here and inside the sandbox), bytes, listing, stat,
// directories and deletes.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { once } from "node:events";
import { after, before, describe, it } from "node:test";

import { BadRequestError, NotFoundError, Sandbox } from "../dist/index.js";
import { useDaemon } from "./helpers/fixture.mjs";

const T = { timeout: 300_000 };
const MIB = 1024 * 1024;

async function sha256File(path) {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk);
  return hash.digest("hex");
}

describe("files", T, () => {
  let sb;
  let dir;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "sandboxd-ts-files-"));
  });
  after(async () => {
    if (sb) await sb.terminate();
    rmSync(dir, { recursive: true, force: true });
  });
  // After the hooks above: its teardown runs after theirs.
  useDaemon();

  it("round-trips 50 MiB through uploadFile and downloadFile", async () => {
    sb = await new Sandbox({ image: "python" }).create();
    const local = join(dir, "big.bin");
    const out = createWriteStream(local);
    const hash = createHash("sha256");
    for (let i = 0; i < 50; i++) {
      const chunk = randomBytes(MIB);
      hash.update(chunk);
      if (!out.write(chunk)) await once(out, "drain");
    }
    out.end();
    await once(out, "finish");
    const expected = hash.digest("hex");

    const info = await sb.fs.uploadFile(local, "/root/big.bin");
    assert.equal(info.size, 50 * MIB);
    assert.equal(info.isFile, true);
    const inside = await sb.process.exec("sha256sum", "/root/big.bin");
    assert.equal(await inside.wait(120), 0);
    assert.equal((await inside.stdout.read()).split(" ")[0], expected, "the sandbox holds the same bytes");

    const back = join(dir, "back.bin");
    await sb.fs.downloadFile("/root/big.bin", back);
    assert.equal(statSync(back).size, 50 * MIB);
    assert.equal(await sha256File(back), expected);
  });

  it("writes a stream it never holds whole, and reads bytes back", async () => {
    const hash = createHash("sha256");
    async function* generate() {
      for (let i = 0; i < 16; i++) {
        const chunk = randomBytes(MIB);
        hash.update(chunk);
        yield chunk;
      }
    }
    const info = await sb.fs.writeBytes("/root/streamed.bin", generate());
    assert.equal(info.size, 16 * MIB);
    const data = await sb.fs.readBytes("/root/streamed.bin");
    assert.equal(createHash("sha256").update(data).digest("hex"), hash.digest("hex"));

    await sb.fs.writeBytes("/tmp/hello.txt", "hello €", { mode: 0o600 });
    assert.equal((await sb.fs.readBytes("/tmp/hello.txt")).toString("utf8"), "hello €");
    const stat = await sb.fs.statFile("/tmp/hello.txt");
    assert.equal(stat.mode & 0o777, 0o600);
    assert.equal(stat.size, Buffer.byteLength("hello €"));
  });

  it("lists, stats, makes directories and deletes", async () => {
    await assert.rejects(sb.fs.createDirectory("/work/a/b"), NotFoundError);
    const made = await sb.fs.createDirectory("/work/a/b", { parents: true });
    assert.equal(made.isDir, true);
    await sb.fs.writeBytes("/work/a/b/one.txt", "1");
    await sb.fs.writeBytes("/work/a/two.txt", "22");
    const entries = await sb.fs.listFiles("/work/a");
    assert.deepEqual(
      entries.map((e) => [e.name, e.kind, e.isDir]).sort(),
      [
        ["b", "dir", true],
        ["two.txt", "file", false],
      ],
    );
    assert.equal(entries.find((e) => e.name === "two.txt").size, 2);
    await sb.fs.deleteFile("/work/a/two.txt");
    await assert.rejects(sb.fs.statFile("/work/a/two.txt"), (e) => e instanceof NotFoundError && e.code === "file_not_found");
    await sb.fs.deleteFile("/work/a", { recursive: true });
    await assert.rejects(sb.fs.listFiles("/work/a"), NotFoundError);
    await assert.rejects(sb.fs.readBytes("/nope/missing"), NotFoundError);
    await assert.rejects(sb.fs.statFile("../../etc/passwd"), BadRequestError);
    const downloadTarget = join(dir, "missing.bin");
    await assert.rejects(sb.fs.downloadFile("/nope/missing", downloadTarget), NotFoundError);
  });
});
