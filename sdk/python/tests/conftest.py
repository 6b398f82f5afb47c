"""Fixtures: a real daemon for the session (with an ingress for preview URLs;
started on first use, stopped at the end with nothing left behind), a leak
check around each test that uses it, and the asyncio backend for the async
tests (anyio's plugin)."""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _daemon import Daemon, ingress_flags  # noqa: E402

# The developer's own remote settings must not steer the tests.
for _name in ("SANDBOXD_URL", "SANDBOXD_TOKEN", "SANDBOXD_TLS_FINGERPRINT", "SANDBOXD_CA_FILE"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def session_daemon() -> Iterator[Daemon]:
    # With an ingress, for the preview-URL tests (`daemon.ingress`).
    d = Daemon(ingress_flags()).start()
    old = os.environ.get("SANDBOXD_SOCKET")
    os.environ["SANDBOXD_SOCKET"] = d.socket
    try:
        yield d
    finally:
        if old is None:
            os.environ.pop("SANDBOXD_SOCKET", None)
        else:
            os.environ["SANDBOXD_SOCKET"] = old
        d.stop()


@pytest.fixture
def daemon(session_daemon: Daemon) -> Iterator[Daemon]:
    """The session's daemon; the test must leave no sandbox of its own."""
    before = set(session_daemon.sandbox_ids())
    yield session_daemon
    left = set(session_daemon.sandbox_ids()) - before
    for sid in left:
        session_daemon.call("DELETE", f"/v1/sandboxes/{sid}")
    assert not left, f"the test left sandboxes behind: {sorted(left)}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
