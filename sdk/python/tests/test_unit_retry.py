"""Without a daemon (httpx.MockTransport): creates retry with the same body
and idempotency key on connection failures and on 409 create_in_progress,
and give up when they should; the output stream resumes from its offsets."""

from __future__ import annotations

import base64
import json
from typing import List

import httpx
import pytest

import sandboxd
from sandboxd import BadRequestError, ConflictError, SandboxConnectionError, SandboxProcessError
from sandboxd import aio

VIEW = {"id": "sb-0123456789ab", "state": "ready"}


def error(status, code, message="m"):
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


class Script:
    """Answers the create requests in turn, recording their bodies."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.bodies: List[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/v1/sandboxes"
        self.bodies.append(json.loads(request.content))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def flaky_script():
    return Script(
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        error(409, "create_in_progress"),
        error(409, "create_in_progress"),
        httpx.Response(201, json=VIEW),
    )


def test_create_retries_with_one_key_and_one_body():
    script = flaky_script()
    client = sandboxd.Client(socket="/nonexistent.sock", transport=httpx.MockTransport(script))
    sb = sandboxd.Sandbox(image="python", cpu=1, client=client).create()
    assert sb.sandbox_id() == VIEW["id"]
    assert len(script.bodies) == 5
    assert all(b == script.bodies[0] for b in script.bodies)
    assert script.bodies[0]["idempotency_key"].startswith("sdk-py-")


@pytest.mark.anyio
async def test_async_create_retries_with_one_key_and_one_body():
    script = flaky_script()
    client = aio.Client(socket="/nonexistent.sock", transport=httpx.MockTransport(script))
    sb = await aio.Sandbox(image="python", client=client).create()
    assert sb.sandbox_id() == VIEW["id"]
    assert len(script.bodies) == 5 and all(b == script.bodies[0] for b in script.bodies)
    await client.aclose()


def test_final_answers_are_not_retried():
    for answer, cls in (
        (error(409, "idempotency_key_reused"), ConflictError),
        (error(400, "invalid_cpu"), BadRequestError),
    ):
        script = Script(answer)
        client = sandboxd.Client(socket="/x", transport=httpx.MockTransport(script))
        with pytest.raises(cls):
            sandboxd.Sandbox(client=client).create()
        assert len(script.bodies) == 1


def test_connection_failures_give_up_after_retry_seconds():
    script = Script(*[httpx.ConnectError("refused")] * 1000)
    client = sandboxd.Client(socket="/x", retry_seconds=0.3, transport=httpx.MockTransport(script))
    with pytest.raises(SandboxConnectionError) as info:
        sandboxd.Sandbox(client=client).create()
    assert "cannot reach sandboxd" in str(info.value)
    assert 2 <= len(script.bodies) < 1000
    assert len({b["idempotency_key"] for b in script.bodies}) == 1


def test_a_create_in_progress_for_too_long_gives_the_409():
    script = Script(*[error(409, "create_in_progress")] * 1000)
    client = sandboxd.Client(socket="/x", create_timeout=0.3, transport=httpx.MockTransport(script))
    with pytest.raises(ConflictError) as info:
        sandboxd.Sandbox(client=client).create()
    assert info.value.code == "create_in_progress"


def test_a_missing_socket_is_a_connection_error():
    client = sandboxd.Client(socket="/nonexistent/sandboxd.sock", retry_seconds=0.2)
    with pytest.raises(SandboxConnectionError) as info:
        sandboxd.Sandbox(client=client).create()
    assert "/nonexistent/sandboxd.sock" in str(info.value)
    with pytest.raises(SandboxConnectionError):
        sandboxd.Sandbox.connect("sb-x", client=client)


def event(stream, offset, data: bytes) -> bytes:
    return (json.dumps({"type": stream, "offset": offset, "data": base64.b64encode(data).decode()}) + "\n").encode()


def exit_line(code) -> bytes:
    return (json.dumps({"type": "exit", "process": {"id": 7, "pid": 42, "state": "exited", "exit_code": code}}) + "\n").encode()


class Daemonish:
    """A process whose output stream breaks once in the middle."""

    def __init__(self):
        self.output_queries: List[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/sandboxes/sb-1/processes" and request.method == "POST":
            return httpx.Response(201, json={"id": 7, "pid": 42, "state": "running", "argv": ["x"]})
        if path == "/v1/sandboxes/sb-1/processes/7/output":
            q = dict(request.url.params)
            self.output_queries.append(q)
            if len(self.output_queries) == 1:
                # Ends before the exit, as a stopping daemon's stream does.
                return httpx.Response(200, content=event("stdout", 0, b"one\ntw") + event("stderr", 0, b"e\n"))
            return httpx.Response(
                200, content=event("stdout", int(q["stdout_offset"]), b"o\n") + exit_line(5)
            )
        if path == "/v1/sandboxes/sb-1/processes/7/wait":
            return httpx.Response(200, json={"id": 7, "pid": 42, "state": "running"})
        raise AssertionError(f"unexpected {request.method} {path}")


def test_output_resumes_from_its_offsets():
    d = Daemonish()
    client = sandboxd.Client(socket="/x", transport=httpx.MockTransport(d))
    sb = sandboxd.SandboxInstance("sb-1", client)
    proc = sb.process.exec("x")
    assert (proc.id, proc.pid) == (7, 42)
    assert list(proc.stdout) == ["one\n", "two\n"]
    assert proc.stderr.read() == "e\n"
    assert proc.exit_code == 5
    assert d.output_queries == [
        {"stdout_offset": "0", "stderr_offset": "0"},
        {"stdout_offset": "6", "stderr_offset": "2"},
    ]


def test_wait_timeout_raises_and_leaves_it_running():
    d = Daemonish()
    client = sandboxd.Client(socket="/x", transport=httpx.MockTransport(d))
    proc = sandboxd.SandboxInstance("sb-1", client).process.exec("x")
    with pytest.raises(SandboxProcessError) as info:
        proc.wait(timeout=0.01)
    assert "still running" in str(info.value)


@pytest.mark.anyio
async def test_async_output_resumes_from_its_offsets():
    d = Daemonish()
    client = aio.Client(socket="/x", transport=httpx.MockTransport(d))
    proc = await aio.SandboxInstance("sb-1", client).process.exec("x")
    lines = [line async for line in proc.stdout]
    assert lines == ["one\n", "two\n"]
    assert await proc.stderr.read() == "e\n"
    assert proc.exit_code == 5
    assert d.output_queries[1] == {"stdout_offset": "6", "stderr_offset": "2"}
    await client.aclose()


def test_connect_by_id_with_a_client_both_ways():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "GET"
        if request.url.path == "/v1/sandboxes/sb-0123456789ab":
            return httpx.Response(200, json=VIEW)
        return error(404, "sandbox_not_found", "no sandbox with id")

    client = sandboxd.Client(socket="/x", transport=httpx.MockTransport(handler))
    assert sandboxd.Sandbox.connect(VIEW["id"], client=client).sandbox_id() == VIEW["id"]
    assert sandboxd.Sandbox(client=client).connect(VIEW["id"]).sandbox_id() == VIEW["id"]
    with pytest.raises(sandboxd.NotFoundError) as info:
        sandboxd.Sandbox(client=client).connect("sb-nope")
    assert isinstance(info.value, SandboxConnectionError)


@pytest.mark.anyio
async def test_async_connect_by_id_with_a_client():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=VIEW)

    client = aio.Client(socket="/x", transport=httpx.MockTransport(handler))
    sb = await aio.Sandbox.connect(VIEW["id"], client=client)
    assert sb.sandbox_id() == VIEW["id"]
    await sb.aclose()  # not its client: stays open
    assert (await aio.Sandbox(client=client).connect(VIEW["id"])).sandbox_id() == VIEW["id"]
    await client.aclose()
