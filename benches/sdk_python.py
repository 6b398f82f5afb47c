#!/usr/bin/env python3
"""What the Python SDK adds: ``Sandbox(image="python").create()`` +
``run_code("print(1)")`` + ``terminate()`` through the SDK, beside the same
four requests through raw HTTP on the socket (http.client over AF_UNIX,
one kept-alive connection: POST /v1/sandboxes, POST .../processes, GET
.../output read to the exit, DELETE), interleaved in one run (the order
alternates each round). Also one cheap request (GET /v1/sandboxes/{id})
both ways, to show the per-request cost alone. Prints medians and the
difference (target: the SDK adds <= 2 ms median), the client-side CPU time
of a round both ways (the SDK's own cost, free of the daemon's time and of
the noise of a shared machine, which moves round medians by several ms),
and writes the raw samples to benches/results/sdk_python.json.

    sdk/python/run-tests.sh -k nothing   # once: makes the venv with the SDK
    /var/cache/sandboxd-sdk/python-venv/bin/python benches/sdk_python.py

BENCH_RUNS (default 30) rounds. Uses the daemon at SANDBOXD_SOCKET when
set, else starts its own test daemon (as the SDK's tests do; root).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk" / "python" / "tests"))
try:
    import sandboxd
except ImportError:  # not installed: the source tree
    sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
    import sandboxd

from _daemon import Daemon  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "30"))
WARMUP = 3
CHEAP_RUNS = 500


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sandboxd", timeout=300)
        self.path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


class Raw:
    """The four requests by hand, on one kept-alive connection."""

    def __init__(self, path: str) -> None:
        self.conn = UnixConnection(path)

    def call(self, method: str, url: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if data is not None else {}
        self.conn.request(method, url, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 400:
            raise RuntimeError(f"{method} {url}: {response.status} {raw!r}")
        return json.loads(raw) if raw else None

    def round(self) -> str:
        sb = self.call("POST", "/v1/sandboxes", {"image": "python", "idempotency_key": "raw-" + uuid.uuid4().hex})
        sid = sb["id"]
        proc = self.call("POST", f"/v1/sandboxes/{sid}/processes", {"code": "print(1)"})
        self.conn.request("GET", f"/v1/sandboxes/{sid}/processes/{proc['id']}/output")
        response = self.conn.getresponse()
        out = b""
        for line in response:
            event = json.loads(line)
            if event["type"] == "stdout":
                out += base64.b64decode(event["data"])
            elif event["type"] == "exit":
                break
        response.read()
        self.call("DELETE", f"/v1/sandboxes/{sid}")
        return out.decode()


def sdk_round(client: "sandboxd.Client") -> str:
    sb = sandboxd.Sandbox(image="python", client=client).create()
    out = sb.process.run_code("print(1)").result
    sb.terminate()
    return out


CPU: dict = {"sdk": [], "raw": []}


def timed(fn, *args, cpu=None) -> float:
    """Wall milliseconds of one call; with `cpu`, its client-side CPU
    milliseconds go to CPU[cpu] (this process only: what the client
    library itself costs, without the daemon's time or the machine's noise)."""
    cpu_start = time.process_time()
    start = time.perf_counter()
    result = fn(*args)
    elapsed = (time.perf_counter() - start) * 1000
    if cpu is not None:
        CPU[cpu].append((time.process_time() - cpu_start) * 1000)
    if result is not None and result != "1\n" and not isinstance(result, dict):
        raise RuntimeError(f"unexpected output {result!r}")
    return elapsed


def main() -> int:
    own = None
    path = os.environ.get("SANDBOXD_SOCKET")
    if not path:
        own = Daemon(prefix="sandboxd-bench-").start()
        path = own.socket
    try:
        client = sandboxd.Client(socket=path)
        raw = Raw(path)
        for _ in range(WARMUP):
            sdk_round(client)
            raw.round()
        sdk, plain = [], []
        for i in range(RUNS):
            pair = [("sdk", lambda: timed(sdk_round, client, cpu="sdk")), ("raw", lambda: timed(raw.round, cpu="raw"))]
            if i % 2:
                pair.reverse()
            for name, run in pair:
                (sdk if name == "sdk" else plain).append(run())

        # One cheap request, both ways, on a sandbox that stays.
        sb = sandboxd.Sandbox(image="python", client=client).create()
        url = f"/v1/sandboxes/{sb.sandbox_id()}"
        for _ in range(20):
            sb.inspect()
            raw.call("GET", url)
        cheap_sdk, cheap_raw = [], []
        for i in range(CHEAP_RUNS):
            pair = [(cheap_sdk, sb.inspect), (cheap_raw, lambda: raw.call("GET", url))]
            if i % 2:
                pair.reverse()
            for samples, fn in pair:
                samples.append(timed(fn))
        sb.terminate()
        client.close()
    finally:
        if own is not None:
            own.stop()

    m_sdk, m_raw = statistics.median(sdk), statistics.median(plain)
    # Each round's pair ran back to back: their difference is less noisy
    # than the difference of the medians.
    paired = statistics.median(a - b for a, b in zip(sdk, plain))
    c_sdk, c_raw = statistics.median(cheap_sdk), statistics.median(cheap_raw)
    print(f"create + run_code(print(1)) + terminate, {RUNS} interleaved rounds:")
    print(f"  sdk  median {m_sdk:8.2f} ms   (min {min(sdk):.2f}, max {max(sdk):.2f})")
    print(f"  raw  median {m_raw:8.2f} ms   (min {min(plain):.2f}, max {max(plain):.2f})")
    print(f"  sdk adds    {m_sdk - m_raw:+8.2f} ms median (target <= 2 ms)")
    print(f"  median of the paired differences {paired:+.2f} ms")
    cpu_sdk, cpu_raw = statistics.median(CPU["sdk"]), statistics.median(CPU["raw"])
    print(f"  client CPU per round: sdk {cpu_sdk:.2f} ms, raw {cpu_raw:.2f} ms: sdk adds {cpu_sdk - cpu_raw:+.2f} ms")
    print(f"one GET /v1/sandboxes/{{id}}, {CHEAP_RUNS} interleaved:")
    print(f"  sdk  median {c_sdk:8.3f} ms")
    print(f"  raw  median {c_raw:8.3f} ms")
    print(f"  sdk adds    {c_sdk - c_raw:+8.3f} ms per request")
    results = REPO / "benches" / "results" / "sdk_python.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(
        json.dumps(
            {
                "sdk_create_run_terminate_ms": sdk,
                "raw_create_run_terminate_ms": plain,
                "sdk_get_ms": cheap_sdk,
                "raw_get_ms": cheap_raw,
                "median_added_ms": m_sdk - m_raw,
                "median_paired_difference_ms": paired,
                "sdk_client_cpu_ms": CPU["sdk"],
                "raw_client_cpu_ms": CPU["raw"],
                "median_added_per_request_ms": c_sdk - c_raw,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"samples: {results}")
    return 0 if m_sdk - m_raw <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
