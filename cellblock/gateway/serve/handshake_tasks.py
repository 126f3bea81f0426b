"""Tasks for handshake-era clients: the experimental tasks of protocol 2025-11-25.

A client whose connection negotiated 2025-11-25 may send a `tools/call` with `params.task`
(`{ttl}`). It gets the same task a 2026-07-28 client would (`serve/tasks.py`): the call admitted
first (route, lock, policy, the human's approval, the audit record), so a denied call is answered
with its refusal and never becomes a task; the same store, ids and limits; then the `ToolCall` it
would be anyway, whose `Reply` is the task (`HandshakeTaskReply`). Only the wire differs:

- the call is answered with a `CreateTaskResult` (`{task: {...}}`), and the task shown as 2025-11-25
  has it (`ttl`, `pollInterval`; a tool's error result ends it `failed`);
- `tasks/result` waits for the end and answers with the call's result (the JSON-RPC error
  of a task that was cancelled), `tasks/list` lists the connection's own tasks, `tasks/cancel`
  answers with the cancelled task, and each change is told in `notifications/tasks/status`;
- a question the server asks midway makes the task `input_required`, and goes to the client as an
  ordinary request (`elicitation/create`, `sampling/createMessage`) tied to the task
  (`io.modelcontextprotocol/related-task`) on the client's `tasks/result`, as the spec's flow has it.

A handshake-era task belongs to the connection that made it (the stdio client, or one HTTP
session): another one's requests never see it. The SDK's server sieves a handshake-era `tools/call`
result to a `CallToolResult`, which a `CreateTaskResult` is not, so such a call is taken by a
middleware (`HandshakeTasks.middleware`), the SDK's own way to answer a request with its own result;
it also adds the `tasks` capability to the answer to a 2025-11-25 `initialize`, and to no other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import anyio
import anyio.abc
import mcp.types as types
from mcp.server.context import CallNext, HandlerResult
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from cellblock.gateway.ask.elicitation import PARK_SECONDS, Asker
from cellblock.gateway.ask.forms import framed
from cellblock.gateway.downstream.rounds import Able
from cellblock.gateway.serve.listeners import Listeners
from cellblock.gateway.serve.shaping import TASKS_VERSION, wire_result
from cellblock.gateway.serve.tasks import (
    POLL_MS,
    TASK_TTL_MS,
    Ctx,
    Task,
    TaskParams,
    TaskReply,
    Tasks,
    asks_for_tasks,
)

__all__ = ["CAPABILITY", "TASKS_VERSION", "HandshakeTaskReply", "HandshakeTasks"]

RELATED = "io.modelcontextprotocol/related-task"
# what the gateway says it can do with tasks, in its answer to a 2025-11-25 initialize
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}

CallTool = Callable[[Ctx, types.CallToolRequestParams], Awaitable[Any]]
Handler = Callable[[Ctx, Any], Awaitable[Any]]


def negotiated(ctx: Ctx) -> bool:
    """The request came on a connection that opened with 2025-11-25: the era of these tasks."""
    return ctx.protocol_version == TASKS_VERSION and ctx.session.client_params is not None


def shown(task: Task) -> dict[str, Any]:
    """The task as 2025-11-25 shows it (a `Task`)."""
    view: dict[str, Any] = {
        "taskId": task.id,
        "status": task.status,
        "createdAt": task.created,
        "lastUpdatedAt": task.updated,
        "ttl": TASK_TTL_MS,
    }
    if not task.ended:
        view["pollInterval"] = POLL_MS
    if task.message is not None:
        view["statusMessage"] = task.message
    return view


def _related(params: Any, task: Task) -> Any:
    """A request's params, tied to `task` (the spec's `io.modelcontextprotocol/related-task`)."""
    meta = dict(params.meta or {})
    meta[RELATED] = {"taskId": task.id}
    return params.model_copy(update={"meta": meta})


class HandshakeTaskReply(TaskReply):
    """A 2025-11-25 client's task (see `serve/replies.Reply`): its end is the task's result, shaped
    as that version's `CallToolResult`; a question of its server goes to the client as a request
    of its own (`direct`), tied to the task, while the task is `input_required`."""

    modern = False

    def __init__(self, task: Task, client: Able, direct: Asker) -> None:
        super().__init__(task, client)
        self.direct = direct

    def shape(self, result: dict[str, Any]) -> Any:
        return wire_result("tools/call", TASKS_VERSION, result, {})

    def answer(self, shaped: Any) -> None:
        self.task.result = shaped
        # the spec's rule: a tool call whose result is an error is a failed task
        failed = bool(shaped.get("isError"))
        self.task.move("failed" if failed else "completed", "the tool returned an error" if failed else None)


class TaskAsker:
    """Puts a handshake-era task's questions to its client: the task goes `input_required`, and
    each question is sent on the client's `tasks/result` for the task, the request the spec has
    the client make when it sees that status. Unsent for `PARK_SECONDS` (no tasks/result came),
    a question counts as unanswered, as a parked call's does."""

    def __init__(self, task: Task, streams: ResultStreams) -> None:
        self.task, self.streams = task, streams
        self.asking = 0

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.ask(framed(server, params))

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        request = types.ElicitRequest(params=_related(params, self.task))
        return cast(types.ElicitResult, await self._sent(request, types.ElicitResult))

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        request = types.CreateMessageRequest(params=_related(params, self.task))
        return cast(types.CreateMessageResult, await self._sent(request, types.CreateMessageResult))

    async def _sent(self, request: types.ServerRequest, result: type[BaseModel]) -> BaseModel:
        """Raises:
        ValueError: no tasks/result came in time to carry the question, or the task ended.
        MCPError: the client answered with an error.
        """
        task = self.task
        self.asking += 1
        task.move("input_required", f"server '{task.server}' asks a question: call tasks/result to answer it")
        try:
            stream = await self.streams.wait(task)
            if stream is None:
                raise ValueError("the client did not ask for the task's result in time to be asked")
            session, request_id = stream
            meta = ServerMessageMetadata(related_request_id=request_id)
            return await session.send_request(request, result, metadata=meta)
        finally:
            self.asking -= 1
            if not self.asking and task.status == "input_required":
                task.move("working")


class ResultStreams:
    """The clients' `tasks/result` requests in flight, by task: where a task's questions go."""

    def __init__(self) -> None:
        self._open: dict[str, list[tuple[ServerSession, types.RequestId]]] = {}
        self._opened: dict[str, anyio.Event] = {}

    @contextlib.contextmanager
    def opened(self, task: Task, ctx: Ctx) -> Any:
        if ctx.request_id is None:  # tasks/result is a request, never a notification
            raise RuntimeError(f"tasks/result for task '{task.id}' came without a request id")
        stream = (ctx.session, ctx.request_id)
        self._open.setdefault(task.id, []).append(stream)
        self.wake(task)
        try:
            yield
        finally:
            streams = self._open.get(task.id, [])
            if stream in streams:
                streams.remove(stream)
            if not streams:
                self._open.pop(task.id, None)

    def wake(self, task: Task) -> None:
        """A request opened for `task`, or it ended: whoever waits to ask looks again."""
        event = self._opened.pop(task.id, None)
        if event is not None:
            event.set()

    async def wait(self, task: Task) -> tuple[ServerSession, types.RequestId] | None:
        """The latest tasks/result for `task` in flight, once there is one; None if none comes
        in time or the task ends first."""
        with anyio.move_on_after(PARK_SECONDS):
            while not task.ended:
                if streams := self._open.get(task.id):
                    return streams[-1]
                await self._opened.setdefault(task.id, anyio.Event()).wait()
        return None


class TaskList(types.PaginatedRequestParams):
    pass


class HandshakeTasks:
    """The 2025-11-25 face of the gateway's tasks: see the module docstring."""

    def __init__(self, tasks: Tasks, group: Callable[[], anyio.abc.TaskGroup]) -> None:
        self.tasks = tasks
        self.group = group
        self.streams = ResultStreams()
        self._call_tool: CallTool | None = None

    def serve(self, server: Server[Any]) -> None:
        """Answer 2025-11-25's task requests on `server` beside the 2026-07-28 ones (`Tasks.serve`,
        registered first), and take its task-augmented calls (`middleware`)."""
        call = server.get_request_handler("tools/call")
        if call is None:
            raise RuntimeError("register tools/call (Tasks.serve) before the 2025-11-25 task handlers")
        self._call_tool = call.handler
        for method, params_type, handshake in (
            ("tasks/get", TaskParams, self.get),
            ("tasks/cancel", TaskParams, self.cancel),
            ("tasks/result", TaskParams, self.result),
            ("tasks/list", TaskList, self.list),
        ):
            entry = server.get_request_handler(method)
            server.add_request_handler(method, params_type, self._by_era(handshake, entry.handler if entry else None))
        server.middleware.append(self.middleware)

    @staticmethod
    def _by_era(handshake: Handler, modern: Handler | None) -> Handler:
        """`handshake` for a 2025-11-25 connection, the extension's `modern` for a 2026-07-28
        request; a method neither has is unknown to the request's protocol version."""

        async def handler(ctx: Ctx, params: Any) -> Any:
            if negotiated(ctx):
                return await handshake(ctx, params)
            if modern is not None and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                return await modern(ctx, params)
            raise MCPError(types.METHOD_NOT_FOUND, f"Method not found at protocol {ctx.protocol_version}")

        return handler

    # -- making a task ------------------------------------------------------------------------

    def open(self, ctx: Ctx, server: str, tool: str, client: Able) -> tuple[Task, TaskReply] | None:
        """The task an admitted call becomes, if its request asks for one in its era's way (and
        there is room): with the reply that ends it. None: the call is answered as a call."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            task = self.tasks.open(server, tool) if asks_for_tasks(ctx.params) else None
            return None if task is None else (task, TaskReply(task, client))
        if not (negotiated(ctx) and _asks(ctx.params)):
            return None  # an earlier version has no tasks: `task` is ignored (the spec's rule)
        task = self.tasks.open(server, tool, owner=Listeners.key(ctx))
        if task is None:
            return None
        session = ctx.session
        task.watchers.append(lambda _: self._told(session, task))
        return task, HandshakeTaskReply(task, client, TaskAsker(task, self.streams))

    def created(self, task: Task) -> dict[str, Any]:
        """The answer to the call that made `task`, in its era."""
        return self.tasks.created(task) if task.owner is None else {"task": shown(task)}

    def _told(self, session: ServerSession, task: Task) -> None:
        if task.ended:
            self.streams.wake(task)
        self.group().start_soon(self._tell, session, task)

    async def _tell(self, session: ServerSession, task: Task) -> None:
        """`notifications/tasks/status` to the connection that made the task: the task as it is
        when sent, so the last one sent shows its end."""
        params = types.TaskStatusNotificationParams.model_validate(shown(task), by_name=False)
        with contextlib.suppress(Exception):  # best effort: the spec has the client poll anyway
            # the session sends any notification model; its type names the 2026-07-28 ones only
            await session.send_notification(cast(Any, types.TaskStatusNotification(params=params)))

    async def middleware(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        """The SDK's server's middleware: a 2025-11-25 `tools/call` that asks for a task is
        answered here, where the SDK does not sieve the result; the answer to `initialize`
        gains the `tasks` capability where the version negotiated is 2025-11-25."""
        if ctx.method == "initialize":
            result = await call_next(ctx)
            if isinstance(result, dict) and result.get("protocolVersion") == TASKS_VERSION:
                result = {**result, "capabilities": {**result.get("capabilities", {}), "tasks": CAPABILITY}}
            return result
        if ctx.method != "tools/call" or not negotiated(ctx) or not _asks(ctx.params) or self._call_tool is None:
            return await call_next(ctx)
        # the checks the SDK's server makes before its handler, then the handler itself
        _methods.validate_client_request("tools/call", ctx.protocol_version, ctx.params)
        params = types.CallToolRequestParams.model_validate(ctx.params, by_name=False)
        result = await self._call_tool(ctx, params)
        dumped = (
            result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if isinstance(result, BaseModel)
            else result
        )
        if "task" in dumped:
            return cast(dict[str, Any], dumped)
        return _methods.serialize_server_result("tools/call", ctx.protocol_version, dumped)  # refused: as a call

    # -- the requests ------------------------------------------------------------------------

    def _find(self, ctx: Ctx, params: TaskParams) -> Task:
        return self.tasks.find(params.task_id, Listeners.key(ctx))

    async def get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        return shown(self._find(ctx, params))

    async def result(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        """The call's result once the task has ended; meanwhile the task's questions come on this
        request."""
        task = self._find(ctx, params)
        with self.streams.opened(task, ctx):
            await task.done.wait()
        if task.result is None:
            raise MCPError(types.INVALID_PARAMS, f"task '{task.id}' was {task.status}: it has no result")
        meta = {**(task.result.get("_meta") or {}), RELATED: {"taskId": task.id}}
        return {**task.result, "_meta": meta}

    async def list(self, ctx: Ctx, params: TaskList) -> dict[str, Any]:
        """This connection's tasks, in one page."""
        if params.cursor is not None:
            raise MCPError(types.INVALID_PARAMS, "tasks/list has one page: no cursor is valid")
        return {"tasks": [shown(t) for t in self.tasks.owned(Listeners.key(ctx))]}

    async def cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        task = self._find(ctx, params)
        if task.ended:
            raise MCPError(types.INVALID_PARAMS, f"task '{task.id}' has ended ({task.status}): it cannot be cancelled")
        self.tasks.stop(task)
        return shown(task)


def _asks(params: Mapping[str, Any] | None) -> bool:
    """The request asks to run as a 2025-11-25 task (`params.task`)."""
    return params is not None and isinstance(params.get("task"), Mapping)
