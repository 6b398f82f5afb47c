"""``Sandbox`` and ``SandboxInstance`` (asyncio twin of :mod:`sandboxd.sandbox`).

    sb = await Sandbox(image="python").create()
    async with sb:
        proc = await sb.process.run_code(code, blocking=False)

Each instance made without ``client=`` owns its connection and closes it in
``terminate()`` (or ``aclose()``, to let go without terminating).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import _ports
from .._hybrid import hybridmethod
from .._models import ListeningPort, PreviewUrl
from .._spec import SandboxArgs
from ..errors import (
    APIError,
    NotFoundError,
    SandboxConnectionError,
    SandboxdError,
    create_error,
    in_context,
    preview_route_error,
)
from .client import Client
from .fs import SandboxFileSystem
from .process import SandboxProcessManager

__all__ = ["Sandbox", "SandboxInstance"]


class Sandbox(SandboxArgs):
    __doc__ = SandboxArgs.__doc__

    def _client(self) -> "Tuple[Client, bool]":
        if self._client_arg is not None:
            return self._client_arg, False
        c = self._conn
        return Client(url=c["url"], token=c["token"], tls_fingerprint=c["tls_fingerprint"], socket=c["socket"]), True

    async def _create(self, body: Dict[str, Any]) -> "SandboxInstance":
        client, owned = self._client()
        try:
            view = await client.create_sandbox(body)
        except APIError as exc:
            if owned:
                await client.aclose()
            raise create_error(exc, self.options) from None
        except BaseException:
            if owned:
                await client.aclose()
            raise
        return SandboxInstance(view["id"], client, view, owns_client=owned)

    async def create(self) -> "SandboxInstance":
        """As :meth:`sandboxd.Sandbox.create`."""
        return await self._create(self.options.create_body())

    async def create_from_memory_snapshot(self, snapshot_id: str) -> "SandboxInstance":
        return await self._create(self.options.fork_body(snapshot_id))

    @hybridmethod
    async def connect(self_or_cls, id: str, **connection: Any) -> "SandboxInstance":  # type: ignore[misc]
        """``await Sandbox.connect(id)`` or ``await Sandbox().connect(id)``."""
        if isinstance(self_or_cls, Sandbox) and not connection:
            client, owned = self_or_cls._client()
        else:
            given = connection.pop("client", None)
            client, owned = (given, False) if given is not None else (Client(**connection), True)
        try:
            view = await client.request_json("GET", f"/v1/sandboxes/{id}")
        except SandboxdError as exc:
            if owned:
                await client.aclose()
            raise in_context(exc, SandboxConnectionError) from None
        return SandboxInstance(view["id"], client, view, owns_client=owned)


class SandboxInstance:
    """A running sandbox (asyncio); ``async with`` terminates it at the end."""

    def __init__(
        self, sandbox_id: str, client: Client, view: Optional[Dict[str, Any]] = None, owns_client: bool = False
    ) -> None:
        self.container_id = sandbox_id
        self._client = client
        self._owns_client = owns_client
        self._view: Dict[str, Any] = dict(view or {})
        self._port_tokens = _ports.PortTokens()
        self._port_tokens.listed(_ports.entries(self._view))
        self.process = SandboxProcessManager(self)
        self.fs = SandboxFileSystem(self)
        self.terminated = False

    @property
    def ok(self) -> bool:
        return True

    @property
    def client(self) -> Client:
        return self._client

    def sandbox_id(self) -> str:
        return self.container_id

    def __repr__(self) -> str:
        return f"aio.SandboxInstance({self.container_id!r})"

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self.container_id}"

    async def inspect(self) -> Dict[str, Any]:
        self._view = await self._client.request_json("GET", self._path)
        self._port_tokens.listed(_ports.entries(self._view))
        return dict(self._view)

    async def terminate(self) -> bool:
        """Deletes the sandbox (True; False when it was already gone) and
        closes the connection this instance owns."""
        try:
            await self._client.request("DELETE", self._path)
            deleted = True
        except NotFoundError:
            deleted = False
        self.terminated = True
        await self.aclose()
        return deleted

    async def aclose(self) -> None:
        """Closes the connection this instance owns, leaving the sandbox running."""
        if self._owns_client:
            self._owns_client = False
            await self._client.aclose()

    async def update_ttl(self, ttl: int) -> Dict[str, Any]:
        self._view = await self._client.request_json("PUT", self._path + "/ttl", json={"ttl_seconds": int(ttl)})
        return dict(self._view)

    async def update_network_permissions(
        self, block_network: Optional[bool] = None, allow_list: Optional[Sequence[str]] = None
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if allow_list is not None:
            if block_network:
                raise ValueError("give block_network=True or an allow_list, not both")
            body["allow_list"] = [str(h) for h in allow_list]
        elif block_network is not None:
            body["block_network"] = bool(block_network)
        self._view = await self._client.request_json("PATCH", self._path + "/network", json=body)
        return dict(self._view.get("network") or {})

    # Preview URLs: as in :class:`sandboxd.SandboxInstance`.

    async def _port_call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return await self._client.request_json(method, path, **kwargs)
        except APIError as exc:
            raise preview_route_error(exc) from None

    async def expose_port(self, port: int, auth: str = "token", protocol: str = "http") -> PreviewUrl:
        """As :meth:`sandboxd.SandboxInstance.expose_port`."""
        body = _ports.expose_body(port, auth, protocol)
        return self._port_tokens.granted(await self._port_call("POST", self._path + "/ports", json=body))

    async def ports(self) -> List[PreviewUrl]:
        raw = await self._port_call("GET", self._path + "/ports")
        return self._port_tokens.listed(_ports.entries(raw))

    async def list_urls(self) -> Dict[int, PreviewUrl]:
        return {u.port: u for u in await self.ports()}

    async def preview_url(self, port: int) -> PreviewUrl:
        port = _ports.checked_port(port)
        for url in await self.ports():
            if url.port == port:
                return url
        raise _ports.not_exposed(self.container_id, port, self._path + "/ports")

    async def listening_ports(self) -> List[ListeningPort]:
        raw = await self._port_call("GET", self._path + "/ports", params={"listening": "true"})
        self._port_tokens.listed(_ports.entries(raw))
        return _ports.listening(raw)

    async def unexpose_port(self, port: int) -> bool:
        port = _ports.checked_port(port)
        try:
            await self._port_call("DELETE", _ports.port_path(self._path, port))
        except NotFoundError as exc:
            if exc.code != "port_not_exposed":
                raise
            return False
        finally:
            self._port_tokens.forget(port)
        return True

    async def rotate_port_token(self, port: int) -> PreviewUrl:
        raw = await self._port_call("POST", _ports.port_path(self._path, port) + "/token")
        return self._port_tokens.granted(raw)

    async def _snapshot(self, kind: str) -> str:
        view = await self._client.request_json("POST", self._path + "/snapshots", json={"kind": kind})
        return str(view["id"])

    async def snapshot_memory(self) -> str:
        return await self._snapshot("memory")

    async def create_image_from_filesystem(self) -> str:
        return await self._snapshot("filesystem")

    async def __aenter__(self) -> "SandboxInstance":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self.terminated:
            await self.terminate()
        else:
            await self.aclose()
