"""The SDK's `tools/call` handler: every call the fast path (`serve/fastpath.py`) does not take.

Before any stage, a call of tool search's own tools (`serve/search.py`) is answered or turned
into the call of the tool it names, and the gateway's own status and review tools are answered
(`serve/review.py`). A 2026-07-28 retry resumes its parked call, or carries the human's answer
to an approval question. Then the call is admitted (`Pipeline.admit`), its server started if it
is lazy, and it becomes a `ToolCall` (`serve/calls.py`): answered here, or as a task the client
polls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.abc
import mcp.types as types
from mcp.server.context import ServerRequestContext

from cellblock.gateway.ask.elicitation import Parked, StateRejected
from cellblock.gateway.downstream.rounds import Able, error_result
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.serve.approvals import NeedsInput
from cellblock.gateway.serve.calls import Calls, ToolCall
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.pipeline import Asking, Call, NotAdmitted
from cellblock.gateway.serve.replies import SendLog, SessionReply
from cellblock.gateway.serve.sealed import STATE_PREFIX as APPROVAL_STATE
from cellblock.gateway.serve.search import Client, client_of
from cellblock.gateway.serve.status import REVIEW, STATUS
from cellblock.gateway.serve.tasks import Task, TaskReply

__all__ = ["CallHandler", "CallResult"]

Ctx = ServerRequestContext[Any, Any]
# what a tools/call handler answers: a result, or (2026-07-28) a round of questions for the client,
# or a task (as JSON: the SDK has no model of it)
CallResult = types.CallToolResult | types.InputRequiredResult | dict[str, Any]


class Listed(Protocol):
    """The catalog the client is shown (`serve/keeper.py`)."""

    @property
    def catalog(self) -> Catalog: ...
    async def client_catalog(self) -> Catalog: ...
    def own_tool(self, tool: str) -> str: ...


class Searching(Protocol):
    """Tool search's two tools (`serve/search.py`)."""

    @property
    def find_name(self) -> str: ...
    def owns(self, name: str) -> bool: ...
    async def find(self, arguments: dict[str, Any] | None, client: Client, version: str) -> types.CallToolResult: ...
    def inner(self, params: types.CallToolRequestParams) -> types.CallToolRequestParams | types.CallToolResult: ...


class OwnTools(Protocol):
    """The gateway's own status and review tools (`serve/review.py`)."""

    async def status(self) -> types.CallToolResult: ...
    async def review(self, call: Call) -> types.CallToolResult | types.InputRequiredResult: ...


class Opening(Protocol):
    """The task an admitted call may become (`serve/handshake_tasks.py`)."""

    def open(self, ctx: Ctx, server: str, tool: str, client: Able) -> tuple[Task, TaskReply] | None: ...
    def created(self, task: Task) -> dict[str, Any]: ...


@dataclass
class CallHandler:
    """`tools/call` as the SDK's server hands it over."""

    keeper: Listed
    search: Searching
    own: OwnTools
    task_calls: Opening
    calls: Calls
    downstreams: dict[str, Downstream]
    met: Callable[[Ctx], None]  # notes the HTTP session a request came on (`Listeners.met`)
    send_log: SendLog  # a server's log during the call, to its request
    redeem: Callable[[str, str, dict[str, Any] | None], Parked]  # a parked call's retry
    carried: Callable[[Call, str, dict[str, Any] | None], str | None]  # an approval's retry
    admit: Callable[[Call], Awaitable[None]]  # `Pipeline.admit`: raises when the call may not go on
    tasks: Callable[[], anyio.abc.TaskGroup]

    async def handle(self, ctx: Ctx, params: types.CallToolRequestParams) -> CallResult:
        self.met(ctx)
        if self.search.owns(params.name):  # a search, or a call of a found tool: then as that tool's call
            await self.keeper.client_catalog()  # as a list does, it waits (bounded) for the servers starting
            if params.name == self.search.find_name:  # what it finds may join the client's list
                return await self.search.find(params.arguments, client_of(ctx), ctx.protocol_version)
            inner = self.search.inner(params)
            if isinstance(inner, types.CallToolResult):
                return inner
            params = inner
        own = params.name in (self.keeper.own_tool(STATUS), self.keeper.own_tool(REVIEW))
        if own and params.name not in {t.name for t in self.keeper.catalog.tools}:
            own = False  # offered only while something is held: otherwise the name routes as any other
        if own and params.name == self.keeper.own_tool(STATUS):
            return await self.own.status()
        reply = SessionReply(self.send_log, ctx)
        call = Call(params.name, params.arguments, ctx=Asking(ctx.session, ctx.request_id, reply.modern, reply.tell))
        if params.request_state and reply.modern:
            if not params.request_state.startswith(APPROVAL_STATE):
                # the retry of a parked call: it was admitted (and audited) when it first came
                try:
                    parked = self.redeem(params.request_state, params.name, params.arguments)
                except StateRejected as exc:
                    return error_result(f"retry of '{params.name}' refused: {exc}")
                if not isinstance(parked, ToolCall):  # only calls.ToolCall parks itself
                    raise RuntimeError(f"the parked call for '{params.name}' is a {type(parked).__name__}")
                parked.resume(reply, params.input_responses)
                return await reply.outcome(parked)
            # the retry that carries the human's answer to an approval question
            why = self.carried(call, params.request_state, params.input_responses)
            if why is not None:
                return error_result(f"retry of '{params.name}' refused: {why}")
        if own:
            return await self.own.review(call)
        try:  # every server's credentials are read first (the `secrets` stage), so the record redacts them
            await self.admit(call)
        except NeedsInput as needed:
            return needed.result
        except NotAdmitted as refused:
            return refused.result
        ds = self.downstreams[call.server]
        ds.supervisor.start(self.tasks())  # lazy servers start on first use
        forwarded: dict[str, Any] = {"name": call.tool}
        if params.arguments is not None:
            forwarded["arguments"] = params.arguments
        if params.meta:
            forwarded["_meta"] = dict(params.meta)
        opened = self.task_calls.open(ctx, call.server, call.tool, reply)
        if opened is not None:  # admitted: from here it runs on while the client polls
            task, task_reply = opened
            task.call = ToolCall(call, ds, task_reply, self.calls, forwarded)
            self.tasks().start_soon(task.call.start)
            return self.task_calls.created(task)
        tc = ToolCall(call, ds, reply, self.calls, forwarded)
        # started beside this handler: a login on the way may put a question to the client first
        self.tasks().start_soon(tc.start)
        return await reply.outcome(tc)
