"""The fast path: the calls and lists the gateway answers without the SDK's session machinery.

Most of what a client sends is a `tools/call` that the policy allows outright, and the lists.
The SDK's sessions would validate each such message into models on the way in, move it through
memory streams and tasks on both sides of the gateway, and serialize it again on the way out:
about as much work again as the call itself. This module takes those messages off the wire
(`gateway/wire/client.py`) as parsed JSON and answers them directly:

- `tools/call`, when every step of a call's one list lets it on without waiting
  (`serve/callhandler.py: CallHandler.path`, each step's fast face, in order): the connection is
  one the SDK already accepted (`Wire.served_version`), it is not the retry of an earlier round,
  the name routes to a running local server, and the pipeline's stages allow it without asking
  (`Pipeline.decide_now`; the last writes the allow's audit record). The first step that
  declines hands the call to the SDK's server, which walks the same list. The call is then
  a `ToolCall` (`serve/calls.py`) like any other, answered on the wire (`WireReply`): its result
  shaped as the SDK would shape it (`wire_result`) and written back under the client's id. A
  server's question midway goes to the client from here too: a handshake-era client is asked on
  the wire (`Wire.request`), a 2026-07-28 one is answered with the question, and its retry is the
  SDK's to carry to the parked call.
- the four lists, from the catalog serialized once per rebuild (`Catalog.wire`).

Everything else is the SDK's: asks, holds, refusals, prompts, resources, remote servers, the
handshake.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import mcp.types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.ask.elicitation import Asker, elicits, elicits_url, samples
from cellblock.gateway.ask.forms import framed
from cellblock.gateway.scrub import Scrubbed, scrub
from cellblock.gateway.serve.callhandler import CallHandler, Taken
from cellblock.gateway.serve.calls import Calls, ToolCall
from cellblock.gateway.serve.catalog import LIST_KINDS, Catalog
from cellblock.gateway.serve.keeper import CatalogKeeper
from cellblock.gateway.serve.logs import log_passes
from cellblock.gateway.serve.search import Client, Search
from cellblock.gateway.serve.shaping import wire_result
from cellblock.gateway.wire.client import Wire
from cellblock.gateway.wire.lines import valid_id

__all__ = ["FastPath", "Host", "WireReply"]

logger = logging.getLogger(__name__)


class Host(Protocol):
    """What the fast path needs of the gateway it serves for (`serve/gateway.py`)."""

    call_handler: CallHandler  # a tools/call's steps (`CallHandler.fast`: their fast faces)
    calls: Calls  # what every call shares: its task group and the secrets no answer may carry
    search: Search
    keeper: CatalogKeeper


@dataclass
class WireAsker:
    """A handshake-era client asked on the wire, within a call the fast path answers."""

    wire: Wire

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.ask(framed(server, params))

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.wire.request(types.ElicitRequest(params=params), types.ElicitResult)

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return await self.wire.request(types.CreateMessageRequest(params=params), types.CreateMessageResult)


class WireReply:
    """A client's `tools/call` answered on the wire (see `serve/replies.Reply`)."""

    def __init__(self, path: FastPath, ident: Any, version: str, token: str | int | None, params: dict[str, Any]):
        self.path, self.ident, self.version, self.token = path, ident, version, token
        self.params = params
        self.modern = version in MODERN_PROTOCOL_VERSIONS
        self.retried = True
        self.wants_progress = token is not None
        # 2026-07-28 logs go only to requests that opt in, and those take the SDK's path
        self.carries_logs = not self.modern

    # read only when a server asks something: most calls never do
    @property
    def can_elicit(self) -> bool:
        return elicits(self.path.wire.client_capabilities(self.params))

    @property
    def can_elicit_url(self) -> bool:
        return elicits_url(self.path.wire.client_capabilities(self.params))

    @property
    def can_sample(self) -> bool:
        return samples(self.path.wire.client_capabilities(self.params))

    @property
    def direct(self) -> Asker | None:
        return None if self.modern else WireAsker(self.path.wire)

    def progress(self, value: float, total: float | None, message: str | None) -> None:
        params: dict[str, Any] = {"progressToken": self.token, "progress": value}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        self.path.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    def log(self, params: types.LoggingMessageNotificationParams) -> None:
        if not self.carries_logs or not log_passes(params.level, self.path.log_level()):
            return
        try:
            body, _ = scrub(
                params.model_dump(by_alias=True, mode="json", exclude_none=True), self.path.host.calls.secrets()
            )
        except Scrubbed:
            return  # a log too deep to check for secrets is not passed on
        self.path.send({"jsonrpc": "2.0", "method": "notifications/message", "params": body})

    def shape(self, result: dict[str, Any]) -> Any:
        return wire_result("tools/call", self.version, result, self.path.stamp)

    def answer(self, shaped: Any) -> None:
        self.path.in_flight.pop(self.ident, None)
        self.path.send({"jsonrpc": "2.0", "id": self.ident, "result": shaped})

    def ask(self, question: types.InputRequiredResult) -> None:
        self.answer(self.shape(question.model_dump(by_alias=True, mode="json", exclude_none=True)))


class FastPath:
    """Takes the messages it can answer off the wire; see the module docstring for which."""

    def __init__(self, host: Host, wire: Wire, stamp: dict[str, Any], log_level: Callable[[], str | None]) -> None:
        self.host = host
        self.wire = wire
        self.in_flight: dict[Any, ToolCall] = {}  # by the client's request id, until answered
        # the gateway's serverInfo, fixed for its life; the SDK copies it per answer, this only
        # ever serializes it
        self.stamp = stamp
        self.log_level = log_level  # the level the client set (`logging/setLevel`)

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

    def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the client left
            self.wire.send(message)

    # -- lists --------------------------------------------------------------------------------

    def _take_list(self, message: dict[str, Any], method: str) -> bool:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        version = self.wire.served_version(params)
        if version is None or params.get("cursor") is not None:
            return False  # the gateway's lists have one page; a cursor is the SDK's to refuse
        client = Client(self.wire.client_name(params), "")  # stdio: the one client
        catalog = self.host.keeper.settled_catalog()
        if catalog is not None:
            self._answer_list(message["id"], catalog, method, version, client)
        else:  # the first list waits (bounded) for the eager servers
            self.host.calls.tasks().start_soon(self._list_when_settled, message["id"], method, version, client)
        return True

    async def _list_when_settled(self, ident: Any, method: str, version: str, client: Client) -> None:
        self._answer_list(ident, await self.host.keeper.client_catalog(), method, version, client)

    def _answer_list(self, ident: Any, catalog: Catalog, method: str, version: str, client: Client) -> None:
        # the list of tools is the client's own where search is on for it (serve/search.py)
        text = self.host.search.view(catalog, client).wire(LIST_KINDS[method], version, self.stamp)
        with contextlib.suppress(OSError):  # the client left
            self.wire.answer_raw(ident, text)

    # -- calls --------------------------------------------------------------------------------

    def _take_call(self, message: dict[str, Any]) -> bool:
        """A call every step lets on (`CallHandler.path`'s fast faces, in order) is taken and sent;
        any step that declines hands it to the SDK's server, which decides, waits or explains."""
        taken = Taken(message, self.wire)
        for now in self.host.call_handler.fast:
            if not now(taken):
                return False
        call, ds = taken.call, taken.ds
        if call is None or ds is None:  # the steps set both on the way
            return False
        forwarded: dict[str, Any] = {"name": call.tool}
        if "arguments" in taken.params:
            forwarded["arguments"] = call.arguments
        if taken.meta:
            forwarded["_meta"] = taken.meta
        reply = WireReply(self, message["id"], taken.version, taken.token, taken.params)
        tc = ToolCall(call, ds, reply, self.host.calls, forwarded)
        self.in_flight[reply.ident] = tc
        ds.fast_calls += 1
        tc.send()
        return True

    def _cancel(self, params: Any) -> bool:
        """The client cancelled a request: True when it was a call still answered here."""
        ident = params.get("requestId") if isinstance(params, dict) else None
        # an id as MCP has it, first: a list cannot be looked up, and true or 1.0 would find call 1
        tc = self.in_flight.pop(ident, None) if valid_id(ident) else None
        if tc is None:
            return False
        tc.cancel("cancelled by the client")
        return True
