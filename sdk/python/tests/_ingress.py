"""For the preview-URL tests: a server to run in a sandbox, and requests
through the test daemon's ingress (`daemon.ingress`) without DNS: to the
listener's address with the URL's host in `Host`."""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, Optional
from urllib.parse import urlsplit

import httpx


def server_code(*ports: int) -> str:
    """Python for `run_code`: an http.server on each port (the first bound to
    127.0.0.1, the others to 0.0.0.0) answering every GET with JSON of the
    port, path and headers it got."""
    return f"""
import http.server, json, threading
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = json.dumps({{"port": self.server.server_address[1], "path": self.path,
                           "headers": {{k.lower(): v for k, v in self.headers.items()}}}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ports = {list(ports)!r}
servers = [http.server.ThreadingHTTPServer(("127.0.0.1" if i == 0 else "0.0.0.0", p), Echo) for i, p in enumerate(ports)]
threads = [threading.Thread(target=s.serve_forever) for s in servers]
for t in threads:
    t.start()
print("serving", flush=True)
for t in threads:
    t.join()
"""


def request_for(daemon: Any, url: str, path: str = "", token: Optional[str] = None, bearer: Optional[str] = None):
    """(target URL on the ingress listener, headers) for `url` + `path`."""
    parts = urlsplit(str(url))
    headers: Dict[str, str] = {"host": parts.netloc}
    if token:
        headers["x-sandbox-token"] = token
    if bearer:
        headers["authorization"] = f"Bearer {bearer}"
    query = f"?{parts.query}" if parts.query else ""
    return f"http://{daemon.ingress}{parts.path}{path}{query}", headers


def fetch(daemon: Any, url: str, path: str = "", token: Optional[str] = None, bearer: Optional[str] = None) -> httpx.Response:
    target, headers = request_for(daemon, url, path, token, bearer)
    return httpx.get(target, headers=headers, timeout=30)


async def afetch(daemon: Any, url: str, path: str = "", token: Optional[str] = None) -> httpx.Response:
    target, headers = request_for(daemon, url, path, token)
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.get(target, headers=headers)


def wait_listening(sb: Any, *ports: int, timeout: float = 60.0) -> None:
    """Until something in the sandbox listens on each of `ports` (sync SDK)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {p.port for p in sb.listening_ports()}
        if set(ports) <= found:
            return
        assert time.monotonic() < deadline, f"nothing listens on {set(ports) - found} after {timeout}s"
        time.sleep(0.1)


def tcp_exchange(address: str, first: bytes, timeout: float = 30.0) -> bytes:
    """Connects to `host:port`, sends `first`, and reads until the peer closes."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
        s.sendall(first)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


async def await_listening(sb: Any, *ports: int, timeout: float = 60.0) -> None:
    """As `wait_listening`, for the asyncio SDK."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        found = {p.port for p in await sb.listening_ports()}
        if set(ports) <= found:
            return
        assert time.monotonic() < deadline, f"nothing listens on {set(ports) - found} after {timeout}s"
        await asyncio.sleep(0.1)
