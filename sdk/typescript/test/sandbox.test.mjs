// Against a real daemon: the example, runCode blocking and not,
// exec with options, the sandbox's view, connect and terminate.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { NotFoundError, Sandbox, SandboxInstance, SandboxProcessError } from "../dist/index.js";
import { terminateAll, useDaemon } from "./helpers/fixture.mjs";

const T = { timeout: 180_000 };

describe("sandbox", T, () => {
  useDaemon();

  it("runs the issue's example", async () => {
    const code = "import sys\nprint('hello from the sandbox')\nprint('a warning', file=sys.stderr)\n";
    const sb = await new Sandbox({ cpu: 1, memory: "1Gi", image: "python", blockNetwork: true, keepWarmSeconds: 120 }).create();
    let out;
    let err;
    try {
      const proc = await sb.process.runCode(code, { blocking: false });
      let exitCode;
      try {
        exitCode = await proc.wait(30);
      } catch (e) {
        if (!(e instanceof SandboxProcessError)) throw e;
        await proc.kill();
      }
      out = await proc.stdout.read();
      err = await proc.stderr.read();
      assert.equal(exitCode, 0);
      assert.equal(proc.exitCode, 0);
    } finally {
      assert.equal(await sb.terminate(), true);
    }
    assert.equal(out, "hello from the sandbox\n");
    assert.equal(err, "a warning\n");
    assert.equal(sb.info.limits.cpu, 1);
    assert.equal(sb.info.limits.memoryMib, 1024);
    assert.equal(sb.info.ttlSeconds, 120);
    assert.equal(sb.info.network.blockNetwork, true);
    assert.equal(sb.info.image, "python");
    await assert.rejects(Sandbox.connect(sb.sandboxId()), NotFoundError);
    assert.equal(await sb.terminate(), false, "terminating twice says it was gone");
  });

  it("runs code blocking and returns its output and exit code", async () => {
    const sb = await new Sandbox({ image: "python", labels: { test: "blocking" } }).create();
    try {
      const ok = await sb.process.runCode("print(6 * 7)");
      assert.equal(ok.exitCode, 0);
      assert.equal(ok.stdout, "42\n");
      assert.equal(ok.stderr, "");
      assert.equal(ok.result, "42\n");
      assert.ok(ok.pid > 0);
      const failed = await sb.process.runCode("import sys\nsys.stderr.write('bad\\n')\nsys.exit(3)");
      assert.equal(failed.exitCode, 3);
      assert.equal(failed.stderr, "bad\n");
      assert.equal(failed.result, "bad\n");
      const shell = await sb.process.runCode('echo "$(basename $(readlink /proc/$$/exe)) in $PWD with $GREETING"', {
        language: "sh",
        cwd: "/tmp",
        env: { GREETING: "hi" },
      });
      assert.match(shell.stdout, /^(dash|sh|bash|busybox) in \/tmp with hi\n$/);
      // The daemon kills the whole tree when the timeout passes.
      const slow = await sb.process.runCode("import time\nprint('started', flush=True)\ntime.sleep(600)", { timeout: 1 });
      assert.equal(slow.timedOut, true);
      assert.equal(slow.stdout, "started\n");
      assert.notEqual(slow.exitCode, 0);
      assert.equal(sb.info.labels.test, "blocking");
    } finally {
      await sb.terminate();
    }
  });

  it("execs argv with cwd and env, and connects to a sandbox by id", async () => {
    const sb = await new Sandbox({ image: "python", env: { FROM_SANDBOX: "yes" } }).create();
    try {
      const proc = await sb.process.exec("sh", "-c", 'echo "$PWD $FROM_SANDBOX $FROM_EXEC"; exit 5', {
        cwd: "/tmp",
        env: { FROM_EXEC: "also" },
      });
      assert.equal(await proc.wait(60), 5);
      assert.equal(await proc.stdout.read(), "/tmp yes also\n");
      const plain = await sb.process.exec("python3", "-c", "print('argv', 1)");
      assert.equal(await plain.wait(60), 0);
      assert.equal(await plain.stdout.read(), "argv 1\n");
      const again = await Sandbox.connect(sb.sandboxId());
      assert.ok(again instanceof SandboxInstance);
      assert.equal(again.id, sb.id);
      const listed = await again.process.listProcesses();
      assert.deepEqual([...listed.keys()].sort(), [proc.pid, plain.pid].sort());
      assert.deepEqual([...listed.values()].map((p) => p.id).sort(), [proc.id, plain.id].sort());
      const reattached = await again.process.getProcess(proc.pid);
      assert.equal(reattached.id, proc.id);
      assert.deepEqual(reattached.args, ["sh", "-c", 'echo "$PWD $FROM_SANDBOX $FROM_EXEC"; exit 5']);
      assert.equal(await reattached.stdout.read(), "/tmp yes also\n");
      assert.deepEqual(await reattached.status(), [5, "exited"]);
      assert.equal(reattached.exitCode, 5);
      // The same manager hands out the same objects.
      assert.equal(await sb.process.getProcess(proc.pid), proc);
      const info = await again.refresh();
      assert.equal(info.state, "ready");
      assert.ok((await Sandbox.list()).some((s) => s.id === sb.id));
      assert.ok(!(await Sandbox.list({ labels: { nobody: "has-this" } })).some((s) => s.id === sb.id));
    } finally {
      await terminateAll([sb]);
    }
  });

  it("gives a sandbox the CPU weight it asks for, and no other one", async () => {
    const heavy = await new Sandbox({ image: "busybox", cpuShares: 2048 }).create();
    const plain = await new Sandbox({ image: "busybox" }).create();
    try {
      assert.equal(heavy.info.limits.cpuShares, 2048);
      assert.equal((await heavy.refresh()).limits.cpuShares, 2048);
      assert.equal(plain.info.limits.cpuShares, undefined);
    } finally {
      await terminateAll([heavy, plain]);
    }
  });
});
