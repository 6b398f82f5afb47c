"""Files in a sandbox (asyncio twin of :mod:`sandboxd.fs`). Uploads and
downloads stream in 1 MiB pieces; local file reads and writes run in a
worker thread so the event loop never waits on the disk."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, AsyncIterator, BinaryIO, List, Union

from .._models import CHUNK, SandboxFileInfo, file_info
from ..errors import NotFoundError, SandboxdError, SandboxFileSystemError, in_context

if TYPE_CHECKING:
    from .sandbox import SandboxInstance

__all__ = ["SandboxFileSystem"]

PathLike = Union[str, "os.PathLike[str]"]


async def _to_thread(func: Any, *args: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, func, *args)


async def _chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    while True:
        data = await _to_thread(f.read, CHUNK)
        if not data:
            return
        yield data


class SandboxFileSystem:
    """``sb.fs`` (asyncio): the same methods as :class:`sandboxd.SandboxFileSystem`, awaited."""

    def __init__(self, sandbox: "SandboxInstance") -> None:
        self.sandbox_instance = sandbox

    @property
    def _base(self) -> str:
        return f"/v1/sandboxes/{self.sandbox_instance.container_id}/files"

    async def _call(self, method: str, suffix: str, **kwargs: Any):
        try:
            return await self.sandbox_instance._client.request(method, self._base + suffix, **kwargs)
        except SandboxdError as exc:
            raise in_context(exc, SandboxFileSystemError) from None

    async def upload_file(self, local_path: PathLike, sandbox_path: str, mode: int = 0o644) -> SandboxFileInfo:
        f = await _to_thread(open, local_path, "rb")
        try:
            response = await self._call("PUT", "", params={"path": sandbox_path, "mode": mode}, content=_chunks(f))
        finally:
            await _to_thread(f.close)
        return file_info(response.json())

    async def download_file(self, sandbox_path: str, local_path: PathLike) -> int:
        client = self.sandbox_instance._client
        try:
            response = await client.open_stream("GET", self._base, params={"path": sandbox_path}, timeout=client.timeout)
        except SandboxdError as exc:
            raise in_context(exc, SandboxFileSystemError) from None
        size = 0
        try:
            f = await _to_thread(open, local_path, "wb")
            try:
                async for data in response.aiter_bytes(CHUNK):
                    await _to_thread(f.write, data)
                    size += len(data)
            finally:
                await _to_thread(f.close)
        except BaseException:
            try:
                os.unlink(local_path)
            except OSError:
                pass
            raise
        finally:
            await response.aclose()
        return size

    async def read_bytes(self, sandbox_path: str) -> bytes:
        return (await self._call("GET", "", params={"path": sandbox_path})).content

    async def write_bytes(self, sandbox_path: str, data: Union[bytes, str], mode: int = 0o644) -> SandboxFileInfo:
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        response = await self._call("PUT", "", params={"path": sandbox_path, "mode": mode}, content=content)
        return file_info(response.json())

    async def list_files(self, sandbox_path: str) -> List[SandboxFileInfo]:
        listing = (await self._call("GET", "/list", params={"path": sandbox_path})).json()
        return [file_info(e) for e in listing.get("entries", [])]

    async def stat_file(self, sandbox_path: str) -> SandboxFileInfo:
        return file_info((await self._call("GET", "/stat", params={"path": sandbox_path})).json())

    async def create_directory(self, sandbox_path: str, parents: bool = True, mode: int = 0o755) -> SandboxFileInfo:
        params = {"path": sandbox_path, "parents": "true" if parents else "false", "mode": mode}
        return file_info((await self._call("POST", "/mkdir", params=params)).json())

    async def delete_file(self, sandbox_path: str) -> None:
        await self._call("DELETE", "", params={"path": sandbox_path})

    async def delete_directory(self, sandbox_path: str, recursive: bool = True) -> None:
        await self._call("DELETE", "", params={"path": sandbox_path, "recursive": "true" if recursive else "false"})

    async def exists(self, sandbox_path: str) -> bool:
        try:
            await self.stat_file(sandbox_path)
            return True
        except NotFoundError:
            return False
