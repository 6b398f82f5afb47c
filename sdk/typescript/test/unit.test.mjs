// Unit tests without a daemon: the Image builder's JSON, memory sizes,
// connection resolution, error mapping, the create's idempotent retries and
// the output stream's framing and resumption (against fake servers on a
// Unix socket).

import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import * as http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  APIError,
  AuthenticationError,
  BadRequestError,
  PermissionDeniedError,
  ServerError,
  CapacityError,
  ConfigurationError,
  ConflictError,
  FeatureUnavailableError,
  PreviewUrl,
  SandboxConnectionError,
  Image,
  NotFoundError,
  PythonVersion,
  Sandbox,
  SandboxdError,
  PayloadTooLargeError,
  Transport,
  createSandbox,
  normalizeFingerprint,
  parseCpu,
  parseMemory,
  resolveConnection,
} from "../dist/index.js";
import { errorFromResponse, isMissingRoute } from "../dist/errors.js";
import { inspect } from "node:util";
import { SandboxProcess } from "../dist/process.js";

describe("Image", () => {
  it("with nothing set leaves image out (the daemon's default image)", () => {
    assert.equal(new Image().toSpec(), undefined);
    assert.equal(JSON.stringify({ image: new Image() }), '{"image":null}');
    assert.equal("image" in new Sandbox({ image: new Image() }).toCreateRequest(), false);
  });

  it("with only a base is that name or reference", () => {
    assert.equal(Image.fromRegistry("node:20").toSpec(), "node:20");
    assert.equal(new Image().fromRegistry("docker.io/library/python:3.12-slim").toSpec(), "docker.io/library/python:3.12-slim");
    assert.equal(Image.fromId("snap-0123").toSpec(), "snap-0123");
    assert.equal(new Sandbox({ image: "python" }).toCreateRequest().image, "python");
    assert.equal(new Sandbox({ image: Image.fromRegistry("node:20") }).toCreateRequest().image, "node:20");
  });

  it("otherwise is the declarative spec of issue 15", () => {
    const image = new Image({ pythonVersion: PythonVersion.Python311 })
      .addPythonPackages(["pandas==2.2.3"])
      .addPythonPackages("numpy")
      .addSystemPackages(["git"])
      .addCommands(["echo built > /built"])
      .withEnvs({ A: "1" })
      .withWorkdir("/workspace");
    assert.deepEqual(image.toSpec(), {
      python_version: "3.11",
      python_packages: ["pandas==2.2.3", "numpy"],
      system_packages: ["git"],
      commands: ["echo built > /built"],
      env: { A: "1" },
      workdir: "/workspace",
    });
    assert.deepEqual(Image.fromRegistry("node:20").addCommands("npm i -g x").toSpec(), {
      base: "node:20",
      commands: ["npm i -g x"],
    });
    assert.deepEqual(new Image({ envVars: ["A=1", "B=x=y"] }).withEnvs({ C: "3" }).toSpec(), { env: { A: "1", B: "x=y", C: "3" } });
    assert.deepEqual(new Image().addPythonVersion("python3.13").toSpec(), { python_version: "3.13" });
    assert.deepEqual(new Image({ baseImage: "python", pythonVersion: "3.13" }).toSpec(), {
      base: "python",
      python_version: "3.13",
    });
    assert.deepEqual(JSON.parse(JSON.stringify(new Sandbox({ image: image }).toCreateRequest())).image, image.toSpec());
  });
});

describe("create request", () => {
  it("maps Beam's options to the daemon's fields and units", () => {
    const body = new Sandbox({
      cpu: "500m",
      memory: "1Gi",
      image: "python",
      gpu: "H100",
      gpuCount: 2,
      blockNetwork: true,
      secrets: ["OPENAI_API_KEY"],
      env: { A: "b" },
      keepWarmSeconds: 120,
      useVm: true,
      labels: { team: "x" },
      disk: "2Gi",
      pids: 64,
      cpuShares: 512,
    }).toCreateRequest();
    assert.deepEqual(body, {
      image: "python",
      runtime: "vm",
      cpu: 0.5,
      memory_mib: 1024,
      disk_mib: 2048,
      pids: 64,
      cpu_shares: 512,
      gpu: "H100",
      gpu_count: 2,
      ttl_seconds: 120,
      block_network: true,
      secrets: ["OPENAI_API_KEY"],
      env: { A: "b" },
      labels: { team: "x" },
    });
    assert.deepEqual(new Sandbox({ allowList: ["pypi.org"], keepWarmSeconds: -1, ports: [3000] }).toCreateRequest(), {
      ttl_seconds: -1,
      allow_list: ["pypi.org"],
      ports: [3000],
    });
    assert.deepEqual(new Sandbox().toCreateRequest(), {});
  });

  it("parses memory sizes", () => {
    assert.equal(parseMemory(512), 512);
    assert.equal(parseMemory("512"), 512);
    assert.equal(parseMemory("512Mi"), 512);
    assert.equal(parseMemory("512MiB"), 512);
    assert.equal(parseMemory("1Gi"), 1024);
    assert.equal(parseMemory("1.5Gi"), 1536);
    assert.equal(parseMemory("2gi"), 2048);
    assert.equal(parseMemory("1G"), 954); // 10^9 bytes, rounded up to whole MiB
    assert.equal(parseMemory("2048Ki"), 2);
    assert.equal(parseCpu(2), 2);
    assert.equal(parseCpu("0.5"), 0.5);
    assert.equal(parseCpu("250m"), 0.25);
    for (const bad of ["", "fast", "-1", 0, "0m"]) {
      assert.throws(() => parseCpu(bad), (e) => e instanceof ConfigurationError && e.field === "cpu", String(bad));
    }
    for (const bad of ["", "lots", "-1Gi", "1Xi", 0, -5, Number.NaN]) {
      assert.throws(() => parseMemory(bad), (e) => e instanceof ConfigurationError && e.field === "memory", String(bad));
    }
  });
});

describe("connection", () => {
  const hex = "ab".repeat(32);

  it("normalises fingerprints in every spelling", () => {
    const colons = hex.toUpperCase().match(/../g).join(":");
    for (const spelling of [hex, hex.toUpperCase(), colons, `sha256:${colons}`, `SHA256:${hex}`, `  ${hex}\n`]) {
      assert.equal(normalizeFingerprint(spelling), hex, spelling);
    }
    for (const bad of ["", "abc", "zz".repeat(32), "ab".repeat(31), `sha1:${hex}`]) {
      assert.throws(() => normalizeFingerprint(bad), ConfigurationError, bad);
    }
  });

  it("defaults to the system socket", () => {
    assert.deepEqual(resolveConnection({}, {}), {
      endpoint: { kind: "unix", socketPath: "/run/sandboxd/sandboxd.sock" },
      token: undefined,
    });
    assert.equal(resolveConnection({}, { SANDBOXD_SOCKET: "/tmp/s.sock" }).endpoint.socketPath, "/tmp/s.sock");
  });

  it("reads the remote API from the environment, options winning field by field", () => {
    const env = {
      SANDBOXD_URL: "https://10.0.0.7:8443",
      SANDBOXD_TOKEN: "env-token",
      SANDBOXD_TLS_FINGERPRINT: `sha256:${hex.toUpperCase()}`,
      SANDBOXD_SOCKET: "/tmp/ignored.sock",
    };
    const fromEnv = resolveConnection({}, env);
    assert.equal(fromEnv.token, "env-token");
    assert.equal(fromEnv.endpoint.kind, "tls");
    assert.equal(fromEnv.endpoint.host, "10.0.0.7");
    assert.equal(fromEnv.endpoint.port, 8443);
    assert.equal(fromEnv.endpoint.servername, undefined);
    assert.equal(fromEnv.endpoint.fingerprint, hex);
    const overridden = resolveConnection({ url: "https://sandboxd.example:9000/api/", token: "mine", tlsFingerprint: "cd".repeat(32) }, env);
    assert.equal(overridden.token, "mine");
    assert.equal(overridden.endpoint.host, "sandboxd.example");
    assert.equal(overridden.endpoint.servername, "sandboxd.example");
    assert.equal(overridden.endpoint.basePath, "/api");
    assert.equal(overridden.endpoint.fingerprint, "cd".repeat(32));
    assert.equal(resolveConnection({ socket: "/tmp/explicit.sock" }, env).endpoint.socketPath, "/tmp/explicit.sock");
    assert.equal(resolveConnection({}, { SANDBOXD_URL: "https://[::1]:7000" }).endpoint.host, "::1");
  });

  it("refuses URLs that would send a token in clear text", () => {
    assert.throws(() => resolveConnection({}, { SANDBOXD_URL: "http://127.0.0.1:80" }), ConfigurationError);
    assert.throws(() => resolveConnection({ url: "not a url" }, {}), ConfigurationError);
    assert.throws(() => resolveConnection({ url: "https://h:1", caFile: "/nonexistent/ca.pem" }, {}), ConfigurationError);
  });
});

describe("errors", () => {
  const body = (error) => JSON.stringify({ error });

  it("map the status to their class and keep the daemon's fields", () => {
    const bad = errorFromResponse(400, body({ code: "invalid_cpu", message: "cpu must be above 0", field: "cpu" }), "POST", "/v1/sandboxes");
    assert.ok(bad instanceof BadRequestError && bad instanceof SandboxdError);
    assert.equal(bad.status, 400);
    assert.equal(bad.code, "invalid_cpu");
    assert.equal(bad.message, "cpu must be above 0");
    assert.equal(bad.field, "cpu");
    assert.equal(bad.method, "POST");
    assert.equal(bad.path, "/v1/sandboxes");
    assert.ok(bad instanceof APIError);
    const named = errorFromResponse(400, body({ code: "invalid_json", message: "request body is not valid: field `memory_mib`: invalid value" }), "GET", "/x");
    assert.equal(named.field, "memory_mib");
    const full = errorFromResponse(503, body({ code: "capacity", message: "no memory left", resource: "memory" }), "GET", "/x");
    assert.ok(full instanceof CapacityError);
    assert.equal(full.resource, "memory");
    assert.ok(errorFromResponse(404, body({ code: "sandbox_not_found", message: "m" }), "GET", "/x") instanceof NotFoundError);
    assert.ok(errorFromResponse(409, body({ code: "sandbox_state", message: "m" }), "GET", "/x") instanceof ConflictError);
    assert.ok(errorFromResponse(413, body({ code: "too_large", message: "m" }), "GET", "/x") instanceof PayloadTooLargeError);
    assert.ok(errorFromResponse(401, body({ code: "unauthorized", message: "m" }), "GET", "/x") instanceof AuthenticationError);
    assert.ok(errorFromResponse(403, body({ code: "forbidden", message: "m" }), "GET", "/x") instanceof PermissionDeniedError);
    const other = errorFromResponse(500, body({ code: "internal", message: "boom" }), "GET", "/x");
    assert.equal(other.constructor, ServerError);
    assert.ok(other instanceof SandboxdError);
    assert.equal(other.message, "boom");
  });

  it("say which request got a body that is not the daemon's", () => {
    const e = errorFromResponse(404, "", "GET", "/v1/sandboxes/x/ports");
    assert.ok(e instanceof NotFoundError);
    assert.equal(e.code, "http_404");
    assert.match(e.message, /GET \/v1\/sandboxes\/x\/ports: HTTP 404/);
    assert.equal(errorFromResponse(502, "<html>bad gateway</html>", "GET", "/x").code, "http_502");
  });
});

/** An HTTP server on a fresh Unix socket; `handler(req, res, body)`. */
async function fakeDaemon(handler) {
  const dir = mkdtempSync(join(tmpdir(), "sandboxd-ts-unit-"));
  const socket = join(dir, "api.sock");
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      requests.push({ method: req.method, url: req.url, body, headers: req.headers });
      handler(req, res, body, requests.length);
    });
  });
  server.listen(socket);
  await once(server, "listening");
  return {
    socket,
    requests,
    transport: new Transport(resolveConnection({ socket }, {})),
    async close() {
      server.closeAllConnections?.();
      server.close();
      await once(server, "close");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const SANDBOX = {
  id: "sb-1",
  state: "ready",
  runtime: "container",
  image: "python",
  image_digest: "sha256:0",
  limits: { cpu: 1, memory_mib: 512, disk_mib: 1024, pids: 64 },
  ttl_seconds: 300,
  expires_at: null,
  created_at: "2026-01-01T00:00:00Z",
  labels: {},
  oom_kills: 0,
  failure: null,
};

describe("idempotent create", () => {
  it("sends one key and retries the same body on a broken connection and while in progress", async () => {
    const fake = await fakeDaemon((req, res, body, n) => {
      if (n === 1) {
        req.socket.destroy(); // the daemon died mid-request
      } else if (n === 2) {
        res.writeHead(409, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "create_in_progress", message: "still creating" } }));
      } else {
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify(SANDBOX));
      }
    });
    try {
      const retries = [];
      const made = await createSandbox(fake.transport, { image: "python", cpu: 1 }, { onRetry: (e) => retries.push(e) });
      assert.equal(made.id, "sb-1");
      assert.equal(fake.requests.length, 3);
      const bodies = fake.requests.map((r) => JSON.parse(r.body));
      assert.equal(typeof bodies[0].idempotency_key, "string");
      assert.ok(bodies[0].idempotency_key.length >= 16);
      for (const b of bodies) assert.deepEqual(b, bodies[0]);
      assert.deepEqual({ ...bodies[0], idempotency_key: undefined }, { image: "python", cpu: 1, idempotency_key: undefined });
      assert.ok(retries[0] instanceof SandboxConnectionError);
      assert.ok(retries[1] instanceof ConflictError && retries[1].code === "create_in_progress");
    } finally {
      fake.transport.close();
      await fake.close();
    }
  });

  it("does not retry other errors, and a fresh create gets a fresh key", async () => {
    const fake = await fakeDaemon((req, res) => {
      res.writeHead(409, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "idempotency_key_reused", message: "used with another body" } }));
    });
    try {
      await assert.rejects(createSandbox(fake.transport, { image: "python" }), (e) => e instanceof ConflictError && e.code === "idempotency_key_reused");
      await assert.rejects(createSandbox(fake.transport, { image: "python" }), ConflictError);
      assert.equal(fake.requests.length, 2);
      const [a, b] = fake.requests.map((r) => JSON.parse(r.body).idempotency_key);
      assert.notEqual(a, b);
    } finally {
      fake.transport.close();
      await fake.close();
    }
  });

  it("gives up on connection errors after its bound", async () => {
    const transport = new Transport(resolveConnection({ socket: "/nonexistent/sandboxd.sock" }, {}));
    const started = Date.now();
    await assert.rejects(
      createSandbox(transport, {}, { connectionRetryMs: 300 }),
      (e) => e instanceof SandboxConnectionError && /is sandboxd running/.test(e.message),
    );
    assert.ok(Date.now() - started >= 300);
  });
});

describe("preview URLs", () => {
  const body = (error) => JSON.stringify({ error });

  it("are their URL as a string, with the daemon's fields beside it", () => {
    const wire = {
      port: 3000,
      protocol: "http",
      auth: "token",
      url: "https://sb-1-3000.example.com/",
      path_url: "https://example.com/sb-1/3000/",
      token: "s3cr3t+/",
    };
    const url = new PreviewUrl(wire);
    assert.equal(String(url), "https://sb-1-3000.example.com/");
    assert.equal(`${url}`, url.href);
    assert.deepEqual([url.port, url.protocol, url.auth, url.url, url.pathUrl, url.address, url.token], [
      3000, "http", "token", wire.url, wire.path_url, undefined, "s3cr3t+/",
    ]);
    assert.deepEqual(url.headers, { "X-Sandbox-Token": "s3cr3t+/" });
    assert.equal(url.withToken(), "https://sb-1-3000.example.com/?sandbox_token=s3cr3t%2B%2F");
    assert.deepEqual(url.toWire(), wire);
    assert.ok(!inspect(url).includes("s3cr3t"));
    // Without ingress_domain: the path form; raw TCP: the address.
    const pathOnly = new PreviewUrl({ port: 80, protocol: "http", auth: "none", path_url: "http://10.0.0.1:8080/sb-1/80/" });
    assert.deepEqual([String(pathOnly), pathOnly.url, pathOnly.token, pathOnly.withToken()], [
      "http://10.0.0.1:8080/sb-1/80/", undefined, undefined, "http://10.0.0.1:8080/sb-1/80/",
    ]);
    // A token path URL: the token goes in a header, no browser URL is made.
    const guarded = new PreviewUrl({ port: 81, protocol: "http", auth: "token", path_url: "http://10.0.0.1:8080/sb-1/81/" }, "t");
    assert.deepEqual(guarded.headers, { "X-Sandbox-Token": "t" });
    assert.throws(() => guarded.withToken(), (e) => e instanceof ConfigurationError && /ingress_domain/.test(e.message));
    const tcp = new PreviewUrl({ port: 5432, protocol: "tcp", auth: "token", address: "10.0.0.1:20000" }, "t");
    assert.deepEqual([String(tcp), tcp.token, tcp.withToken()], ["10.0.0.1:20000", "t", "10.0.0.1:20000"]);
  });

  it("map a daemon without the routes, or without an ingress, to FeatureUnavailableError", async () => {
    let ingressOff = false;
    const fake = await fakeDaemon((req, res) => {
      if (!req.url.includes("/ports")) {
        res.writeHead(req.method === "POST" ? 201 : 200, { "content-type": "application/json" });
        res.end(JSON.stringify(SANDBOX));
      } else if (ingressOff) {
        res.writeHead(400, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "ingress_disabled", message: "this daemon serves no preview URLs: set ingress_listen" } }));
      } else {
        res.writeHead(req.method === "DELETE" ? 405 : 404);
        res.end();
      }
    });
    try {
      const sb = await Sandbox.connect("sb-1", { socket: fake.socket });
      assert.deepEqual(sb.info.ports, []);
      const calls = [
        () => sb.exposePort(8000),
        () => sb.listUrls(),
        () => sb.ports(),
        () => sb.listeningPorts(),
        () => sb.previewUrl(8000),
        () => sb.unexposePort(8000),
        () => sb.rotatePortToken(8000),
      ];
      for (const call of calls) {
        await assert.rejects(call(), (e) => e instanceof FeatureUnavailableError && e.code === "feature_unavailable" && /no such route/.test(e.message));
      }
      ingressOff = true;
      await assert.rejects(sb.exposePort(8000), (e) => e instanceof FeatureUnavailableError && e.status === 400 && e.code === "ingress_disabled" && /ingress_listen/.test(e.message));
      fake.transport.close();
    } finally {
      await fake.close();
    }
  });

  it("on create: the field refused or the ingress off", async () => {
    let answer;
    const fake = await fakeDaemon((req, res) => {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: answer }));
    });
    try {
      answer = { code: "invalid_json", message: "request body is not valid: field `ports`: unknown field `ports`, expected one of ..." };
      await assert.rejects(new Sandbox({ socket: fake.socket, ports: [8000] }).create(), (e) => e instanceof FeatureUnavailableError && e.field === "ports" && /no such route/.test(e.message));
      answer = { code: "ingress_disabled", message: "this daemon serves no preview URLs" };
      await assert.rejects(new Sandbox({ socket: fake.socket, ports: [8000] }).create(), (e) => e instanceof FeatureUnavailableError && e.field === "ports" && e.code === "ingress_disabled");
      // Without ports the daemon's error stays as it is.
      answer = { code: "invalid_cpu", message: "cpu must be above 0", field: "cpu" };
      await assert.rejects(new Sandbox({ socket: fake.socket }).create(), (e) => e instanceof BadRequestError && e.code === "invalid_cpu");
      assert.equal(isMissingRoute(errorFromResponse(404, body({ code: "port_not_exposed", message: "m" }), "DELETE", "/x")), false);
      assert.equal(isMissingRoute(errorFromResponse(404, body({ code: "not_found", message: "no route" }), "GET", "/x")), true);
      assert.equal(isMissingRoute(errorFromResponse(404, "", "GET", "/x")), true);
    } finally {
      await fake.close();
    }
  });
});

describe("output stream", () => {
  const b64 = (s) => Buffer.from(s, "utf8").toString("base64");
  const exit = {
    id: 7,
    sandbox_id: "sb-1",
    argv: ["python3", "-u"],
    state: "exited",
    pid: 3,
    exit_code: 0,
    signal: null,
    timed_out: false,
    oom_killed: false,
    dropped_bytes: 0,
    started_at: "t",
    ended_at: "t",
  };
  const event = (e) => `${JSON.stringify(e)}\n`;

  it("demultiplexes NDJSON, splits lines across chunks and resumes from its offsets", async () => {
    const euro = Buffer.from("€", "utf8"); // 3 bytes, split across two chunks below
    const fake = await fakeDaemon((req, res, _body, n) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      if (n === 1) {
        // First connection: part of the output, then the daemon goes away.
        res.write(event({ type: "stdout", offset: 0, data: b64("one\ntw") }));
        res.write(event({ type: "stderr", offset: 0, data: b64("e1\n") }));
        const line = event({ type: "stdout", offset: 6, data: Buffer.concat([Buffer.from("o "), euro.subarray(0, 2)]).toString("base64") });
        res.write(line.slice(0, 10)); // an NDJSON line split across TCP chunks
        res.end(line.slice(10));
      } else {
        // Resumed: the daemon starts at the offsets asked for, repeating a bit.
        res.write(event({ type: "stdout", offset: 8, data: Buffer.concat([euro, Buffer.from("\nthree")]).toString("base64") }));
        res.write(event({ type: "stderr", offset: 3, data: b64("e2\n") }));
        res.end(event({ type: "exit", process: exit }));
      }
    });
    try {
      const proc = new SandboxProcess(fake.transport, { ...exit, state: "running", exit_code: null, ended_at: null });
      assert.equal(proc.exitCode, -1);
      proc.startOutput();
      const lines = [];
      for await (const line of proc.stdout) lines.push(line);
      assert.deepEqual(lines, ["one", "two €", "three"]);
      assert.equal(await proc.stderr.read(), "e1\ne2\n");
      assert.equal((await proc.exitedViaOutput()).exitCode, 0);
      assert.equal(proc.exitCode, 0);
      assert.equal(fake.requests.length, 2);
      assert.equal(fake.requests[0].url, "/v1/sandboxes/sb-1/processes/7/output?stdout_offset=0&stderr_offset=0");
      assert.equal(fake.requests[1].url, "/v1/sandboxes/sb-1/processes/7/output?stdout_offset=10&stderr_offset=3");
      assert.equal(proc.stdout.droppedBytes, 0);
    } finally {
      fake.transport.close();
      await fake.close();
    }
  });

  it("counts bytes the daemon dropped and reports a signal as 128 + it", async () => {
    const fake = await fakeDaemon((req, res) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.write(event({ type: "dropped", stream: "stdout", bytes: 100 }));
      res.write(event({ type: "stdout", offset: 100, data: b64("tail\n") }));
      res.end(event({ type: "exit", process: { ...exit, exit_code: null, signal: 9 } }));
    });
    try {
      const proc = new SandboxProcess(fake.transport, { ...exit, state: "running", exit_code: null });
      proc.startOutput();
      assert.equal(await proc.stdout.read(), "tail\n");
      assert.equal(proc.stdout.droppedBytes, 100);
      await proc.exitedViaOutput();
      assert.equal(proc.exitCode, 137);
      assert.equal(proc.signal, 9);
    } finally {
      fake.transport.close();
      await fake.close();
    }
  });

  it("merges both streams into logs in the order lines were completed", async () => {
    const fake = await fakeDaemon((req, res) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.write(event({ type: "stdout", offset: 0, data: b64("a1\na2") }));
      res.write(event({ type: "stderr", offset: 0, data: b64("b1\n") }));
      res.write(event({ type: "stderr", offset: 3, data: b64("b2\n") }));
      res.write(event({ type: "stdout", offset: 5, data: b64(" done\n") }));
      res.write(event({ type: "stderr", offset: 6, data: b64("last without newline") }));
      res.end(event({ type: "exit", process: exit }));
    });
    try {
      const proc = new SandboxProcess(fake.transport, { ...exit, state: "running", exit_code: null });
      const seen = [];
      for await (const entry of proc.logs.withStream()) seen.push([entry.stream, entry.line]);
      assert.deepEqual(seen, [
        ["stdout", "a1"],
        ["stderr", "b1"],
        ["stderr", "b2"],
        ["stdout", "a2 done"],
        ["stderr", "last without newline"],
      ]);
      assert.equal(await proc.stdout.read(), "", "logs took the lines from the same buffers");
    } finally {
      fake.transport.close();
      await fake.close();
    }
  });

  it("fails both streams with the daemon's error", async () => {
    const fake = await fakeDaemon((req, res) => {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "sandbox_not_found", message: "no sandbox with id \"sb-1\"" } }));
    });
    try {
      const proc = new SandboxProcess(fake.transport, { ...exit, state: "running" });
      await assert.rejects(proc.stdout.read(), NotFoundError);
      await assert.rejects(proc.stderr.read(), NotFoundError);
    } finally {
      fake.transport.close();
      await fake.close();
    }
  });
});

describe("transport", () => {
  let fake;
  before(async () => {
    fake = await fakeDaemon((req, res, body) => {
      if (req.url === "/v1/echo") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ length: Buffer.byteLength(body), type: req.headers["content-type"] }));
      } else {
        res.writeHead(204);
        res.end();
      }
    });
  });
  after(async () => {
    fake.transport.close();
    await fake.close();
  });

  it("streams an async iterable body and sends JSON as JSON", async () => {
    async function* chunks() {
      for (let i = 0; i < 8; i++) yield Buffer.alloc(64 * 1024, i);
    }
    assert.deepEqual(await fake.transport.json("PUT", "/v1/echo", { body: chunks() }), {
      length: 8 * 64 * 1024,
      type: "application/octet-stream",
    });
    assert.deepEqual(await fake.transport.json("POST", "/v1/echo", { json: { a: 1 } }), { length: 7, type: "application/json" });
    assert.equal(await fake.transport.json("DELETE", "/v1/nothing"), undefined);
    assert.equal(fake.requests.at(-1).headers.authorization, undefined);
  });
});
