"""Plain data the SDK returns, shared by the sync and asyncio APIs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union
from urllib.parse import quote

__all__ = [
    "SandboxFileInfo", "CompletedStream", "PreviewUrl", "ListeningPort", "file_info", "argv_of", "ProcessSpec",
]

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
    """An exposed port of a sandbox (``expose_port``, ``list_urls``,
    ``ports``...). As a string it is the URL to hand out, as Beam's
    ``expose_port`` returns it: ``url`` (host-name routing,
    ``<id>-<port>.<ingress_domain>``) when the daemon has an
    ``ingress_domain``, else ``path_url`` (``/<id>/<port>/`` on the ingress),
    else ``address`` (a raw TCP port's ``host:port``).

    Beside it: ``port``, ``protocol`` (``"http"`` or ``"tcp"``), ``auth``
    (``"token"`` or ``"none"``), ``url``, ``path_url``, ``address`` (each
    None when the daemon gave none) and ``token``: the secret a token URL
    needs, known only to the instance that exposed the port, created the
    sandbox with it, or rotated its token (the daemon keeps only a hash of
    it; None otherwise and for public ports). Send it as
    :attr:`headers`, or hand out :meth:`with_token` to a browser. ``repr``
    does not show it."""

    port: int
    protocol: str
    auth: str
    url: Optional[str]
    path_url: Optional[str]
    address: Optional[str]
    token: Optional[str]

    def __new__(cls, raw: Dict[str, Any], token: Optional[str] = None) -> "PreviewUrl":
        def text(key: str) -> Optional[str]:
            value = raw.get(key)
            return str(value) if value else None

        url, path_url, address = text("url"), text("path_url"), text("address")
        obj = super().__new__(cls, url or path_url or address or "")
        obj.port = int(raw.get("port", 0))
        obj.protocol = str(raw.get("protocol") or "http")
        obj.auth = str(raw.get("auth") or "token")
        obj.url = url
        obj.path_url = path_url
        obj.address = address
        obj.token = text("token") or token
        return obj

    def as_dict(self) -> Dict[str, Any]:
        """The daemon's ``PortUrl`` object again (with the token when known)."""
        out: Dict[str, Any] = {"port": self.port, "protocol": self.protocol, "auth": self.auth}
        for key in ("url", "path_url", "address", "token"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def __getnewargs__(self) -> Tuple[Dict[str, Any]]:  # type: ignore[override]
        # pickle and copy rebuild it from its fields, not from the bare string.
        return (self.as_dict(),)

    @property
    def headers(self) -> Dict[str, str]:
        """The header that carries the token (``{"X-Sandbox-Token": token}``),
        or ``{}`` when there is none to send."""
        return {"X-Sandbox-Token": self.token} if self.token else {}

    def with_token(self) -> str:
        """The host-name URL with ``?sandbox_token=TOKEN``: for a browser,
        which the ingress answers with a redirect to the plain URL and a
        cookie holding the token. The URL itself when there is no token.
        Whoever has this string can use the URL: hand it out as you would
        the token. ValueError when there is only a path URL: every sandbox
        shares its origin, so the ingress takes the token there in a header
        only (give the daemon an ``ingress_domain``)."""
        if not self.token or self.protocol != "http":
            return str(self)
        if not self.url:
            raise ValueError(
                "path URLs take their token in a header only (X-Sandbox-Token or "
                "Authorization: Bearer); a browser URL needs the daemon's ingress_domain"
            )
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}sandbox_token={quote(self.token, safe='')}"

    def __repr__(self) -> str:
        token = "..." if self.token else None
        return (
            f"PreviewUrl({str(self)!r}, port={self.port}, protocol={self.protocol!r}, "
            f"auth={self.auth!r}, token={token!r})"
        )


@dataclass
class ListeningPort:
    """A TCP socket something in the sandbox listens on
    (``listening_ports()``): its ``port``, the ``address`` it is bound to
    (``0.0.0.0``, ``::``, ``127.0.0.1``...; the ingress reaches either), and
    whether it is ``exposed``."""

    port: int
    address: str
    exposed: bool

    @classmethod
    def from_raw(cls, raw: Dict[str, Any]) -> "ListeningPort":
        return cls(port=int(raw.get("port", 0)), address=str(raw.get("address", "")), exposed=bool(raw.get("exposed")))


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
    uid: Optional[int] = None
    gid: Optional[int] = None
    groups: Optional[List[int]] = None
    capabilities: Optional[List[str]] = None
    seccomp: Optional[Dict[str, Any]] = None
    oom_score_adj: Optional[int] = None

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
        for name in ("uid", "gid", "oom_score_adj"):
            value = getattr(self, name)
            if value is not None:
                out[name] = int(value)
        if self.groups is not None:
            out["groups"] = [int(g) for g in self.groups]
        if self.capabilities is not None:
            out["capabilities"] = [str(c) for c in self.capabilities]
        if self.seccomp is not None:
            out["seccomp"] = self.seccomp
        return out


def stdin_bytes(data: Union[str, bytes, bytearray, memoryview]) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    return bytes(data)
