"""Against a real daemon: the asyncio twin (sandboxd.aio)."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from _ingress import afetch, await_listening, server_code
from sandboxd import aio
from sandboxd.aio import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    Sandbox,
    SandboxConnectionError,
    SandboxFileSystemError,
    SandboxProcessError,
)

pytestmark = [pytest.mark.daemon, pytest.mark.anyio]


async def test_ten_sandboxes_created_concurrently(daemon):
    async def one(i: int):
        sb = await Sandbox(image="python", labels={"batch": "async10", "i": str(i)}).create()
        async with sb:
            r = await sb.process.run_code(f"print({i} * {i})")
            view = await sb.inspect()
            return sb.sandbox_id(), r.result, view["labels"]["i"]

    results = await asyncio.gather(*(one(i) for i in range(10)))
    assert len({sid for sid, _, _ in results}) == 10
    assert [(out, label) for _, out, label in results] == [(f"{i * i}\n", str(i)) for i in range(10)]
    status, listing = daemon.call("GET", "/v1/sandboxes?label=batch=async10")
    assert status == 200 and listing["sandboxes"] == []


async def test_the_issue_example_async(daemon):
    code = "import sys, time\nprint('out', flush=True)\nprint('err', file=sys.stderr, flush=True)\ntime.sleep(600)\n"
    sb = await Sandbox(cpu=1, memory="1Gi", image="python", block_network=True, keep_warm_seconds=120).create()
    try:
        proc = await sb.process.run_code(code, blocking=False)
        assert await proc.stdout.readline() == "out\n"
        try:
            await proc.wait(timeout=1)
        except SandboxProcessError:
            await proc.kill()
        out, err = await proc.stdout.read(), await proc.stderr.read()
    finally:
        assert await sb.terminate() is True
    assert (out, err, proc.exit_code) == ("", "err\n", 137)
    with pytest.raises(NotFoundError) as info:
        await Sandbox.connect(sb.sandbox_id())
    assert isinstance(info.value, SandboxConnectionError)


async def test_streams_in_order_while_running(daemon):
    code = (
        "import sys\n"
        "for i in range(3):\n"
        "    print('out', i, flush=True)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    async with await Sandbox(image="python").create() as sb:
        proc = await sb.process.run_code(code, blocking=False)
        for i in range(3):
            assert await proc.logs.next_with_stream() == ("stdout", f"out {i}\n")
            assert await proc.logs.next_with_stream() == ("stderr", f"err {i}\n")
            assert (await proc.status())[1] == "running"
            await proc.stdin.write("go\n")
        assert [line async for line in proc.stdout] == []
        assert await proc.wait(timeout=60) == 0
        r = await sb.process.run_code("import sys\nprint('a')\nsys.exit(2)")
        assert (r.exit_code, r.result) == (2, "a\n")
        p = await sb.process.exec("sh", "-c", "cat")
        await p.stdin.write("echo\n")
        await p.stdin.close()
        assert await p.wait(60) == 0 and await p.stdout.read() == "echo\n"
        assert p.pid in await sb.process.list_processes()


async def test_kill_ends_the_tree_async(daemon):
    async with await Sandbox(image="python").create() as sb:
        proc = await sb.process.exec("sh", "-c", "sleep 1000 & echo started; wait")
        assert await proc.stdout.readline() == "started\n"
        with pytest.raises(SandboxProcessError):
            await proc.wait(timeout=0.5)
        await proc.kill()
        assert await proc.wait(timeout=60) == 137
        r = await sb.process.run_code(
            "import os\nprint(sum(1 for p in os.listdir('/proc') if p.isdigit()"
            " and open('/proc/%s/cmdline' % p, 'rb').read().startswith(b'sleep\\0')))"
        )
        assert r.result == "0\n"


async def test_files_async(daemon, tmp_path):
    src, back = tmp_path / "src.bin", tmp_path / "back.bin"
    data = os.urandom(8 * 1024 * 1024 + 17)
    src.write_bytes(data)
    async with await Sandbox(image="python").create() as sb:
        await sb.fs.create_directory("/data")
        info = await sb.fs.upload_file(str(src), "/data/f.bin")
        assert info.size == len(data)
        assert await sb.fs.download_file("/data/f.bin", str(back)) == len(data)
        assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()
        await sb.fs.write_bytes("/data/t.txt", "text")
        assert await sb.fs.read_bytes("/data/t.txt") == b"text"
        assert sorted(f.name for f in await sb.fs.list_files("/data")) == ["f.bin", "t.txt"]
        assert (await sb.fs.stat_file("/data/t.txt")).size == 4
        await sb.fs.delete_file("/data/t.txt")
        assert not await sb.fs.exists("/data/t.txt")
        with pytest.raises(SandboxFileSystemError) as info:
            await sb.fs.read_bytes("/data/t.txt")
        assert isinstance(info.value, NotFoundError)
        await sb.fs.delete_directory("/data")
        assert not await sb.fs.exists("/data")


async def test_lifecycle_async(daemon):
    async with await Sandbox(image="python", block_network=True, keep_warm_seconds=100).create() as sb:
        view = await sb.update_ttl(-1)
        assert view["ttl_seconds"] == -1 and view["expires_at"] is None
        policy = await sb.update_network_permissions(allow_list=["example.com"])
        assert policy["mode"] == "allow_list" and policy["allow_list"] == ["example.com"]
        assert (await sb.update_network_permissions(block_network=True))["mode"] == "block"
        await sb.fs.write_bytes("/state.txt", "kept")
        server = await sb.process.run_code(
            "import sys\nvalue = 'in memory'\nprint('ready', flush=True)\n"
            "for line in sys.stdin:\n    print(eval(line), flush=True)\n",
            blocking=False,
        )
        assert await server.stdout.readline() == "ready\n"
        snap = await sb.snapshot_memory()
        fork = await Sandbox().create_from_memory_snapshot(snap)
        async with fork:
            assert await fork.fs.read_bytes("/state.txt") == b"kept"
            inherited = [p for p in (await fork.process.list_processes()).values() if p.id == server.id]
            assert inherited and inherited[0].info["state"] == "running"
        image = await sb.create_image_from_filesystem()
        async with await Sandbox(image=image).create() as child:
            assert await child.fs.read_bytes("/state.txt") == b"kept"
        with pytest.raises(BadRequestError):
            await sb.update_ttl(0)
        p = await sb.process.exec("true")
        assert await p.wait(60) == 0
        with pytest.raises(ConflictError):
            await p.stdin.write("late")
        for sid in (snap, image):
            assert daemon.call("DELETE", f"/v1/snapshots/{sid}")[0] == 204
        # Connecting by id gives a second handle on the same sandbox.
        again = await aio.Sandbox.connect(sb.sandbox_id())
        assert (await again.inspect())["id"] == sb.sandbox_id()
        await again.aclose()


async def test_preview_urls_async(daemon):
    async with await Sandbox(image="python", ports=[8000]).create() as sb:
        created = await sb.preview_url(8000)
        assert created.token and created.path_url
        await sb.process.run_code(server_code(8000, 9000), blocking=False)
        await await_listening(sb, 8000, 9000)
        r = await afetch(daemon, created.path_url, "a", token=created.token)
        assert r.status_code == 200 and r.json()["path"] == "/a"
        url = await sb.expose_port(9000)
        assert url.token and url != created
        urls = await sb.list_urls()
        assert urls == {8000: created, 9000: url}
        assert (urls[8000].token, urls[9000].token) == (created.token, url.token)
        rotated = await sb.rotate_port_token(9000)
        assert (await afetch(daemon, url, token=url.token)).status_code == 401
        assert (await afetch(daemon, url, token=rotated.token)).status_code == 200
        assert [(p.port, p.exposed) for p in await sb.listening_ports() if p.port in (8000, 9000)] == [
            (8000, True), (9000, True)]

        # A fork of a memory snapshot: its own URLs for the same ports, with
        # fresh tokens in its create answer, its servers already running.
        snap = await sb.snapshot_memory()
        fork = await Sandbox().create_from_memory_snapshot(snap)
        async with fork:
            forked = await fork.list_urls()
            assert sorted(forked) == [8000, 9000]
            assert all(u.token for u in forked.values())
            assert forked[9000].token not in (url.token, rotated.token)
            await await_listening(fork, 9000)
            r = await afetch(daemon, forked[9000].path_url, "fork", token=forked[9000].token)
            assert r.status_code == 200 and r.json()["path"] == "/fork"
            assert (await afetch(daemon, forked[9000].path_url, token=rotated.token)).status_code == 401
        assert daemon.call("DELETE", f"/v1/snapshots/{snap}")[0] == 204

        assert await sb.unexpose_port(9000) is True
        assert (await afetch(daemon, url.path_url, token=rotated.token)).status_code == 404
        assert list(await sb.list_urls()) == [8000]
        assert await sb.unexpose_port(9000) is False
        with pytest.raises(NotFoundError):
            await sb.preview_url(9000)
