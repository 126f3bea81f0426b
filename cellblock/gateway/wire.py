"""The client's connection: each line parsed once, the fast path's share answered here, the rest
handed to the SDK's server.

`Wire` reads the client's lines and `json.loads` each one once. Every message is first offered to
a taker (the fast path, `gateway/fastpath.py`); what it does not take is validated into the SDK's
message type and fed to the low-level `Server`, as the SDK's `stdio_server` would. What the
server writes goes back to the client through one writer that the fast path shares, so the two
never interleave.

The fast path bypasses the SDK's session, so the wire keeps what it must know of the connection:
the era the client opened (the first request decides, as in the SDK), the version the handshake
negotiated, and which 2026-07-28 request envelopes the SDK has already accepted. Until the SDK
has answered one of them, every request goes the SDK's way.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from pydantic import ValidationError

from cellblock.gateway.stdio import Reader, ReaderFactory, Writer

__all__ = ["Wire"]

logger = logging.getLogger(__name__)

# the part of a 2026-07-28 request's `_meta` that says who is asking, at which version
ENVELOPE_KEYS = (PROTOCOL_VERSION_META_KEY, CLIENT_INFO_META_KEY, CLIENT_CAPABILITIES_META_KEY)
# distinct accepted envelopes remembered; a client sends one, this only bounds a strange one
_MAX_ENVELOPES = 8
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


# A taker sees every message from the client first; True means it took the message (and answers it).
Taker = Callable[[dict[str, Any]], bool]
# Messages waiting for the SDK's server beyond this pause reading from the client; reading
# resumes when fewer than _RESUME wait. The server takes them as fast as it starts handlers.
_PAUSE, _RESUME = 64, 16


class Wire:
    """One client connection: a line reader (from its factory) and a writer (the gateway's stdio)."""

    def __init__(self, make_reader: ReaderFactory, writer: Writer) -> None:
        self._make_reader = make_reader
        self._writer = writer
        self.modern = False  # the client opened with a 2026-07-28 request
        self.version: str | None = None  # handshake era: the version the SDK negotiated
        self._opened = False
        self._handshake: Any = None  # the id of the client's `initialize`, until it is answered
        self._accepted: list[dict[str, Any]] = []
        self._asking: dict[Any, dict[str, Any]] = {}  # request id -> its envelope, until answered
        # what goes to the SDK's server, in arrival order: a message (or why it is not one),
        # and the request context a handed-over fast call carries
        self._backlog: deque[tuple[Any, Any]] = deque()
        self._waiting = anyio.Event()
        self._eof = False
        self._reader: Reader | None = None

    def served_version(self, params: dict[str, Any]) -> str | None:
        """The version a request with these params would be served at, if the SDK already accepted
        the like of it; None leaves the request to the SDK (which also has the right error for it)."""
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        if not self.modern:
            # an enveloped request on a handshake connection is the SDK's to refuse
            return None if PROTOCOL_VERSION_META_KEY in meta else self.version
        envelope = {key: meta[key] for key in ENVELOPE_KEYS if key in meta}
        return envelope.get(PROTOCOL_VERSION_META_KEY) if envelope in self._accepted else None

    def send(self, message: dict[str, Any]) -> None:
        """Write one message to the client now (a full pipe queues it, in order).

        Raises:
            OSError: the client is gone.
        """
        self._writer.write_nowait((_ENCODER.encode(message) + "\n").encode())

    def send_raw(self, line: str) -> None:
        """Write one already-serialized message (without its newline), as `send`."""
        self._writer.write_nowait((line + "\n").encode())

    def hand_to_server(self, message: dict[str, Any], context: Any) -> None:
        """Give the SDK's server a request as if it had just arrived, carrying `context` for its
        handler (`ctx.request`): how a fast-path call passes to the SDK path midway."""
        self._enqueue(message, context)

    def _enqueue(self, item: Any, context: Any = None) -> None:
        self._backlog.append((item, context))
        self._waiting.set()
        if len(self._backlog) > _PAUSE and self._reader is not None:
            self._reader.pause()

    @asynccontextmanager
    async def streams(
        self, take: Taker
    ) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
    ]:
        """The SDK server's read and write streams, fed from and drained to the client."""
        to_server, server_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        server_write, from_server = anyio.create_memory_object_stream[SessionMessage](0)

        def on_line(line: bytes) -> None:
            if not line.strip():
                return
            try:
                message = json.loads(line)
            except ValueError as exc:
                self._enqueue(exc)  # the SDK reports a line that is not JSON
                return
            if isinstance(message, dict):
                self._note_request(message)
                if take(message):
                    return
            self._enqueue(message)

        def on_eof() -> None:
            self._eof = True
            self._waiting.set()

        async def feed() -> None:
            async with to_server:
                while True:
                    while self._backlog:
                        item, context = self._backlog.popleft()
                        if len(self._backlog) < _RESUME and self._reader is not None:
                            self._reader.resume()
                        await to_server.send(_session_message(item, context))
                    if self._eof:
                        return
                    self._waiting = anyio.Event()
                    await self._waiting.wait()

        async def write() -> None:
            async with from_server:
                async for item in from_server:
                    self._note_answer(item.message)
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    with contextlib.suppress(OSError):  # the client left; reading ends the connection
                        await self._writer.write(data.encode())

        self._reader = self._make_reader(on_line, on_eof)
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            tg.start_soon(write)
            self._reader.start()
            try:
                yield server_read, server_write
            finally:
                self._reader.close()
                tg.cancel_scope.cancel()

    def _note_request(self, message: dict[str, Any]) -> None:
        """Follow the opening of the connection as the SDK sees it: the first request decides the era."""
        if "id" not in message or "method" not in message:
            return
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        envelope = {k: meta[k] for k in ENVELOPE_KEYS if k in meta} if isinstance(meta, dict) else {}
        if not self._opened:
            self._opened = True
            self.modern = message["method"] != "initialize" and PROTOCOL_VERSION_META_KEY in envelope
            if not self.modern and message["method"] == "initialize":
                self._handshake = message["id"]
        if self.modern and envelope and envelope not in self._accepted and len(self._asking) < _MAX_ENVELOPES:
            self._asking[message["id"]] = envelope

    def _note_answer(self, message: types.JSONRPCMessage) -> None:
        if not isinstance(message, types.JSONRPCResponse):
            if isinstance(message, types.JSONRPCError):
                self._asking.pop(message.id, None)
            return
        if self._handshake is not None and message.id == self._handshake:
            self._handshake = None
            version = message.result.get("protocolVersion")
            self.version = version if isinstance(version, str) else None
        envelope = self._asking.pop(message.id, None)
        if envelope is not None and envelope not in self._accepted and len(self._accepted) < _MAX_ENVELOPES:
            self._accepted.append(envelope)


def _session_message(item: Any, context: Any) -> SessionMessage | Exception:
    if isinstance(item, Exception):
        return item
    try:
        parsed = types.jsonrpc_message_adapter.validate_python(item, by_name=False)
    except ValidationError as exc:
        return exc
    metadata = ServerMessageMetadata(request_context=context) if context is not None else None
    return SessionMessage(parsed, metadata=metadata)
