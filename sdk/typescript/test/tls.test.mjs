// The remote transport against a local TLS server with self-signed
// certificates made by `openssl req` (no daemon): the pin accepts exactly
// its certificate, on every connection, and a refused server never sees a
// byte of the request (so never the token); without a pin, normal CA
// verification; 401 is an AuthenticationError.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import * as tls from "node:tls";

import {
  AuthenticationError,
  SandboxConnectionError,
  Sandbox,
  TLSFingerprintError,
  Transport,
  closeAllTransports,
  resolveConnection,
} from "../dist/index.js";

const TOKEN = "good-token";

function makeCert(dir, name) {
  const key = join(dir, `${name}.key`);
  const cert = join(dir, `${name}.crt`);
  execFileSync(
    "openssl",
    [
      "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
      "-keyout", key, "-out", cert, "-days", "2", "-subj", `/CN=sandboxd-test-${name}`,
      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
    ],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  // openssl's own fingerprint: "sha256 Fingerprint=AB:CD:..." (the DER's SHA-256).
  const out = execFileSync("openssl", ["x509", "-in", cert, "-noout", "-fingerprint", "-sha256"], { encoding: "utf8" });
  const fingerprint = out.trim().split("=")[1];
  assert.match(fingerprint, /^([0-9A-F]{2}:){31}[0-9A-F]{2}$/);
  return { key: readFileSync(key), cert: readFileSync(cert), certPath: cert, fingerprint };
}

/**
 * A raw TLS server speaking just enough HTTP/1.1: GET /v1/health (200 with
 * the right token, else the daemon's 401) and GET /v1/sandboxes/sb-x.
 * Every connection records the application bytes it received.
 */
function startServer(identity) {
  const connections = [];
  const server = tls.createServer({ key: identity.key, cert: identity.cert }, (socket) => {
    const record = connections.find((c) => c.port === socket.remotePort);
    let buffer = "";
    socket.on("error", () => {});
    socket.on("data", (data) => {
      record.appBytes += data.length;
      buffer += data.toString("latin1");
      let end;
      while ((end = buffer.indexOf("\r\n\r\n")) !== -1) {
        const head = buffer.slice(0, end);
        buffer = buffer.slice(end + 4);
        const [requestLine, ...lines] = head.split("\r\n");
        const headers = Object.fromEntries(
          lines.map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]),
        );
        record.requests.push({ requestLine, headers });
        let status = 200;
        let body;
        if (headers.authorization !== `Bearer ${TOKEN}`) {
          status = 401;
          body = { error: { code: "unauthorized", message: "this API needs `Authorization: Bearer TOKEN`" } };
        } else if (requestLine.startsWith("GET /v1/sandboxes/sb-x ")) {
          body = {
            id: "sb-x", state: "ready", runtime: "container", image: "python", image_digest: "sha256:0",
            limits: { cpu: 1, memory_mib: 512, disk_mib: 1024, pids: 64 }, ttl_seconds: 60, expires_at: null,
            created_at: "t", labels: {}, oom_kills: 0, failure: null,
          };
        } else {
          body = { status: "ok" };
        }
        const text = JSON.stringify(body);
        const close = server.closeAfterReply === true;
        socket.write(
          `HTTP/1.1 ${status} ${status === 200 ? "OK" : "Unauthorized"}\r\ncontent-type: application/json\r\n` +
            `content-length: ${Buffer.byteLength(text)}\r\nconnection: ${close ? "close" : "keep-alive"}\r\n\r\n${text}`,
        );
        if (close) socket.end();
      }
    });
  });
  // Every TCP connection, whether its handshake completed or not.
  server.on("connection", (tcp) => {
    connections.push({ port: tcp.remotePort, appBytes: 0, requests: [], closed: once(tcp, "close") });
  });
  server.on("tlsClientError", () => {});
  server.connections = connections;
  server.listen(0, "127.0.0.1");
  return once(server, "listening").then(() => server);
}

describe("remote transport over TLS", () => {
  let dir;
  let a;
  let b;
  let server;
  let url;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "sandboxd-ts-tls-"));
    a = makeCert(dir, "a");
    b = makeCert(dir, "b");
    assert.notEqual(a.fingerprint, b.fingerprint);
    server = await startServer(a);
    url = `https://127.0.0.1:${server.address().port}`;
  });

  after(async () => {
    closeAllTransports();
    server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const transport = (options) => new Transport(resolveConnection({ url, ...options }, {}));

  async function settledConnection(before) {
    // The connection the refused client opened: wait for its close, then
    // everything it could have sent has arrived.
    assert.equal(server.connections.length, before + 1, "the client made one TLS connection");
    const record = server.connections[before];
    await record.closed;
    return record;
  }

  it("accepts the pinned certificate in every spelling and sends the token", async () => {
    for (const spelling of [a.fingerprint, `sha256:${a.fingerprint}`, a.fingerprint.replace(/:/g, "").toLowerCase()]) {
      const t = transport({ token: TOKEN, tlsFingerprint: spelling });
      try {
        assert.deepEqual(await t.json("GET", "/v1/health"), { status: "ok" });
      } finally {
        t.close();
      }
      const last = server.connections.at(-1).requests.at(-1);
      assert.equal(last.requestLine, "GET /v1/health HTTP/1.1");
      assert.equal(last.headers.authorization, `Bearer ${TOKEN}`);
    }
  });

  it("refuses another certificate before writing a byte", async () => {
    const before = server.connections.length;
    const t = transport({ token: TOKEN, tlsFingerprint: b.fingerprint });
    try {
      await assert.rejects(t.json("GET", "/v1/health"), (e) => {
        assert.ok(e instanceof TLSFingerprintError && e instanceof SandboxConnectionError, String(e));
        assert.equal(e.code, "tls_fingerprint_mismatch");
        assert.match(e.message, new RegExp(a.fingerprint.replace(/:/g, "").toLowerCase()));
        return true;
      });
    } finally {
      t.close();
    }
    const record = await settledConnection(before);
    assert.equal(record.appBytes, 0, "no request byte (and no token) reached the server");
    assert.equal(record.requests.length, 0);
  });

  it("checks every new connection, not only the first", async () => {
    const t = transport({ token: TOKEN, tlsFingerprint: a.fingerprint });
    try {
      server.closeAfterReply = true;
      assert.deepEqual(await t.json("GET", "/v1/health"), { status: "ok" });
      await server.connections.at(-1).closed;
      // The same address now serves another certificate.
      server.setSecureContext({ key: b.key, cert: b.cert });
      const before = server.connections.length;
      await assert.rejects(t.json("GET", "/v1/health"), TLSFingerprintError);
      const record = await settledConnection(before);
      assert.equal(record.appBytes, 0);
    } finally {
      server.closeAfterReply = false;
      server.setSecureContext({ key: a.key, cert: a.cert });
      t.close();
    }
  });

  it("keeps one verified connection alive across requests", async () => {
    const t = transport({ token: TOKEN, tlsFingerprint: a.fingerprint });
    try {
      const before = server.connections.length;
      for (let i = 0; i < 3; i++) assert.deepEqual(await t.json("GET", "/v1/health"), { status: "ok" });
      assert.equal(server.connections.length, before + 1);
      assert.equal(server.connections.at(-1).requests.length, 3);
    } finally {
      t.close();
    }
  });

  it("without a pin verifies the chain: a self-signed server is refused, its CA file accepted", async () => {
    const before = server.connections.length;
    const plain = transport({ token: TOKEN });
    try {
      await assert.rejects(plain.json("GET", "/v1/health"), (e) => {
        assert.ok(e instanceof SandboxConnectionError, String(e));
        assert.ok(!(e instanceof TLSFingerprintError));
        return true;
      });
    } finally {
      plain.close();
    }
    const record = await settledConnection(before);
    assert.equal(record.appBytes, 0);
    const withCa = transport({ token: TOKEN, caFile: a.certPath });
    try {
      assert.deepEqual(await withCa.json("GET", "/v1/health"), { status: "ok" });
    } finally {
      withCa.close();
    }
  });

  it("maps a missing or wrong token to AuthenticationError", async () => {
    for (const token of [undefined, "wrong-token"]) {
      const t = transport({ token, tlsFingerprint: a.fingerprint });
      try {
        await assert.rejects(t.json("GET", "/v1/health"), (e) => {
          assert.ok(e instanceof AuthenticationError, String(e));
          assert.equal(e.status, 401);
          assert.equal(e.code, "unauthorized");
          return true;
        });
      } finally {
        t.close();
      }
      const last = server.connections.at(-1).requests.at(-1);
      assert.equal(last.headers.authorization, token === undefined ? undefined : `Bearer ${token}`);
    }
  });

  it("is what Sandbox uses given url, token and fingerprint (options or env)", async () => {
    const sb = await Sandbox.connect("sb-x", { url, token: TOKEN, tlsFingerprint: a.fingerprint });
    assert.equal(sb.sandboxId(), "sb-x");
    assert.equal(sb.info.ttlSeconds, 60);
    const saved = { ...process.env };
    try {
      Object.assign(process.env, { SANDBOXD_URL: url, SANDBOXD_TOKEN: TOKEN, SANDBOXD_TLS_FINGERPRINT: a.fingerprint });
      assert.equal((await Sandbox.connect("sb-x")).id, "sb-x");
      process.env.SANDBOXD_TLS_FINGERPRINT = b.fingerprint;
      await assert.rejects(Sandbox.connect("sb-x"), TLSFingerprintError);
      delete process.env.SANDBOXD_TOKEN;
      await assert.rejects(Sandbox.connect("sb-x", { tlsFingerprint: a.fingerprint }), AuthenticationError);
    } finally {
      for (const k of ["SANDBOXD_URL", "SANDBOXD_TOKEN", "SANDBOXD_TLS_FINGERPRINT"]) {
        if (saved[k] === undefined) delete process.env[k];
        else process.env[k] = saved[k];
      }
    }
  });
});
