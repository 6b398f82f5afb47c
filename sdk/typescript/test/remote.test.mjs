// Remote mode against a real daemon serving its API over TLS with bearer
// tokens (issue 16 part 4): `sandboxd token create`, `--api-listen`,
// `--api-tokens-file`, the self-signed certificate's fingerprint from
// `sandboxd --print-fingerprint`. The SDK pins that fingerprint; a wrong one
// is refused, and so is a missing or wrong token.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  AuthenticationError,
  SandboxConnectionError,
  Sandbox,
  TLSFingerprintError,
  closeAllTransports,
} from "../dist/index.js";
import { DAEMON, TestDaemon, freePort } from "./helpers/daemon.mjs";

const T = { timeout: 240_000 };

describe("remote API over TLS", T, () => {
  let daemon;
  let url;
  let token;
  let fingerprint;

  before(async () => {
    const port = await freePort();
    url = `https://127.0.0.1:${port}`;
    daemon = new TestDaemon();
    const tokens = join(daemon.dir, "api-tokens");
    daemon.extraArgs = ["--api-listen", `127.0.0.1:${port}`, "--api-tokens-file", tokens];
    // Top-level flags before the subcommand, where clap takes them either way.
    token = execFileSync(DAEMON, ["--state-dir", daemon.stateDir, "--api-tokens-file", tokens, "token", "create", "sdk-test"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    }).trim();
    assert.ok(token.length >= 16, "token create printed a token");
    await daemon.start();
    fingerprint = execFileSync(DAEMON, ["--state-dir", daemon.stateDir, "--print-fingerprint"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    }).trim();
    assert.match(fingerprint, /^[0-9a-f]{64}$/);
    // Only what each test gives counts (and never the socket).
    for (const k of ["SANDBOXD_SOCKET", "SANDBOXD_URL", "SANDBOXD_TOKEN", "SANDBOXD_TLS_FINGERPRINT", "SANDBOXD_CA_FILE"]) {
      delete process.env[k];
    }
  });

  after(async () => {
    closeAllTransports();
    if (daemon) {
      const leftovers = await daemon.stop();
      assert.deepEqual(leftovers, []);
    }
  });

  const remote = (overrides = {}) => ({ url, token, tlsFingerprint: fingerprint, ...overrides });

  it("creates, runs code, streams output and moves files with a token and a pinned certificate", async () => {
    const saved = { ...process.env };
    // From the environment, the fingerprint in openssl's spelling.
    process.env.SANDBOXD_URL = url;
    process.env.SANDBOXD_TOKEN = token;
    process.env.SANDBOXD_TLS_FINGERPRINT = `sha256:${fingerprint.toUpperCase().match(/../g).join(":")}`;
    let sb;
    try {
      sb = await new Sandbox({ image: "python" }).create();
      const r = await sb.process.runCode("import sys\nprint('over tls')\nprint('err', file=sys.stderr)");
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "over tls\n");
      assert.equal(r.stderr, "err\n");
      const proc = await sb.process.exec("sh", "-c", "for i in 1 2 3; do echo line $i; done");
      const lines = [];
      for await (const line of proc.stdout) lines.push(line);
      assert.deepEqual(lines, ["line 1", "line 2", "line 3"]);
      const payload = Buffer.alloc(3 * 1024 * 1024, 7);
      await sb.fs.writeBytes("/tmp/payload", payload);
      assert.ok((await sb.fs.readBytes("/tmp/payload")).equals(payload));
      assert.equal((await Sandbox.connect(sb.id)).id, sb.id);
    } finally {
      await sb?.terminate();
      for (const k of ["SANDBOXD_URL", "SANDBOXD_TOKEN", "SANDBOXD_TLS_FINGERPRINT"]) {
        if (saved[k] === undefined) delete process.env[k];
        else process.env[k] = saved[k];
      }
    }
  });

  it("refuses a server whose certificate is not the pinned one", async () => {
    const wrong = (fingerprint[0] === "0" ? "1" : "0") + fingerprint.slice(1);
    await assert.rejects(Sandbox.list(remote({ tlsFingerprint: wrong })), TLSFingerprintError);
    await assert.rejects(
      new Sandbox({ ...remote({ tlsFingerprint: wrong }), image: "python" }).create(),
      TLSFingerprintError,
      "a pin mismatch is not retried as a connection error",
    );
    // No pin: normal CA verification, which a self-signed certificate fails.
    await assert.rejects(Sandbox.list(remote({ tlsFingerprint: undefined })), (e) => e instanceof SandboxConnectionError && !(e instanceof TLSFingerprintError));
  });

  it("maps no token and a wrong token to AuthenticationError", async () => {
    for (const bad of [undefined, `${token}x`, "not-a-token"]) {
      await assert.rejects(Sandbox.list(remote({ token: bad })), (e) => {
        assert.ok(e instanceof AuthenticationError, `${bad}: ${e}`);
        assert.equal(e.status, 401);
        assert.equal(e.code, "unauthorized");
        return true;
      });
    }
    await assert.rejects(new Sandbox({ ...remote({ token: undefined }), image: "python" }).create(), AuthenticationError);
    assert.deepEqual(await Sandbox.list(remote()), []);
  });
});
