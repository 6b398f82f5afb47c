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

    for status, raw in ((404, b""), (405, b""), (404, body(code="not_found", message="no route"))):
        err = preview_route_error(error_from_response(status, raw, "POST", "/v1/sandboxes/sb-1/ports"))
        assert isinstance(err, FeatureUnavailableError) and "issue 14" in str(err)
    gone = error_from_response(404, body(code="sandbox_not_found", message="no sandbox"))
    assert preview_route_error(gone) is gone
    refused = error_from_response(
        400, body(code="invalid_json", message="request body is not valid: field `ports`: unknown field `ports`, expected one of ...")
    )
    assert isinstance(create_error(refused, SandboxOptions(ports=[3000])), FeatureUnavailableError)
    assert create_error(refused, SandboxOptions()) is refused
