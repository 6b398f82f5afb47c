// Preview URLs against a real daemon with an ingress (127.0.0.1, host
// names under sbx.test, a few raw TCP ports): a Python http.server started
// in the sandbox with the process API, exposed and fetched through its
// URLs with the token; listUrls, ports, listeningPorts; rotate (the old
// token refused at once), unexpose (404); public and raw TCP ports; ports
// at create with their tokens; a fork of a memory snapshot.

import assert from "node:assert/strict";
import * as http from "node:http";
import { connect } from "node:net";
import { describe, it } from "node:test";

import {
  ConfigurationError,
  ConflictError,
  BadRequestError,
  NotFoundError,
  PreviewUrl,
  Sandbox,
} from "../dist/index.js";
import { ingressArgs, rawRequest } from "./helpers/daemon.mjs";
import { terminateAll, useDaemon } from "./helpers/fixture.mjs";

const T = { timeout: 240_000 };

/** Python for runCode: an http.server on each port (the first on 127.0.0.1, the others on 0.0.0.0) echoing port, path and headers as JSON. */
function serverCode(...ports) {
  return `
import http.server, json, threading
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = json.dumps({"port": self.server.server_address[1], "path": self.path,
                           "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ports = ${JSON.stringify(ports)}
servers = [http.server.ThreadingHTTPServer(("127.0.0.1" if i == 0 else "0.0.0.0", p), Echo) for i, p in enumerate(ports)]
threads = [threading.Thread(target=s.serve_forever) for s in servers]
for t in threads:
    t.start()
for t in threads:
    t.join()
`;
}

/**
 * GET `url` + `path` through the daemon's ingress without DNS: to the
 * listener's address, with the URL's host in Host. Resolves with
 * `{ status, headers, json }`.
 */
function fetchThrough(daemon, url, { path = "", token, bearer } = {}) {
  const u = new URL(String(url));
  const [host, port] = daemon.ingress.split(":");
  const headers = { host: u.host };
  if (token) headers["x-sandbox-token"] = token;
  if (bearer) headers.authorization = `Bearer ${bearer}`;
  return new Promise((resolve, reject) => {
    const req = http.request({ host, port: Number(port), path: `${u.pathname}${path}${u.search}`, headers, agent: false }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let json;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode, headers: res.headers, json, text });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

/** Connects to `host:port`, writes `first`, and reads until the peer closes. */
function tcpExchange(address, first) {
  const i = address.lastIndexOf(":");
  return new Promise((resolve, reject) => {
    const socket = connect({ host: address.slice(0, i), port: Number(address.slice(i + 1)) });
    const chunks = [];
    socket.on("connect", () => socket.write(first));
    socket.on("data", (c) => chunks.push(c));
    socket.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    socket.on("error", reject);
  });
}

async function waitListening(sb, ...ports) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const found = new Set((await sb.listeningPorts()).map((p) => p.port));
    if (ports.every((p) => found.has(p))) return;
    assert.ok(Date.now() < deadline, `nothing listens on ${ports.filter((p) => !found.has(p))} after 60 s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("preview URLs", T, () => {
  const ctx = useDaemon(() => ingressArgs());

  it("reach a server in the sandbox with the token, rotate and unexpose", async () => {
    const daemon = ctx.daemon;
    const sb = await new Sandbox({ image: "python" }).create();
    try {
      await sb.process.runCode(serverCode(8000), { blocking: false });
      await waitListening(sb, 8000);
      assert.deepEqual((await sb.listeningPorts()).filter((p) => p.port === 8000).map((p) => p.exposed), [false]);
      assert.deepEqual(await sb.listUrls(), {});

      const url = await sb.exposePort(8000);
      assert.ok(url instanceof PreviewUrl);
      const ingressPort = daemon.ingress.split(":")[1];
      assert.equal(String(url), `http://${sb.id}-8000.sbx.test:${ingressPort}/`);
      assert.equal(`${url}`, url.url);
      assert.equal(url.href, url.url);
      assert.equal(url.pathUrl, `http://sbx.test:${ingressPort}/${sb.id}/8000/`);
      assert.deepEqual([url.port, url.protocol, url.auth, url.address], [8000, "http", "token", undefined]);
      assert.ok(url.token);
      assert.deepEqual(url.headers, { "X-Sandbox-Token": url.token });
      const { inspect } = await import("node:util");
      assert.ok(!inspect(url).includes(url.token), "console.log does not show the token");

      // Path form with X-Sandbox-Token: the app sees the rest, the prefix
      // in X-Forwarded-Prefix, and no token.
      let r = await fetchThrough(daemon, url.pathUrl, { path: "hello?x=1", token: url.token });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.path, "/hello?x=1");
      assert.equal(r.json.headers["x-forwarded-prefix"], `/${sb.id}/8000`);
      assert.equal(r.json.headers["x-sandbox-token"], undefined);
      // Host form with a bearer token.
      r = await fetchThrough(daemon, url, { path: "hello", bearer: url.token });
      assert.equal(r.status, 200);
      assert.equal(r.json.path, "/hello");
      assert.equal(r.json.headers.authorization, undefined);
      assert.equal((await fetchThrough(daemon, url.pathUrl)).status, 401);
      assert.equal((await fetchThrough(daemon, url, { token: "not-the-token" })).status, 401);
      // withToken(): for a browser, a redirect that sets the cookie.
      assert.equal(url.withToken(), `${url}?sandbox_token=${encodeURIComponent(url.token)}`);
      r = await fetchThrough(daemon, url.withToken());
      assert.ok([302, 303, 307].includes(r.status), String(r.status));
      assert.match(String(r.headers["set-cookie"]), /sandboxd_token=/);

      // Listings: the URL strings (Beam's), and the PreviewUrls with the token this instance holds.
      assert.deepEqual(await sb.listUrls(), { 8000: String(url) });
      assert.deepEqual((await sb.ports()).map((p) => [p.port, p.token]), [[8000, url.token]]);
      assert.equal((await sb.previewUrl(8000)).token, url.token);
      assert.deepEqual((await sb.listeningPorts()).filter((p) => p.port === 8000).map((p) => p.exposed), [true]);
      const info = await sb.refresh();
      assert.deepEqual(info.ports.map((p) => [p.port, p.pathUrl]), [[8000, url.pathUrl]]);
      assert.ok(!("token" in info.ports[0]));
      // Another handle on the sandbox has the URL, not the token.
      const other = await Sandbox.connect(sb.id);
      assert.equal((await other.previewUrl(8000)).token, undefined);
      assert.deepEqual(await other.listUrls(), { 8000: String(url) });

      await assert.rejects(sb.exposePort(8000), (e) => e instanceof ConflictError && e.code === "port_already_exposed");

      // Rotated: the old token is refused at once, the new one works.
      const rotated = await sb.rotatePortToken(8000);
      assert.equal(String(rotated), String(url));
      assert.ok(rotated.token && rotated.token !== url.token);
      assert.equal((await fetchThrough(daemon, url.pathUrl, { token: url.token })).status, 401);
      assert.equal((await fetchThrough(daemon, url.pathUrl, { token: rotated.token })).status, 200);
      assert.equal((await sb.previewUrl(8000)).token, rotated.token);

      // Unexposed: the URL answers 404 and the port leaves the lists.
      assert.equal(await sb.unexposePort(8000), true);
      assert.equal((await fetchThrough(daemon, url.pathUrl, { token: rotated.token })).status, 404);
      assert.deepEqual(await sb.listUrls(), {});
      assert.deepEqual(await sb.ports(), []);
      assert.equal(await sb.unexposePort(8000), false);
      await assert.rejects(sb.previewUrl(8000), (e) => e instanceof NotFoundError && e.code === "port_not_exposed");
      await assert.rejects(sb.rotatePortToken(8000), (e) => e instanceof NotFoundError && e.code === "port_not_exposed");
      const again = await sb.exposePort(8000);
      assert.ok(![url.token, rotated.token].includes(again.token));
      assert.equal((await fetchThrough(daemon, again.pathUrl, { token: again.token })).status, 200);
      assert.ok((await sb.refresh()).usage.ingressBytes > 0);
    } finally {
      await terminateAll([sb]);
    }
  });

  it("exposes public and raw TCP ports", async () => {
    const daemon = ctx.daemon;
    const sb = await new Sandbox({ image: "python" }).create();
    try {
      await sb.process.runCode(serverCode(9000, 9001), { blocking: false });
      await waitListening(sb, 9000, 9001);
      const pub = await sb.exposePort(9000, { auth: "none" });
      assert.deepEqual([pub.auth, pub.token, pub.headers, pub.withToken()], ["none", undefined, {}, String(pub)]);
      const r = await fetchThrough(daemon, pub);
      assert.equal(r.status, 200);
      assert.equal(r.json.port, 9000);
      await assert.rejects(sb.rotatePortToken(9000), (e) => e instanceof ConflictError && e.code === "port_public");

      const tcp = await sb.exposePort(9001, { protocol: "tcp" });
      assert.deepEqual([tcp.protocol, tcp.url, tcp.pathUrl], ["tcp", undefined, undefined]);
      assert.equal(String(tcp), tcp.address);
      assert.match(tcp.address, /^127\.0\.0\.1:\d+$/);
      assert.ok(tcp.token);
      const reply = await tcpExchange(tcp.address, `${tcp.token}\nGET /raw HTTP/1.0\r\n\r\n`);
      assert.match(reply, /^HTTP\/1\.[01] 200 /);
      assert.match(reply, /"\/raw"/);
      assert.deepEqual(await sb.listUrls(), { 9000: String(pub), 9001: tcp.address });
      assert.equal(await sb.unexposePort(9001), true);
      assert.equal(await sb.unexposePort(9000), true);
    } finally {
      await terminateAll([sb]);
    }
  });

  it("gives ports exposed at create their tokens, and a fork its own", async () => {
    const daemon = ctx.daemon;
    const sb = await new Sandbox({ image: "python", ports: [8000] }).create();
    let fork;
    let snapshot;
    try {
      const url = await sb.previewUrl(8000);
      assert.ok(url.token && url.pathUrl);
      assert.deepEqual(sb.info.ports.map((p) => p.port), [8000]);
      await sb.process.runCode(serverCode(8000), { blocking: false });
      await waitListening(sb, 8000);
      const r = await fetchThrough(daemon, url.pathUrl, { path: "created", token: url.token });
      assert.equal(r.status, 200);
      assert.equal(r.json.path, "/created");

      snapshot = await sb.snapshotMemory();
      fork = await new Sandbox().createFromMemorySnapshot(snapshot);
      const forked = await fork.previewUrl(8000);
      assert.ok(forked.token && forked.token !== url.token);
      assert.notEqual(String(forked), String(url));
      await waitListening(fork, 8000);
      const f = await fetchThrough(daemon, forked.pathUrl, { path: "fork", token: forked.token });
      assert.equal(f.status, 200);
      assert.equal(f.json.path, "/fork");
      assert.equal((await fetchThrough(daemon, forked.pathUrl, { token: url.token })).status, 401);
    } finally {
      await terminateAll([fork, sb]);
      if (snapshot) await rawRequest(ctx.daemon.socket, "DELETE", `/v1/snapshots/${snapshot}`);
    }
  });

  it("checks its arguments", async () => {
    const sb = await new Sandbox({ image: "python" }).create();
    try {
      for (const [port, options] of [[0, {}], [70000, {}], [1.5, {}], [8000, { auth: "public" }], [8000, { protocol: "udp" }]]) {
        await assert.rejects(sb.exposePort(port, options), ConfigurationError);
      }
      await assert.rejects(sb.exposePort(15001), (e) => e instanceof BadRequestError && e.code === "invalid_port" && e.field === "port");
    } finally {
      await sb.terminate();
    }
    await assert.rejects(sb.exposePort(8000), (e) => e instanceof NotFoundError && e.code === "sandbox_not_found");
  });
});
