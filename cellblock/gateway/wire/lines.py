"""JSON-RPC lines between a pipe and an SDK session: each parsed once, offered to a taker first.

Both ends of the gateway work this way: the client's connection (`gateway/wire/client.py`) and each
local server's (`gateway/downstream/local.py`). A line is parsed with `json.loads` once, in the loop callback
that read it, and offered to `take`, the fast path's share; the rest is validated into the SDK's
message type and handed to the SDK session, in arrival order, by one feeder task. What the session
writes is serialized onto the pipe by one writer task, in order with whatever else is written to
the same `Writer`. Reading pauses while too many messages wait for the session (its backpressure).

Nothing a peer sends can stop the connection: a line that is not strict JSON is reported to the
session as such (`policy.jsontext.loads`, which also replaces lone surrogates), a line longer than
the reader's limit goes to `oversized` (`request_id` finds whom it answered), and a message the
session cannot serialize fails alone: a response becomes an error response for its id, a request
is answered to the session with an error, a notification is dropped.
"""

from __future__ import annotations

import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from cellblock.gateway.wire.stdio import KEPT, Oversized, Reader, ReaderFactory, Writer
from cellblock.policy.jsontext import loads, more_values_than

__all__ = ["MAX_VALUES", "SessionLines", "Streams", "error_response", "remote_message", "request_id", "valid_id"]

logger = logging.getLogger(__name__)

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
# Messages waiting for the session beyond this pause reading; reading resumes below _RESUME.
# A session takes them as fast as it starts handlers, so this only bounds a flood.
_PAUSE, _RESUME = 64, 16
# Where a JSON-RPC message's id sits in its first or last bytes: serializers put the envelope
# (`jsonrpc`, `id`) first, or last after the payload. Content cannot end a line in `"id":X}` after
# a leading envelope (the payload's object closes first) or start one before it.
_ID = r'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)'
_ID_AT_HEAD = re.compile(rf'^\s*\{{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?{_ID}'.encode())
_ID_AT_TAIL = re.compile(rf"[{{,]\s*{_ID}\s*\}}\s*$".encode())


# The most values a server's message may hold outside its free-form fields. Validating a message
# costs memory per value, and far more per invalid one (pydantic keeps an error for each union
# member it tried): 50,000 bad content items in under 1 MB took 335 MB, so a 32 MB line could
# take the gateway's memory. At this bound the worst is a few hundred MB, once, for that message.
MAX_VALUES = 100_000
FREE_FORM = frozenset({"structuredContent", "_meta"})  # `Any` in MCP: validated as one value
DENSE = f"holds more than {MAX_VALUES:,} values (outside structuredContent and _meta), more than Cellblock takes"


def too_dense(message: dict[str, Any]) -> dict[str, Any] | Exception | None:
    """What replaces a server's `message` that holds too many values (see MAX_VALUES): an error
    response to the request it answers, or an error the session reports; None if it does not."""
    if more_values_than(message.get("result"), MAX_VALUES, FREE_FORM) and valid_id(message.get("id")):
        return error_response(message["id"], types.INTERNAL_ERROR, f"its answer {DENSE}")
    if more_values_than(message.get("params"), MAX_VALUES, FREE_FORM):
        return ValueError(f"a message that {DENSE}")
    return None


def remote_message(item: SessionMessage | Exception) -> SessionMessage | Exception:
    """A remote server's message as the session may take it: `too_dense` applied (the SDK's HTTP
    transport has parsed it already, into an envelope whose payload is not validated yet)."""
    if not isinstance(item, SessionMessage):
        return item
    message = item.message
    parts = {"id": getattr(message, "id", None), **{k: getattr(message, k, None) for k in ("result", "params")}}
    replaced = too_dense(parts)
    return item if replaced is None else _session_message(replaced)


def valid_id(ident: Any) -> bool:
    """A request id as MCP allows it: a string or an integer (not null, a boolean or a fraction)."""
    return isinstance(ident, str | int) and not isinstance(ident, bool)


def request_id(oversized: Oversized) -> str | int | None:
    """The id of the message a dropped line carried, when its ends show one."""
    found = _ID_AT_HEAD.match(oversized.head) or _ID_AT_TAIL.search(oversized.tail)
    if found is None:
        return None
    try:
        ident = json.loads(found.group(1))
    except ValueError:
        return None
    return ident if valid_id(ident) else None


def error_response(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


class SessionLines:
    """One pipe's lines for one SDK session; `take` sees every parsed line first (True: taken)."""

    def __init__(
        self,
        make_reader: ReaderFactory,
        writer: Writer,
        take: Callable[[Any], bool],
        oversized: Callable[[Oversized], None],
        *,
        outgoing: Callable[[types.JSONRPCMessage], bool] | None = None,
        ended: Callable[[], None] | None = None,
        unparsable: Callable[[Oversized, ValueError], bool] | None = None,
        bounded: bool = False,
    ) -> None:
        self._take = take
        self._bounded = bounded  # a server's lines: at most MAX_VALUES values in each
        # told of each line that is not JSON (by its ends, as an oversized one); True: it answered it
        self._unparsable = unparsable
        self._writer = writer
        self._oversized = oversized  # told of each line too long to deliver (see stdio.LineReader)
        self._outgoing = outgoing  # sees each message the session writes first; False keeps it back
        self._ended = ended  # called once, when the pipe reaches its end
        # what goes to the session, in arrival order: a message, or why it is not one
        self._backlog: deque[Any] = deque()
        self._waiting = anyio.Event()
        self._eof = False
        self._dropping = False
        self._reader: Reader = make_reader(self._line, self._end, self._oversize)

    def hand(self, message: Any) -> None:
        """Give the session a message as if it had just been read."""
        if self._dropping:
            return
        self._backlog.append(message)
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
            message: Any = loads(line)
        except ValueError as exc:
            ends = Oversized(len(line), line[:KEPT], line[-KEPT:])
            if self._unparsable is None or not self._unparsable(ends, exc):
                self.hand(exc)  # the session reports a line that is not JSON
            return
        # a line shorter than the bound cannot hold more values than it (each takes a byte)
        if self._bounded and len(line) > MAX_VALUES and isinstance(message, dict):
            replaced = too_dense(message)
            if isinstance(replaced, Exception):
                self.hand(replaced)
                return
            message = message if replaced is None else replaced
        if not self._take(message):
            self.hand(message)

    def _oversize(self, oversized: Oversized) -> None:
        if not self._dropping:
            self._oversized(oversized)

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
                            item = self._backlog.popleft()
                            if len(self._backlog) < _RESUME:
                                self._reader.resume()
                            await to_session.send(_session_message(item))
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
                        line = self._serialized(item.message)
                        if line is not None:
                            await self._writer.write(line)
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

    def _serialized(self, message: types.JSONRPCMessage) -> bytes | None:
        """`message` as one line; one that cannot be serialized fails alone (see the module docstring)."""
        try:
            return (message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
        except (ValueError, TypeError) as exc:  # pydantic's serialization errors are ValueErrors
            why = f"the message could not be encoded ({type(exc).__name__})"
        ident = getattr(message, "id", None)
        if isinstance(message, types.JSONRPCRequest):
            logger.error("%s request %s not sent: %s", message.method, ident, why)
            self.hand(error_response(ident, types.INTERNAL_ERROR, why))  # its sender stops waiting
            return None
        if isinstance(message, types.JSONRPCNotification):
            logger.error("%s notification dropped: %s", message.method, why)
            return None
        logger.error("the answer to request %s failed: %s", ident, why)
        return (json.dumps(error_response(ident, types.INTERNAL_ERROR, why)) + "\n").encode()

    def close(self) -> None:
        """Stop reading (the pipe stays open: its owner closes it)."""
        self._reader.close()


def _session_message(item: Any) -> SessionMessage | Exception:
    if isinstance(item, Exception):
        return item
    try:
        parsed = types.jsonrpc_message_adapter.validate_python(item, by_name=False)
    except ValidationError as exc:
        return exc
    return SessionMessage(parsed)
