"""A tools/call's one list of steps, `CallHandler.path`, walked by every way a call can take.

In order: served (the request is one the connection's era already accepted, well formed), search
(a call of tool search's own tools, `serve/search.py`, is answered or turned into the call of the
tool it names), own (the gateway's status tool, `serve/review.py`), reply (how the answer goes
back), retry (a 2026-07-28 retry resumes its parked call, or carries the human's answer to an
approval question), review (the review tool), local (the fast path's: the name routes to a local
server that is up), the pipeline's stages (`serve/pipeline.py`: route, start, secrets, lock,
policy, share, approval, record), run (the admitted call becomes a `ToolCall`, `serve/calls.py`,
its server started if it is lazy, answered here or as a task the client polls), then, in the
call's own task, ready (its server up, logged in through the client where it must), recheck (a
server that was not up at admission may offer something else now: the call still routes where
it did) and send (the first round).

Each step has a face for each way. `run`, the SDK's handler (`CallHandler.handle`), answers the
call (a result) or lets it on (None), and waits where a stage asks to. `now`, the fast path's
(`serve/fastpath.py`), is synchronous over the raw JSON: True lets the call on, False hands it to
the SDK's path, which starts again from the first step. `then` is the SDK's once the call is a
`ToolCall`, walked by `ToolCall.start` (`Calls.then`) beside the handler (a task call is
answered before its server is up), and again after a login for more scope: False, the call has
ended. A step without one of the faces has nothing to do on that way: the SDK validated the
request itself, only the SDK's path answers the gateway's own tools or waits for a server to
start, and the fast path takes only a call whose server is up (`local`), just routed, and sends
it at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio.abc
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp_types import LOG_LEVEL_META_KEY

from cellblock.gateway.ask.elicitation import Parked, StateRejected
from cellblock.gateway.downstream.rounds import Able, error_result
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve.approvals import NeedsInput
from cellblock.gateway.serve.calls import Calls, ToolCall
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.pipeline import Asking, Call, NotAdmitted, Stage
from cellblock.gateway.serve.replies import SendLog, SessionReply
from cellblock.gateway.serve.sealed import STATE_PREFIX as APPROVAL_STATE
from cellblock.gateway.serve.search import Client, client_of
from cellblock.gateway.serve.status import REVIEW, STATUS
from cellblock.gateway.serve.tasks import Task, TaskReply, asks_for_tasks

__all__ = ["CallHandler", "CallResult", "Step", "Taken"]

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


class Deciding(Protocol):
    """The pipeline's stages (`serve/pipeline.py`)."""

    @property
    def stages(self) -> tuple[Stage, ...]: ...
    async def decide(self, call: Call, stage: Stage) -> None: ...
    def decide_now(self, call: Call, stage: Stage) -> bool: ...
    def route(self, name: str) -> tuple[str, str] | None: ...


class Served(Protocol):
    """What the fast path's faces read of the client's connection (`wire/client.py: Wire`)."""

    def served_version(self, params: dict[str, Any]) -> str | None: ...


@dataclass
class Entry:
    """One tools/call on the SDK's path: what each step found, for the next."""

    ctx: Ctx
    params: types.CallToolRequestParams  # a found tool's call, once `search_tools` has turned it
    own: bool = False  # it names one of the gateway's own tools, offered now
    reply: SessionReply | None = None  # where its answer goes (`reply` on)
    call: Call | None = None  # the call the stages decide on (`reply` on)

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


@dataclass
class Taken:
    """One tools/call on the fast path, as parsed JSON: what each step found, for the next."""

    message: dict[str, Any]
    wire: Served
    params: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    token: Any = None  # the client's progress token
    version: str = ""
    ds: Downstream | None = None
    call: Call | None = None


@dataclass(frozen=True)
class Step:
    """One step of a tools/call, with its face on each path (None: nothing to do there)."""

    name: str
    run: Callable[[Entry], Awaitable[CallResult | None]] | None  # the SDK's: an answer, or None to go on
    now: Callable[[Taken], bool] | None  # the fast path's: True goes on, False hands the call to the SDK
    # the SDK's, once the call is a `ToolCall`, in a task of its own: False, it has ended
    then: Callable[[ToolCall], Awaitable[bool]] | None = None


@dataclass
class CallHandler:
    """`tools/call`, as the SDK's server hands it over (`handle`) and as the fast path walks it."""

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
    pipeline: Deciding
    tasks: Callable[[], anyio.abc.TaskGroup]

    def __post_init__(self) -> None:
        # fixed by the config for the gateway's life
        self._own_names = (self.keeper.own_tool(STATUS), self.keeper.own_tool(REVIEW))
        # the steps of a call in order (see the module docstring)
        self.path: tuple[Step, ...] = (
            Step("served", None, self.served_now),
            Step("search", self.search_tools, self.search_now),
            Step("own", self.status, self.own_now),
            Step("reply", self.reply, self.reply_now),
            Step("retry", self.retry, self.retry_now),
            Step("review", self.review, None),
            Step("local", None, self.local_now),
            *map(self.staged, self.pipeline.stages),
            Step("run", self.run, None),
            Step("ready", None, None, ToolCall.ready),
            Step("recheck", None, None, self.recheck),
            Step("send", None, None, self.send),
        )
        self._sdk = tuple(step.run for step in self.path if step.run is not None)
        self.fast = tuple(step.now for step in self.path if step.now is not None)
        self.then = tuple(step.then for step in self.path if step.then is not None)

    async def handle(self, ctx: Ctx, params: types.CallToolRequestParams) -> CallResult:
        self.met(ctx)
        entry = Entry(ctx, params)
        for run in self._sdk:
            answer = await run(entry)
            if answer is not None:
                return answer
        raise RuntimeError(f"no step answered the call to '{params.name}'")  # `run` always answers

    def staged(self, stage: Stage) -> Step:
        """A pipeline stage as a step: decided, waiting where it asks to (`Pipeline.decide`), or
        without waiting on the fast path (`Pipeline.decide_now`)."""

        async def run(entry: Entry) -> CallResult | None:
            try:
                await self.pipeline.decide(entry.admitting, stage)
            except NeedsInput as needed:
                return needed.result
            except NotAdmitted as refused:
                return refused.result
            return None

        def now(taken: Taken) -> bool:
            return taken.call is not None and self.pipeline.decide_now(taken.call, stage)

        return Step(stage.__name__.lstrip("_"), run, now)

    # -- served ---------------------------------------------------------------------------------

    def served_now(self, taken: Taken) -> bool:
        """The connection already accepted the like of this request, and its params hold a name,
        object arguments and a `_meta` object; else the SDK's validation names the problem."""
        params = taken.message.get("params")
        if not isinstance(params, dict):
            return False
        name, arguments, meta = params.get("name"), params.get("arguments"), params.get("_meta", {})
        if not isinstance(name, str) or not isinstance(meta, dict):
            return False
        if not (arguments is None or isinstance(arguments, dict)):
            return False
        version = taken.wire.served_version(params)
        if version is None:
            return False
        taken.params, taken.meta, taken.version, taken.call = params, meta, version, Call(name, arguments)
        return True

    # -- search ---------------------------------------------------------------------------------

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

    def search_now(self, taken: Taken) -> bool:
        return taken.call is not None and not self.search.owns(taken.call.name)

    # -- own ------------------------------------------------------------------------------------

    async def status(self, entry: Entry) -> CallResult | None:
        """The gateway's own tools, offered only while something is held: the status tool is
        answered here, the review tool once a retry has been looked at (`review`)."""
        name = entry.params.name
        # while nothing is held they are not offered, and the name routes as any other
        entry.own = name in self._own_names and name in {t.name for t in self.keeper.catalog.tools}
        if entry.own and name == self._own_names[0]:
            return await self.own.status()
        return None

    def own_now(self, taken: Taken) -> bool:
        return taken.call is not None and taken.call.name not in self._own_names

    # -- reply ----------------------------------------------------------------------------------

    async def reply(self, entry: Entry) -> CallResult | None:
        """Where the answer goes (the SDK's request), and the call the stages decide on."""
        ctx, params = entry.ctx, entry.params
        reply = entry.reply = SessionReply(self.send_log, ctx)
        asking = Asking(ctx.session, ctx.request_id, reply.modern, reply.tell)
        entry.call = Call(params.name, params.arguments, ctx=asking)
        return None

    def reply_now(self, taken: Taken) -> bool:
        """Answered on the wire: no task (`serve/tasks.py`, `serve/handshake_tasks.py`), no
        per-request log level, a progress token (if any) a string or an integer."""
        params, token = taken.params, taken.meta.get("progressToken")
        if asks_for_tasks(params) or "task" in params or LOG_LEVEL_META_KEY in taken.meta:
            return False
        taken.token = token
        return token is None or (not isinstance(token, bool) and isinstance(token, str | int))

    # -- retry ----------------------------------------------------------------------------------

    async def retry(self, entry: Entry) -> CallResult | None:
        """A 2026-07-28 retry: it resumes its parked call, or carries the human's answer to an
        approval question (checked here, taken by the approval stage)."""
        params, reply, call = entry.params, entry.replying, entry.admitting
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

    def retry_now(self, taken: Taken) -> bool:
        return not ("requestState" in taken.params or "inputResponses" in taken.params)

    # -- review ---------------------------------------------------------------------------------

    async def review(self, entry: Entry) -> CallResult | None:
        """The review tool: a held server's catalog put before the user."""
        return await self.own.review(entry.admitting) if entry.own else None

    # -- local ----------------------------------------------------------------------------------

    def local_now(self, taken: Taken) -> bool:
        """The name routes to a tool not held, of a local server that is up with its pipes open;
        starting, restarting or remote, the SDK's path waits or explains. (Before `route`, which
        looks the name up again: a name that routes nowhere must not reach its refusal here,
        whose text retries a server that failed, `startable.unavailable_of`.)"""
        route = self.pipeline.route(taken.call.name) if taken.call is not None else None
        if route is None:
            return False
        ds = taken.ds = self.downstreams[route[0]]
        channel = ds.channel
        return ds.supervisor.state is State.READY and ds.client is not None and channel is not None and channel.open

    # -- run ------------------------------------------------------------------------------------

    async def run(self, entry: Entry) -> CallResult:
        """The admitted call becomes a `ToolCall`, its server started if it is lazy, and goes on
        in a task of its own (`ToolCall.start`, the `then` steps): answered here, or as a task the
        client polls."""
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

    # -- recheck, send (ready: `ToolCall.ready`) ---------------------------------------------------

    async def recheck(self, tc: ToolCall) -> bool:
        """It still routes where it did now that its server is up: `ToolCall.recheck`."""
        return tc.recheck()

    async def send(self, tc: ToolCall) -> bool:
        """The first round sent; the call's rounds, questions and end are its own (`serve/calls.py`)."""
        tc.send()
        return True
