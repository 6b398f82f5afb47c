// Many at once and a daemon restart, against a real daemon: 10 concurrent
// creates each running code, and a create sent while the daemon is down
// that retries with its idempotency key and lands exactly once.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { SandboxConnectionError, Sandbox } from "../dist/index.js";
import { terminateAll, useDaemon } from "./helpers/fixture.mjs";

const T = { timeout: 300_000 };

describe("concurrency", T, () => {
  const ctx = useDaemon();

  it("creates 10 sandboxes concurrently and runs code in each", async () => {
    const sandboxes = await Promise.all(
      Array.from({ length: 10 }, (_, i) => new Sandbox({ image: "python", labels: { batch: "ten", n: String(i) } }).create()),
    );
    try {
      assert.equal(new Set(sandboxes.map((s) => s.id)).size, 10);
      const results = await Promise.all(sandboxes.map((sb, i) => sb.process.runCode(`print(${i} * ${i})`)));
      results.forEach((r, i) => {
        assert.equal(r.exitCode, 0);
        assert.equal(r.stdout, `${i * i}\n`);
      });
      assert.equal((await Sandbox.list({ labels: { batch: "ten" } })).length, 10);
    } finally {
      await terminateAll(sandboxes);
    }
    assert.equal((await Sandbox.list({ labels: { batch: "ten" } })).length, 0);
  });

  it("retries a create across a daemon restart and makes one sandbox", async () => {
    const daemon = ctx.daemon;
    const survivor = await new Sandbox({ image: "python" }).create();
    await daemon.stopProcess();
    let firstFailure;
    const failed = new Promise((resolve) => (firstFailure = resolve));
    const pending = new Sandbox({
      image: "python",
      labels: { made: "during-restart" },
      retry: { onRetry: (error) => firstFailure(error) },
    }).create();
    const error = await failed;
    assert.ok(error instanceof SandboxConnectionError, String(error));
    await daemon.start();
    const made = await pending;
    try {
      const listed = await Sandbox.list({ labels: { made: "during-restart" } });
      assert.deepEqual(listed.map((s) => s.id), [made.id]);
      assert.equal((await made.process.runCode("print('after restart')")).stdout, "after restart\n");
      // The sandbox from before the restart was adopted and still runs code.
      assert.equal((await survivor.process.runCode("print('adopted')")).stdout, "adopted\n");
    } finally {
      await terminateAll([made, survivor]);
    }
  });
});
