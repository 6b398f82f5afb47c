"""Without a daemon: error mapping, fingerprints, connection settings."""

from __future__ import annotations

import json

import pytest

import sandboxd
from sandboxd import (
    APIError,
    AuthenticationError,
    BadRequestError,
    CapacityError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    SandboxdError,
    SandboxFileSystemError,
    ServerError,
    normalize_fingerprint,
)
from sandboxd._http import DEFAULT_SOCKET, resolve_config
from sandboxd.errors import error_from_response, in_context


def body(**error):
    return json.dumps({"error": error}).encode()


@pytest.mark.parametrize(
    "status, cls",
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (404, NotFoundError),
        (409, ConflictError),
        (413, PayloadTooLargeError),
        (503, CapacityError),
        (500, ServerError),
        (502, ServerError),
    ],
)
def test_status_maps_to_type(status, cls):
    err = error_from_response(status, body(code="c", message="m"), "GET", "/v1/x")
    assert type(err) is cls
    assert isinstance(err, APIError) and isinstance(err, SandboxdError)
    assert (err.status, err.code, err.message, err.method, err.path) == (status, "c", "m", "GET", "/v1/x")


def test_field_and_resource_are_carried():
    err = error_from_response(400, body(code="invalid_cpu", message="cpu must be...", field="cpu"))
    assert isinstance(err, BadRequestError)
    assert err.field == "cpu" and err.resource is None
    assert "field cpu" in str(err) and "invalid_cpu" in str(err)
    err = error_from_response(503, body(code="no_capacity", message="full", resource="memory"))
    assert isinstance(err, CapacityError)
    assert err.resource == "memory" and err.field is None
    assert "resource memory" in str(err)


def test_bodies_that_are_not_the_error_shape():
    err = error_from_response(404, b"", "POST", "/v1/sandboxes/x/ports")
    assert isinstance(err, NotFoundError) and err.code == "" and err.body is None
    assert "404" in err.message
    err = error_from_response(502, b"<html>bad gateway</html>")
    assert isinstance(err, ServerError) and err.body == "<html>bad gateway</html>"
    assert "bad gateway" in err.message
    err = error_from_response(400, b"[1, 2]")
    assert isinstance(err, BadRequestError) and err.body == [1, 2]


def test_in_context_makes_both_types():
    err = error_from_response(404, body(code="file_not_found", message="/x: No such file"))
    both = in_context(err, SandboxFileSystemError)
    assert isinstance(both, NotFoundError) and isinstance(both, SandboxFileSystemError)
    assert both.code == "file_not_found" and str(both) == str(err)
    # The same mixed class every time, named as the original.
    again = in_context(error_from_response(404, body(code="a", message="b")), SandboxFileSystemError)
    assert type(again) is type(both) and type(both).__name__ == "NotFoundError"
    # Already of the context: unchanged.
    assert in_context(both, SandboxFileSystemError) is both


FP = "a3" * 32


@pytest.mark.parametrize(
    "given",
    [
        FP,
        FP.upper(),
        ":".join(FP[i : i + 2] for i in range(0, 64, 2)),
        ":".join(FP[i : i + 2] for i in range(0, 64, 2)).upper(),
        "sha256:" + FP,
        "SHA256:" + ":".join(FP[i : i + 2] for i in range(0, 64, 2)),
        "  " + FP + "\n",
    ],
)
def test_fingerprint_forms(given):
    assert normalize_fingerprint(given) == FP


@pytest.mark.parametrize("bad", ["", "a3" * 31, "a3" * 33, "zz" * 32, "md5:" + FP, 5])
def test_bad_fingerprints(bad):
    with pytest.raises(ValueError):
        normalize_fingerprint(bad)


def test_connection_settings_from_env_and_arguments(monkeypatch):
    for name in ("SANDBOXD_URL", "SANDBOXD_TOKEN", "SANDBOXD_TLS_FINGERPRINT", "SANDBOXD_CA_FILE", "SANDBOXD_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    c = resolve_config()
    assert (c.url, c.socket, c.token) == (None, DEFAULT_SOCKET, None)
    monkeypatch.setenv("SANDBOXD_SOCKET", "/tmp/x.sock")
    assert resolve_config().socket == "/tmp/x.sock"
    monkeypatch.setenv("SANDBOXD_URL", "https://127.0.0.1:8443/")
    monkeypatch.setenv("SANDBOXD_TOKEN", "tok")
    monkeypatch.setenv("SANDBOXD_TLS_FINGERPRINT", "SHA256:" + FP.upper())
    c = resolve_config()
    assert (c.url, c.token, c.tls_fingerprint) == ("https://127.0.0.1:8443", "tok", FP)
    assert c.base_url == "https://127.0.0.1:8443"
    # Arguments win: socket= over the env's URL, url= and the rest over theirs.
    c = resolve_config(socket="/run/other.sock")
    assert (c.url, c.socket) == (None, "/run/other.sock")
    c = resolve_config(url="https://h:1", token="t2", tls_fingerprint=FP.replace("a", "b"))
    assert (c.url, c.token, c.tls_fingerprint) == ("https://h:1", "t2", FP.replace("a", "b"))
    with pytest.raises(ValueError):
        resolve_config(url="https://h:1", socket="/x")
    with pytest.raises(ValueError):
        resolve_config(url="ftp://h")
    with pytest.raises(ValueError):
        resolve_config(url="http://h:1", tls_fingerprint=FP)
    monkeypatch.setenv("SANDBOXD_TLS_FINGERPRINT", "nonsense")
    with pytest.raises(ValueError):
        resolve_config()


def test_version_and_public_names():
    assert sandboxd.__version__
    for name in sandboxd.__all__:
        assert hasattr(sandboxd, name), name
    from sandboxd import aio

    for name in aio.__all__:
        assert hasattr(aio, name), name
    # The async twin has the sync API's names.
    for cls in ("Sandbox", "SandboxInstance", "SandboxProcess", "SandboxProcessManager", "SandboxFileSystem"):
        sync_names = {n for n in dir(getattr(sandboxd, cls)) if not n.startswith("_")}
        async_names = {n for n in dir(getattr(aio, cls)) if not n.startswith("_")}
        # Only the sync Sandbox holds a shared client; async instances own theirs.
        assert sync_names - async_names == ({"client"} if cls == "Sandbox" else set()), cls


def test_missing_preview_routes_say_so():
    from sandboxd import FeatureUnavailableError
    from sandboxd._spec import SandboxOptions
    from sandboxd.errors import create_error, preview_route_error

    # A daemon older than preview URLs: no such route (404 or 405 without
    # the daemon's error body, or a router's generic one).
    for status, raw in ((404, b""), (405, b""), (404, body(code="not_found", message="no route"))):
        err = preview_route_error(error_from_response(status, raw, "POST", "/v1/sandboxes/sb-1/ports"))
        assert isinstance(err, FeatureUnavailableError) and err.status == status
        assert "no such route" in str(err) and "issue 14" not in str(err)
        assert err.path == "/v1/sandboxes/sb-1/ports"
    # The daemon's own 404s name what is missing: left as they are.
    for code in ("sandbox_not_found", "port_not_exposed"):
        gone = error_from_response(404, body(code=code, message="no such thing"))
        assert preview_route_error(gone) is gone and not isinstance(gone, FeatureUnavailableError)
    # A daemon with its ingress off: FeatureUnavailableError, and still the
    # BadRequestError it was, with the daemon's code and words.
    off = error_from_response(400, body(code="ingress_disabled", message="this daemon serves no preview URLs: set ingress_listen"))
    err = preview_route_error(off)
    assert isinstance(err, FeatureUnavailableError) and isinstance(err, BadRequestError)
    assert (err.status, err.code, err.message) == (400, "ingress_disabled", off.message)
    other = error_from_response(400, body(code="invalid_port", message="port 0", field="port"))
    assert preview_route_error(other) is other

    # Creates with ports=: the field refused (no preview URLs), or the ingress off.
    refused = error_from_response(
        400, body(code="invalid_json", message="request body is not valid: field `ports`: unknown field `ports`, expected one of ...")
    )
    err = create_error(refused, SandboxOptions(ports=[3000]))
    assert isinstance(err, FeatureUnavailableError) and err.field == "ports"
    assert create_error(refused, SandboxOptions()) is refused
    err = create_error(off, SandboxOptions(ports=[3000]))
    assert isinstance(err, FeatureUnavailableError) and isinstance(err, BadRequestError)
    assert (err.code, err.field) == ("ingress_disabled", "ports")
    assert off.field is None, "the original error is left as it was"
    assert create_error(off, SandboxOptions()) is off


def test_preview_url_values():
    import copy
    import pickle

    from sandboxd import PreviewUrl

    raw = {"port": 3000, "protocol": "http", "auth": "token", "url": "https://sb-1-3000.example.com/",
           "path_url": "https://example.com/sb-1/3000/", "token": "s3cr3t+/"}
    url = PreviewUrl(raw)
    assert url == "https://sb-1-3000.example.com/" and isinstance(url, str)
    assert (url.port, url.protocol, url.auth, url.path_url, url.address, url.token) == (
        3000, "http", "token", "https://example.com/sb-1/3000/", None, "s3cr3t+/")
    assert "s3cr3t" not in repr(url) and "s3cr3t" not in str(url)
    assert url.headers == {"X-Sandbox-Token": "s3cr3t+/"}
    assert url.with_token() == "https://sb-1-3000.example.com/?sandbox_token=s3cr3t%2B%2F"
    assert url.as_dict() == raw
    for again in (pickle.loads(pickle.dumps(url)), copy.deepcopy(url)):
        assert type(again) is PreviewUrl and again == url and again.token == url.token and again.port == 3000
    # Without ingress_domain: the path form; raw TCP: the address.
    path_only = PreviewUrl({"port": 80, "protocol": "http", "auth": "none", "path_url": "http://10.0.0.1:8080/sb-1/80/"})
    assert path_only == path_only.path_url and path_only.url is None and path_only.token is None
    assert path_only.headers == {} and path_only.with_token() == path_only
    # A token path URL: the token goes in a header, no browser URL is made.
    guarded = PreviewUrl({"port": 81, "protocol": "http", "auth": "token", "path_url": "http://10.0.0.1:8080/sb-1/81/"}, token="t")
    assert guarded.headers == {"X-Sandbox-Token": "t"}
    with pytest.raises(ValueError, match="ingress_domain"):
        guarded.with_token()
    tcp = PreviewUrl({"port": 5432, "protocol": "tcp", "auth": "token", "address": "10.0.0.1:20000"}, token="t")
    assert tcp == "10.0.0.1:20000" and tcp.token == "t" and tcp.with_token() == tcp


def test_tokens_are_kept_from_the_answers_that_carry_them():
    from sandboxd._ports import PortTokens

    tokens = PortTokens()
    created = tokens.listed([{"port": 1, "auth": "token", "path_url": "p1", "token": "a"},
                             {"port": 2, "auth": "none", "path_url": "p2"}])
    assert [u.token for u in created] == ["a", None]
    assert tokens.granted({"port": 3, "auth": "token", "path_url": "p3", "token": "c"}).token == "c"
    listed = tokens.listed([{"port": 1, "auth": "token", "path_url": "p1"}, {"port": 3, "auth": "token", "path_url": "p3"}])
    assert [u.token for u in listed] == ["a", "c"]
    assert tokens.granted({"port": 1, "auth": "token", "path_url": "p1", "token": "b"}).token == "b"
    # A port missing from a listing was unexposed: its token is dropped.
    assert [u.token for u in tokens.listed([{"port": 1, "auth": "token", "path_url": "p1"}])] == ["b"]
    assert tokens.listed([{"port": 3, "auth": "token", "path_url": "p3"}])[0].token is None
    tokens.forget(1)
    assert tokens.granted({"port": 1, "auth": "token", "path_url": "p1"}).token is None


def _old_daemon(request):
    """A sandboxd older than preview URLs: no /ports routes."""
    import httpx

    if request.url.path.endswith("/ports") and request.method == "POST":
        return httpx.Response(404)
    if "/ports" in request.url.path:
        return httpx.Response(405 if request.method == "DELETE" else 404)
    return httpx.Response(200, json={"id": "sb-0123456789ab", "state": "ready"})


def test_a_daemon_without_preview_urls_says_so():
    import httpx

    from sandboxd import FeatureUnavailableError

    client = sandboxd.Client(socket="/nonexistent.sock", transport=httpx.MockTransport(_old_daemon))
    sb = sandboxd.Sandbox.connect("sb-0123456789ab", client=client)
    for call in (lambda: sb.expose_port(8000), sb.list_urls, sb.ports, sb.listening_ports,
                 lambda: sb.preview_url(8000), lambda: sb.unexpose_port(8000), lambda: sb.rotate_port_token(8000)):
        with pytest.raises(FeatureUnavailableError) as info:
            call()
        assert "no such route" in str(info.value)


@pytest.mark.anyio
async def test_a_daemon_without_preview_urls_says_so_async():
    import httpx

    from sandboxd import FeatureUnavailableError, aio

    client = aio.Client(socket="/nonexistent.sock", transport=httpx.MockTransport(_old_daemon))
    sb = await aio.Sandbox.connect("sb-0123456789ab", client=client)
    for call in (lambda: sb.expose_port(8000), sb.list_urls, lambda: sb.unexpose_port(8000),
                 lambda: sb.rotate_port_token(8000)):
        with pytest.raises(FeatureUnavailableError):
            await call()
