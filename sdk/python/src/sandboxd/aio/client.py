"""The connection to one daemon (asyncio twin of :mod:`sandboxd.client`)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterable, Dict, Iterable, Mapping, Optional, Union

import httpx

from .. import _http
from .._http import ConnectionConfig, CreateRetry, resolve_config
from ..errors import SandboxdError, error_from_response

__all__ = ["Client"]

_UNSET: Any = object()


class Client:
    """As :class:`sandboxd.Client`, with coroutines. Close it with
    ``await client.aclose()`` (or ``async with``)."""

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
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.config: ConnectionConfig = resolve_config(url, token, tls_fingerprint, socket, ca_file)
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.create_timeout = create_timeout
        self._transport: httpx.AsyncBaseTransport = transport or _http.async_transport(self.config)
        self._headers = _http.headers(self.config)

    def __repr__(self) -> str:
        return f"aio.Client({self.config.where})"

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        content: Union[bytes, AsyncIterable[bytes], Iterable[bytes], None] = None,
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
            response = await self._transport.handle_async_request(request)
            if not stream:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            return response
        except SandboxdError:
            raise
        except httpx.TransportError as exc:
            raise _http.connection_error(exc, self.config, method, path) from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        content: Union[bytes, AsyncIterable[bytes], None] = None,
        timeout: Any = _UNSET,
    ) -> httpx.Response:
        response = await self._send(method, path, json=json, params=params, content=content, timeout=timeout)
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content, method, path)
        return response

    async def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return _http.json_or_none(await self.request(method, path, **kwargs))

    async def open_stream(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> httpx.Response:
        response = await self._send(method, path, params=params, timeout=timeout, stream=True)
        if response.status_code >= 400:
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            raise error_from_response(response.status_code, raw, method, path)
        return response

    async def create_sandbox(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """As :meth:`sandboxd.Client.create_sandbox`."""
        retry = CreateRetry(self.retry_seconds, self.create_timeout)
        path = "/v1/sandboxes"
        while True:
            request = _http.build_request(
                self.config, self._headers, "POST", path, json=body, read_timeout=self.create_timeout
            )
            try:
                response = await self._transport.handle_async_request(request)
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            except httpx.TransportError as exc:
                delay = retry.after_transport_error(exc)
                if delay is None:
                    raise _http.connection_error(exc, self.config, "POST", path) from exc
                await asyncio.sleep(delay)
                continue
            delay = retry.after_response(response.status_code, response.content)
            if delay is not None:
                await asyncio.sleep(delay)
                continue
            if response.status_code >= 400:
                raise error_from_response(response.status_code, response.content, "POST", path)
            return response.json()

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
