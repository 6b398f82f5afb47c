"""Where the daemon is and how to reach it, shared by the sync client and
the asyncio one: the connection settings (arguments over environment),
the httpx transport for them, the mapping of httpx's failures to the SDK's
errors, and the retry policy of creates."""

from __future__ import annotations

import os
import ssl
import time
from dataclasses import dataclass
import json as _json
from typing import Any, Dict, Mapping, Optional, Union
from urllib.parse import urlencode, urlsplit

import httpx

from . import __version__
from ._tls import ca_context, normalize_fingerprint, pinned_context
from .errors import (
    SandboxConnectionError,
    SandboxTimeoutError,
    TLSFingerprintError,
    parse_error_body,
)

DEFAULT_SOCKET = "/run/sandboxd/sandboxd.sock"
# Requests that return at once; creates, waits and streams set their own.
DEFAULT_TIMEOUT = 300.0
CONNECT_TIMEOUT = 10.0
# How long a create keeps retrying connection failures in a row (a daemon
# restart), and how long it waits on a create still in progress.
RETRY_SECONDS = 30.0
CREATE_TIMEOUT = 900.0
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=32)


@dataclass(frozen=True)
class ConnectionConfig:
    """Resolved settings: ``url`` None means the Unix socket ``socket``."""

    url: Optional[str]
    socket: str
    token: Optional[str]
    tls_fingerprint: Optional[str]
    ca_file: Optional[str]

    @property
    def base_url(self) -> str:
        return self.url if self.url else "http://sandboxd"

    @property
    def where(self) -> str:
        return self.url if self.url else f"unix:{self.socket}"


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


def resolve_config(
    url: Optional[str] = None,
    token: Optional[str] = None,
    tls_fingerprint: Optional[str] = None,
    socket: Optional[str] = None,
    ca_file: Optional[str] = None,
) -> ConnectionConfig:
    """Arguments first, then ``SANDBOXD_URL`` / ``SANDBOXD_TOKEN`` /
    ``SANDBOXD_TLS_FINGERPRINT`` / ``SANDBOXD_CA_FILE``, then
    ``SANDBOXD_SOCKET``, then the default socket. ``socket=`` given as an
    argument wins over ``SANDBOXD_URL`` in the environment."""
    if url and socket:
        raise ValueError("give url= (remote API) or socket= (Unix socket), not both")
    if url is None and socket is None:
        url = _env("SANDBOXD_URL")
    token = token if token is not None else _env("SANDBOXD_TOKEN")
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise ValueError(f"SANDBOXD_URL {url!r} must look like https://host:port")
        fingerprint = tls_fingerprint if tls_fingerprint is not None else _env("SANDBOXD_TLS_FINGERPRINT")
        fingerprint = normalize_fingerprint(fingerprint) if fingerprint else None
        if fingerprint and parts.scheme != "https":
            raise ValueError("a TLS fingerprint needs an https:// URL")
        ca = ca_file if ca_file is not None else _env("SANDBOXD_CA_FILE")
        return ConnectionConfig(url.rstrip("/"), "", token, fingerprint, ca)
    path = socket or _env("SANDBOXD_SOCKET") or DEFAULT_SOCKET
    return ConnectionConfig(None, path, token, None, None)


def _verify(config: ConnectionConfig) -> Union[ssl.SSLContext, bool]:
    if config.tls_fingerprint:
        return pinned_context(config.tls_fingerprint)
    if config.url and config.url.startswith("https:"):
        return ca_context(config.ca_file)
    return True


def sync_transport(config: ConnectionConfig) -> httpx.BaseTransport:
    if config.url is None:
        return httpx.HTTPTransport(uds=config.socket, limits=_LIMITS)
    return httpx.HTTPTransport(verify=_verify(config), limits=_LIMITS)


def async_transport(config: ConnectionConfig) -> httpx.AsyncBaseTransport:
    if config.url is None:
        return httpx.AsyncHTTPTransport(uds=config.socket, limits=_LIMITS)
    return httpx.AsyncHTTPTransport(verify=_verify(config), limits=_LIMITS)


def headers(config: ConnectionConfig) -> Dict[str, str]:
    out = {"user-agent": f"sandboxd-python/{__version__}"}
    if config.token:
        out["authorization"] = f"Bearer {config.token}"
    return out


def timeout(read: Optional[float]) -> Dict[str, Optional[float]]:
    """The transport's timeout extension; ``read`` None: no limit (streams)."""
    return {"connect": CONNECT_TIMEOUT, "read": read, "write": read, "pool": read}


def build_request(
    config: ConnectionConfig,
    base_headers: Dict[str, str],
    method: str,
    path: str,
    *,
    json: Any = None,
    params: Optional[Mapping[str, Any]] = None,
    content: Any = None,
    read_timeout: Optional[float],
) -> httpx.Request:
    """A request for the transport itself. The SDK skips httpx's Client
    layer (URL merging, cookies, auth flows, redirects, event hooks): it
    needs none of them, and they cost more per request than the rest."""
    url = config.base_url + path
    if params:
        url += "?" + urlencode(params)
    headers = dict(base_headers)
    if json is not None:
        content = _json.dumps(json, separators=(",", ":")).encode()
        headers["content-type"] = "application/json"
    return httpx.Request(
        method, url, headers=headers, content=content, extensions={"timeout": timeout(read_timeout)}
    )


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def fingerprint_error(exc: BaseException) -> Optional[TLSFingerprintError]:
    for e in _chain(exc):
        if isinstance(e, TLSFingerprintError):
            return e
    return None


def connection_error(exc: BaseException, config: ConnectionConfig, method: str, path: str) -> SandboxConnectionError:
    """The SDK's error for a failure to talk to the daemon."""
    pinned = fingerprint_error(exc)
    if pinned is not None:
        return TLSFingerprintError(pinned.expected, pinned.got)
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return SandboxTimeoutError(f"{method} {path}: sandboxd at {config.where} did not answer in time ({detail})")
    return SandboxConnectionError(f"{method} {path}: cannot reach sandboxd at {config.where}: {detail}")


def retryable(exc: BaseException) -> bool:
    """A failure a daemon restart explains: refused, reset, closed early.
    Certificate problems and pool exhaustion are not retried."""
    for e in _chain(exc):
        if isinstance(e, (TLSFingerprintError, ssl.SSLCertVerificationError)):
            return False
    if isinstance(exc, httpx.PoolTimeout):
        return False
    return isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.TimeoutException))


class CreateRetry:
    """When a create is tried again with the same body and idempotency key:
    after connection failures (for ``retry_seconds`` of failures in a row,
    the daemon may be restarting) and while the daemon says the first
    attempt is still in progress (409 ``create_in_progress``, for up to
    ``progress_seconds``)."""

    def __init__(self, retry_seconds: float = RETRY_SECONDS, progress_seconds: float = CREATE_TIMEOUT) -> None:
        self.retry_seconds = retry_seconds
        self.progress_seconds = progress_seconds
        self.started = time.monotonic()
        self.failing_since: Optional[float] = None
        self.delay = 0.05
        self.attempts = 0

    def _next_delay(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, 1.0)
        return delay

    def after_transport_error(self, exc: BaseException) -> Optional[float]:
        """Seconds to wait before the next attempt, or None to give up."""
        self.attempts += 1
        if not retryable(exc):
            return None
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        if now - self.failing_since >= self.retry_seconds:
            return None
        return self._next_delay()

    def after_response(self, status: int, raw: bytes) -> Optional[float]:
        """Seconds to wait before asking again, or None when this answer is final."""
        self.attempts += 1
        self.failing_since = None
        if status != 409:
            return None
        _, detail = parse_error_body(raw)
        if detail.get("code") != "create_in_progress":
            return None
        if time.monotonic() - self.started >= self.progress_seconds:
            return None
        return self._next_delay()


def json_or_none(response: httpx.Response) -> Any:
    if not response.content:
        return None
    return response.json()
