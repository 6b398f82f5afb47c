"""Processes in a sandbox (asyncio twin of :mod:`sandboxd.process`).

``async for line in proc.stdout``, ``await proc.stdout.read()``,
``await proc.wait(timeout)``, ``await proc.kill()``,
``await proc.stdin.write(...)``. ``exit_code`` is the last known value
(-1 until the exit was seen); ``await proc.status()`` asks the daemon.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Optional, Tuple, Union

import httpx

from .. import _http
from .._models import CompletedStream, ProcessSpec, argv_of, stdin_bytes
from .._output import OutputState, asplit_lines, exit_code_of
from ..errors import APIError, SandboxConnectionError, SandboxdError, SandboxProcessError, in_context

if TYPE_CHECKING:
    from .sandbox import SandboxInstance

__all__ = [
    "SandboxProcessManager",
    "SandboxProcess",
    "SandboxProcessStream",
    "SandboxProcessLogs",
    "SandboxProcessStdin",
    "SandboxProcessResponse",
]

_WAIT_SLICE = 3600.0


def _process_error(exc: SandboxdError) -> SandboxdError:
    return in_context(exc, SandboxProcessError)


class _OutputPump:
    def __init__(self, process: "SandboxProcess") -> None:
        self.process = process
        self.state = OutputState()
        self.lock = asyncio.Lock()
        self._response: Optional[httpx.Response] = None
        self._lines: Optional[AsyncIterator[bytes]] = None
        self._failing_since: Optional[float] = None

    async def _open(self) -> None:
        self._response = await self.process._client.open_stream(
            "GET", self.process._path + "/output", params=self.state.params(), timeout=None
        )
        self._lines = asplit_lines(self._response.aiter_bytes())

    async def _close(self) -> None:
        response, self._response, self._lines = self._response, None, None
        if response is not None:
            await response.aclose()

    async def pull(self) -> None:
        if self.state.ended:
            return
        while True:
            try:
                if self._lines is None:
                    await self._open()
                assert self._lines is not None
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                await self._close()
                if await self._note_failure(None):
                    continue
                raise SandboxConnectionError("the output stream ended before the process exited")
            except (httpx.TransportError, SandboxConnectionError) as exc:
                await self._close()
                if await self._note_failure(exc):
                    continue
                if isinstance(exc, httpx.TransportError):
                    raise _http.connection_error(exc, self.process._client.config, "GET", "output") from exc
                raise
            self._failing_since = None
            self.state.feed_line(line)
            if self.state.ended:
                await self._finish()
                self.process._update(self.state.exit or {})
            return

    async def _finish(self) -> None:
        """After the exit: read the body's end so the connection is reused."""
        try:
            if self._lines is not None:
                async for _ in self._lines:
                    pass
        except httpx.TransportError:
            pass
        await self._close()

    async def _note_failure(self, exc: Optional[BaseException]) -> bool:
        if exc is not None and isinstance(exc, httpx.TransportError) and not _http.retryable(exc):
            return False
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            return True
        if now - self._failing_since >= self.process._client.retry_seconds:
            return False
        await asyncio.sleep(0.2)
        return True

    async def close(self) -> None:
        async with self.lock:
            await self._close()


class SandboxProcessStream:
    """stdout or stderr: ``async for line in stream`` (lines as they
    arrive), ``await stream.readline()``, ``await stream.read()`` (all not
    yet read, at the exit)."""

    def __init__(self, pump: _OutputPump, name: str) -> None:
        self._pump = pump
        self._name = name

    def __aiter__(self) -> "SandboxProcessStream":
        return self

    async def __anext__(self) -> str:
        pump = self._pump
        while True:
            async with pump.lock:
                line = pump.state.take_line(self._name)
                if line is not None:
                    return line
                if pump.state.ended:
                    raise StopAsyncIteration
                await pump.pull()

    async def readline(self) -> str:
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return ""

    async def read_bytes(self) -> bytes:
        pump = self._pump
        async with pump.lock:
            while not pump.state.ended:
                await pump.pull()
            return pump.state.take_all(self._name)

    async def read(self) -> str:
        return (await self.read_bytes()).decode("utf-8", errors="replace")

    @property
    def dropped_bytes(self) -> int:
        return self._pump.state.streams[self._name].dropped


class SandboxProcessLogs:
    """stdout and stderr together, in the order their lines were completed."""

    def __init__(self, pump: _OutputPump) -> None:
        self._pump = pump

    def __aiter__(self) -> "SandboxProcessLogs":
        return self

    async def __anext__(self) -> str:
        return (await self.next_with_stream())[1]

    async def next_with_stream(self) -> Tuple[str, str]:
        pump = self._pump
        while True:
            async with pump.lock:
                item = pump.state.take_any_line()
                if item is not None:
                    return item
                if pump.state.ended:
                    raise StopAsyncIteration
                await pump.pull()

    async def read(self) -> str:
        pump = self._pump
        async with pump.lock:
            while not pump.state.ended:
                await pump.pull()
            return pump.state.take_all_combined()


class SandboxProcessStdin:
    def __init__(self, process: "SandboxProcess") -> None:
        self._process = process

    async def write(self, data: Union[str, bytes]) -> None:
        p = self._process
        try:
            await p._client.request("POST", p._path + "/stdin", content=stdin_bytes(data))
        except SandboxdError as exc:
            raise _process_error(exc) from None

    async def close(self) -> None:
        p = self._process
        try:
            await p._client.request("DELETE", p._path + "/stdin")
        except SandboxdError as exc:
            raise _process_error(exc) from None


class SandboxProcess:
    """A process in the sandbox (see :class:`sandboxd.SandboxProcess`)."""

    def __init__(self, sandbox: "SandboxInstance", info: Dict[str, Any]) -> None:
        self.sandbox_instance = sandbox
        self._client = sandbox._client
        self.id: int = int(info["id"])
        self._path = f"/v1/sandboxes/{sandbox.container_id}/processes/{self.id}"
        self._info: Dict[str, Any] = dict(info)
        self._pump = _OutputPump(self)
        self.stdout = SandboxProcessStream(self._pump, "stdout")
        self.stderr = SandboxProcessStream(self._pump, "stderr")
        self.logs = SandboxProcessLogs(self._pump)
        self.stdin = SandboxProcessStdin(self)

    def _update(self, info: Dict[str, Any]) -> None:
        if not info:
            return
        if self._info.get("state") == "exited" and info.get("state") != "exited":
            return
        self._info = dict(info)

    @property
    def pid(self) -> int:
        return int(self._info.get("pid", 0))

    @property
    def args(self) -> List[str]:
        return list(self._info.get("argv", []))

    @property
    def info(self) -> Dict[str, Any]:
        return dict(self._info)

    @property
    def exit_code(self) -> int:
        """The last known exit code (-1 until the exit was seen)."""
        return exit_code_of(self._info)

    @property
    def signal(self) -> Optional[int]:
        return self._info.get("signal")

    @property
    def timed_out(self) -> bool:
        return bool(self._info.get("timed_out"))

    @property
    def oom_killed(self) -> bool:
        return bool(self._info.get("oom_killed"))

    async def refresh(self) -> Dict[str, Any]:
        try:
            self._update(await self._client.request_json("GET", self._path))
        except SandboxdError as exc:
            raise _process_error(exc) from None
        return self.info

    async def status(self) -> Tuple[int, str]:
        info = await self.refresh()
        return exit_code_of(info), str(info.get("state", ""))

    async def is_running(self) -> bool:
        return (await self.status())[1] == "running"

    async def wait(self, timeout: Optional[float] = None) -> int:
        """As :meth:`sandboxd.SandboxProcess.wait`."""
        if self._info.get("state") == "exited":
            return exit_code_of(self._info)
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        while True:
            left = _WAIT_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            slice_ = min(left, _WAIT_SLICE)
            try:
                info = await self._client.request_json(
                    "GET",
                    self._path + "/wait",
                    params={"timeout_seconds": f"{slice_:.3f}"},
                    timeout=slice_ + 60.0,
                )
            except SandboxdError as exc:
                raise _process_error(exc) from None
            self._update(info)
            if info.get("state") == "exited":
                return exit_code_of(info)
            if deadline is not None and time.monotonic() >= deadline:
                raise SandboxProcessError(
                    f"process {self.id} (pid {self.pid}) in {self.sandbox_instance.container_id} "
                    f"is still running after {timeout} s"
                )

    async def kill(self) -> None:
        try:
            await self._client.request("POST", self._path + "/kill")
        except APIError as exc:
            if exc.status == 409 and exc.code == "process_state":
                return
            raise _process_error(exc) from None
        except SandboxdError as exc:
            raise _process_error(exc) from None

    async def send_signal(self, signal: Union[int, str]) -> None:
        try:
            await self._client.request("POST", self._path + "/signal", json={"signal": signal})
        except SandboxdError as exc:
            raise _process_error(exc) from None

    async def close(self) -> None:
        await self._pump.close()

    def __repr__(self) -> str:
        return f"aio.SandboxProcess(id={self.id}, pid={self.pid}, args={self.args!r}, state={self._info.get('state')!r})"


class SandboxProcessResponse:
    """See :class:`sandboxd.SandboxProcessResponse`."""

    def __init__(self, process: SandboxProcess, stdout: str, stderr: str) -> None:
        self.process = process
        self.pid = process.pid
        self.exit_code = exit_code_of(process.info)
        self.timed_out = process.timed_out
        self.stdout = CompletedStream(stdout)
        self.stderr = CompletedStream(stderr)
        self.result = stdout + stderr

    def __repr__(self) -> str:
        return f"SandboxProcessResponse(pid={self.pid}, exit_code={self.exit_code}, result={self.result!r})"


class SandboxProcessManager:
    """``sb.process`` (asyncio)."""

    def __init__(self, sandbox: "SandboxInstance") -> None:
        self.sandbox_instance = sandbox
        self.processes: Dict[int, SandboxProcess] = {}

    async def _start(self, spec: ProcessSpec) -> SandboxProcess:
        sb = self.sandbox_instance
        try:
            info = await sb._client.request_json(
                "POST", f"/v1/sandboxes/{sb.container_id}/processes", json=spec.body()
            )
        except SandboxdError as exc:
            raise _process_error(exc) from None
        process = SandboxProcess(sb, info)
        self.processes[process.pid] = process
        return process

    async def run_code(
        self,
        code: str,
        blocking: bool = True,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        language: str = "python",
        stdin: Optional[bool] = None,
    ) -> Union[SandboxProcessResponse, SandboxProcess]:
        """As :meth:`sandboxd.SandboxProcessManager.run_code`."""
        spec = ProcessSpec(
            code=code,
            language=language,
            cwd=cwd,
            env=dict(env or {}),
            timeout=timeout,
            stdin=(not blocking) if stdin is None else bool(stdin),
        )
        process = await self._start(spec)
        if not blocking:
            return process
        pump = process._pump
        async with pump.lock:
            while not pump.state.ended:
                await pump.pull()
            out = pump.state.take_all("stdout").decode("utf-8", errors="replace")
            err = pump.state.take_all("stderr").decode("utf-8", errors="replace")
        return SandboxProcessResponse(process, out, err)

    async def exec(
        self,
        *args: Any,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        stdin: bool = True,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        groups: Optional[List[int]] = None,
        capabilities: Optional[List[str]] = None,
        seccomp: Optional[Dict[str, Any]] = None,
        oom_score_adj: Optional[int] = None,
    ) -> SandboxProcess:
        return await self._start(
            ProcessSpec(
                argv=argv_of(args),
                cwd=cwd,
                env=dict(env or {}),
                timeout=timeout,
                stdin=stdin,
                uid=uid,
                gid=gid,
                groups=groups,
                capabilities=capabilities,
                seccomp=seccomp,
                oom_score_adj=oom_score_adj,
            )
        )

    async def list_processes(self) -> Dict[int, SandboxProcess]:
        sb = self.sandbox_instance
        try:
            listing = await sb._client.request_json("GET", f"/v1/sandboxes/{sb.container_id}/processes")
        except SandboxdError as exc:
            raise _process_error(exc) from None
        out: Dict[int, SandboxProcess] = {}
        for info in listing.get("processes", []):
            known = next((p for p in self.processes.values() if p.id == info.get("id")), None)
            if known is not None:
                known._update(info)
                out[known.pid] = known
            else:
                process = SandboxProcess(sb, info)
                out[process.pid] = process
        return out

    async def get_process(self, pid: int) -> SandboxProcess:
        processes = await self.list_processes()
        if pid not in processes:
            raise SandboxProcessError(f"no process with pid {pid} in {self.sandbox_instance.container_id}")
        return processes[pid]
