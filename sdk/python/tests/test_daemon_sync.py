"""Against a real daemon (the session fixture): the sync SDK end to end."""

from __future__ import annotations

import hashlib
import os
import threading
import tracemalloc

import httpx
import pytest

from _daemon import Daemon
from _ingress import fetch, request_for, server_code, tcp_exchange, wait_listening
from sandboxd import (
    APIError,
    BadRequestError,
    Client,
    ConflictError,
    Image,
    NotFoundError,
    PreviewUrl,
    Sandbox,
    SandboxConnectionError,
    SandboxFileSystemError,
    SandboxProcessError,
)

pytestmark = pytest.mark.daemon


def test_the_issue_example(daemon):
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n"
    sb = Sandbox(cpu=1, memory="1Gi", image="python", block_network=True, keep_warm_seconds=120).create()
    try:
        view = sb.inspect()
        proc = sb.process.run_code(code, blocking=False)
        try:
            exit_code = proc.wait(timeout=30)
        except SandboxProcessError:
            proc.kill()
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        assert sb.terminate() is True
    assert (exit_code, out, err) == (0, "to stdout\n", "to stderr\n")
    assert view["limits"]["cpu"] == 1.0 and view["limits"]["memory_mib"] == 1024
    assert view["ttl_seconds"] == 120 and view["expires_at"]
    assert view["network"]["mode"] == "block"
    # Terminated means gone.
    with pytest.raises(NotFoundError):
        Sandbox.connect(sb.sandbox_id())
    assert sb.terminate() is False


def test_a_cpu_weight_is_the_sandboxs_own(daemon):
    with Sandbox(image="busybox", cpu_shares=2048).create() as heavy, Sandbox(image="busybox").create() as plain:
        assert heavy.inspect()["limits"]["cpu_shares"] == 2048
        assert "cpu_shares" not in plain.inspect()["limits"]


def test_the_issue_example_when_the_code_hangs(daemon):
    code = "import sys, time\nprint('started', flush=True)\nprint('warn', file=sys.stderr, flush=True)\ntime.sleep(600)\n"
    with Sandbox(image="python", block_network=True).create() as sb:
        proc = sb.process.run_code(code, blocking=False)
        assert proc.stdout.readline() == "started\n"
        with pytest.raises(SandboxProcessError):
            proc.wait(timeout=1)
        assert proc.status() == (-1, "running")
        proc.kill()
        assert (proc.stdout.read(), proc.stderr.read()) == ("", "warn\n")
        assert proc.exit_code == 137 and proc.signal == 9


def test_the_issue_example_image_is_sent_as_a_spec(daemon):
    image = Image(python_version="python3.11").add_python_packages(["pandas"])
    assert image.to_spec() == {"python_version": "3.11", "python_packages": ["pandas"]}
    # This daemon has no declarative images (issue 15): it refuses the spec,
    # and with no package index reachable here a build could not work anyway.
    with pytest.raises(APIError) as info:
        Sandbox(image=image, block_network=True).create()
    if isinstance(info.value, BadRequestError):
        assert "image" in info.value.message


def test_blocking_run_code_and_exec(daemon):
    with Sandbox(image="python").create() as sb:
        r = sb.process.run_code("import sys\nprint(6 * 7)\nprint('e', file=sys.stderr)\nsys.exit(3)")
        assert (r.exit_code, r.stdout.read(), r.stderr.read(), r.result) == (3, "42\n", "e\n", "42\ne\n")
        assert r.pid > 0
        r = sb.process.run_code("echo $GREETING from $(pwd)", language="bash", cwd="/tmp", env={"GREETING": "hi"})
        assert r.result == "hi from /tmp\n"
        r = sb.process.run_code("import time\ntime.sleep(600)", timeout=1)
        assert r.timed_out and r.exit_code == 137
        p = sb.process.exec("sh", "-c", "cat; echo done >&2", env={"X": "1"})
        p.stdin.write("fed in\n")
        p.stdin.write(b"bytes too\n")
        p.stdin.close()
        assert p.wait(timeout=60) == 0
        assert p.stdout.read() == "fed in\nbytes too\n" and p.stderr.read() == "done\n"
        p2 = sb.process.exec(["python3", "-c", "print('list form')"])
        assert p2.wait(60) == 0 and p2.stdout.read() == "list form\n"
        status = "grep -E '^(Uid|Groups|CapBnd|Seccomp_filters):' /proc/self/status; cat /proc/self/oom_score_adj"
        plain = sb.process.exec("sh", "-c", status)
        confined = sb.process.exec(
            "sh",
            "-c",
            status,
            uid=1000,
            gid=1000,
            groups=[4000],
            cwd="/tmp",
            capabilities=["CAP_KILL"],
            seccomp={"defaultAction": "SCMP_ACT_ALLOW"},
            oom_score_adj=500,
        )
        assert plain.wait(60) == 0 and confined.wait(60) == 0, confined.stderr.read()
        before = dict(line.split(":", 1) for line in plain.stdout.read().splitlines()[:-1])
        lines = confined.stdout.read().splitlines()
        after = dict(line.split(":", 1) for line in lines[:-1])
        assert after["Uid"].split()[0] == "1000" and after["Groups"].split() == ["4000"], after
        assert after["CapBnd"].strip() == "0000000000000020", after
        assert int(after["Seccomp_filters"]) == int(before["Seccomp_filters"]) + 1, (before, after)
        assert lines[-1] == "500", lines
        listed = sb.process.list_processes()
        assert p.pid in listed and listed[p.pid] is p
        assert sb.process.get_process(p2.pid) is p2
        with pytest.raises(SandboxProcessError):
            sb.process.get_process(99999)


def test_stdout_and_stderr_stream_separately_and_in_order(daemon):
    # The program advances only when the test has seen its previous line, so
    # the order it writes in is the order the streams must give.
    code = (
        "import sys\n"
        "for i in range(5):\n"
        "    print('out', i, flush=True)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n"
        "    sys.stdin.readline()\n"
        "print('tail without newline', end='', flush=True)\n"
    )
    with Sandbox(image="python").create() as sb:
        proc = sb.process.run_code(code, blocking=False)
        seen = []
        for i in range(5):
            # Lines arrive while the process runs: it is blocked on stdin now.
            assert proc.logs.next_with_stream() == ("stdout", f"out {i}\n")
            assert proc.logs.next_with_stream() == ("stderr", f"err {i}\n")
            assert proc.status()[1] == "running"
            seen.append(i)
            proc.stdin.write("next\n")
        assert list(proc.stdout) == ["tail without newline"]
        assert proc.wait(timeout=60) == 0
        assert proc.stderr.read() == ""
        assert seen == [0, 1, 2, 3, 4]

        # Iterating one stream keeps the other's lines for later, in order.
        proc = sb.process.run_code(
            "import sys\nfor i in range(200):\n    print('o%d' % i)\n    print('e%d' % i, file=sys.stderr)\n"
        )
        assert proc.stdout.read().split() == ["o%d" % i for i in range(200)]
        assert proc.stderr.read().split() == ["e%d" % i for i in range(200)]


# How many `sleep` processes the sandbox holds.
SLEEPERS = (
    "import os\n"
    "print(sum(1 for p in os.listdir('/proc') if p.isdigit()"
    " and open('/proc/%s/cmdline' % p, 'rb').read().startswith(b'sleep\\0')))"
)


def test_wait_timeout_raises_and_kill_ends_the_whole_tree(daemon):
    with Sandbox(image="python").create() as sb:
        proc = sb.process.exec("sh", "-c", "sleep 1000 & sleep 1001 & echo started; wait")
        assert proc.stdout.readline() == "started\n"
        with pytest.raises(SandboxProcessError) as info:
            proc.wait(timeout=1)
        assert "still running" in str(info.value)
        # Left running, as Beam leaves it.
        assert proc.is_running()
        r = sb.process.run_code(SLEEPERS)
        assert r.result == "2\n"
        proc.kill()
        assert proc.wait(timeout=60) == 137
        assert proc.signal == 9
        assert sb.process.list_processes()[proc.pid].info["state"] == "exited"
        # Nothing of the tree is left: the sleeps went with it.
        r = sb.process.run_code(SLEEPERS)
        assert r.result == "0\n"
        proc.kill()  # killing what is gone is fine


def _write_random(path: str, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 1 << 20))
            h.update(block)
            f.write(block)
            left -= len(block)
    return h.hexdigest()


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def test_a_50_mib_file_round_trip_streams(daemon, tmp_path):
    size = 50 * 1024 * 1024
    src, back = str(tmp_path / "src.bin"), str(tmp_path / "back.bin")
    digest = _write_random(src, size)
    with Sandbox(image="python").create() as sb:
        sb.fs.create_directory("/data/in")
        tracemalloc.start()
        try:
            info = sb.fs.upload_file(src, "/data/in/big.bin")
            _, upload_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            assert sb.fs.download_file("/data/in/big.bin", back) == size
            _, download_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert info.size == size and info.kind == "file" and not info.is_dir
        # Neither direction held the file whole.
        assert upload_peak < 12 << 20, upload_peak
        assert download_peak < 12 << 20, download_peak
        assert _sha256(back) == digest
        r = sb.process.run_code(
            "import hashlib\nh = hashlib.sha256()\nf = open('/data/in/big.bin', 'rb')\n"
            "for b in iter(lambda: f.read(1 << 20), b''):\n    h.update(b)\nprint(h.hexdigest())"
        )
        assert r.result.strip() == digest


def test_files(daemon, tmp_path):
    with Sandbox(image="python").create() as sb:
        fs = sb.fs
        made = fs.create_directory("/work/a/b")
        assert made.is_dir and made.kind == "dir"
        fs.write_bytes("/work/a/b/hello.txt", "héllo\n")
        fs.write_bytes("/work/a/b/raw.bin", b"\x00\x01\xff", mode=0o600)
        assert fs.read_bytes("/work/a/b/hello.txt") == "héllo\n".encode()
        names = sorted(f.name for f in fs.list_files("/work/a/b"))
        assert names == ["hello.txt", "raw.bin"]
        st = fs.stat_file("/work/a/b/raw.bin")
        assert (st.size, st.permissions, st.is_dir) == (3, 0o600, False)
        assert fs.exists("/work/a/b/raw.bin")
        fs.delete_file("/work/a/b/raw.bin")
        assert not fs.exists("/work/a/b/raw.bin")
        with pytest.raises(NotFoundError) as info:
            fs.stat_file("/work/a/b/raw.bin")
        assert isinstance(info.value, SandboxFileSystemError) and info.value.code == "file_not_found"
        with pytest.raises(SandboxFileSystemError):
            fs.download_file("/nope", str(tmp_path / "nope"))
        assert not (tmp_path / "nope").exists()
        with pytest.raises(ConflictError) as conflict:
            fs.delete_file("/work")  # not empty: the files' state, a 409
        assert isinstance(conflict.value, SandboxFileSystemError) and conflict.value.code == "file_error"
        fs.delete_directory("/work")
        assert not fs.exists("/work")
        with pytest.raises(BadRequestError):
            fs.stat_file("../../etc/passwd")


def _resolves(sb, host: str) -> str:
    code = (
        "import socket\n"
        f"try:\n    socket.getaddrinfo({host!r}, 80)\n    print('resolved')\n"
        "except socket.gaierror as e:\n    print('gaierror')\n"
    )
    return sb.process.run_code(code, timeout=60).result.strip()


def _connect(sb, address: str) -> str:
    code = (
        "import socket\n"
        f"try:\n    s = socket.create_connection(({address!r}, 80), timeout=20)\n"
        "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n    print('answer' if s.recv(100) else 'closed')\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
    )
    return sb.process.run_code(code, timeout=60).result.strip()


def test_network_update(daemon):
    with Sandbox(image="python", block_network=True).create() as sb:
        assert sb.inspect()["network"] == {"mode": "block", "block_network": True, "allow_list": []}
        # Blocked: not even DNS.
        assert _resolves(sb, "example.com") == "gaierror"

        policy = sb.update_network_permissions(allow_list=["example.com", "*.pythonhosted.org"])
        assert policy == {"mode": "allow_list", "block_network": False, "allow_list": ["example.com", "*.pythonhosted.org"]}
        assert sb.inspect()["network"]["mode"] == "allow_list"
        # The allowed name now resolves inside the sandbox; another does not.
        assert _resolves(sb, "example.com") == "resolved"
        assert _resolves(sb, "not-allowed.example.org") == "gaierror"
        # An address outside the list: the egress proxy refuses it, and says so.
        assert _connect(sb, "203.0.113.9") in ("closed", "ConnectionResetError", "ConnectionRefusedError")
        status, log = daemon.call("GET", f"/v1/sandboxes/{sb.sandbox_id()}/network/log")
        assert status == 200
        refused = [e for e in log["entries"] if e["host"] == "203.0.113.9"]
        assert refused and refused[-1]["verdict"] == "refused", log

        assert sb.update_network_permissions(block_network=True)["mode"] == "block"
        assert _resolves(sb, "example.com") == "gaierror"
        with pytest.raises(ValueError):
            sb.update_network_permissions(block_network=True, allow_list=["x.org"])
        with pytest.raises(BadRequestError):
            sb.update_network_permissions(allow_list=["not a host name!"])


def test_ttl_update(daemon):
    with Sandbox(image="python", keep_warm_seconds=120).create() as sb:
        first = sb.inspect()
        assert first["ttl_seconds"] == 120 and first["expires_at"]
        view = sb.update_ttl(3600)
        assert view["ttl_seconds"] == 3600 and view["expires_at"] > first["expires_at"]
        assert sb.inspect()["ttl_seconds"] == 3600
        view = sb.update_ttl(-1)
        assert view["ttl_seconds"] == -1 and view["expires_at"] is None
        with pytest.raises(BadRequestError) as info:
            sb.update_ttl(0)
        assert info.value.code == "invalid_ttl"
    with Sandbox(image="python", keep_warm_seconds=-1).create() as sb:
        assert sb.inspect()["expires_at"] is None
    # Left out: the daemon's default TTL.
    with Sandbox(image="python").create() as sb:
        assert sb.inspect()["ttl_seconds"] > 0


SERVER = r"""
import random, socket, sys
secret = '%032x' % random.getrandbits(128)
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 7000))
srv.listen(4)
print(secret, flush=True)
while True:
    conn, _ = srv.accept()
    conn.sendall(secret.encode())
    conn.close()
"""

ASK = "import socket\ns = socket.create_connection(('127.0.0.1', 7000), timeout=20)\nprint(s.recv(100).decode())"


def test_snapshot_and_fork(daemon):
    with Sandbox(image="python", keep_warm_seconds=600).create() as source:
        source.fs.write_bytes("/kept.txt", "from the source\n")
        server = source.process.run_code(SERVER, blocking=False)
        secret = server.stdout.readline().strip()
        assert len(secret) == 32
        assert source.process.run_code(ASK).result.strip() == secret

        snap = source.snapshot_memory()
        assert snap.startswith("snap-")
        with Sandbox(keep_warm_seconds=300, labels={"fork": "yes"}).create_from_memory_snapshot(snap) as fork:
            assert fork.sandbox_id() != source.sandbox_id()
            # The variable lives on in the fork's copy of the server's memory.
            assert fork.process.run_code(ASK).result.strip() == secret
            assert fork.fs.read_bytes("/kept.txt") == b"from the source\n"
            view = fork.inspect()
            assert view["labels"] == {"fork": "yes"} and view["ttl_seconds"] == 300
            # The fork lists the process it inherited.
            inherited = fork.process.list_processes()
            assert any(p.id == server.id and p.info["state"] == "running" for p in inherited.values())

        image = source.create_image_from_filesystem()
        with Sandbox(image=image).create() as child:
            assert child.fs.read_bytes("/kept.txt") == b"from the source\n"
        for sid in (snap, image):
            assert daemon.call("DELETE", f"/v1/snapshots/{sid}")[0] == 204


def test_errors_are_typed(daemon):
    with pytest.raises(NotFoundError) as info:
        Sandbox.connect("sb-000000000000")
    err = info.value
    assert isinstance(err, SandboxConnectionError)
    assert (err.status, err.code) == (404, "sandbox_not_found") and "sb-000000000000" in err.message
    with pytest.raises(NotFoundError):
        Sandbox().connect("sb-000000000000")  # Beam's form

    with pytest.raises(BadRequestError) as info:
        Sandbox(image="python", cpu=1000).create()
    err = info.value
    assert err.status == 400 and err.code == "invalid_cpu" and "cpu" in err.message
    # The daemon names the field where it can (the `field` member).
    assert err.field == (err.body["error"].get("field"))
    assert err.field in (None, "cpu")

    with pytest.raises(NotFoundError) as info:
        Sandbox(image="no-such-image-here").create()

    with Sandbox(image="python").create() as sb:
        again = Sandbox.connect(sb.sandbox_id())
        assert again.sandbox_id() == sb.sandbox_id()
        proc = sb.process.exec("true")
        assert proc.wait(60) == 0
        with pytest.raises(ConflictError) as info:
            proc.stdin.write("too late")
        assert isinstance(info.value, SandboxProcessError)
        assert (info.value.status, info.value.code) == (409, "process_state")
        with pytest.raises(BadRequestError):
            sb.process.run_code("print(1)", language="cobol")
        with pytest.raises(NotFoundError):
            sb.fs.read_bytes("/no/such/file")


def test_idempotency_keys(daemon):
    client = Client()
    body = Sandbox(image="python", labels={"k": "v"}).create_request()
    first = client.create_sandbox(body)
    try:
        # The same key and body: the same sandbox, not a second one.
        assert client.create_sandbox(dict(body))["id"] == first["id"]
        other = dict(body, labels={"k": "other"})
        with pytest.raises(ConflictError) as info:
            client.create_sandbox(other)
        assert info.value.code == "idempotency_key_reused"
    finally:
        Sandbox.connect(first["id"]).terminate()


class _CountingTransport(httpx.HTTPTransport):
    """Counts connection failures; sets `failed` at the first."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.failures = 0
        self.failed = threading.Event()

    def handle_request(self, request):
        try:
            return super().handle_request(request)
        except httpx.ConnectError:
            self.failures += 1
            self.failed.set()
            raise


def test_a_create_waits_out_a_daemon_that_is_starting():
    d = Daemon()
    transport = _CountingTransport(uds=d.socket)
    client = Client(socket=d.socket, retry_seconds=120, transport=transport)
    result = {}

    def create():
        try:
            result["sandbox"] = Sandbox(image="python", client=client).create()
        except BaseException as e:  # reported below
            result["error"] = e

    worker = threading.Thread(target=create)
    worker.start()
    try:
        assert transport.failed.wait(60), "the create never tried the missing daemon"
        d.start()
        worker.join(180)
        assert not worker.is_alive()
        assert "error" not in result, result.get("error")
        sb = result["sandbox"]
        assert transport.failures >= 1
        assert d.sandbox_ids() == [sb.sandbox_id()]
        assert sb.process.run_code("print('after the retry')").result == "after the retry\n"
        assert sb.terminate()
    finally:
        worker.join(180)
        client.close()
        d.stop()


def test_preview_urls_reach_a_server_in_the_sandbox(daemon):
    assert daemon.ingress, "the session daemon has an ingress"
    with Sandbox(image="python").create() as sb:
        sb.process.run_code(server_code(8000), blocking=False)
        wait_listening(sb, 8000)
        assert [(p.port, p.exposed) for p in sb.listening_ports() if p.port == 8000] == [(8000, False)]
        assert sb.list_urls() == {}

        url = sb.expose_port(8000)
        assert isinstance(url, PreviewUrl) and isinstance(url, str)
        assert (url.port, url.protocol, url.auth, url.address) == (8000, "http", "token", None)
        sid = sb.sandbox_id()
        host = daemon.ingress.rsplit(":", 1)[1]
        assert url == url.url == f"http://{sid}-8000.sbx.test:{host}/"
        assert url.path_url == f"http://sbx.test:{host}/{sid}/8000/"
        assert url.token and url.token not in repr(url)
        assert url.headers == {"X-Sandbox-Token": url.token}

        # The path form, the token in X-Sandbox-Token: the app sees the rest
        # of the path, the prefix in X-Forwarded-Prefix, and no token.
        r = fetch(daemon, url.path_url, "hello?x=1", token=url.token)
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["path"] == "/hello?x=1" and seen["port"] == 8000
        assert seen["headers"]["x-forwarded-prefix"] == f"/{sid}/8000"
        assert "x-sandbox-token" not in seen["headers"]
        # The host form, the token as a bearer: the request as it came.
        r = fetch(daemon, url, "hello", bearer=url.token)
        assert r.status_code == 200 and r.json()["path"] == "/hello"
        assert "authorization" not in r.json()["headers"]
        # No token, a wrong one: 401.
        assert fetch(daemon, url.path_url).status_code == 401
        assert fetch(daemon, url, token="not-the-token").status_code == 401
        # ?sandbox_token= (what with_token() gives a browser): a redirect that sets the cookie.
        assert url.with_token() == f"{url}?sandbox_token={url.token}"
        target, headers = request_for(daemon, url.with_token())
        r = httpx.get(target, headers=headers)
        assert r.status_code in (302, 303, 307) and "sandboxd_token" in r.headers.get("set-cookie", "")

        # The listings hand out the token this instance holds.
        urls = sb.list_urls()
        assert urls == {8000: url} and urls[8000].token == url.token
        assert [(p.port, p.token) for p in sb.ports()] == [(8000, url.token)]
        assert sb.preview_url(8000).token == url.token
        assert [(p.port, p.exposed) for p in sb.listening_ports() if p.port == 8000] == [(8000, True)]
        assert sb.inspect()["ports"][0]["port"] == 8000
        # Another instance of the sandbox has the URL, not the token.
        other = Sandbox.connect(sid)
        assert other.list_urls() == {8000: url} and other.list_urls()[8000].token is None

        with pytest.raises(ConflictError) as conflict:
            sb.expose_port(8000)
        assert conflict.value.code == "port_already_exposed"

        # A new token: the old one is refused at once, the new one works.
        rotated = sb.rotate_port_token(8000)
        assert rotated == url and rotated.token and rotated.token != url.token
        assert fetch(daemon, url.path_url, token=url.token).status_code == 401
        assert fetch(daemon, url.path_url, token=rotated.token).status_code == 200
        assert sb.preview_url(8000).token == rotated.token

        # Unexposed: the URL is gone (404), and so is the port from the lists.
        assert sb.unexpose_port(8000) is True
        assert fetch(daemon, url.path_url, token=rotated.token).status_code == 404
        assert sb.list_urls() == {} and sb.ports() == []
        assert sb.unexpose_port(8000) is False
        with pytest.raises(NotFoundError) as gone:
            sb.preview_url(8000)
        assert gone.value.code == "port_not_exposed"
        with pytest.raises(NotFoundError) as gone:
            sb.rotate_port_token(8000)
        assert gone.value.code == "port_not_exposed"
        # Exposed again: a fresh token.
        again = sb.expose_port(8000)
        assert again.token not in (url.token, rotated.token)
        assert fetch(daemon, again.path_url, token=again.token).status_code == 200
        assert sb.inspect()["usage"]["ingress_bytes"] > 0


def test_public_and_raw_tcp_ports(daemon):
    with Sandbox(image="python").create() as sb:
        sb.process.run_code(server_code(9000, 9001), blocking=False)
        wait_listening(sb, 9000, 9001)
        public = sb.expose_port(9000, auth="none")
        assert (public.auth, public.token, public.headers) == ("none", None, {})
        assert public.with_token() == str(public)
        r = fetch(daemon, public)
        assert r.status_code == 200 and r.json()["port"] == 9000
        with pytest.raises(ConflictError) as public_port:
            sb.rotate_port_token(9000)
        assert public_port.value.code == "port_public"

        tcp = sb.expose_port(9001, protocol="tcp")
        assert (tcp.protocol, tcp.url, tcp.path_url) == ("tcp", None, None)
        assert tcp == tcp.address and tcp.address.startswith("127.0.0.1:") and tcp.token
        assert tcp.with_token() == str(tcp)
        reply = tcp_exchange(tcp.address, tcp.token.encode() + b"\nGET /raw HTTP/1.0\r\n\r\n")
        assert reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n")[0] and b'"/raw"' in reply
        assert sb.list_urls() == {9000: public, 9001: tcp}
        assert sb.unexpose_port(9001) and sb.unexpose_port(9000)


def test_ports_at_create_come_with_their_tokens(daemon):
    with Sandbox(image="python", ports=[8000]).create() as sb:
        url = sb.preview_url(8000)
        assert url.token and url.path_url and sb.list_urls() == {8000: url}
        sb.process.run_code(server_code(8000), blocking=False)
        wait_listening(sb, 8000)
        r = fetch(daemon, url.path_url, "created", token=url.token)
        assert r.status_code == 200 and r.json()["path"] == "/created"
        assert sb.list_urls()[8000].token == url.token


class _LosingTransport(httpx.HTTPTransport):
    """Loses the answer of the first create: the daemon made the sandbox,
    the client sees a broken connection (and retries with the same key)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lost = None

    def handle_request(self, request):
        response = super().handle_request(request)
        if self.lost is None and request.method == "POST" and request.url.path == "/v1/sandboxes":
            response.read()
            response.close()
            self.lost = response.json()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return response


def test_a_create_retried_after_a_lost_answer_still_hands_out_tokens(daemon):
    # The daemon answers a create again for its idempotency key with the
    # same sandbox and new tokens for its ports (the lost answer's no longer
    # work), so the instance can hand them out.
    transport = _LosingTransport(uds=daemon.socket)
    with Client(socket=daemon.socket, transport=transport) as client:
        with Sandbox(image="python", ports=[8000], client=client).create() as sb:
            lost_token = transport.lost["ports"][0]["token"]
            assert transport.lost["id"] == sb.sandbox_id()
            url = sb.preview_url(8000)
            assert url.token and url.token != lost_token
            sb.process.run_code(server_code(8000), blocking=False)
            wait_listening(sb, 8000)
            assert fetch(daemon, url.path_url, token=url.token).status_code == 200
            assert fetch(daemon, url.path_url, token=lost_token).status_code == 401


def test_preview_url_arguments_are_checked(daemon):
    with Sandbox(image="python").create() as sb:
        for bad in (dict(port=0), dict(port=70000), dict(port=8000, auth="public"), dict(port=8000, protocol="udp")):
            with pytest.raises(ValueError):
                sb.expose_port(**bad)
        with pytest.raises(BadRequestError) as own:
            sb.expose_port(15001)
        assert own.value.code == "invalid_port" and own.value.field == "port"
        with pytest.raises(ValueError):
            Sandbox(image="python", ports=[0])
    with pytest.raises(NotFoundError) as missing:
        sb.expose_port(8000)
    assert missing.value.code == "sandbox_not_found"


def test_the_default_socket_setting_reaches_the_daemon(daemon):
    # SANDBOXD_SOCKET (set by the fixture) is the whole configuration.
    assert os.environ["SANDBOXD_SOCKET"] == daemon.socket
    health = Client().request_json("GET", "/v1/health")
    assert health["status"] == "ok"
    with Client(socket="/nonexistent/sandboxd.sock") as other:
        with pytest.raises(SandboxConnectionError):
            other.request_json("GET", "/v1/health")
