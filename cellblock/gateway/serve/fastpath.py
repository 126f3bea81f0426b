"""The fast path: the calls and lists the gateway answers without the SDK's session machinery.

Most of what a client sends is a `tools/call` that the policy allows outright, and the lists.
The SDK's sessions would validate each such message into models on the way in, move it through
memory streams and tasks on both sides of the gateway, and serialize it again on the way out:
about as much work again as the call itself. This module takes those messages off the wire
(`gateway/wire/client.py`) as parsed JSON and answers them directly:

- `tools/call`, when the connection is one the SDK already accepted (`Wire.served_version`), the
  name routes to a running local server, the policy allows it without asking (`Pipeline.allow_now`,
  which audits the decision first), and it is not the retry of an earlier round. The request is
  renamed and written onto the server's stdin under a private id (`LocalChannel`); its response
  line is shaped as the SDK would shape it (`wire_result`) and written back under the client's id.
  Progress, logs, timeouts, cancellation and a server that dies are handled here too.
- the four lists, from the catalog serialized once per rebuild (`Catalog.wire`).

Everything else is the SDK's: asks, holds, refusals, prompts, resources, remote servers, the
handshake. A fast call whose server asks the user something midway, or answers with an
`input_required` round, is handed to the SDK's path with its downstream request still running:
the wire gives the client's original request to the SDK's server carrying the `FastCall`
(`Wire.hand_to_server`), and the gateway's `tools/call` handler adopts it (`Gateway._adopt`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import mcp.types as types
from mcp.shared.exceptions import MCPError
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.downstream.local import LocalChannel, Pending
from cellblock.gateway.downstream.supervisor import CALL_RESULT, Downstream, DownstreamError, InFlight, forwardable
from cellblock.gateway.scrub import Scrubbed, scrub, scrub_result
from cellblock.gateway.serve.catalog import LIST_KINDS, Catalog
from cellblock.gateway.serve.pipeline import Call, Pipeline
from cellblock.gateway.serve.shaping import exposed_result, wire_result
from cellblock.gateway.wire.client import Wire

__all__ = ["FastCall", "FastPath"]

logger = logging.getLogger(__name__)

# A fast call handed to the SDK's path waits this long for the SDK's handler to adopt it before
# the server's question is declined: the handler starts at once unless the gateway is shutting down.
ADOPT_SECONDS = 10.0
_LOG_ORDER = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


class Host(Protocol):
    """What the fast path needs of the gateway it serves for (`serve/gateway.py`)."""

    pipeline: Pipeline
    downstreams: dict[str, Downstream]
    log_level: str | None

    @property
    def tasks(self) -> anyio.abc.TaskGroup: ...
    @property
    def stamp(self) -> dict[str, Any]: ...
    def settled_catalog(self) -> Catalog | None: ...
    async def client_catalog(self) -> Catalog: ...
    def secrets(self) -> re.Pattern[str] | None: ...


def _error_of(response: dict[str, Any]) -> MCPError:
    """The MCPError an error response stands for (the SDK raises the same for its own requests).

    Raises:
        ValueError: the response is neither a result nor a well-formed error.
    """
    return MCPError.from_error_data(types.ErrorData.model_validate(response.get("error"), by_name=False))


@dataclass(eq=False)
class FastCall:
    """One `tools/call` on the fast path, from the client's request to its answer."""

    request: dict[str, Any]  # the client's message, as it came
    call: Call  # admitted: routed, allowed and audited
    ds: Downstream
    channel: LocalChannel
    entry: InFlight
    version: str  # the protocol version the client is served at
    wire: Wire
    began: float = field(default_factory=time.perf_counter)
    pending: Pending | None = None
    response: dict[str, Any] | None = None
    timed_out: bool = False
    failure: DownstreamError | None = None  # why the call could not be sent, when it could not
    cancelled: bool = False
    done: bool = False  # the server answered, the call timed out or was cancelled, or the server went
    handed_over: bool = False  # the SDK's path answers the client now
    # made when first needed: most calls end without anyone waiting on either
    _finished: anyio.Event | None = None
    _adopted: anyio.Event | None = None

    @property
    def adopted(self) -> anyio.Event:
        """Set when the SDK's path has taken the call over (its asker can reach the client)."""
        if self._adopted is None:
            self._adopted = anyio.Event()
        return self._adopted

    @property
    def id(self) -> Any:
        return self.request["id"]

    async def hand_over(self) -> None:
        """Give this call to the SDK's path (once), and wait until its handler has adopted it."""
        if not self.handed_over:
            self.handed_over = True
            self.wire.hand_to_server(self.request, self)
        with anyio.move_on_after(ADOPT_SECONDS):
            await self.adopted.wait()

    def cancel(self, reason: str) -> None:
        """Stop waiting for the server, and tell it to stop; the call ends unanswered."""
        if not self.done:
            self.cancelled = True
            if self.pending is not None:
                self.channel.cancel(self.pending, reason)
            self._end()

    def _end(self) -> None:
        self.done = True
        if self._finished is not None:
            self._finished.set()
        with contextlib.suppress(ValueError):  # already untracked
            self.ds.untrack(self.entry)

    async def outcome(self) -> types.CallToolResult | types.InputRequiredResult:
        """The server's answer to the first round, for the SDK path that adopted this call.

        Raises:
            TimeoutError: the server did not answer within its timeout.
            MCPError: the server answered with an error, or closed the connection.
            ValueError: the answer is not a call result.
        """
        try:
            if not self.done:
                self._finished = self._finished or anyio.Event()
                await self._finished.wait()
        except anyio.get_cancelled_exc_class():
            self.cancel("cancelled by the client")  # the adopting request was cancelled
            raise
        return CALL_RESULT.validate_python(self.result(), by_name=False)

    def result(self) -> dict[str, Any]:
        """The server's result as it sent it, once the call has finished.

        Raises:
            TimeoutError: the server did not answer within its timeout.
            MCPError: the server answered with an error, or closed the connection.
            DownstreamError: the call could not be sent.
            ValueError: the answer is not a JSON object.
        """
        if self.failure is not None:
            raise self.failure
        if self.timed_out:
            raise TimeoutError
        if self.response is None:
            raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
        if "result" not in self.response:
            raise _error_of(self.response)
        result = self.response["result"]
        if not isinstance(result, dict):
            raise ValueError("the result is not an object")
        return result


class FastPath:
    """Takes the messages it can answer off the wire; see the module docstring for which."""

    def __init__(self, gateway: Host, wire: Wire) -> None:
        self.gateway = gateway
        self.wire = wire
        self.in_flight: dict[Any, FastCall] = {}  # by the client's request id, while in flight
        # the gateway's serverInfo, fixed for its life; the SDK copies it per answer, this only
        # ever serializes it
        self.stamp = gateway.stamp

    def take(self, message: dict[str, Any]) -> bool:
        """True when this message is answered here; False hands it to the SDK's server."""
        method = message.get("method")
        if "id" not in message:
            return method == "notifications/cancelled" and self._cancel(message.get("params"))
        if method == "tools/call":
            return self._take_call(message)
        if method in LIST_KINDS:
            return self._take_list(message, method)
        return False

    # -- lists --------------------------------------------------------------------------------

    def _take_list(self, message: dict[str, Any], method: str) -> bool:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        version = self.wire.served_version(params)
        if version is None or params.get("cursor") is not None:
            return False  # the gateway's lists have one page; a cursor is the SDK's to refuse
        catalog = self.gateway.settled_catalog()
        if catalog is not None:
            self._answer_list(message["id"], catalog, method, version)
        else:  # the first list waits (bounded) for the eager servers
            self.gateway.tasks.start_soon(self._list_when_settled, message["id"], method, version)
        return True

    async def _list_when_settled(self, ident: Any, method: str, version: str) -> None:
        self._answer_list(ident, await self.gateway.client_catalog(), method, version)

    def _answer_list(self, ident: Any, catalog: Catalog, method: str, version: str) -> None:
        text = catalog.wire(LIST_KINDS[method], version, self.stamp)
        with contextlib.suppress(OSError):  # the client left
            self.wire.answer_raw(ident, text)

    # -- calls --------------------------------------------------------------------------------

    def _take_call(self, message: dict[str, Any]) -> bool:
        params = message.get("params")
        if not isinstance(params, dict):
            return False
        name, arguments, meta = params.get("name"), params.get("arguments"), params.get("_meta", {})
        if not isinstance(name, str) or not isinstance(meta, dict):
            return False  # malformed: the SDK's validation names the problem
        if arguments is not None and not isinstance(arguments, dict):
            return False
        if "requestState" in params or "inputResponses" in params or LOG_LEVEL_META_KEY in meta:
            return False  # a retry of an earlier round, or a per-request log opt-in
        token = meta.get("progressToken")
        if token is not None and (isinstance(token, bool) or not isinstance(token, str | int)):
            return False
        version = self.wire.served_version(params)
        pipeline = self.gateway.pipeline
        route = pipeline.route(name)
        if version is None or route is None:
            return False
        ds = self.gateway.downstreams[route[0]]
        channel, client = ds.channel, ds.client
        if ds.state != "ready" or client is None or channel is None or not channel.open:
            return False  # starting, restarting, remote: the SDK's path waits or explains
        modern_server = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern_server and channel.envelope is None:
            return False
        call = Call(name, arguments)
        if not pipeline.allow_now(call, route):
            return False  # ask, deny, or an audit log that cannot be written: the SDK's path decides
        forwarded: dict[str, Any] = {"name": call.tool}
        if "arguments" in params:
            forwarded["arguments"] = arguments
        out_meta = forwardable(meta) or {}
        if modern_server:
            out_meta.update(channel.envelope or {})
            if version in MODERN_PROTOCOL_VERSIONS:
                out_meta.pop(LOG_LEVEL_META_KEY, None)  # nothing would carry the server's logs on
        if out_meta:
            forwarded["_meta"] = out_meta
        fc = FastCall(message, call, ds, channel, InFlight(asker=None), version, self.wire)
        fc.entry.log = self._log_sink(version)
        fc.entry.hand_over = fc.hand_over
        self.in_flight[fc.id] = fc
        ds.track(fc.entry)
        ds.calls += 1
        ds.fast_calls += 1
        try:
            fc.pending = channel.request(
                "tools/call",
                forwarded,
                ds.timeout,
                lambda pending: self._done(fc, pending),
                self._progress_sink(fc, token) if token is not None else None,
            )
        except OSError:
            self._done(fc, None)  # the server went away just now: answered as a closed connection
        except (ValueError, RecursionError) as exc:  # arguments nested too deep to encode again
            fc.failure = DownstreamError(f"Cellblock could not pass the call to '{name}' on: {type(exc).__name__}")
            self._done(fc, None)
        return True

    def _cancel(self, params: Any) -> bool:
        """The client cancelled a request: True when it was a fast call still answered here."""
        fc = self.in_flight.get(params.get("requestId")) if isinstance(params, dict) else None
        if fc is None:
            return False
        if not fc.adopted.is_set():  # once adopted, the SDK's handler cancels it
            fc.cancel("cancelled by the client")
            self.in_flight.pop(fc.id, None)
        # a handed-over request is the SDK's too (its handler may not have started yet)
        return not fc.handed_over

    def _done(self, fc: FastCall, pending: Pending | None) -> None:
        """The server answered (or timed out, or went away): answer the client, audit the end."""
        if pending is not None:
            fc.response, fc.timed_out = pending.response, pending.timed_out
        if self.in_flight.get(fc.id) is fc:
            del self.in_flight[fc.id]
        fc._end()
        if fc.cancelled or fc.handed_over:
            return  # cancelled calls are never answered; a handed-over one is the SDK's to answer
        result = fc.response.get("result") if fc.response is not None else None
        if isinstance(result, dict) and _methods.is_input_required(result):
            # the server asks for input in rounds: the SDK's path carries them (and answers)
            fc.handed_over = True
            self.wire.hand_to_server(fc.request, fc)
            return
        shaped = self._shape(fc)
        # the record is complete before the answer leaves, as on the SDK's path
        self.gateway.pipeline.finished(fc.call, bool(shaped.get("isError")), (time.perf_counter() - fc.began) * 1000)
        with contextlib.suppress(OSError):  # the client left
            self.wire.send({"jsonrpc": "2.0", "id": fc.id, "result": shaped})

    def _shape(self, fc: FastCall) -> dict[str, Any]:
        stamp, secrets = self.stamp, self.gateway.secrets()
        try:
            result = scrub_result(exposed_result(fc.call.server, fc.result()), secrets)
            return wire_result("tools/call", fc.version, result, stamp)
        except (TimeoutError, MCPError, DownstreamError, ValueError) as exc:  # Scrubbed is a ValueError
            # the server's error text is its own too (one line of text: it cannot be too deep to scrub)
            failed = scrub_result(fc.ds.failed_call(fc.call.tool, exc).model_dump(by_alias=True, mode="json"), secrets)
            return wire_result("tools/call", fc.version, failed, stamp)

    # -- what a fast call reports while it runs -----------------------------------------------

    def _log_sink(self, version: str) -> Any:
        if version in MODERN_PROTOCOL_VERSIONS:
            return _drop  # 2026-07-28 logs go only to requests that opt in, and those take the SDK's path

        async def log(params: types.LoggingMessageNotificationParams) -> None:
            level = self.gateway.log_level
            if level and _LOG_ORDER.index(params.level) < _LOG_ORDER.index(level):
                return
            body = params.model_dump(by_alias=True, mode="json", exclude_none=True)
            try:
                body, _ = scrub(body, self.gateway.secrets())
            except Scrubbed:
                return  # a log too deep to check for secrets is not passed on
            with contextlib.suppress(OSError):
                self.wire.send({"jsonrpc": "2.0", "method": "notifications/message", "params": body})

        return log

    def _progress_sink(self, fc: FastCall, token: str | int) -> Any:
        def progress(value: float, total: float | None, message: str | None) -> None:
            if fc.handed_over:
                # the SDK's path reports now (after a 2026-07-28 retry, under the retry's token)
                if fc.adopted.is_set():
                    self.gateway.tasks.start_soon(fc.entry.report, value, total, message)
                return
            params: dict[str, Any] = {"progressToken": token, "progress": value}
            if total is not None:
                params["total"] = total
            if message is not None:
                params["message"] = scrub(message, self.gateway.secrets())[0]
            with contextlib.suppress(OSError):
                self.wire.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

        return progress


async def _drop(params: types.LoggingMessageNotificationParams) -> None:
    return None
