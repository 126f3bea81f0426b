"""The bytes of a connection the egress proxy (`sandbox/egress.py`) lets through: the accepted Unix
socket as a stream, and the copy both ways between it and the destination.
"""

from __future__ import annotations

import socket
from contextlib import suppress

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["UnixStream", "pipe"]

# Bytes per read while piping.
_CHUNK = 64 * 1024


# -- piping --------------------------------------------------------------------------------


async def pipe(reader: BufferedByteReceiveStream, client: UnixStream, upstream: anyio.abc.SocketStream) -> None:
    """Copy both ways until both sides are done; an EOF is passed on as a half-close."""
    async with anyio.create_task_group() as tg:

        async def copy(source: anyio.abc.ByteReceiveStream, sink: anyio.abc.ByteStream) -> None:
            try:
                while True:
                    await sink.send(await source.receive(_CHUNK))
            except anyio.EndOfStream:
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    await sink.send_eof()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                # a reset on either side ends the whole exchange
                tg.cancel_scope.cancel()

        tg.start_soon(copy, reader, upstream)
        tg.start_soon(copy, upstream, client)


# -- the Unix socket ------------------------------------------------------------------------


class UnixStream(anyio.abc.ByteStream):
    """A byte stream over an accepted Unix socket, waiting with `anyio.wait_readable/writable`.

    anyio 4.16's own UNIX socket stream (asyncio backend) can raise InvalidStateError from an
    event-loop callback when a pending receive is cancelled just as data arrives, which is how
    every tunnel ends when the proxy stops; `wait_readable` tolerates that race.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._closed = False

    async def receive(self, max_bytes: int = _CHUNK) -> bytes:
        await anyio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = self._sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            if not data:
                raise anyio.EndOfStream
            return data

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        view = memoryview(item)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_writable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            view = view[sent:]

    async def send_eof(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()
        await anyio.lowlevel.checkpoint()
