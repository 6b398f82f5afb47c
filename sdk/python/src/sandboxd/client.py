"""The connection to one daemon (sync): an httpx transport over the Unix
socket or the remote API, typed errors for error answers, and creates that retry
with their idempotency key."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import httpx

from . import _http
from ._http import ConnectionConfig, CreateRetry, resolve_config
from .errors import SandboxdError, error_from_response

__all__ = ["Client", "default_client"]

_UNSET: Any = object()


class Client:
    """Where the daemon is: ``socket=`` (a Unix socket path) or ``url=``
    (``https://host:port``, with ``token=`` and optionally
    ``tls_fingerprint=`` or ``ca_file=``); anything not given comes from
    ``SANDBOXD_SOCKET`` / ``SANDBOXD_URL`` / ``SANDBOXD_TOKEN`` /
    ``SANDBOXD_TLS_FINGERPRINT`` / ``SANDBOXD_CA_FILE``, then the default
    socket ``/run/sandboxd/sandboxd.sock``. Thread-safe; share one."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        tls_fingerprint: Optional[str] = None,
        socket: Optional[str] = None,
        ca_file: Optional[str] = None,
        *,
        timeout: float = _http.DEFAULT_TIMEOUT,
        retry_seconds: float = _http.RETRY_SECONDS,
        create_timeout: float = _http.CREATE_TIMEOUT,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.config: ConnectionConfig = resolve_config(url, token, tls_fingerprint, socket, ca_file)
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.create_timeout = create_timeout
        self._transport: httpx.BaseTransport = transport or _http.sync_transport(self.config)
        self._headers = _http.headers(self.config)

    def __repr__(self) -> str:
        return f"Client({self.config.where})"

    # Plain requests.

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        content: Union[bytes, Iterable[bytes], None] = None,
        timeout: Any = _UNSET,
        stream: bool = False,
    ) -> httpx.Response:
        request = _http.build_request(
            self.config,
            self._headers,
            method,
            path,
            json=json,
            params=params,
            content=content,
            read_timeout=self.timeout if timeout is _UNSET else timeout,
        )
        try:
            response = self._transport.handle_request(request)
            if not stream:
                try:
                    response.read()
                finally:
                    response.close()
            return response
        except SandboxdError:
            raise
        except httpx.TransportError as exc:
            raise _http.connection_error(exc, self.config, method, path) from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        content: Union[bytes, Iterable[bytes], None] = None,
        timeout: Any = _UNSET,
    ) -> httpx.Response:
        """One request; an error status raises its typed APIError."""
        response = self._send(method, path, json=json, params=params, content=content, timeout=timeout)
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content, method, path)
        return response

    def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return _http.json_or_none(self.request(method, path, **kwargs))

    def open_stream(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> httpx.Response:
        """A streaming response (the caller closes it); errors raise."""
        response = self._send(method, path, params=params, timeout=timeout, stream=True)
        if response.status_code >= 400:
            try:
                raw = response.read()
            finally:
                response.close()
            raise error_from_response(response.status_code, raw, method, path)
        return response

    # Creates.

    def create_sandbox(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """``POST /v1/sandboxes`` with ``body`` (which holds its
        idempotency key), tried again with the same body on connection
        failures (for ``retry_seconds``: a daemon restart) and while the
        daemon says the first attempt is in progress (409
        ``create_in_progress``): a retried key gets the first attempt's
        sandbox, so none is orphaned."""
        retry = CreateRetry(self.retry_seconds, self.create_timeout)
        path = "/v1/sandboxes"
        while True:
            request = _http.build_request(
                self.config, self._headers, "POST", path, json=body, read_timeout=self.create_timeout
            )
            try:
                response = self._transport.handle_request(request)
                try:
                    response.read()
                finally:
                    response.close()
            except httpx.TransportError as exc:
                delay = retry.after_transport_error(exc)
                if delay is None:
                    raise _http.connection_error(exc, self.config, "POST", path) from exc
                time.sleep(delay)
                continue
            delay = retry.after_response(response.status_code, response.content)
            if delay is not None:
                time.sleep(delay)
                continue
            if response.status_code >= 400:
                raise error_from_response(response.status_code, response.content, "POST", path)
            return response.json()

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_defaults: Dict[Tuple[int, ConnectionConfig], Client] = {}
_defaults_lock = threading.Lock()


def default_client(
    url: Optional[str] = None,
    token: Optional[str] = None,
    tls_fingerprint: Optional[str] = None,
    socket: Optional[str] = None,
    ca_file: Optional[str] = None,
) -> Client:
    """One shared client per process and connection settings."""
    config = resolve_config(url, token, tls_fingerprint, socket, ca_file)
    key = (os.getpid(), config)
    with _defaults_lock:
        client = _defaults.get(key)
        if client is None:
            client = Client(
                url=config.url,
                token=config.token,
                tls_fingerprint=config.tls_fingerprint,
                socket=config.socket or None,
                ca_file=config.ca_file,
            )
            _defaults[key] = client
        return client
