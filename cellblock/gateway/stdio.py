"""The gateway's stdin and stdout, read and written on the event loop without worker threads.

The SDK's `stdio_server()` wraps the standard files with `anyio.wrap_file`: every line read and
every write and flush is a hop to a worker thread and back, several per tool call. When both
ends are pipes or sockets (how every MCP client starts a server), this module hands
`stdio_server()` non-blocking readers and writers on private duplicates of fds 0 and 1 instead.
As the SDK does, it then points fd 0 at /dev/null and fd 1 at stderr, so nothing else in the
process or its children reads the requests or writes on the wire; everything is restored on exit.
A terminal or a file keeps the SDK's own handling: making a shared terminal non-blocking would
leak into the shell.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

__all__ = ["PipeReader", "PipeWriter", "pipe_stdio"]

_CHUNK = 1 << 16


class PipeReader:
    """Lines from a non-blocking fd, as `async for line in reader` (each with its newline)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self._eof = False

    def __aiter__(self) -> PipeReader:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return line.decode("utf-8", errors="replace")
            if self._eof:
                if not self._buffer:
                    raise StopAsyncIteration
                line, self._buffer = self._buffer, b""
                return line.decode("utf-8", errors="replace")
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            self._eof = not chunk
            self._buffer += chunk


class PipeWriter:
    """Writes whole strings to a non-blocking fd, waiting while the pipe is full."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    async def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:
                await anyio.wait_writable(self.fd)

    async def flush(self) -> None:
        """Nothing is buffered here."""


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextmanager
def pipe_stdio() -> Iterator[tuple[PipeReader, PipeWriter] | None]:
    """The wire as a non-blocking reader and writer, or None when stdin or stdout is not a pipe."""
    if not (_is_pipe(0) and _is_pipe(1)):
        yield None
        return
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    os.set_blocking(wire_in, False)
    os.set_blocking(wire_out, False)
    try:
        yield PipeReader(wire_in), PipeWriter(wire_out)
    finally:
        for private, fd in ((wire_in, 0), (wire_out, 1)):
            os.set_blocking(private, True)
            os.dup2(private, fd)
            os.close(private)
