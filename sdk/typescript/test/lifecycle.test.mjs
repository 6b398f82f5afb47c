// A sandbox's life against a real daemon: network permissions and TTL
// updated while it runs, a memory snapshot forked into a sandbox whose
// process carries on where it stood, a filesystem snapshot as an image.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Image, NotFoundError, Sandbox } from "../dist/index.js";
import { terminateAll, useDaemon } from "./helpers/fixture.mjs";

const T = { timeout: 300_000 };

describe("lifecycle", T, () => {
  useDaemon();

  it("updates network permissions", async () => {
    const sb = await new Sandbox({ image: "python", blockNetwork: true }).create();
    try {
      assert.equal(sb.info.network.blockNetwork, true);
      const allowed = await sb.updateNetworkPermissions({ allowList: ["pypi.org", "*.pythonhosted.org"] });
      assert.equal(allowed.network.mode, "allow_list");
      assert.deepEqual(allowed.network.allowList, ["pypi.org", "*.pythonhosted.org"]);
      assert.deepEqual((await sb.refresh()).network.allowList, ["pypi.org", "*.pythonhosted.org"]);
      const open = await sb.updateNetworkPermissions({ blockNetwork: false });
      assert.equal(open.network.blockNetwork, false);
      assert.equal(open.network.mode, "open");
      const blocked = await sb.updateNetworkPermissions({ blockNetwork: true });
      assert.equal(blocked.network.blockNetwork, true);
      assert.equal((await sb.refresh()).network.mode, "block");
      // Blocked means no DNS either, inside the sandbox.
      const dns = await sb.process.runCode(
        "import socket\ntry:\n    socket.getaddrinfo('example.com', 443)\n    print('resolved')\nexcept OSError:\n    print('blocked')",
        { timeout: 60 },
      );
      assert.equal(dns.stdout, "blocked\n");
    } finally {
      await sb.terminate();
    }
  });

  it("updates the TTL, counted from now", async () => {
    const sb = await new Sandbox({ image: "python", keepWarmSeconds: 60 }).create();
    try {
      assert.equal(sb.info.ttlSeconds, 60);
      const before = Date.now();
      const longer = await sb.updateTtl(3600);
      assert.equal(longer.ttlSeconds, 3600);
      const expires = Date.parse(longer.expiresAt);
      assert.ok(expires >= before + 3599_000 && expires <= Date.now() + 3601_000, longer.expiresAt);
      const forever = await sb.updateTtl(-1);
      assert.equal(forever.ttlSeconds, -1);
      assert.equal(forever.expiresAt, null);
      assert.equal((await sb.refresh()).expiresAt, null);
    } finally {
      await sb.terminate();
    }
  });

  it("snapshots memory and forks: the fork's process goes on from where it stood", async () => {
    const sb = await new Sandbox({ image: "python" }).create();
    let fork;
    try {
      const code = [
        "import os, random, time",
        "secret = random.getrandbits(64)",
        "open('/tmp/disk.txt', 'w').write('on disk')",
        "print(secret, flush=True)",
        "while not os.path.exists('/tmp/go'):",
        "    time.sleep(0.05)",
        "open('/tmp/out', 'w').write(str(secret))",
        "while True:",
        "    time.sleep(1)",
      ].join("\n");
      const proc = await sb.process.runCode(code, { blocking: false });
      const secret = (await proc.stdout[Symbol.asyncIterator]().next()).value;
      assert.match(secret, /^\d+$/);
      const snapshot = await sb.snapshotMemory();
      assert.match(snapshot, /^snap-/);
      fork = await new Sandbox({ keepWarmSeconds: 300, labels: { fork: "yes" } }).createFromMemorySnapshot(snapshot);
      assert.notEqual(fork.sandboxId(), sb.sandboxId());
      assert.equal(fork.info.ttlSeconds, 300);
      assert.equal(fork.info.labels.fork, "yes");
      assert.equal((await fork.fs.readBytes("/tmp/disk.txt")).toString(), "on disk");
      // Wake the restored process in the fork only; it writes the secret it
      // held in memory since before the snapshot.
      await fork.fs.writeBytes("/tmp/go", "1");
      const waited = await fork.process.exec("sh", "-c", "while [ ! -s /tmp/out ]; do sleep 0.05; done; cat /tmp/out");
      assert.equal(await waited.wait(120), 0);
      assert.equal(await waited.stdout.read(), secret);
      await assert.rejects(sb.fs.statFile("/tmp/out"), NotFoundError, "the source did not move on");
      assert.deepEqual(await proc.status(), [-1, "running"]);
    } finally {
      await terminateAll([sb, fork]);
    }
  });

  it("makes an image of the filesystem that new sandboxes start from", async () => {
    const sb = await new Sandbox({ image: "python" }).create();
    const made = [];
    try {
      await sb.fs.writeBytes("/root/marker.txt", "from the snapshot");
      const imageId = await sb.createImageFromFilesystem();
      assert.ok(imageId.length > 0);
      for (const image of [imageId, Image.fromId(imageId)]) {
        const child = await new Sandbox({ image }).create();
        made.push(child);
        assert.equal((await child.fs.readBytes("/root/marker.txt")).toString(), "from the snapshot");
        const run = await child.process.runCode("print(open('/root/marker.txt').read())");
        assert.equal(run.stdout, "from the snapshot\n");
      }
    } finally {
      await terminateAll([sb, ...made]);
    }
  });
});
