"""Pipes read and written from the event loop's own callbacks: the gateway's stdio, and each
local server's.

Every message of the fast path crosses two pipes in and two out. The SDK's `stdio_server()`
hands each line and each write to a worker thread and back; anyio's `wait_readable` registers
and unregisters the fd on every wait (two `epoll_ctl` calls and a future per line, about 20 µs
measured). Here a pipe stays registered with the asyncio loop the gateway runs on (anyio's
asyncio backend) for as long as it is read: `LineReader` calls back with each complete line as
it arrives, so a fast-path message is handled in the same loop iteration that read it, and
`PipeWriter` writes at once, queueing only what a full pipe does not take.

For the gateway's own stdio (`client_stdio`), fds 0 and 1 are first moved to private duplicates,
and fd 0 then reads /dev/null and fd 1 writes to stderr, as the SDK does, so nothing else in the
process or its children reads the requests or writes on the wire; everything is restored on
exit. A terminal or a file (which epoll cannot watch, and which must not be left non-blocking in
a shell) is read by a thread instead and written directly.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

# asyncio and anyio are imported where used: the early answers (gateway/wire/early.py) import
# this module before any event loop runs, and those imports would be a third of their head start
if TYPE_CHECKING:
    import asyncio

    import anyio

__all__ = [
    "DEFAULT_LINE_LIMIT",
    "KEPT",
    "FileWriter",
    "LineReader",
    "Oversized",
    "PipeWriter",
    "Reader",
    "ThreadLineReader",
    "Writer",
    "client_stdio",
    "is_pipe",
]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16
# The longest line a reader delivers unless told otherwise (`max_message_size` in the config).
DEFAULT_LINE_LIMIT = 32 << 20
# What is kept of a line too long to deliver: enough of each end to find its JSON-RPC id.
KEPT = 256

OnLine = Callable[[bytes], None]


@dataclass
class Oversized:
    """A line longer than the reader's limit, dropped as it arrived: its size (so far, when the
    pipe ended first) and the first and last bytes of it."""

    size: int
    head: bytes
    tail: bytes

    def add(self, data: bytes | bytearray | memoryview) -> None:
        self.size += len(data)
        self.tail = (self.tail + bytes(data[-KEPT:]))[-KEPT:]


OnOversize = Callable[[Oversized], None]


class Reader(Protocol):
    def start(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def close(self) -> None: ...


class Writer(Protocol):
    def write_nowait(self, data: bytes) -> None: ...
    async def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...


class LineReader:
    """Calls `on_line` with each line (without its newline) read from a non-blocking pipe fd,
    from the loop's reader callback; `on_eof` once, after the last line.

    A line longer than `limit` is never held whole: once the bytes waiting for a newline pass
    the limit they are dropped as they arrive, up to the next newline, and `on_oversize` is told
    instead of `on_line`. Each byte is searched for a newline once, so a line without end costs
    linear time and at most `limit` bytes of memory.

    `pause()` stops delivery (and reading) until `resume()`: the caller's backpressure.
    """

    def __init__(
        self,
        fd: int,
        on_line: OnLine,
        on_eof: Callable[[], None],
        on_oversize: OnOversize,
        read: bytes = b"",
        limit: int = DEFAULT_LINE_LIMIT,
    ) -> None:
        self.fd = fd
        self._on_line = on_line
        self._on_eof = on_eof
        self._on_oversize = on_oversize
        self._limit = limit
        self._buffer = bytearray(read)  # bytes read from the fd before (`gateway/wire/early.py`)
        self._searched = 0  # how much of the buffer is known to hold no newline
        self._dropping: Oversized | None = None  # the line being dropped, until its newline
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused = False
        self._eof = False
        self._closed = False

    def start(self) -> None:
        import asyncio

        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._readable)
        if self._buffer:
            self._loop.call_soon(self._deliver)

    def pause(self) -> None:
        if not self._paused and not self._closed:
            self._paused = True
            if self._loop is not None and not self._eof:
                self._loop.remove_reader(self.fd)

    def resume(self) -> None:
        if self._paused and not self._closed:
            self._paused = False
            self._deliver()
            if self._loop is not None and not self._eof and not self._paused and not self._closed:
                self._loop.add_reader(self.fd, self._readable)

    def close(self) -> None:
        """Stop reading; the fd stays open (its owner closes it)."""
        if not self._closed:
            self._closed = True
            if self._loop is not None and not self._eof:
                self._loop.remove_reader(self.fd)

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._eof = True
            if self._loop is not None:
                self._loop.remove_reader(self.fd)
        elif self._dropping is not None:
            end = chunk.find(b"\n")
            if end < 0:
                self._dropping.add(chunk)
                return
            self._dropping.add(chunk[:end])
            self._dropped()
            self._buffer += chunk[end + 1 :]
        else:
            self._buffer += chunk
        self._deliver()

    def _deliver(self) -> None:
        while not self._paused and not self._closed:
            end = self._buffer.find(b"\n", self._searched)
            if end < 0:
                self._searched = len(self._buffer)
                if self._searched > self._limit:
                    self._dropping = Oversized(0, bytes(self._buffer[:KEPT]), b"")
                    self._dropping.add(self._buffer)
                    self._buffer.clear()
                    self._searched = 0
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            self._searched = 0
            if end > self._limit:
                self._dropping = Oversized(0, line[:KEPT], b"")
                self._dropping.add(line)
                self._dropped()
            else:
                self._call(line)
        if self._eof and not self._paused and not self._closed:
            if self._dropping is not None:
                self._dropped()
            elif self._buffer:
                line, self._buffer = bytes(self._buffer), bytearray()
                self._call(line)
            self._closed = True
            self._on_eof()

    def _dropped(self) -> None:
        oversized, self._dropping = self._dropping, None
        if oversized is not None:
            self._guard(self._on_oversize, oversized)

    def _call(self, line: bytes) -> None:
        self._guard(self._on_line, line)

    def _guard(self, callback: Callable[[Any], None], value: Any) -> None:
        try:
            callback(value)
        except Exception:  # the reader's top level: one bad line must not stop the connection
            logger.exception("handling a line from fd %d failed", self.fd)


class ThreadLineReader:
    """`LineReader` for a terminal or a regular file: a thread reads, the loop is called back.

    Lines longer than `limit` are dropped the same way, reading at most `limit` bytes at a time."""

    def __init__(
        self,
        file: BinaryIO,
        on_line: OnLine,
        on_eof: Callable[[], None],
        on_oversize: OnOversize,
        limit: int = DEFAULT_LINE_LIMIT,
    ) -> None:
        self._file = file
        self._on_line = on_line
        self._on_eof = on_eof
        self._on_oversize = on_oversize
        self._limit = limit
        self._go = threading.Event()
        self._go.set()
        self._closed = False

    def start(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()

        def run() -> None:
            dropping: Oversized | None = None
            while line := self._file.readline(self._limit + 1):
                self._go.wait()
                if self._closed:
                    return
                ended = line.endswith(b"\n")
                if dropping is None and (ended or len(line) <= self._limit):
                    loop.call_soon_threadsafe(self._call, self._on_line, line.rstrip(b"\n"))
                    continue
                if dropping is None:
                    dropping = Oversized(0, line[:KEPT], b"")
                dropping.add(line.rstrip(b"\n"))
                if ended:
                    loop.call_soon_threadsafe(self._call, self._on_oversize, dropping)
                    dropping = None
            if dropping is not None:
                loop.call_soon_threadsafe(self._call, self._on_oversize, dropping)
            loop.call_soon_threadsafe(self._end)

        threading.Thread(target=run, name="cellblock-stdin", daemon=True).start()

    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def close(self) -> None:
        self._closed = True
        self._go.set()

    def _call(self, callback: Callable[[Any], None], value: Any) -> None:
        if not self._closed:
            try:
                callback(value)
            except Exception:  # as in LineReader
                logger.exception("handling a line from stdin failed")

    def _end(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_eof()


class PipeWriter:
    """Writes to a non-blocking pipe fd at once, in the order given, from any task or callback.

    What a full pipe does not take waits in a queue that the loop's writer callback drains;
    later writes queue behind it, so lines never interleave. `write()` also waits until the
    queue has drained: backpressure for a writer that can wait.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._queue: deque[memoryview] = deque()
        self._drained: list[anyio.Event] = []
        self._error: OSError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def write_nowait(self, data: bytes) -> None:
        """Write `data` whole, now or (if the pipe is full) as soon as it takes it.

        Raises:
            OSError: the reader is gone (BrokenPipeError), or the fd is closed.
        """
        if self._error is not None:
            raise self._error
        view = memoryview(data)
        if not self._queue:
            try:
                view = view[os.write(self.fd, view) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                self._fail(exc)
                raise
            if not view:
                return
            import asyncio

            self._loop = asyncio.get_running_loop()
            self._loop.add_writer(self.fd, self._writable)
        self._queue.append(view)

    async def write(self, data: bytes) -> None:
        """Raises:
        OSError: as `write_nowait`, now or while the data waited.
        """
        self.write_nowait(data)
        await self.drained()
        if self._error is not None:
            raise self._error

    async def drained(self) -> None:
        """Wait until everything written so far has reached the pipe (or the pipe broke)."""
        if self._queue:
            import anyio

            drained = anyio.Event()
            self._drained.append(drained)
            await drained.wait()

    def close(self) -> None:
        """Drop what is still queued; later writes raise."""
        self._fail(BrokenPipeError("the pipe was closed"))

    def _writable(self) -> None:
        while self._queue:
            head = self._queue[0]
            try:
                rest = head[os.write(self.fd, head) :]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._fail(exc)
                return
            if rest:
                self._queue[0] = rest
                return
            self._queue.popleft()
        self._settle()

    def _fail(self, exc: OSError) -> None:
        if self._error is None:
            self._error = exc
        self._queue.clear()
        self._settle()

    def _settle(self) -> None:
        if self._loop is not None:
            self._loop.remove_writer(self.fd)
            self._loop = None
        drained, self._drained = self._drained, []
        for event in drained:
            event.set()


class FileWriter:
    """`PipeWriter` for a terminal or a regular file: plain blocking writes, flushed."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def write_nowait(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()

    async def write(self, data: bytes) -> None:
        self.write_nowait(data)

    def close(self) -> None:
        """The file belongs to the process."""


def is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


# Makes a reader given its callbacks: each line, the end, and each line too long to deliver.
ReaderFactory = Callable[[OnLine, Callable[[], None], OnOversize], Reader]


@contextmanager
def client_stdio(read: bytes = b"", limit: int = DEFAULT_LINE_LIMIT) -> Iterator[tuple[ReaderFactory, Writer]]:
    """The client's wire: a factory for the line reader (given its callbacks), and the writer.

    `read` is what was already read from stdin (only ever from a pipe): it is delivered first.
    Lines longer than `limit` bytes are not delivered (see `LineReader`)."""
    if not (is_pipe(0) and is_pipe(1)):
        stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

        def thread_reader(on_line: OnLine, on_eof: Callable[[], None], on_oversize: OnOversize) -> Reader:
            return ThreadLineReader(stdin, on_line, on_eof, on_oversize, limit)

        yield thread_reader, FileWriter(stdout)
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

        def pipe_reader(on_line: OnLine, on_eof: Callable[[], None], on_oversize: OnOversize) -> Reader:
            return LineReader(wire_in, on_line, on_eof, on_oversize, read, limit)

        yield pipe_reader, PipeWriter(wire_out)
    finally:
        for private, fd in ((wire_in, 0), (wire_out, 1)):
            os.set_blocking(private, True)
            os.dup2(private, fd)
            os.close(private)
