"""A process's output as the SDK holds it, fed from the daemon's stream.

``GET /v1/sandboxes/{id}/processes/{proc}/output`` is NDJSON, one event a
line, stdout and stderr interleaved in the order they were written::

    {"type":"stdout","offset":0,"data":"<base64>"}
    {"type":"stderr","offset":0,"data":"<base64>"}
    {"type":"dropped","stream":"stdout","bytes":N}
    {"type":"exit","process":{...}}

``offset`` counts the bytes of that stream before the chunk, so a reader
that lost its connection resumes with ``?stdout_offset=&stderr_offset=``.
The stream ends after ``exit``.

This module is pure (no I/O): the sync and asyncio pumps feed it lines and
their stream objects take complete lines out of it. Each stream keeps its
complete lines (each tagged with an arrival number, so ``logs`` can give
both streams' lines in the order they were completed) and its unfinished
tail, given out as a last line at the exit.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from typing import Any, AsyncIterator, Deque, Dict, Iterator, Optional, Tuple, Union

STREAMS = ("stdout", "stderr")


class StreamBuffer:
    def __init__(self) -> None:
        self.lines: Deque[Tuple[int, bytes]] = deque()
        self.partial = bytearray()
        self.offset = 0
        self.dropped = 0


class OutputState:
    def __init__(self) -> None:
        self.streams: Dict[str, StreamBuffer] = {name: StreamBuffer() for name in STREAMS}
        self.exit: Optional[Dict[str, Any]] = None
        self._seq = 0

    @property
    def ended(self) -> bool:
        return self.exit is not None

    def params(self) -> Dict[str, int]:
        """Where to resume the stream."""
        return {
            "stdout_offset": self.streams["stdout"].offset,
            "stderr_offset": self.streams["stderr"].offset,
        }

    def feed_line(self, line: Union[str, bytes]) -> None:
        line = line.strip()
        if not line:
            return
        event = json.loads(line)
        kind = event.get("type")
        if kind in STREAMS:
            buf = self.streams[kind]
            data = base64.b64decode(event.get("data", ""))
            offset = int(event.get("offset", buf.offset))
            if offset + len(data) <= buf.offset:
                return  # already had it (a resumed stream repeats nothing, but be safe)
            if offset < buf.offset:
                data = data[buf.offset - offset :]
                offset = buf.offset
            elif offset > buf.offset:
                buf.dropped += offset - buf.offset
            buf.offset = offset + len(data)
            self._add(buf, data)
        # "dropped" needs nothing: the next chunk's offset jump counts it.
        elif kind == "exit":
            self.exit = event.get("process") or {}
            for buf in self.streams.values():
                if buf.partial:
                    self._seq += 1
                    buf.lines.append((self._seq, bytes(buf.partial)))
                    buf.partial.clear()

    def _add(self, buf: StreamBuffer, data: bytes) -> None:
        buf.partial.extend(data)
        start = 0
        while True:
            nl = buf.partial.find(b"\n", start)
            if nl < 0:
                break
            self._seq += 1
            buf.lines.append((self._seq, bytes(buf.partial[start : nl + 1])))
            start = nl + 1
        if start:
            del buf.partial[:start]

    # What the stream objects take out.

    def take_line(self, name: str) -> Optional[str]:
        buf = self.streams[name]
        if buf.lines:
            return buf.lines.popleft()[1].decode("utf-8", errors="replace")
        return None

    def take_any_line(self) -> Optional[Tuple[str, str]]:
        """The earliest complete line of either stream: (stream, line)."""
        best = None
        for name in STREAMS:
            lines = self.streams[name].lines
            if lines and (best is None or lines[0][0] < self.streams[best].lines[0][0]):
                best = name
        if best is None:
            return None
        return best, self.streams[best].lines.popleft()[1].decode("utf-8", errors="replace")

    def take_all(self, name: str) -> bytes:
        """Everything of the stream not yet taken (its tail only after the exit)."""
        buf = self.streams[name]
        out = b"".join(line for _, line in buf.lines)
        buf.lines.clear()
        return out

    def take_all_combined(self) -> str:
        parts = []
        while True:
            item = self.take_any_line()
            if item is None:
                break
            parts.append(item[1])
        return "".join(parts)


def split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """NDJSON lines from a byte stream, each as soon as its newline came
    (cheaper than decoding text first: the events are ASCII JSON)."""
    pending = b""
    for chunk in chunks:
        if pending:
            chunk = pending + chunk
        lines = chunk.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line:
                yield line
    if pending:
        yield pending


async def asplit_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    pending = b""
    async for chunk in chunks:
        if pending:
            chunk = pending + chunk
        lines = chunk.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line:
                yield line
    if pending:
        yield pending


def exit_code_of(process: Dict[str, Any]) -> int:
    """Beam's convention: -1 while running; the exit status; 128+N when
    signal N ended it (as a shell reports it)."""
    if process.get("state") != "exited":
        return -1
    code = process.get("exit_code")
    if code is not None:
        return int(code)
    signal = process.get("signal")
    if signal is not None:
        return 128 + int(signal)
    return -1
