"""Plain data the SDK returns, shared by the sync and asyncio APIs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Union

__all__ = ["SandboxFileInfo", "CompletedStream", "PreviewUrl", "file_info", "argv_of", "ProcessSpec"]

# Upload and download in pieces of this size: a 50 MiB file never sits in memory whole.
CHUNK = 1 << 20


@dataclass
class SandboxFileInfo:
    """A file in the sandbox. Beam's fields (``name``, ``is_dir``, ``size``,
    ``mode``, ``mod_time``, ``permissions``, ``owner``, ``group``) and the
    daemon's own (``kind``: file, dir, symlink or other; ``uid``, ``gid``,
    ``link_target``). ``name`` is the entry's name in a listing and the path
    for ``stat_file``; ``mode`` and ``permissions`` are the permission bits."""

    name: str
    is_dir: bool
    size: int
    mode: int
    mod_time: int
    permissions: int
    owner: str
    group: str
    kind: str = "file"
    uid: int = 0
    gid: int = 0
    link_target: Optional[str] = None

    def __str__(self) -> str:
        return (
            f"SandboxFileInfo(name={self.name!r}, kind={self.kind}, size={self.size}, "
            f"permissions={oct(self.permissions)}, owner={self.owner}, group={self.group})"
        )


def file_info(raw: Dict[str, Any]) -> SandboxFileInfo:
    mode = int(raw.get("mode", 0))
    return SandboxFileInfo(
        name=str(raw.get("name", "")),
        is_dir=raw.get("kind") == "dir",
        size=int(raw.get("size", 0)),
        mode=mode,
        mod_time=int(raw.get("mtime", 0)),
        permissions=mode & 0o7777,
        owner=str(raw.get("uid", 0)),
        group=str(raw.get("gid", 0)),
        kind=str(raw.get("kind", "file")),
        uid=int(raw.get("uid", 0)),
        gid=int(raw.get("gid", 0)),
        link_target=raw.get("link_target"),
    )


class CompletedStream:
    """The whole output of a finished process (``run_code(blocking=True)``'s
    ``stdout`` and ``stderr``): ``read()`` it, iterate its lines, or use it
    as a string."""

    def __init__(self, text: str) -> None:
        self._text = text

    def read(self) -> str:
        return self._text

    def __iter__(self) -> Iterator[str]:
        return iter(self._text.splitlines(keepends=True))

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"CompletedStream({self._text!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CompletedStream):
            return self._text == other._text
        if isinstance(other, str):
            return self._text == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._text)


class PreviewUrl(str):
    """A preview URL (``expose_port``): the URL as a string, with ``port``,
    ``path_url`` and ``token`` (for ``auth: "token"`` URLs) beside it."""

    port: int
    path_url: Optional[str]
    token: Optional[str]

    def __new__(cls, raw: Dict[str, Any]) -> "PreviewUrl":
        url = raw.get("url") or raw.get("path_url") or ""
        obj = super().__new__(cls, str(url))
        obj.port = int(raw.get("port", 0))
        obj.path_url = raw.get("path_url")
        obj.token = raw.get("token")
        return obj


def argv_of(args: tuple) -> List[str]:
    """Beam's ``exec("ls", "-la")`` and ``exec(["ls", "-la"])``."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    argv = [str(a) for a in args]
    if not argv or not argv[0]:
        raise ValueError("exec needs a program to run, e.g. exec(\"ls\", \"-la\")")
    return argv


@dataclass
class ProcessSpec:
    """The body of ``POST /v1/sandboxes/{id}/processes``."""

    argv: Optional[List[str]] = None
    code: Optional[str] = None
    language: Optional[str] = None
    cwd: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None
    stdin: bool = False

    def body(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.argv is not None:
            out["argv"] = self.argv
        if self.code is not None:
            out["code"] = self.code
            if self.language:
                out["language"] = self.language
        if self.cwd:
            out["cwd"] = self.cwd
        if self.env:
            out["env"] = {str(k): str(v) for k, v in self.env.items()}
        if self.timeout is not None:
            if self.timeout <= 0:
                raise ValueError("timeout must be above 0 seconds")
            out["timeout_seconds"] = float(self.timeout)
        if self.stdin:
            out["stdin"] = True
        return out


def stdin_bytes(data: Union[str, bytes, bytearray, memoryview]) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    return bytes(data)
