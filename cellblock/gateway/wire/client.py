"""The client's connection: each line parsed once, the fast path's share answered here, the rest
handed to the SDK's server.

`Wire` reads the client's lines and `json.loads` each one once. Every message is first offered to
a taker (the fast path, `gateway/serve/fastpath.py`); what it does not take is validated into the SDK's
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
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import mcp.types as types
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from pydantic import BaseModel

from cellblock.gateway.wire.early import client_name, request_key
from cellblock.gateway.wire.lines import SessionLines, Streams, error_response, request_id, valid_id
from cellblock.gateway.wire.stdio import Oversized, ReaderFactory, Writer

__all__ = ["Wire"]

logger = logging.getLogger(__name__)

# the part of a 2026-07-28 request's `_meta` that says who is asking, at which version
ENVELOPE_KEYS = (PROTOCOL_VERSION_META_KEY, CLIENT_INFO_META_KEY, CLIENT_CAPABILITIES_META_KEY)
# distinct accepted envelopes remembered; a client sends one, this only bounds a strange one
_MAX_ENVELOPES = 8
# opening requests followed for the record at once; a client sends a handful, this bounds a flood
_MAX_RECORDING = 16
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# The ids of the gateway's own requests to the client; the SDK's server numbers its own.
_ID_PREFIX = "cb-"
M = TypeVar("M", bound=BaseModel)


# A taker sees every message from the client first; True means it took the message (and answers it).
Taker = Callable[[dict[str, Any]], bool]
# Told of an answer that may be given early next time: its request's key, and how to get the
# result's JSON (None: the answer was an error).
Recorder = Callable[[str, Callable[[], str | None]], None]
# Told when an early answer (`gateway/wire/early.py`) was not what the gateway answers: the key, the
# early result's JSON, and the gateway's.
Differed = Callable[[str, str, str], None]


class Wire:
    """One client connection: a line reader (from its factory) and a writer (the gateway's stdio).

    `served` holds the requests already answered early, by id, with their key and result: the
    reader delivers them again first, and their answers here are compared, not sent.
    """

    def __init__(
        self,
        make_reader: ReaderFactory,
        writer: Writer,
        *,
        served: dict[Any, tuple[str, str]] | None = None,
        record: Recorder | None = None,
        differed: Differed | None = None,
        introduced: Callable[[types.ClientCapabilities | None, bool], None] | None = None,
    ) -> None:
        self._make_reader = make_reader
        # told what the client can do, and whether it opened with a handshake, at its first request
        self._introduced = introduced
        self._writer = writer
        self._served = dict(served or {})
        self._record = record
        self._differed = differed
        self._keys: dict[Any, str] = {}  # request id -> its key, for the requests worth recording
        self.modern = False  # the client opened with a 2026-07-28 request
        self.version: str | None = None  # handshake era: the version the SDK negotiated
        self._opened = False
        self._handshake: Any = None  # the id of the client's `initialize`, until it is answered
        self._accepted: list[dict[str, Any]] = []
        self._asking: dict[Any, dict[str, Any]] = {}  # request id -> its envelope, until answered
        self._lines: SessionLines | None = None
        self._capabilities: types.ClientCapabilities | None = None  # declared at the handshake
        self._client_name: str | None = None  # given at the handshake (clientInfo)
        self._waiting: dict[str, _Waiting] = {}  # the gateway's own requests to the client, by id
        self._ids = itertools.count(1)

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

        A message that cannot be encoded fails alone: an answer becomes an error answer to the
        same request, anything else is dropped (and logged).

        Raises:
            OSError: the client is gone.
        """
        try:
            line = _ENCODER.encode(message).encode()
        except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
            ident = message.get("id")
            why = f"Cellblock could not encode the message ({type(exc).__name__})"
            logger.error("a message to the client was not sent: %s", why)
            if "method" in message or not valid_id(ident):
                return
            line = _ENCODER.encode(error_response(ident, types.INTERNAL_ERROR, why)).encode()
        self._writer.write_nowait(line + b"\n")

    def send_raw(self, line: str) -> None:
        """Write one already-serialized message (without its newline), as `send`."""
        self._writer.write_nowait((line + "\n").encode())

    def answer_raw(self, ident: Any, result: str) -> None:
        """Answer request `ident` with an already-serialized result, as `send`."""
        if self._answered(ident, result, lambda: json.loads(result)):
            self.send_raw(f'{{"jsonrpc":"2.0","id":{json.dumps(ident)},"result":{result}}}')

    async def request(self, request: types.ElicitRequest | types.CreateMessageRequest, result_type: type[M]) -> M:
        """Ask the client something within a call the gateway answers itself (a handshake-era
        fast-path call whose server asks the user): sent under a private id, its response taken
        off the wire before the SDK's server sees it.

        Raises:
            MCPError: the client answered with an error, or left.
            ValueError: its answer is not a `result_type`.
        """
        ident = f"{_ID_PREFIX}{next(self._ids)}"
        waiting = self._waiting[ident] = _Waiting()
        params = request.params.model_dump(by_alias=True, mode="json", exclude_none=True)
        message = {"jsonrpc": "2.0", "id": ident, "method": request.method, "params": params}
        try:
            self.send(message)
            await waiting.done.wait()
        except OSError:
            raise MCPError(types.CONNECTION_CLOSED, "the client left") from None
        except anyio.get_cancelled_exc_class():
            with contextlib.suppress(OSError):  # the client stops asking the user
                self.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ident}})
            raise
        finally:
            self._waiting.pop(ident, None)
        response = waiting.response
        if response is None:
            raise MCPError(types.CONNECTION_CLOSED, "the client left")
        if "result" not in response:
            raise MCPError.from_error_data(types.ErrorData.model_validate(response.get("error"), by_name=False))
        return result_type.model_validate(response["result"], by_name=False)

    def client_capabilities(self, params: dict[str, Any]) -> types.ClientCapabilities | None:
        """What the client said it can do, as a request with these params stands: declared at the
        handshake, or (2026-07-28) in the request's envelope."""
        if not self.modern:
            return self._capabilities
        meta = params.get("_meta")
        caps = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
        try:
            return types.ClientCapabilities.model_validate(caps, by_name=False) if isinstance(caps, dict) else None
        except ValueError:
            return None

    def client_name(self, params: dict[str, Any]) -> str | None:
        """The name the client gave itself (clientInfo): at the handshake, or (2026-07-28) in the
        request's envelope."""
        if not self.modern:
            return self._client_name
        meta = params.get("_meta")
        return client_name(meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else None)

    @asynccontextmanager
    async def streams(self, take: Taker) -> AsyncIterator[Streams]:
        """The SDK server's read and write streams, fed from and drained to the client."""

        def first(message: Any) -> bool:
            ident = message.get("id") if isinstance(message, dict) and "method" not in message else None
            # a string first: the client may send any JSON as an id, a list that cannot be looked up
            if isinstance(ident, str) and ident in self._waiting:
                # off the table at once: a second answer read in the same go is not this one's
                waiting = self._waiting.pop(ident)
                waiting.response = message
                waiting.done.set()
                return True
            if not isinstance(message, dict):
                self._refuse(None, "Invalid Request: not a JSON-RPC object (batches are not part of MCP)")
                return True
            if "method" in message and "id" in message and not valid_id(message["id"]):
                self._refuse(None, "Invalid Request: the id must be a string or an integer")
                return True
            if "method" in message and "id" in message and not _enveloped(message):
                self._refuse(message["id"], "Invalid Request: not JSON-RPC 2.0, or a method that is not a string")
                return True
            if "method" in message and "id" in message and not isinstance(message.get("params", {}), dict):
                self._refuse(message["id"], "Invalid params: params must be an object", types.INVALID_PARAMS)
                return True
            self._note_request(message)
            return take(message)

        self._lines = SessionLines(
            self._make_reader,
            self._writer,
            first,
            self._oversized,
            outgoing=self._note_answer,
            unparsable=self._unparsable,
        )
        try:
            async with self._lines.streams() as streams:
                yield streams
        finally:
            self._lines.close()
            for waiting in self._waiting.values():
                waiting.done.set()  # the client left: no answer comes

    def _refuse(self, ident: Any, message: str, code: int = types.INVALID_REQUEST) -> None:
        with contextlib.suppress(OSError):  # the client left
            self.send(error_response(ident, code, message))

    def _unparsable(self, line: Oversized, exc: ValueError) -> bool:
        """The client sent a line that is not JSON: it gets the JSON-RPC parse error."""
        logger.warning("the client sent a line of %s bytes that is not JSON: %s", f"{line.size:,}", exc)
        with contextlib.suppress(OSError):
            self.send(error_response(None, types.PARSE_ERROR, f"Parse error: {exc}"))
        return True

    def _oversized(self, line: Oversized) -> None:
        """The client sent a line longer than the limit: it is dropped, its request (if its id
        shows) refused."""
        ident = request_id(line)
        logger.warning(
            "the client sent a message of %s bytes or more, over the limit (max_message_size); dropped%s",
            f"{line.size:,}",
            "" if ident is None else f" and request {ident!r} refused",
        )
        if ident is not None:
            self._refuse(ident, f"the request is larger than Cellblock accepts ({line.size:,} bytes or more)")

    def _note_request(self, message: dict[str, Any]) -> None:
        """Follow the opening of the connection as the SDK sees it: the first request decides the era."""
        if "id" not in message or "method" not in message:
            return
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        envelope = {k: meta[k] for k in ENVELOPE_KEYS if k in meta} if isinstance(meta, dict) else {}
        if self._record is not None and message["id"] not in self._served:
            # a handshake-era list is keyed by the name given at the handshake, as the early answers key it
            who = None if self.modern else self._client_name
            key = request_key(message["method"], params if params is not None else {}, who)
            if key is not None and len(self._keys) < _MAX_RECORDING:
                self._keys[message["id"]] = key
        if not self._opened:
            self._opened = True
            self.modern = message["method"] != "initialize" and PROTOCOL_VERSION_META_KEY in envelope
            if not self.modern and message["method"] == "initialize":
                self._handshake = message["id"]
                caps = params.get("capabilities") if isinstance(params, dict) else None
                with contextlib.suppress(ValueError):  # malformed: the SDK's handshake refuses it
                    self._capabilities = types.ClientCapabilities.model_validate(caps or {}, by_name=False)
                self._client_name = client_name(params.get("clientInfo") if isinstance(params, dict) else None)
            if self._introduced is not None:
                handshake = not self.modern and message["method"] == "initialize"
                self._introduced(self.client_capabilities(params if isinstance(params, dict) else {}), handshake)
        if self.modern and envelope and envelope not in self._accepted and len(self._asking) < _MAX_ENVELOPES:
            self._asking[message["id"]] = envelope

    def _note_answer(self, message: types.JSONRPCMessage) -> bool:
        """Follow what the SDK's server answers; False keeps an answer given early off the pipe."""
        if isinstance(message, types.JSONRPCError):
            self._asking.pop(message.id, None)
            return self._answered(message.id, None, lambda: None)
        if not isinstance(message, types.JSONRPCResponse):
            return True
        keep = self._answered(message.id, None, lambda: message.result)
        if self._handshake is not None and message.id == self._handshake:
            self._handshake = None
            version = message.result.get("protocolVersion")
            self.version = version if isinstance(version, str) else None
        envelope = self._asking.pop(message.id, None)
        if envelope is not None and envelope not in self._accepted and len(self._accepted) < _MAX_ENVELOPES:
            self._accepted.append(envelope)
        return keep

    def _answered(self, ident: Any, text: str | None, result: Callable[[], Any]) -> bool:
        """An answer is going out: record it, or, if it was given early, compare it (False: do not send).

        `text` is the result's JSON when the caller has it; `result()` the result (None: an error)."""
        early = self._served.pop(ident, None)
        key = early[0] if early is not None else self._keys.pop(ident, None)
        if key is None:
            return True

        def serialized(value: Any) -> str | None:
            return text if text is not None or value is None else _ENCODER.encode(value)

        if early is None:
            if self._record is not None:
                # serialized only if it is kept: a list is large, and most are not
                self._record(key, lambda: serialized(result()))
            return True
        value = result()
        # an error is no verdict on the record: it is what pending requests get when the client
        # leaves before the gateway is up, as a client that only wanted the list may
        if value is not None and json.loads(early[1]) != value and self._differed is not None:
            self._differed(key, early[1], serialized(value) or "")
        return False


@dataclass(eq=False)
class _Waiting:
    done: anyio.Event = field(default_factory=anyio.Event)
    response: dict[str, Any] | None = None  # None once done: the client left


def _enveloped(request: dict[str, Any]) -> bool:
    """A request the SDK can read: JSON-RPC 2.0, its method a string (else it drops it unanswered)."""
    return request.get("jsonrpc") == "2.0" and isinstance(request["method"], str)
