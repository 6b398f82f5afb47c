"""Preview URLs (exposed ports), shared by the sync and asyncio instances:
the request bodies and paths, and the tokens an instance has been given.

The daemon shows a port's token once, in the answer that made it (expose,
rotate, a create with ``ports``), and keeps only its hash; so the instance
that got it keeps it, and hands it out with the port's URL from then on
(``list_urls``, ``ports``, ``preview_url``)."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List

from ._models import ListeningPort, PreviewUrl
from .errors import NotFoundError

AUTHS = ("token", "none")
PROTOCOLS = ("http", "tcp")


def checked_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise ValueError(f"port must be an int in 1..65535, not {port!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port {port} must be between 1 and 65535")
    return port


def expose_body(port: int, auth: str, protocol: str) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes/{id}/ports``."""
    if auth not in AUTHS:
        raise ValueError(f'auth must be "token" (the URL needs its token) or "none" (public), not {auth!r}')
    if protocol not in PROTOCOLS:
        raise ValueError(f'protocol must be "http" or "tcp" (a raw TCP port), not {protocol!r}')
    return {"port": checked_port(port), "auth": auth, "protocol": protocol}


def port_path(sandbox_path: str, port: int) -> str:
    return f"{sandbox_path}/ports/{checked_port(port)}"


def entries(raw: Any) -> List[Dict[str, Any]]:
    """The ``ports`` of a ``PortList`` (or of a sandbox's view)."""
    ports = raw.get("ports") if isinstance(raw, dict) else raw
    return [p for p in (ports or []) if isinstance(p, dict)]


def listening(raw: Any) -> List[ListeningPort]:
    found = raw.get("listening") if isinstance(raw, dict) else None
    return [ListeningPort.from_raw(p) for p in (found or []) if isinstance(p, dict)]


def not_exposed(sandbox_id: str, port: int, path: str) -> NotFoundError:
    return NotFoundError(
        f"port {port} of sandbox {sandbox_id} is not exposed; expose_port({port}) exposes it",
        status=404,
        code="port_not_exposed",
        method="GET",
        path=path,
    )


class PortTokens:
    """The tokens this instance was given, by port."""

    def __init__(self) -> None:
        self._tokens: Dict[int, str] = {}

    def granted(self, raw: Dict[str, Any]) -> PreviewUrl:
        """An answer that may carry a new token (expose, rotate, create)."""
        url = PreviewUrl(raw, token=self._tokens.get(int(raw.get("port", 0))))
        if raw.get("token"):
            self._tokens[url.port] = str(raw["token"])
        elif url.auth != "token":
            self._tokens.pop(url.port, None)
        return url

    def listed(self, ports: Iterable[Dict[str, Any]], complete: bool = True) -> List[PreviewUrl]:
        """A listing (no tokens in it): each port with the token held for
        it. A complete listing also lets go of the tokens of ports no
        longer exposed."""
        out = [self.granted(p) for p in ports]
        if complete:
            live = {u.port for u in out if u.auth == "token"}
            for port in list(self._tokens):
                if port not in live:
                    del self._tokens[port]
        return out

    def forget(self, port: int) -> None:
        self._tokens.pop(port, None)
