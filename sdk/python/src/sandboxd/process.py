"""Processes in a sandbox (sync): start them (``exec``, ``run_code``), wait,
kill, write their stdin, and read their stdout and stderr as they arrive."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import httpx

from . import _http
from ._models import CompletedStream, ProcessSpec, argv_of, stdin_bytes
from ._output import OutputState, exit_code_of, split_lines
from .errors import APIError, SandboxConnectionError, SandboxdError, SandboxProcessError, in_context

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

# The daemon's wait takes at most an hour a call; longer waits ask again.
_WAIT_SLICE = 3600.0


def _process_error(exc: SandboxdError) -> SandboxdError:
    return in_context(exc, SandboxProcessError)


class _OutputPump:
    """Pulls the output stream on demand: whoever needs a line reads the next
    event under the lock; the other stream's lines wait in the state. A lost
    connection is resumed from the offsets held."""

    def __init__(self, process: "SandboxProcess") -> None:
        self.process = process
        self.state = OutputState()
        self.lock = threading.Lock()
        self._response: Optional[httpx.Response] = None
        self._lines: Optional[Iterator[bytes]] = None
        self._failing_since: Optional[float] = None

    def _open(self) -> None:
        client = self.process._client
        self._response = client.open_stream(
            "GET", self.process._path + "/output", params=self.state.params(), timeout=None
        )
        self._lines = split_lines(self._response.iter_bytes())

    def _close(self) -> None:
        if self._response is not None:
            self._response.close()
        self._response = None
        self._lines = None

    def pull(self) -> None:
        """Reads one event (the caller holds the lock)."""
        if self.state.ended:
            return
        while True:
            try:
                if self._lines is None:
                    self._open()
                assert self._lines is not None
                line = next(self._lines)
            except StopIteration:
                # The stream ended before the exit (a daemon stopping): resume.
                self._close()
                if self._note_failure(None):
                    continue
                raise SandboxConnectionError("the output stream ended before the process exited")
            except (httpx.TransportError, SandboxConnectionError) as exc:
                self._close()
                if self._note_failure(exc):
                    continue
                if isinstance(exc, httpx.TransportError):
                    raise _http.connection_error(exc, self.process._client.config, "GET", "output") from exc
                raise
            self._failing_since = None
            self.state.feed_line(line)
            if self.state.ended:
                self._finish()
                self.process._update(self.state.exit or {})
            return

    def _finish(self) -> None:
        """After the exit: the body ends right after it; reading that end
        lets the connection go back to the pool instead of being closed."""
        try:
            for _ in self._lines or ():
                pass
        except httpx.TransportError:
            pass
        self._close()

    def _note_failure(self, exc: Optional[BaseException]) -> bool:
        """Whether to try the stream again."""
        if exc is not None and isinstance(exc, httpx.TransportError) and not _http.retryable(exc):
            return False
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            return True
        if now - self._failing_since >= self.process._client.retry_seconds:
            return False
        time.sleep(0.2)
        return True

    def close(self) -> None:
        with self.lock:
            self._close()


class SandboxProcessStream:
    """stdout or stderr of a process. Iterate it for lines as they arrive
    (each with its ``\\n``, the last one without when the output does not
    end in one), or ``read()`` everything not yet read, which returns at the
    process's exit. Output is decoded as UTF-8 (bad bytes replaced)."""

    def __init__(self, pump: _OutputPump, name: str) -> None:
        self._pump = pump
        self._name = name

    def __iter__(self) -> "SandboxProcessStream":
        return self

    def __next__(self) -> str:
        pump = self._pump
        while True:
            with pump.lock:
                line = pump.state.take_line(self._name)
                if line is not None:
                    return line
                if pump.state.ended:
                    raise StopIteration
                pump.pull()

    def readline(self) -> str:
        """The next line, or "" at the end."""
        try:
            return next(self)
        except StopIteration:
            return ""

    def read(self) -> str:
        pump = self._pump
        with pump.lock:
            while not pump.state.ended:
                pump.pull()
            return pump.state.take_all(self._name).decode("utf-8", errors="replace")

    def read_bytes(self) -> bytes:
        """As ``read()``, undecoded."""
        pump = self._pump
        with pump.lock:
            while not pump.state.ended:
                pump.pull()
            return pump.state.take_all(self._name)

    @property
    def dropped_bytes(self) -> int:
        """Bytes the daemon dropped because nobody read them in time."""
        return self._pump.state.streams[self._name].dropped


class SandboxProcessLogs:
    """stdout and stderr together, line by line in the order the lines were
    completed (Beam's ``logs``). It takes lines from the same buffers as
    ``stdout`` and ``stderr``."""

    def __init__(self, pump: _OutputPump) -> None:
        self._pump = pump

    def __iter__(self) -> "SandboxProcessLogs":
        return self

    def __next__(self) -> str:
        return self.next_with_stream()[1]

    def next_with_stream(self) -> Tuple[str, str]:
        """(``"stdout"`` or ``"stderr"``, line)."""
        pump = self._pump
        while True:
            with pump.lock:
                item = pump.state.take_any_line()
                if item is not None:
                    return item
                if pump.state.ended:
                    raise StopIteration
                pump.pull()

    def read(self) -> str:
        pump = self._pump
        with pump.lock:
            while not pump.state.ended:
                pump.pull()
            return pump.state.take_all_combined()


class SandboxProcessStdin:
    """The process's stdin (open unless it was started with ``stdin=False``)."""

    def __init__(self, process: "SandboxProcess") -> None:
        self._process = process

    def write(self, data: Union[str, bytes]) -> None:
        p = self._process
        try:
            p._client.request("POST", p._path + "/stdin", content=stdin_bytes(data))
        except SandboxdError as exc:
            raise _process_error(exc) from None

    def close(self) -> None:
        """End of input: the process reads EOF."""
        p = self._process
        try:
            p._client.request("DELETE", p._path + "/stdin")
        except SandboxdError as exc:
            raise _process_error(exc) from None


class SandboxProcess:
    """A process in the sandbox.

    ``id`` is the daemon's handle of the process, ``pid`` its process id
    inside the sandbox (what ``ps`` shows there). ``exit_code`` is -1 while
    it runs, then its exit status, or 128+N when signal N ended it.
    """

    def __init__(self, sandbox: "SandboxInstance", info: Dict[str, Any]) -> None:
        self.sandbox_instance = sandbox
        self._client = sandbox._client
        self.id: int = int(info["id"])
        self._path = f"/v1/sandboxes/{sandbox.container_id}/processes/{self.id}"
        self._info: Dict[str, Any] = dict(info)
        self._info_lock = threading.Lock()
        self._pump = _OutputPump(self)
        self.stdout = SandboxProcessStream(self._pump, "stdout")
        self.stderr = SandboxProcessStream(self._pump, "stderr")
        self.logs = SandboxProcessLogs(self._pump)
        self.stdin = SandboxProcessStdin(self)

    def _update(self, info: Dict[str, Any]) -> None:
        if not info:
            return
        with self._info_lock:
            # An exited view is final; a later "running" one cannot undo it.
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
        """The daemon's last view of the process."""
        return dict(self._info)

    @property
    def exit_code(self) -> int:
        if self._info.get("state") != "exited":
            self.refresh()
        return exit_code_of(self._info)

    @property
    def signal(self) -> Optional[int]:
        return self._info.get("signal")

    @property
    def timed_out(self) -> bool:
        """The process tree was killed because its ``timeout`` passed."""
        return bool(self._info.get("timed_out"))

    @property
    def oom_killed(self) -> bool:
        return bool(self._info.get("oom_killed"))

    def refresh(self) -> Dict[str, Any]:
        try:
            self._update(self._client.request_json("GET", self._path))
        except SandboxdError as exc:
            raise _process_error(exc) from None
        return self.info

    def status(self) -> Tuple[int, str]:
        """(exit code, ``"running"`` or ``"exited"``), as Beam's ``status()``."""
        info = self.refresh()
        return exit_code_of(info), str(info.get("state", ""))

    def is_running(self) -> bool:
        return self.status()[1] == "running"

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the exit and returns the exit code. With ``timeout``
        (seconds) and the process still running then, raises
        SandboxProcessError and leaves the process running (``kill()`` it)."""
        if self._info.get("state") == "exited":
            return exit_code_of(self._info)
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        while True:
            left = _WAIT_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            slice_ = min(left, _WAIT_SLICE)
            try:
                info = self._client.request_json(
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

    def kill(self) -> None:
        """Kills the process and everything it started (its whole tree)."""
        try:
            self._client.request("POST", self._path + "/kill")
        except APIError as exc:
            # Already gone is what was asked for.
            if exc.status == 409 and exc.code == "process_state":
                return
            raise _process_error(exc) from None
        except SandboxdError as exc:
            raise _process_error(exc) from None

    def send_signal(self, signal: Union[int, str]) -> None:
        """Sends a signal (15, ``"TERM"``, ``"SIGINT"``) to the process."""
        try:
            self._client.request("POST", self._path + "/signal", json={"signal": signal})
        except SandboxdError as exc:
            raise _process_error(exc) from None

    def close(self) -> None:
        """Drops the output connection, if one is open."""
        self._pump.close()

    def __repr__(self) -> str:
        return f"SandboxProcess(id={self.id}, pid={self.pid}, args={self.args!r}, state={self._info.get('state')!r})"


class SandboxProcessResponse:
    """What ``run_code(blocking=True)`` returns: ``pid``, ``exit_code``,
    ``stdout`` and ``stderr`` (whole), ``result`` (stdout then stderr, as
    Beam's), and ``process`` (the finished SandboxProcess)."""

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
    """``sb.process``: start processes and find them again."""

    def __init__(self, sandbox: "SandboxInstance") -> None:
        self.sandbox_instance = sandbox
        self.processes: Dict[int, SandboxProcess] = {}

    def _start(self, spec: ProcessSpec) -> SandboxProcess:
        sb = self.sandbox_instance
        try:
            info = sb._client.request_json("POST", f"/v1/sandboxes/{sb.container_id}/processes", json=spec.body())
        except SandboxdError as exc:
            raise _process_error(exc) from None
        process = SandboxProcess(sb, info)
        self.processes[process.pid] = process
        return process

    def run_code(
        self,
        code: str,
        blocking: bool = True,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        language: str = "python",
        stdin: Optional[bool] = None,
    ) -> Union[SandboxProcessResponse, SandboxProcess]:
        """Runs ``code`` (Python by default; ``language`` may be bash, sh or
        node). ``timeout`` seconds: the daemon kills the whole process tree
        then. Blocking: returns a SandboxProcessResponse when it ended.
        Otherwise returns the running SandboxProcess (stdin open unless
        ``stdin=False``)."""
        spec = ProcessSpec(
            code=code,
            language=language,
            cwd=cwd,
            env=dict(env or {}),
            timeout=timeout,
            stdin=(not blocking) if stdin is None else bool(stdin),
        )
        process = self._start(spec)
        if not blocking:
            return process
        with process._pump.lock:
            while not process._pump.state.ended:
                process._pump.pull()
            out = process._pump.state.take_all("stdout").decode("utf-8", errors="replace")
            err = process._pump.state.take_all("stderr").decode("utf-8", errors="replace")
        return SandboxProcessResponse(process, out, err)

    def exec(
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
        """Starts a program: ``exec("ls", "-la")`` or ``exec(["ls", "-la"])``
        (argv, no shell; write ``exec("sh", "-c", "...")`` for one).
        ``uid``/``gid``/``groups``: who it runs as inside the sandbox;
        ``capabilities``: the ones it keeps of the sandbox's (``[]`` for
        none); ``seccomp``: an OCI ``linux.seccomp`` profile loaded on top of
        the sandbox's filter; ``oom_score_adj``: 0 to 1000."""
        return self._start(
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

    def list_processes(self) -> Dict[int, SandboxProcess]:
        """Every process the API started in this sandbox, by pid."""
        sb = self.sandbox_instance
        try:
            listing = sb._client.request_json("GET", f"/v1/sandboxes/{sb.container_id}/processes")
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

    def get_process(self, pid: int) -> SandboxProcess:
        """The process with this pid (inside the sandbox)."""
        processes = self.list_processes()
        if pid not in processes:
            raise SandboxProcessError(f"no process with pid {pid} in {self.sandbox_instance.container_id}")
        return processes[pid]
