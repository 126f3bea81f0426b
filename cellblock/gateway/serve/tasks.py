"""Tasks (the `io.modelcontextprotocol/tasks` extension of 2026-07-28): a tool call the client
lets run on while it polls for the result.

A client that declares the extension on its `tools/call` is answered with a task handle instead
of the result. The task is the gateway's own: the call is admitted first, like every call (route,
lock, policy, the human's approval, the audit record), so a denied call never becomes a task and
never reaches its server. Then it runs as the `ToolCall` it would be anyway, with the task as the
request it answers (`TaskReply`): the end of the call is the task's result, a question the server
asks midway makes the task `input_required` until the client's `tasks/update` carries the answer,
and `tasks/cancel` cancels the call and tells the server. A server that dies or restarts during
the call ends its task with the error that says so, as it would end the call.

A task id is `<server>+<random>`: it names the server the task runs on, and cannot be guessed, so
the id is the only handle to a 2026-07-28 task (the extension has no `tasks/list`). Ended tasks
are kept for `TASK_TTL_MS`; at most `MAX_TASKS` are kept at a time, and a call that would be one
more is answered as a plain call. A handshake-era client's task (2025-11-25) is the same task,
shown on that era's wire (`serve/handshake_tasks.py`).
"""

from __future__ import annotations

import datetime
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from pydantic import Field

from cellblock.gateway.ask.elicitation import Asker
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.downstream.rounds import Able

if TYPE_CHECKING:
    from cellblock.gateway.serve.calls import ToolCall

__all__ = ["EXTENSION", "MAX_TASKS", "TASK_TTL_MS", "Task", "TaskReply", "Tasks", "asks_for_tasks"]

EXTENSION = "io.modelcontextprotocol/tasks"
# how long a task is kept from its creation (told to the client as ttlMs), and how often to poll
TASK_TTL_MS = 3_600_000
POLL_MS = 500
MAX_TASKS = 256

Ctx = ServerRequestContext[Any, Any]
TERMINAL = ("completed", "failed", "cancelled")


def asks_for_tasks(params: Mapping[str, Any] | None) -> bool:
    """The request (its params as JSON) declares the tasks extension in its own capabilities."""
    meta = params.get("_meta") if params is not None else None
    caps = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(extensions, Mapping) and EXTENSION in extensions


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(eq=False)
class Task:
    """One task the gateway handed out, as `tasks/get` shows it."""

    id: str
    server: str
    tool: str
    call: ToolCall | None = None
    status: str = "working"
    created: str = field(default_factory=_now)
    updated: str = ""
    born: float = field(default_factory=time.monotonic)
    message: str | None = None
    result: dict[str, Any] | None = None
    # handshake era (serve/handshake_tasks.py): the connection that made it, the only one that sees
    # it (`Listeners.key`); None for a 2026-07-28 task, which its id alone names
    owner: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)  # set once the status is terminal
    # the listen streams that name the task: each is told the task at every change (serve/listen.py)
    watchers: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.updated = self.created

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    def move(self, status: str, message: str | None = None) -> None:
        if self.ended:
            return  # a terminal status is final
        self.status, self.message, self.updated = status, message, _now()
        if self.ended:
            self.done.set()
        self.told()

    def told(self) -> None:
        """Tell the task's watchers how it stands now."""
        if self.watchers:
            view = self.view()
            for watcher in list(self.watchers):
                watcher(view)

    @property
    def asked(self) -> dict[str, Any] | None:
        """The input requests the task waits on: its call's question, while the call is parked."""
        return self.call.question if self.call is not None and not self.ended else None

    def view(self) -> dict[str, Any]:
        """The task on the wire (a `DetailedTask`): its status, and what that status carries."""
        asked = self.asked
        task: dict[str, Any] = {
            "taskId": self.id,
            "status": "input_required" if asked is not None else self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttlMs": TASK_TTL_MS,
        }
        if not self.ended:
            task["pollIntervalMs"] = POLL_MS
        if asked is not None:
            task["statusMessage"] = f"server '{self.server}' asks a question"
            task["inputRequests"] = asked
        elif self.message is not None:
            task["statusMessage"] = self.message
        if self.status == "completed" and self.result is not None:
            task["result"] = self.result
        return task


class TaskReply:
    """A call whose client holds a task (see `serve/replies.Reply`): its answer is the task's
    result. A question of its server parks the call, which the task shows as its `inputRequests`
    (`Task.asked`) until tasks/update answers it."""

    modern = True  # a question goes to the client as input requests, never within a request
    retried = False  # answered by tasks/update, not by a retry of the call
    wants_progress = False  # tasks carry no progress (the extension's rule)
    carries_logs = False
    direct: Asker | None = None

    def __init__(self, task: Task, client: Able) -> None:
        self.task = task
        # what the client that made the task can do, as its tools/call declared it
        self.can_elicit, self.can_elicit_url = client.can_elicit, client.can_elicit_url
        self.can_sample = client.can_sample

    def progress(self, value: float, total: float | None, message: str | None) -> None:
        return None

    def log(self, params: types.LoggingMessageNotificationParams) -> None:
        return None

    def shape(self, result: dict[str, Any]) -> Any:
        call = types.CallToolResult.model_validate(result, by_name=False)
        return call.model_dump(by_alias=True, mode="json", exclude_none=True)

    def answer(self, shaped: Any) -> None:
        self.task.result = shaped
        self.task.move("completed", "the tool returned an error" if shaped.get("isError") else None)

    def ask(self, question: types.InputRequiredResult) -> None:
        self.task.told()  # the parked call is the question (`Task.asked`)


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


class Tasks:
    """The gateway's tasks, and the SDK handlers for tasks/get, tasks/update and tasks/cancel."""

    def __init__(self, audit: Audit) -> None:
        self.audit = audit
        self._tasks: dict[str, Task] = {}

    def serve(self, server: Server[Any]) -> None:
        """Answer the extension's requests on `server`, and say so in its capabilities."""
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/update", UpdateParams, self.update)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)
        server.extensions[EXTENSION] = {}

    def open(self, server: str, tool: str, owner: str | None = None) -> Task | None:
        """A new task for a call to `tool` on `server` (made on the handshake-era connection
        `owner`, if any); None when there is no room for one."""
        self._forget_expired()
        if len(self._tasks) >= MAX_TASKS:
            ended = [t for t in self._tasks.values() if t.ended]
            if not ended:
                return None
            del self._tasks[min(ended, key=lambda t: t.born).id]
        task = Task(f"{server}+{secrets.token_urlsafe(18)}", server, tool, owner=owner)
        self._tasks[task.id] = task
        self.audit.note("task", server, tool=tool, task=task.id, status=task.status)
        return task

    def created(self, task: Task) -> dict[str, Any]:
        """The answer to the call that made `task`: a `CreateTaskResult`."""
        return {"resultType": "task", **task.view()}

    def _forget_expired(self) -> None:
        cutoff = time.monotonic() - TASK_TTL_MS / 1000
        for task in [t for t in self._tasks.values() if t.born < cutoff]:
            if task.call is not None:
                task.call.cancel("the task expired")
            task.move("cancelled", "the task expired")  # whoever waits on it is let go
            del self._tasks[task.id]

    def watchable(self, ctx: Ctx, task_ids: Any) -> list[str]:
        """Of the task ids a listen filter names, those the stream may watch: the ones held here.

        Raises:
            MCPError: the request names some without declaring the extension, or not as a list.
        """
        if task_ids is None:
            return []
        _declared(ctx)
        if not isinstance(task_ids, list):
            raise MCPError(types.INVALID_PARAMS, "taskIds must be a list of task ids")
        self._forget_expired()
        return [i for i in dict.fromkeys(task_ids) if isinstance(i, str) and self._held(i, None) is not None]

    def watch(self, task_id: str, watcher: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Tell `watcher` the task at each change, until the returned function is called."""
        watchers = self._tasks[task_id].watchers
        watchers.append(watcher)
        return lambda: watchers.remove(watcher) if watcher in watchers else None

    def _task(self, ctx: Ctx, task_id: str) -> Task:
        """Raises:
        MCPError: the request does not declare the extension, or names no task the gateway holds.
        """
        _declared(ctx)
        return self.find(task_id, None)

    def _held(self, task_id: str, owner: str | None) -> Task | None:
        task = self._tasks.get(task_id)
        return task if task is not None and task.owner == owner else None

    def find(self, task_id: str, owner: str | None) -> Task:
        """The task `task_id` as a request of `owner` may see it: one that connection made in the
        handshake era, or (None) a 2026-07-28 task.

        Raises:
            MCPError: no such task, for that request.
        """
        self._forget_expired()
        task = self._held(task_id, owner)
        if task is None:
            named = task_id if len(task_id) <= 100 else f"{task_id[:100]}…"  # the client's own text, bounded
            raise MCPError(types.INVALID_PARAMS, f"no task '{named}': it never existed here, or it expired")
        return task

    def owned(self, owner: str) -> list[Task]:
        """The tasks the handshake-era connection `owner` made, oldest first."""
        self._forget_expired()
        return [t for t in self._tasks.values() if t.owner == owner]

    async def get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        return self._task(ctx, params.task_id).view()

    async def update(self, ctx: Ctx, params: UpdateParams) -> dict[str, Any]:
        """The client's answers to the task's input requests; an answer to a question no longer
        asked is ignored (the extension's rule)."""
        task = self._task(ctx, params.task_id)
        asked, call = task.asked or {}, task.call
        answers = {key: value for key, value in params.input_responses.items() if key in asked}
        if call is not None and call.reply is not None and answers:
            call.resume(call.reply, answers)
            task.told()
        return {}

    async def cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        self.stop(self._task(ctx, params.task_id))
        return {}

    def stop(self, task: Task) -> None:
        """The client cancels `task`: its call is cancelled (the server is told), and the task is."""
        if not task.ended:
            if task.call is not None:
                task.call.cancel("the client cancelled the task")
            task.move("cancelled", "cancelled by the client")
            self.audit.note("task", task.server, tool=task.tool, task=task.id, status=task.status)


def _declared(ctx: Ctx) -> None:
    """Raises:
    MCPError: the request does not declare the tasks extension (the extension's own error).
    """
    if not asks_for_tasks(ctx.params):
        raise MCPError(
            types.MISSING_REQUIRED_CLIENT_CAPABILITY,
            "Missing required client capability",
            {"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
        )
