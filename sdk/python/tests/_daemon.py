"""A real sandboxd for the SDK's tests and benchmark, started as the Rust
harness starts one (tests/common/mod.rs): its own temp dir, state, run dir,
socket, btrfs pool and cgroup parent, the shared image cache. It says
READY=1 on a datagram socket when it is ready. `stop()` deletes what is
left (sandboxes, snapshots), SIGTERMs it, unmounts its pool, removes its
cgroup groups and its dir, and raises if a mount of it is left.

Binaries: env SANDBOXD_BIN and SANDBOXD_AGENT (defaults: the release build).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[3]
DAEMON_BIN = os.environ.get("SANDBOXD_BIN", str(REPO / "target/release/sandboxd"))
AGENT_BIN = os.environ.get(
    "SANDBOXD_AGENT",
    str(REPO / "target/x86_64-unknown-linux-gnu/release/sandbox-agent"),
)
IMAGES_DIR = os.environ.get("SANDBOXD_TEST_IMAGES_DIR", "/var/lib/sandboxd/images")
CGROUP_ROOT = Path("/sys/fs/cgroup")
READY_TIMEOUT = 120.0


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 120.0) -> None:
        super().__init__("sandboxd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def raw_call(
    socket_path: str, method: str, path: str, body: Optional[Any] = None, timeout: float = 120.0
) -> Tuple[int, Any]:
    """One request on a fresh connection, without the SDK: (status, JSON or None)."""
    conn = _UnixHTTPConnection(socket_path, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            value = json.loads(raw) if raw else None
        except ValueError:
            value = raw.decode(errors="replace")
        return response.status, value
    finally:
        conn.close()


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(count: int) -> Tuple[int, int]:
    """`count` consecutive TCP ports free right now on 127.0.0.1."""
    for _ in range(200):
        first = free_port()
        if first + count > 65535:
            continue
        held = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first, first + count - 1
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


INGRESS_DOMAIN = "sbx.test"


def ingress_flags(tcp_ports: int = 4) -> List[str]:
    """An ingress on a free port of 127.0.0.1 with host-name URLs under
    `sbx.test` (no DNS: clients connect to the listener and send the Host)
    and `tcp_ports` host ports for raw TCP exposures."""
    flags = ["--ingress-listen", f"127.0.0.1:{free_port()}", "--ingress-domain", INGRESS_DOMAIN]
    if tcp_ports:
        first, last = free_port_range(tcp_ports)
        flags += ["--ingress-tcp-ports", f"{first}-{last}"]
    return flags


class Daemon:
    """One test daemon. `extra` flags replace the defaults of the same name."""

    def __init__(self, extra: Sequence[str] = (), prefix: str = "sandboxd-test-") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
        # The sandboxes' ids must be able to search their way to the run dir.
        os.chmod(self.dir, 0o711)
        self.socket = str(self.dir / "api.sock")
        self.extra = list(extra)
        self.process: Optional[subprocess.Popen] = None

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def ingress(self) -> Optional[str]:
        """`host:port` of its ingress listener, when it has one."""
        if "--ingress-listen" not in self.extra:
            return None
        return self.extra[self.extra.index("--ingress-listen") + 1].split(",")[0]

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def cgroup_parent(self) -> str:
        return "/" + self.name

    def args(self) -> List[str]:
        d = self.dir
        defaults = [
            ("--state-dir", str(d / "state")),
            ("--run-dir", str(d / "run")),
            ("--socket", self.socket),
            ("--images-dir", IMAGES_DIR),
            ("--agent-path", AGENT_BIN),
            ("--disk-pool-gib", "64"),
            ("--cgroup-parent", self.cgroup_parent),
        ]
        args = [DAEMON_BIN]
        for flag, value in defaults:
            if flag not in self.extra:
                args += [flag, value]
        return args + self.extra

    def log(self) -> str:
        try:
            return (self.dir / "daemon.log").read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> "Daemon":
        for path, what in ((DAEMON_BIN, "SANDBOXD_BIN"), (AGENT_BIN, "SANDBOXD_AGENT")):
            if not os.path.exists(path):
                raise RuntimeError(f"{path} does not exist: build it or point {what} at one")
        notify_path = str(self.dir / "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.settimeout(1.0)
        log = open(self.dir / "daemon.log", "ab")
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, RUST_LOG="info")
        try:
            self.process = subprocess.Popen(
                self.args(), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        finally:
            log.close()
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while True:
                try:
                    if notify.recv(256).startswith(b"READY=1"):
                        return self
                except socket.timeout:
                    pass
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"sandboxd exited ({self.process.returncode}) before it was ready:\n{self.log()}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sandboxd was not ready after {READY_TIMEOUT}s:\n{self.log()}")
        except BaseException:
            self.stop()
            raise
        finally:
            notify.close()

    def call(self, method: str, path: str, body: Optional[Any] = None) -> Tuple[int, Any]:
        return raw_call(self.socket, method, path, body)

    def sandbox_ids(self) -> List[str]:
        status, body = self.call("GET", "/v1/sandboxes")
        if status != 200:
            return []
        return [s["id"] for s in body["sandboxes"]]

    def _mounts(self) -> List[str]:
        prefix = str(self.dir)
        with open("/proc/self/mounts") as f:
            return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]

    def stop(self) -> None:
        """Deletes what is left, stops the daemon, removes its traces."""
        if self.process is not None and self.process.poll() is None:
            try:
                for sid in self.sandbox_ids():
                    self.call("DELETE", f"/v1/sandboxes/{sid}")
                status, body = self.call("GET", "/v1/snapshots")
                if status == 200:
                    for snap in body.get("snapshots", []):
                        self.call("DELETE", f"/v1/snapshots/{snap['id']}")
            except OSError:
                pass
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for hierarchy in _cgroup_hierarchies():
            group = hierarchy / self.name
            for sub in (group / "supervisors", group):
                try:
                    sub.rmdir()
                except OSError:
                    pass
        pool = self.state_dir / "disk"
        if any(m == str(pool) for m in self._mounts()):
            subprocess.run(["umount", "-l", str(pool)], check=False)
        left = self._mounts()
        if left:
            raise RuntimeError(f"mounts left behind by the test daemon: {left}")
        shutil.rmtree(self.dir, ignore_errors=True)


def _cgroup_hierarchies() -> List[Path]:
    try:
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            return [CGROUP_ROOT]
        return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir())
    except OSError:
        return []
