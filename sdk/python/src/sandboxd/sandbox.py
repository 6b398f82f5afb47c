"""``Sandbox`` (what to create) and ``SandboxInstance`` (one that runs), in
Beam's names, over sandboxd's API (sync)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from . import _ports
from ._hybrid import hybridmethod
from ._models import ListeningPort, PreviewUrl
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
        # Tokens of its ports: a create's answer carries them, nothing else will.
        self._port_tokens = _ports.PortTokens()
        self._port_tokens.listed(_ports.entries(self._view))
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
        ``expires_at``, network policy, usage, exposed ``ports``...)."""
        self._view = self._client.request_json("GET", self._path)
        self._port_tokens.listed(_ports.entries(self._view))
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

    # Preview URLs (docs/preview-urls.md).

    def _port_call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return self._client.request_json(method, path, **kwargs)
        except APIError as exc:
            raise preview_route_error(exc) from None

    def expose_port(self, port: int, auth: str = "token", protocol: str = "http") -> PreviewUrl:
        """Exposes ``port`` of the sandbox through the daemon's ingress and
        returns its URL (Beam's ``expose_port``): a ``str`` with ``port``,
        ``protocol``, ``auth``, ``url``, ``path_url``, ``address`` and
        ``token``. ``auth="token"`` (default): the URL needs ``url.token``
        (as ``X-Sandbox-Token`` or ``Authorization: Bearer``; see
        :class:`PreviewUrl`); ``auth="none"``: a public URL, anyone who can
        reach the ingress can use it. ``protocol="tcp"``: a raw TCP port of
        the host (``address``) instead of HTTP URLs. The app may listen on
        ``127.0.0.1`` or ``0.0.0.0``, before or after this call (until it
        does, the URL answers 502). A port exposed already: ConflictError
        (``port_already_exposed``); a daemon without preview URLs or with
        its ingress off: FeatureUnavailableError."""
        body = _ports.expose_body(port, auth, protocol)
        return self._port_tokens.granted(self._port_call("POST", self._path + "/ports", json=body))

    def ports(self) -> List[PreviewUrl]:
        """The exposed ports, each a :class:`PreviewUrl` (with its token when
        this instance holds it)."""
        raw = self._port_call("GET", self._path + "/ports")
        return self._port_tokens.listed(_ports.entries(raw))

    def list_urls(self) -> Dict[int, PreviewUrl]:
        """``{port: url}`` of the exposed ports (Beam's ``list_urls``); each
        url is a :class:`PreviewUrl`, a ``str``."""
        return {u.port: u for u in self.ports()}

    def preview_url(self, port: int) -> PreviewUrl:
        """The URL of an exposed port, with the token this instance holds
        for it (from the create, ``expose_port`` or ``rotate_port_token``);
        NotFoundError (``port_not_exposed``) when it is not exposed."""
        port = _ports.checked_port(port)
        for url in self.ports():
            if url.port == port:
                return url
        raise _ports.not_exposed(self.container_id, port, self._path + "/ports")

    def listening_ports(self) -> List[ListeningPort]:
        """The TCP ports something in the sandbox listens on now, exposed or
        not (``port``, ``address``, ``exposed``): what a server it started
        is ready on. The sandbox must be running."""
        raw = self._port_call("GET", self._path + "/ports", params={"listening": "true"})
        self._port_tokens.listed(_ports.entries(raw))
        return _ports.listening(raw)

    def unexpose_port(self, port: int) -> bool:
        """Stops exposing ``port``: its URLs answer 404 and connections open
        through them end at once. True when it was unexposed now, False
        when it was not exposed."""
        port = _ports.checked_port(port)
        try:
            self._port_call("DELETE", _ports.port_path(self._path, port))
        except NotFoundError as exc:
            if exc.code != "port_not_exposed":
                raise
            return False
        finally:
            self._port_tokens.forget(port)
        return True

    def rotate_port_token(self, port: int) -> PreviewUrl:
        """A new token for an exposed port; the old one stops working at once
        (and connections made with it end). Returns the URL with the new
        ``token``. A public port (``auth="none"``): ConflictError
        (``port_public``)."""
        raw = self._port_call("POST", _ports.port_path(self._path, port) + "/token")
        return self._port_tokens.granted(raw)

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
