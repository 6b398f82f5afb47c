// examples/typescript/run_agent_code.mjs, run as written against a real
// daemon: copied beside a node_modules/sandboxd that is this package (what
// `npm install` of it makes), run as a program and imported as a module.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL, fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import { Sandbox } from "../dist/index.js";
import { useDaemon } from "./helpers/fixture.mjs";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const EXAMPLE = fileURLToPath(new URL("../../../examples/typescript/run_agent_code.mjs", import.meta.url));
const T = { timeout: 240_000 };

function run(script, args, input) {
  return new Promise((resolve, reject) => {
    const child = execFile(process.execPath, [script, ...args], { env: process.env, timeout: 180_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${script} failed: ${error.message}\n${stderr}`));
      else resolve(JSON.parse(stdout));
    });
    child.stdin.end(input ?? "");
  });
}

describe("examples/typescript/run_agent_code.mjs", T, () => {
  let dir;
  let script;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "sandboxd-ts-example-"));
    mkdirSync(join(dir, "node_modules"));
    symlinkSync(PACKAGE, join(dir, "node_modules", "sandboxd"), "dir");
    script = join(dir, "run_agent_code.mjs");
    copyFileSync(EXAMPLE, script);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));
  useDaemon();

  it("runs its demo as a program", async () => {
    const result = await run(script, []);
    assert.equal(result.exitCode, 0);
    assert.equal(result.timedOut, false);
    assert.match(result.stdout, /^hello from CPython 3\.\d+\.\d+\nsquares: \[0, 1, 4, 9, 16\]\n$/);
    assert.equal(result.stderr, "this goes to stderr\n");
  });

  it("kills code that runs past its timeout and reports it", async () => {
    const code = "import time\nprint('tick', flush=True)\nwhile True:\n    time.sleep(1)\n";
    const result = await run(script, ["--timeout", "2", "-"], code);
    assert.equal(result.timedOut, true);
    assert.equal(result.exitCode, 137);
    assert.equal(result.stdout, "tick\n");
  });

  it("is a tool function an agent imports", async () => {
    const { runAgentCode } = await import(pathToFileURL(script).href);
    const failed = await runAgentCode("raise SystemExit('bad input')", { timeout: 60 });
    assert.deepEqual(failed, { stdout: "", stderr: "bad input\n", exitCode: 1, timedOut: false });
    const reads = await runAgentCode("try:\n    input()\nexcept EOFError:\n    print('no input')", { timeout: 60 });
    assert.deepEqual(reads, { stdout: "no input\n", stderr: "", exitCode: 0, timedOut: false });
    const offline = await runAgentCode(
      "import urllib.request\ntry:\n    urllib.request.urlopen('http://example.com', timeout=5)\n    print('online')\nexcept Exception:\n    print('offline')",
    );
    assert.equal(offline.stdout, "offline\n");
    assert.deepEqual(await Sandbox.list(), [], "every sandbox it made is gone");
  });
});
