"""``Sandbox`` (what to create) and ``SandboxInstance`` (one that runs), in
Beam's names, over sandboxd's API (sync)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ._hybrid import hybridmethod
from ._models import PreviewUrl
from ._spec import SandboxArgs
from .client import Client, default_client
from .errors import (
    APIError,
    NotFoundError,
    SandboxConnectionError,
    SandboxdError,
    create_error,
    in_context,
    preview_route_error,
)
from .fs import SandboxFileSystem
from .process import SandboxProcessManager

__all__ = ["Sandbox", "SandboxInstance"]

class Sandbox(SandboxArgs):
    __doc__ = SandboxArgs.__doc__

    @property
    def client(self) -> Client:
        if self._client_arg is None:
            self._client_arg = default_client(**self._conn)
        return self._client_arg

    def _create(self, body: Dict[str, Any]) -> "SandboxInstance":
        client = self.client
        try:
            view = client.create_sandbox(body)
        except APIError as exc:
            raise create_error(exc, self.options) from None
        return SandboxInstance(view["id"], client, view)

    def create(self) -> "SandboxInstance":
        """Creates the sandbox; returns when it is ready. Safe to retry: the
        create carries an idempotency key and is tried again with it when
        the daemon restarts in the middle."""
        return self._create(self.options.create_body())

    def create_from_memory_snapshot(self, snapshot_id: str) -> "SandboxInstance":
        """A fork of a memory snapshot (``snapshot_memory()``): its processes
        run on where they stood, with the snapshot's files, limits and
        environment. TTL, labels, env, egress and secrets of this Sandbox
        apply to the fork."""
        return self._create(self.options.fork_body(snapshot_id))

    @hybridmethod
    def connect(self_or_cls, id: str, **connection: Any) -> "SandboxInstance":  # type: ignore[misc]
        """Attaches to a running sandbox by id: ``Sandbox.connect(id)`` or
        ``Sandbox().connect(id)`` (Beam's form). A missing sandbox raises
        NotFoundError (also a SandboxConnectionError)."""
        given = connection.pop("client", None)
        if given is not None:
            client = given
        elif isinstance(self_or_cls, Sandbox) and not connection:
            client = self_or_cls.client
        else:
            client = default_client(**connection)
        try:
            view = client.request_json("GET", f"/v1/sandboxes/{id}")
        except SandboxdError as exc:
            raise in_context(exc, SandboxConnectionError) from None
        return SandboxInstance(view["id"], client, view)


class SandboxInstance:
    """A running sandbox: ``process``, ``fs``, and its lifecycle. A context
    manager: leaving the ``with`` block terminates it."""

    def __init__(self, sandbox_id: str, client: Client, view: Optional[Dict[str, Any]] = None) -> None:
        self.container_id = sandbox_id
        self._client = client
        self._view: Dict[str, Any] = dict(view or {})
        self.process = SandboxProcessManager(self)
        self.fs = SandboxFileSystem(self)
        self.terminated = False

    @property
    def ok(self) -> bool:
        """Beam's flag: the instance exists (errors raise instead)."""
        return True

    @property
    def client(self) -> Client:
        return self._client

    def sandbox_id(self) -> str:
        return self.container_id

    def __repr__(self) -> str:
        return f"SandboxInstance({self.container_id!r})"

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self.container_id}"

    def inspect(self) -> Dict[str, Any]:
        """The daemon's view of the sandbox now (state, limits, TTL and
        ``expires_at``, network policy, usage...)."""
        self._view = self._client.request_json("GET", self._path)
        return dict(self._view)

    def terminate(self) -> bool:
        """Deletes the sandbox and everything in it. True when it was
        deleted now, False when it was already gone."""
        try:
            self._client.request("DELETE", self._path)
        except NotFoundError:
            self.terminated = True
            return False
        self.terminated = True
        return True

    def update_ttl(self, ttl: int) -> Dict[str, Any]:
        """A new TTL counted from now, in seconds; -1: no TTL. Returns the
        daemon's view (``ttl_seconds``, ``expires_at``)."""
        self._view = self._client.request_json("PUT", self._path + "/ttl", json={"ttl_seconds": int(ttl)})
        return dict(self._view)

    def update_network_permissions(
        self, block_network: Optional[bool] = None, allow_list: Optional[Sequence[str]] = None
    ) -> Dict[str, Any]:
        """Changes the egress policy of the running sandbox:
        ``block_network=True`` (nothing leaves), ``allow_list=[...]`` (only
        those), ``block_network=False`` (open), neither (the daemon's
        default). Returns the policy in force (``mode``, ``block_network``,
        ``allow_list``)."""
        body: Dict[str, Any] = {}
        if allow_list is not None:
            if block_network:
                raise ValueError("give block_network=True or an allow_list, not both")
            body["allow_list"] = [str(h) for h in allow_list]
        elif block_network is not None:
            body["block_network"] = bool(block_network)
        self._view = self._client.request_json("PATCH", self._path + "/network", json=body)
        return dict(self._view.get("network") or {})

    def expose_port(self, port: int, auth: Optional[str] = None) -> PreviewUrl:
        """A URL for ``port`` of the sandbox (preview URLs, issue 14); a str
        with ``.token`` and ``.path_url``. ``auth``: ``"token"`` or
        ``"none"`` (the daemon's default when not given)."""
        body: Dict[str, Any] = {"port": int(port)}
        if auth is not None:
            body["auth"] = auth
        try:
            return PreviewUrl(self._client.request_json("POST", self._path + "/ports", json=body))
        except APIError as exc:
            raise preview_route_error(exc) from None

    def list_urls(self) -> Dict[int, str]:
        """Exposed ports and their URLs."""
        try:
            raw = self._client.request_json("GET", self._path + "/ports")
        except APIError as exc:
            raise preview_route_error(exc) from None
        entries: List[Dict[str, Any]] = raw.get("ports", []) if isinstance(raw, dict) else list(raw or [])
        return {int(e["port"]): str(e.get("url") or e.get("path_url") or "") for e in entries}

    def _snapshot(self, kind: str) -> str:
        view = self._client.request_json("POST", self._path + "/snapshots", json={"kind": kind})
        return str(view["id"])

    def snapshot_memory(self) -> str:
        """A memory snapshot (processes, memory and files, through CRIU);
        returns its id, for ``Sandbox().create_from_memory_snapshot(id)``."""
        return self._snapshot("memory")

    def create_image_from_filesystem(self) -> str:
        """A filesystem snapshot of the sandbox's files; returns its id,
        usable as ``Sandbox(image=id)``."""
        return self._snapshot("filesystem")

    def __enter__(self) -> "SandboxInstance":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.terminated:
            self.terminate()
