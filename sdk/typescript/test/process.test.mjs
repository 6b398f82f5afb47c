// Processes against a real daemon: stdout and stderr stream apart and in
// order as they are written, stdin, wait(timeout) rejecting while the
// process keeps running, kill() ending the whole tree, output accounting.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { ConflictError, Sandbox, SandboxProcessError } from "../dist/index.js";
import { useDaemon } from "./helpers/fixture.mjs";

const T = { timeout: 240_000 };

describe("processes", T, () => {
  useDaemon();
  let sb;

  it("streams stdout and stderr separately, in order, while the process runs", async () => {
    sb = await new Sandbox({ image: "python" }).create();
    // It prints a first line, then waits for stdin before printing the rest:
    // reading that first line before writing stdin shows lines arrive while
    // the process still runs, not at its exit.
    const code = [
      "import sys",
      "print('ready', flush=True)",
      "sys.stdin.readline()",
      "for i in range(200):",
      "    print(f'out {i}', flush=True)",
      "    print(f'err {i}', file=sys.stderr, flush=True)",
      "print('no newline at the end', end='', flush=True)",
    ].join("\n");
    const proc = await sb.process.runCode(code, { blocking: false, stdin: true });
    const out = proc.stdout[Symbol.asyncIterator]();
    const first = await out.next();
    assert.deepEqual(first, { value: "ready", done: false });
    assert.equal(proc.exitCode, -1, "the process is still running");
    assert.deepEqual(await proc.status(), [-1, "running"]);
    await proc.stdin.write("go\n");
    const stdoutLines = [];
    const stderrLines = [];
    const readErr = (async () => {
      for await (const line of proc.stderr) stderrLines.push(line);
    })();
    for (let next = await out.next(); !next.done; next = await out.next()) stdoutLines.push(next.value);
    await readErr;
    const expect = (prefix) => Array.from({ length: 200 }, (_, i) => `${prefix} ${i}`);
    assert.deepEqual(stdoutLines, [...expect("out"), "no newline at the end"]);
    assert.deepEqual(stderrLines, expect("err"));
    assert.equal(await proc.wait(60), 0);
    assert.equal(proc.stdout.droppedBytes, 0);
    assert.equal(await proc.stdout.read(), "", "a consumed stream has nothing left");
  });

  it("reads both streams together from logs", async () => {
    const code = "import sys\nfor i in range(50):\n    print(f'o{i}', flush=True)\n    print(f'e{i}', file=sys.stderr, flush=True)";
    const proc = await sb.process.runCode(code, { blocking: false });
    const seen = [];
    for await (const entry of proc.logs.withStream()) seen.push(entry);
    const of = (stream) => seen.filter((e) => e.stream === stream).map((e) => e.line);
    assert.deepEqual(of("stdout"), Array.from({ length: 50 }, (_, i) => `o${i}`));
    assert.deepEqual(of("stderr"), Array.from({ length: 50 }, (_, i) => `e${i}`));
    assert.equal(await proc.wait(60), 0);
    const again = await sb.process.runCode("print('x')\nprint('y')", { blocking: false });
    assert.equal(await again.logs.read(), "x\ny\n");
  });

  it("writes and closes stdin", async () => {
    const cat = await sb.process.exec("cat");
    await cat.stdin.write("line one\n");
    await cat.stdin.write(Buffer.from([0xe2, 0x82, 0xac, 0x0a])); // "€\n" as bytes
    await cat.stdin.close();
    assert.equal(await cat.wait(60), 0);
    assert.equal(await cat.stdout.read(), "line one\n€\n");
    // Without { stdin: true } stdin is /dev/null: the program reads end of file at once.
    const noStdin = await sb.process.runCode("import sys\nprint(repr(sys.stdin.read()))");
    assert.equal(noStdin.stdout, "''\n");
    await assert.rejects(cat.stdin.write("too late"), ConflictError);
  });

  it("runs a process as a user, with groups, fewer capabilities, a seccomp profile and an OOM score", async () => {
    const status = "grep -E '^(Uid|Groups|CapBnd|Seccomp_filters):' /proc/self/status; cat /proc/self/oom_score_adj";
    const plain = await sb.process.exec("sh", "-c", status);
    assert.equal(await plain.wait(60), 0);
    const confined = await sb.process.exec("sh", "-c", status, {
      uid: 1000,
      gid: 1000,
      groups: [4000],
      cwd: "/tmp",
      capabilities: ["CAP_KILL"],
      seccomp: { defaultAction: "SCMP_ACT_ALLOW" },
      oomScoreAdj: 500,
    });
    assert.equal(await confined.wait(60), 0);
    // The status fields, then the OOM score on the last line.
    const parse = (text) => {
      const lines = text.trim().split("\n");
      const score = lines.pop();
      return { score, ...Object.fromEntries(lines.map((l) => l.split(/:\s*/))) };
    };
    const before = parse(await plain.stdout.read());
    const after = parse(await confined.stdout.read());
    assert.match(after.Uid, /^1000\s/);
    assert.equal(after.Groups.trim(), "4000");
    assert.equal(after.CapBnd, "0000000000000020");
    assert.equal(Number(after.Seccomp_filters), Number(before.Seccomp_filters) + 1);
    assert.equal(after.score, "500");
  });

  it("wait(timeout) rejects and leaves the process running; kill() ends the whole tree", async () => {
    const code = [
      "import subprocess, time",
      "child = subprocess.Popen(['sleep', '1000'])",
      "print(child.pid, flush=True)",
      "time.sleep(1000)",
    ].join("\n");
    const proc = await sb.process.runCode(code, { blocking: false });
    const lines = proc.stdout[Symbol.asyncIterator]();
    const childPid = Number((await lines.next()).value);
    assert.ok(childPid > 1, `child pid ${childPid}`);
    const started = Date.now();
    await assert.rejects(proc.wait(1), (e) => {
      assert.ok(e instanceof SandboxProcessError, String(e));
      assert.equal(e.processId, proc.id);
      return true;
    });
    assert.ok(Date.now() - started >= 900, "wait honoured its timeout");
    assert.equal(proc.exitCode, -1);
    assert.equal(await proc.isRunning(), true, "the timeout did not end the process");
    const alive = await sb.process.exec("sh", "-c", `kill -0 ${childPid}`);
    assert.equal(await alive.wait(30), 0, "the child runs too");

    await proc.kill();
    assert.equal(await proc.wait(60), 137, "SIGKILL reads as 128 + 9");
    assert.equal(proc.signal, 9);
    await proc.kill(); // killing an exited process is fine
    const gone = await sb.process.exec("sh", "-c", `kill -0 ${childPid} 2>/dev/null; echo $?`);
    assert.equal(await gone.wait(30), 0);
    assert.equal((await gone.stdout.read()).trim(), "1", "the child died with its parent");
    const ps = await sb.process.exec("sh", "-c", "ls /proc | grep -E '^[0-9]+$' | while read p; do cat /proc/$p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done");
    await ps.wait(30);
    assert.doesNotMatch(await ps.stdout.read(), /sleep 1000/);
  });

  it("accounts for every byte of a big output: received or dropped", async () => {
    const size = 12 * 1024 * 1024;
    const proc = await sb.process.runCode(`import sys\nsys.stdout.buffer.write(b'x' * ${size})\nsys.stdout.flush()`, {
      blocking: false,
    });
    const data = await proc.stdout.readBytes();
    assert.equal(await proc.wait(120), 0);
    assert.equal(data.length + proc.stdout.droppedBytes, size);
    assert.ok(data.every((b) => b === 0x78));
    await sb.terminate();
  });
});
