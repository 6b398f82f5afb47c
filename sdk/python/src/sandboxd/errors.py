"""The SDK's errors.

Every error is a :class:`SandboxdError`. An error answer of the daemon
(``{"error": {"code", "message", "resource"?, "field"?}}``) becomes an
:class:`APIError` subclass chosen by its HTTP status, carrying the daemon's
``code``, ``message``, ``field`` (the request field at fault, when the daemon
names one) and ``resource`` (what ran out, on a 503).

Beam's names are kept: errors raised by ``sb.process`` calls are also
:class:`SandboxProcessError`, errors raised by ``sb.fs`` calls are also
:class:`SandboxFileSystemError`, and ``Sandbox.connect`` failures are also
:class:`SandboxConnectionError`; so ``except NotFoundError`` and ``except
SandboxFileSystemError`` both catch a missing file.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

__all__ = [
    "SandboxdError",
    "SandboxConnectionError",
    "SandboxTimeoutError",
    "TLSFingerprintError",
    "SandboxProcessError",
    "SandboxFileSystemError",
    "APIError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "PayloadTooLargeError",
    "CapacityError",
    "ServerError",
    "FeatureUnavailableError",
    "error_from_response",
]


class SandboxdError(Exception):
    """Base of every error this SDK raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SandboxConnectionError(SandboxdError):
    """The daemon could not be reached (socket missing, refused, reset, TLS
    failure), or ``Sandbox.connect`` could not attach to a sandbox."""


class SandboxTimeoutError(SandboxConnectionError):
    """The daemon did not answer in time."""


class TLSFingerprintError(SandboxConnectionError):
    """The server's certificate is not the one ``SANDBOXD_TLS_FINGERPRINT``
    (or ``tls_fingerprint=``) pins. Never retried."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(
            f"the server's TLS certificate has SHA-256 fingerprint {got}, "
            f"not the pinned {expected}: refusing the connection"
        )
        self.expected = expected
        self.got = got


class SandboxProcessError(SandboxdError):
    """A process operation failed; also raised by ``wait(timeout)`` when the
    process is still running at the timeout (the process is left running)."""


class SandboxFileSystemError(SandboxdError):
    """A file operation failed."""


class APIError(SandboxdError):
    """The daemon answered with an error status.

    Attributes: ``status`` (HTTP status), ``code`` (the daemon's machine
    code, e.g. ``sandbox_not_found``), ``message`` (the daemon's words),
    ``field`` and ``resource`` (when the daemon gives them), ``body`` (the
    parsed body, or the text when it was not JSON), ``method`` and ``path``
    of the request.
    """

    status: int = 0

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str = "",
        field: Optional[str] = None,
        resource: Optional[str] = None,
        body: Any = None,
        method: str = "",
        path: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field
        self.resource = resource
        self.body = body
        self.method = method
        self.path = path

    def __str__(self) -> str:
        extra = []
        if self.field:
            extra.append(f"field {self.field}")
        if self.resource:
            extra.append(f"resource {self.resource}")
        tail = f" ({', '.join(extra)})" if extra else ""
        code = f" {self.code}" if self.code else ""
        return f"{self.status}{code}: {self.message}{tail}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"message={self.message!r}, field={self.field!r}, resource={self.resource!r})"
        )


class BadRequestError(APIError):
    """400: the request is malformed or impossible; ``field`` names the
    request field at fault when the daemon says which."""

    status = 400


class AuthenticationError(APIError):
    """401: the remote API wants a valid bearer token (``SANDBOXD_TOKEN``)."""

    status = 401


class PermissionDeniedError(APIError):
    """403: the token may not do this."""

    status = 403


class NotFoundError(APIError):
    """404: no such sandbox, process, snapshot, image or file."""

    status = 404


class ConflictError(APIError):
    """409: the request conflicts with the object's state (a stopped
    sandbox, an exited process, an idempotency key used with another body)."""

    status = 409


class PayloadTooLargeError(APIError):
    """413: an upload over the daemon's ``max_upload_mib``."""

    status = 413


class CapacityError(APIError):
    """503: the host cannot take it now; ``resource`` says what ran out
    (cpu, memory, disk, gpu, sandboxes)."""

    status = 503


class ServerError(APIError):
    """Any other error status (500: a bug in the daemon, say so)."""


class FeatureUnavailableError(APIError):
    """This daemon cannot do it: it has no route for it (a sandboxd older
    than the feature: ``status`` 404 or 405), or the feature is off in its
    configuration (preview URLs on a daemon without ``ingress_listen``, raw
    TCP ports without ``ingress_tcp_ports``: the daemon's 400
    ``ingress_disabled``, then also a :class:`BadRequestError`)."""


_BY_STATUS: Dict[int, Type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    503: CapacityError,
}


def parse_error_body(raw: bytes) -> Tuple[Any, Dict[str, Any]]:
    """(the body as parsed or as text, the ``error`` object or {})."""
    if not raw:
        return None, {}
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace"), {}
    detail = body.get("error") if isinstance(body, dict) else None
    return body, detail if isinstance(detail, dict) else {}


def error_from_response(status: int, raw: bytes, method: str = "", path: str = "") -> APIError:
    """The typed error for an error answer of the daemon."""
    body, detail = parse_error_body(raw)
    cls = _BY_STATUS.get(status, ServerError)
    message = detail.get("message")
    if not isinstance(message, str) or not message:
        text = body if isinstance(body, str) and body.strip() else ""
        message = text.strip()[:500] or f"HTTP {status} from {method} {path}".strip()

    def text_or_none(key: str) -> Optional[str]:
        value = detail.get(key)
        return value if isinstance(value, str) and value else None

    return cls(
        message,
        status=status,
        code=text_or_none("code") or "",
        field=text_or_none("field"),
        resource=text_or_none("resource"),
        body=body,
        method=method,
        path=path,
    )


E = TypeVar("E", bound=SandboxdError)
_MIXED: Dict[Tuple[type, type], type] = {}


def in_context(error: E, context: Type[SandboxdError]) -> E:
    """``error`` as an instance of its own class and of ``context`` too (a
    404 of ``fs.stat_file`` is a NotFoundError and a SandboxFileSystemError)."""
    cls = type(error)
    if issubclass(cls, context):
        return error
    mixed: Any = _MIXED.get((cls, context))
    if mixed is None:
        mixed = type(cls.__name__, (cls, context), {"__module__": cls.__module__})
        mixed.__qualname__ = cls.__qualname__
        _MIXED[(cls, context)] = mixed
    clone = mixed.__new__(mixed)
    clone.__dict__.update(error.__dict__)
    clone.args = error.args
    clone.__traceback__ = error.__traceback__
    clone.__cause__ = error.__cause__
    return clone  # type: ignore[return-value]


PREVIEW_URLS_MISSING = (
    "preview URLs (expose_port, list_urls, ports=...) need a sandboxd with preview URLs "
    "(POST/GET /v1/sandboxes/{id}/ports, docs/preview-urls.md); this daemon has no such route: upgrade it"
)


def _missing_route(exc: APIError) -> bool:
    """A 405, or a 404 no daemon handler wrote (no error body, or a
    router's generic ``not_found``): a 404 of the daemon's own names what
    is missing (``sandbox_not_found``, ``port_not_exposed``)."""
    return exc.status == 405 or (exc.status == 404 and exc.code in ("", "not_found"))


def preview_route_error(exc: APIError) -> APIError:
    """The error of a preview-URL call: a daemon without the routes, or
    with its ingress off (400 ``ingress_disabled``), raises
    FeatureUnavailableError; any other error is left as it is."""
    if _missing_route(exc):
        return FeatureUnavailableError(
            PREVIEW_URLS_MISSING, status=exc.status, body=exc.body, method=exc.method, path=exc.path
        )
    if exc.status == 400 and exc.code == "ingress_disabled":
        return in_context(exc, FeatureUnavailableError)
    return exc


def create_error(exc: APIError, options: Any) -> APIError:
    """A create's error. With ``ports=``: a daemon that refuses the field
    has no preview URLs, and one without an ingress says
    ``ingress_disabled``; both raise FeatureUnavailableError (field ``ports``)."""
    if not getattr(options, "ports", None) or exc.status != 400:
        return exc
    if "unknown field `ports`" in exc.message:
        return FeatureUnavailableError(
            PREVIEW_URLS_MISSING, status=400, code=exc.code, field="ports", body=exc.body,
            method=exc.method, path=exc.path,
        )
    if exc.code == "ingress_disabled":
        err = in_context(exc, FeatureUnavailableError)
        err.field = err.field or "ports"
        return err
    return exc
