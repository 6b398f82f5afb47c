"""Files in a sandbox (sync). Uploads and downloads stream in 1 MiB pieces,
so a big file never sits in memory whole."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, BinaryIO, Iterator, List, Union

from ._models import CHUNK, SandboxFileInfo, file_info
from .errors import NotFoundError, SandboxdError, SandboxFileSystemError, in_context

if TYPE_CHECKING:
    from .sandbox import SandboxInstance

__all__ = ["SandboxFileSystem"]

PathLike = Union[str, "os.PathLike[str]"]


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while True:
        data = f.read(CHUNK)
        if not data:
            return
        yield data


class SandboxFileSystem:
    """``sb.fs``. Paths inside the sandbox are absolute (``/root/x``);
    errors are typed (``NotFoundError``...) and also SandboxFileSystemError."""

    def __init__(self, sandbox: "SandboxInstance") -> None:
        self.sandbox_instance = sandbox

    @property
    def _base(self) -> str:
        return f"/v1/sandboxes/{self.sandbox_instance.container_id}/files"

    def _call(self, method: str, suffix: str, **kwargs):
        try:
            return self.sandbox_instance._client.request(method, self._base + suffix, **kwargs)
        except SandboxdError as exc:
            raise in_context(exc, SandboxFileSystemError) from None

    def upload_file(self, local_path: PathLike, sandbox_path: str, mode: int = 0o644) -> SandboxFileInfo:
        """Copies a local file into the sandbox (the folder must exist)."""
        with open(local_path, "rb") as f:
            response = self._call("PUT", "", params={"path": sandbox_path, "mode": mode}, content=_chunks(f))
        return file_info(response.json())

    def download_file(self, sandbox_path: str, local_path: PathLike) -> int:
        """Copies a file out of the sandbox; returns its size. A failed
        download leaves no partial local file."""
        client = self.sandbox_instance._client
        try:
            response = client.open_stream("GET", self._base, params={"path": sandbox_path}, timeout=client.timeout)
        except SandboxdError as exc:
            raise in_context(exc, SandboxFileSystemError) from None
        size = 0
        try:
            with open(local_path, "wb") as f:
                for data in response.iter_bytes(CHUNK):
                    f.write(data)
                    size += len(data)
        except BaseException:
            try:
                os.unlink(local_path)
            except OSError:
                pass
            raise
        finally:
            response.close()
        return size

    def read_bytes(self, sandbox_path: str) -> bytes:
        """A file's contents (whole, in memory: use download_file for big ones)."""
        return self._call("GET", "", params={"path": sandbox_path}).content

    def write_bytes(self, sandbox_path: str, data: Union[bytes, str], mode: int = 0o644) -> SandboxFileInfo:
        """Writes a file (str is written as UTF-8)."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        response = self._call("PUT", "", params={"path": sandbox_path, "mode": mode}, content=content)
        return file_info(response.json())

    def list_files(self, sandbox_path: str) -> List[SandboxFileInfo]:
        listing = self._call("GET", "/list", params={"path": sandbox_path}).json()
        return [file_info(e) for e in listing.get("entries", [])]

    def stat_file(self, sandbox_path: str) -> SandboxFileInfo:
        return file_info(self._call("GET", "/stat", params={"path": sandbox_path}).json())

    def create_directory(self, sandbox_path: str, parents: bool = True, mode: int = 0o755) -> SandboxFileInfo:
        """``mkdir`` (with ``parents``, as ``mkdir -p``: missing parents too)."""
        params = {"path": sandbox_path, "parents": "true" if parents else "false", "mode": mode}
        return file_info(self._call("POST", "/mkdir", params=params).json())

    def delete_file(self, sandbox_path: str) -> None:
        self._call("DELETE", "", params={"path": sandbox_path})

    def delete_directory(self, sandbox_path: str, recursive: bool = True) -> None:
        """Removes a folder, with what it holds unless ``recursive=False``."""
        self._call("DELETE", "", params={"path": sandbox_path, "recursive": "true" if recursive else "false"})

    def exists(self, sandbox_path: str) -> bool:
        try:
            self.stat_file(sandbox_path)
            return True
        except NotFoundError:
            return False
