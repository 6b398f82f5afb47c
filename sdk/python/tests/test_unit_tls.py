"""Without a daemon: certificate pinning and tokens against a local TLS
server this test starts, with self-signed certificates made by
``openssl req``. The pin is checked in every handshake, before any request
goes out: a server that changes its certificate is refused on the next
connection."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import sandboxd
from sandboxd import AuthenticationError, SandboxConnectionError, TLSFingerprintError
from sandboxd import aio

TOKEN = "test-token-123"


def make_cert(dir: Path, name: str) -> Tuple[str, str, str]:
    """(cert path, key path, fingerprint as openssl prints it: AB:CD:...)."""
    cert, key = dir / f"{name}.pem", dir / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
        check=True, capture_output=True, text=True,
    ).stdout
    return str(cert), str(key), out.strip().split("=", 1)[1]


class Server:
    """HTTPS on 127.0.0.1 answering /v1/health, 401 without the token; one
    request per connection, so each request is a new handshake."""

    def __init__(self, cert: str, key: str) -> None:
        self.requests: List[str] = []
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    status, body = 401, {"error": {"code": "unauthorized", "message": "a valid bearer token is needed"}}
                else:
                    status, body = 200, {"status": "ok", "version": "test", "sandboxes": 0}
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(raw)
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # Handshakes the client refuses are expected here: no tracebacks.
        self.httpd.handle_error = lambda request, address: None  # type: ignore[assignment]
        ctx = self.ctx
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.httpd.server_address[1]}"

    def use_cert(self, cert: str, key: str) -> None:
        """New handshakes present this certificate from now on."""
        self.ctx.load_cert_chain(cert, key)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("certs")
    return {name: make_cert(d, name) for name in ("a", "b")}


@pytest.fixture
def server(certs) -> Iterator[Server]:
    cert, key, _ = certs["a"]
    s = Server(cert, key)
    yield s
    s.close()


def health(client: sandboxd.Client) -> dict:
    return client.request_json("GET", "/v1/health")


def test_pinned_certificate_is_accepted_in_every_written_form(server, certs):
    fp = certs["a"][2]
    for form in (fp, fp.replace(":", "").lower(), "sha256:" + fp.lower()):
        with sandboxd.Client(url=server.url, token=TOKEN, tls_fingerprint=form) as client:
            assert health(client)["status"] == "ok"
            assert health(client)["status"] == "ok"


def test_a_wrong_pin_is_refused_before_any_request(server, certs):
    with sandboxd.Client(url=server.url, token=TOKEN, tls_fingerprint=certs["b"][2]) as client:
        with pytest.raises(TLSFingerprintError) as info:
            health(client)
    assert info.value.expected == certs["b"][2].replace(":", "").lower()
    assert info.value.got == certs["a"][2].replace(":", "").lower()
    assert isinstance(info.value, SandboxConnectionError)
    assert server.requests == []


def test_the_pin_is_checked_on_every_connection(server, certs):
    with sandboxd.Client(url=server.url, token=TOKEN, tls_fingerprint=certs["a"][2]) as client:
        assert health(client)["status"] == "ok"
        server.use_cert(*certs["b"][:2])
        with pytest.raises(TLSFingerprintError):
            health(client)
        server.use_cert(*certs["a"][:2])
        assert health(client)["status"] == "ok"
    assert len(server.requests) == 2


def test_a_create_does_not_retry_a_wrong_pin(server, certs):
    client = sandboxd.Client(url=server.url, token=TOKEN, tls_fingerprint=certs["b"][2], retry_seconds=60)
    with pytest.raises(TLSFingerprintError):
        sandboxd.Sandbox(client=client).create()
    client.close()


def test_token_missing_or_wrong_is_an_authentication_error(server, certs):
    for token in (None, "wrong"):
        with sandboxd.Client(url=server.url, token=token, tls_fingerprint=certs["a"][2]) as client:
            with pytest.raises(AuthenticationError) as info:
                health(client)
        assert info.value.status == 401 and info.value.code == "unauthorized"


def test_env_settings_reach_the_server(server, certs, monkeypatch):
    monkeypatch.setenv("SANDBOXD_URL", server.url)
    monkeypatch.setenv("SANDBOXD_TOKEN", TOKEN)
    monkeypatch.setenv("SANDBOXD_TLS_FINGERPRINT", certs["a"][2])
    with sandboxd.Client() as client:
        assert health(client)["status"] == "ok"


def test_without_a_pin_ca_verification_applies(server, certs, monkeypatch):
    monkeypatch.delenv("SANDBOXD_CA_FILE", raising=False)
    # The self-signed certificate is no CA anyone trusts...
    with sandboxd.Client(url=server.url, token=TOKEN) as client:
        with pytest.raises(SandboxConnectionError) as info:
            health(client)
        assert not isinstance(info.value, TLSFingerprintError)
    # ...unless named as the CA.
    with sandboxd.Client(url=server.url, token=TOKEN, ca_file=certs["a"][0]) as client:
        assert health(client)["status"] == "ok"
    monkeypatch.setenv("SANDBOXD_CA_FILE", certs["b"][0])
    with sandboxd.Client(url=server.url, token=TOKEN) as client:
        with pytest.raises(SandboxConnectionError):
            health(client)


@pytest.mark.anyio
async def test_async_pin_checked_on_every_connection(server, certs):
    async with aio.Client(url=server.url, token=TOKEN, tls_fingerprint=certs["a"][2]) as client:
        assert (await client.request_json("GET", "/v1/health"))["status"] == "ok"
        server.use_cert(*certs["b"][:2])
        with pytest.raises(TLSFingerprintError):
            await client.request_json("GET", "/v1/health")
        server.use_cert(*certs["a"][:2])
        assert (await client.request_json("GET", "/v1/health"))["status"] == "ok"
    async with aio.Client(url=server.url, tls_fingerprint=certs["a"][2]) as client:
        with pytest.raises(AuthenticationError):
            await client.request_json("GET", "/v1/health")
    assert len(server.requests) == 3
