"""The SDK's `tools/call` handler: every call the fast path (`serve/fastpath.py`) does not take.

A call goes through `CallHandler.steps`, in order, until one answers it: a call of tool search's
own tools (`serve/search.py`) is answered or turned into the call of the tool it names; the
gateway's own status tool is answered (`serve/review.py`); a 2026-07-28 retry resumes its parked
call, or carries the human's answer to an approval question; the review tool is answered; the
call is admitted (`Pipeline.admit`: its stages, in order); its server is started if it is lazy
and it becomes a `ToolCall` (`serve/calls.py`), answered here or as a task the client polls.
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
class Entry:
    """One tools/call on its way through the steps: what each step found, for the next."""

    ctx: Ctx
    params: types.CallToolRequestParams  # a found tool's call, once `search_tools` has turned it
    own: bool = False  # it names one of the gateway's own tools, offered now
    reply: SessionReply | None = None  # where its answer goes (`retry` on)
    call: Call | None = None  # the call the stages decide on (`retry` on)

    @property
    def admitting(self) -> Call:
        if self.call is None:
            raise RuntimeError(f"the call to '{self.params.name}' was decided on before it was made")
        return self.call

    @property
    def replying(self) -> SessionReply:
        if self.reply is None:
            raise RuntimeError(f"the call to '{self.params.name}' was run before its reply was made")
        return self.reply


# A step answers the call (its result) or lets it on to the next (None).
Step = Callable[[Entry], Awaitable[CallResult | None]]


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

    def __post_init__(self) -> None:
        # the steps of a call in order; each answers it, or lets it on to the next
        self.steps: tuple[Step, ...] = (
            self.search_tools,
            self.status,
            self.retry,
            self.review,
            self.admitted,
            self.run,
        )

    async def handle(self, ctx: Ctx, params: types.CallToolRequestParams) -> CallResult:
        self.met(ctx)
        entry = Entry(ctx, params)
        for step in self.steps:
            answer = await step(entry)
            if answer is not None:
                return answer
        raise RuntimeError(f"no step answered the call to '{params.name}'")  # `run` always answers

    # -- the steps ------------------------------------------------------------------------------

    async def search_tools(self, entry: Entry) -> CallResult | None:
        """A search is answered; the call of a found tool goes on as that tool's call."""
        params = entry.params
        if not self.search.owns(params.name):
            return None
        await self.keeper.client_catalog()  # as a list does, it waits (bounded) for the servers starting
        if params.name == self.search.find_name:  # what it finds may join the client's list
            return await self.search.find(params.arguments, client_of(entry.ctx), entry.ctx.protocol_version)
        inner = self.search.inner(params)
        if isinstance(inner, types.CallToolResult):
            return inner
        entry.params = inner
        return None

    async def status(self, entry: Entry) -> CallResult | None:
        """The gateway's own tools, offered only while something is held: the status tool is
        answered here, the review tool once a retry has been looked at (`review`)."""
        name = entry.params.name
        own = name in (self.keeper.own_tool(STATUS), self.keeper.own_tool(REVIEW))
        # while nothing is held they are not offered, and the name routes as any other
        entry.own = own and name in {t.name for t in self.keeper.catalog.tools}
        if entry.own and name == self.keeper.own_tool(STATUS):
            return await self.own.status()
        return None

    async def retry(self, entry: Entry) -> CallResult | None:
        """A 2026-07-28 retry: it resumes its parked call, or carries the human's answer to an
        approval question (checked here, taken by the approval stage)."""
        ctx, params = entry.ctx, entry.params
        reply = entry.reply = SessionReply(self.send_log, ctx)
        call = Call(params.name, params.arguments, ctx=Asking(ctx.session, ctx.request_id, reply.modern, reply.tell))
        entry.call = call
        if not (params.request_state and reply.modern):
            return None
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
        why = self.carried(call, params.request_state, params.input_responses)
        return None if why is None else error_result(f"retry of '{params.name}' refused: {why}")

    async def review(self, entry: Entry) -> CallResult | None:
        """The review tool: a held server's catalog put before the user."""
        return await self.own.review(entry.admitting) if entry.own else None

    async def admitted(self, entry: Entry) -> CallResult | None:
        """The pipeline's stages (`Pipeline.admit`): route, start, secrets, lock, policy, share,
        approval, record. Every server's credentials are read first (the `secrets` stage), so the
        record redacts them."""
        try:
            await self.admit(entry.admitting)
        except NeedsInput as needed:
            return needed.result
        except NotAdmitted as refused:
            return refused.result
        return None

    async def run(self, entry: Entry) -> CallResult:
        """The admitted call becomes a `ToolCall`, its server started if it is lazy: answered
        here, or as a task the client polls."""
        call, params, reply = entry.admitting, entry.params, entry.replying
        ds = self.downstreams[call.server]
        ds.supervisor.start(self.tasks())  # lazy servers start on first use
        forwarded: dict[str, Any] = {"name": call.tool}
        if params.arguments is not None:
            forwarded["arguments"] = params.arguments
        if params.meta:
            forwarded["_meta"] = dict(params.meta)
        opened = self.task_calls.open(entry.ctx, call.server, call.tool, reply)
        if opened is not None:  # admitted: from here it runs on while the client polls
            task, task_reply = opened
            task.call = ToolCall(call, ds, task_reply, self.calls, forwarded)
            self.tasks().start_soon(task.call.start)
            return self.task_calls.created(task)
        tc = ToolCall(call, ds, reply, self.calls, forwarded)
        # started beside this handler: a login on the way may put a question to the client first
        self.tasks().start_soon(tc.start)
        return await reply.outcome(tc)
