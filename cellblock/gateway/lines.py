"""JSON-RPC lines between a pipe and an SDK session: each parsed once, offered to a taker first.

Both ends of the gateway work this way: the client's connection (`gateway/wire.py`) and each
local server's (`gateway/local.py`). A line is parsed with `json.loads` once, in the loop callback
that read it, and offered to `take`, the fast path's share; the rest is validated into the SDK's
message type and handed to the SDK session, in arrival order, by one feeder task. What the session
writes is serialized onto the pipe by one writer task, in order with whatever else is written to
the same `Writer`. Reading pauses while too many messages wait for the session (its backpressure).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from pydantic import ValidationError

from cellblock.gateway.stdio import Reader, ReaderFactory, Writer

__all__ = ["SessionLines", "Streams"]

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
# Messages waiting for the session beyond this pause reading; reading resumes below _RESUME.
# A session takes them as fast as it starts handlers, so this only bounds a flood.
_PAUSE, _RESUME = 64, 16


class SessionLines:
    """One pipe's lines for one SDK session; `take` sees every parsed line first (True: taken)."""

    def __init__(
        self,
        make_reader: ReaderFactory,
        writer: Writer,
        take: Callable[[Any], bool],
        *,
        outgoing: Callable[[types.JSONRPCMessage], bool] | None = None,
        ended: Callable[[], None] | None = None,
    ) -> None:
        self._take = take
        self._writer = writer
        self._outgoing = outgoing  # sees each message the session writes first; False keeps it back
        self._ended = ended  # called once, when the pipe reaches its end
        # what goes to the session, in arrival order: a message (or why it is not one), and the
        # request context that a message handed over (`hand`) carries
        self._backlog: deque[tuple[Any, Any]] = deque()
        self._waiting = anyio.Event()
        self._eof = False
        self._dropping = False
        self._reader: Reader = make_reader(self._line, self._end)

    def hand(self, message: Any, context: Any = None) -> None:
        """Give the session a message as if it had just been read; `context` reaches its handler
        as the request context (`ctx.request`)."""
        if self._dropping:
            return
        self._backlog.append((message, context))
        self._waiting.set()
        if len(self._backlog) > _PAUSE:
            self._reader.pause()

    def drop(self) -> None:
        """From now on what arrives is read and dropped: the session is going, and a peer that is
        still writing must not block on a full pipe."""
        self._dropping = True
        self._backlog.clear()
        self._reader.resume()

    def _line(self, line: bytes) -> None:
        if self._dropping or not line.strip():
            return
        try:
            message: Any = json.loads(line.decode("utf-8", "replace"))  # str parses faster than bytes
        except ValueError as exc:
            self.hand(exc)  # the session reports a line that is not JSON
            return
        if not self._take(message):
            self.hand(message)

    def _end(self) -> None:
        self._eof = True
        self._waiting.set()
        if self._ended is not None:
            self._ended()

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[Streams]:
        """The session's read and write streams, fed from and drained to the pipe."""
        to_session, session_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        session_write, from_session = anyio.create_memory_object_stream[SessionMessage](0)

        async def feed() -> None:
            try:
                async with to_session:
                    while True:
                        while self._backlog:
                            item, context = self._backlog.popleft()
                            if len(self._backlog) < _RESUME:
                                self._reader.resume()
                            await to_session.send(_session_message(item, context))
                        if self._eof:
                            return
                        self._waiting = anyio.Event()
                        await self._waiting.wait()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self.drop()  # the session is gone

        async def write() -> None:
            try:
                async with from_session:
                    async for item in from_session:
                        if self._outgoing is not None and not self._outgoing(item.message):
                            continue
                        line = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await self._writer.write(line.encode())
            except OSError:
                await to_session.aclose()  # the peer is gone: the session sees the end, not a hang

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            tg.start_soon(write)
            self._reader.start()
            try:
                yield session_read, session_write
            finally:
                session_write.close()
                tg.cancel_scope.cancel()

    def close(self) -> None:
        """Stop reading (the pipe stays open: its owner closes it)."""
        self._reader.close()


def _session_message(item: Any, context: Any) -> SessionMessage | Exception:
    if isinstance(item, Exception):
        return item
    try:
        parsed = types.jsonrpc_message_adapter.validate_python(item, by_name=False)
    except ValidationError as exc:
        return exc
    metadata = ServerMessageMetadata(request_context=context) if context is not None else None
    return SessionMessage(parsed, metadata=metadata)
