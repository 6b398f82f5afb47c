"""The asyncio twin of :mod:`sandboxd`: the same names, awaited::

    from sandboxd.aio import Sandbox

    async with await Sandbox(image="python").create() as sb:
        proc = await sb.process.run_code("print(1)", blocking=False)
        async for line in proc.stdout:
            print(line, end="")

Errors, ``Image`` and the data types are the sync package's own.
"""

from .._models import CompletedStream, ListeningPort, PreviewUrl, SandboxFileInfo
from ..errors import (
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
from ..image import Image
from .client import Client
from .fs import SandboxFileSystem
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
]
