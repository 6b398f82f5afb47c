"""Python SDK of sandboxd, shaped like Beam's ``Sandbox``::

    from sandboxd import Sandbox

    with Sandbox(image="python", block_network=True).create() as sb:
        print(sb.process.run_code("print(6 * 7)").result)

The asyncio twin, with the same names, is :mod:`sandboxd.aio`.
"""

__version__ = "0.1.0"

from ._models import CompletedStream, ListeningPort, PreviewUrl, SandboxFileInfo
from ._spec import parse_cpu, parse_memory
from ._tls import normalize_fingerprint
from .client import Client
from .errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    CapacityError,
    ConflictError,
    FeatureUnavailableError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    SandboxConnectionError,
    SandboxdError,
    SandboxFileSystemError,
    SandboxProcessError,
    SandboxTimeoutError,
    ServerError,
    TLSFingerprintError,
)
from .fs import SandboxFileSystem
from .image import Image
from .process import (
    SandboxProcess,
    SandboxProcessLogs,
    SandboxProcessManager,
    SandboxProcessResponse,
    SandboxProcessStdin,
    SandboxProcessStream,
)
from .sandbox import Sandbox, SandboxInstance

__all__ = [
    "__version__",
    "Sandbox",
    "SandboxInstance",
    "Image",
    "Client",
    "SandboxProcessManager",
    "SandboxProcess",
    "SandboxProcessStream",
    "SandboxProcessLogs",
    "SandboxProcessStdin",
    "SandboxProcessResponse",
    "SandboxFileSystem",
    "SandboxFileInfo",
    "CompletedStream",
    "PreviewUrl",
    "ListeningPort",
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
    "parse_memory",
    "parse_cpu",
    "normalize_fingerprint",
]
