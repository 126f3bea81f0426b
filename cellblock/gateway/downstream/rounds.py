"""One round of a tool call with a server: the request sent, and its answer handed back once.

A local server's round goes over its pipes (`LocalChannel.request`): written at once, answered
from the callback that read the response, timed out by the channel's deadline queue and
cancelled with a `notifications/cancelled`. A remote server's round (or a local one's before its
session has stamped a 2026-07-28 envelope to copy) goes through the SDK's client in a task of
its own, under the server's timeout. A tool that a 2025-11-25 server runs only as a task is
called as one by a `TaskRound`, whose requests go either way. Either way the caller is told once,
with the result as JSON or the failure, and a `Round` it can cancel.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
import anyio.abc
import mcp.types as types
from mcp import Client
from mcp.shared.dispatcher import CallOptions, ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, TypeAdapter

from cellblock.gateway.ask.elicitation import Asker
from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.downstream.local import LocalChannel, Pending
from cellblock.gateway.errors import first_line
from cellblock.policy.errors import CellblockError

__all__ = [
    "CALL_RESULT",
    "Able",
    "Answered",
    "Caller",
    "DownstreamError",
    "LocalRound",
    "Progress",
    "RemoteRequests",
    "RemoteRound",
    "Round",
    "TaskRound",
    "error_result",
    "failed_result",
    "forwardable",
    "owner_of",
]

logger = logging.getLogger(__name__)
R = TypeVar("R", bound=types.Result)
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

CALL_RESULT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    types.CallToolResult | types.InputRequiredResult
)

# Told once how a round ended: the result as the server sent it, or why there is none.
Answered = Callable[[dict[str, Any] | None, BaseException | None], None]
Progress = Callable[[float, float | None, str | None], None]


class DownstreamError(CellblockError):
    """A downstream server could not serve a request; the message names the server."""


class Able(Protocol):
    """What the client a request came from says it can do."""

    @property
    def can_elicit(self) -> bool: ...
    @property
    def can_elicit_url(self) -> bool: ...
    @property
    def can_sample(self) -> bool: ...


class Caller(Able, Protocol):
    """The call in flight on a server: where its questions, logs and sampling requests go."""

    questions: int  # how many the server has put to it (`Questions.count`)

    @property
    def asker(self) -> Asker | None: ...
    @property
    def waiting(self) -> bool:
        """Its client waits on the call's own request (it is not a task, nor parked)."""
        ...

    def log(self, params: types.LoggingMessageNotificationParams) -> None: ...


def owner_of(in_flight: Sequence[Caller]) -> Caller | None:
    """Of the calls in flight on a server, oldest first, the one a question or log from it belongs
    to. Nothing in the protocol links them (over stdio the server's request names no call), so it
    is the newest call whose client waits on its request, else the newest (a task, or a call
    parked on a question); with none in flight nobody can answer. Not a task first: the client is
    asked a call's question at once, a task's only when it asks for the task's result, so a call's
    question put to a task would wait unanswered, and the call with it; a task's question put to a
    call is answered at once."""
    for caller in reversed(in_flight):
        if caller.waiting:
            return caller
    return in_flight[-1] if in_flight else None


class Round(Protocol):
    def cancel(self, reason: str) -> None:
        """Stop waiting and tell the server to stop; the caller is not told."""
        ...


def forwardable(meta: Any) -> dict[str, Any] | None:
    """The caller's `_meta` minus what belongs to this hop (progress token, protocol envelope)."""
    if not meta:
        return None
    data = meta if isinstance(meta, dict) else dict(meta)
    kept = {
        k: v
        for k, v in data.items()
        if k not in ("progressToken", "progress_token") and not k.startswith("io.modelcontextprotocol/")
    }
    return kept or None


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


@dataclass(eq=False)
class LocalRound:
    channel: LocalChannel
    pending: Pending

    @classmethod
    def send(
        cls,
        channel: LocalChannel,
        params: dict[str, Any],
        timeout: float,
        answered: Answered,
        progress: Progress | None,
        method: str = "tools/call",
    ) -> LocalRound:
        """Raises:
        OSError: the server's stdin is gone.
        ValueError, RecursionError: the params cannot be encoded.
        """

        def done(pending: Pending) -> None:
            if pending.timed_out:
                answered(None, TimeoutError())
            elif pending.response is None:
                answered(None, MCPError(types.CONNECTION_CLOSED, "Connection closed"))
            elif "result" not in pending.response:
                answered(None, _error_of(pending.response))
            else:
                result = pending.response["result"]
                answered(result, None) if isinstance(result, dict) else answered(None, ValueError("not an object"))

        return cls(channel, channel.request(method, params, timeout, done, progress))

    def cancel(self, reason: str) -> None:
        self.channel.cancel(self.pending, reason)


RELATED_TASK = "io.modelcontextprotocol/related-task"
# sends one request of a round (its method and params as JSON), told once how it ended
Send = Callable[[str, dict[str, Any], Answered], Round]


@dataclass(eq=False)
class TaskRound:
    """A call to a tool that a 2025-11-25 server runs only as a task (`execution.taskSupport:
    required`): the call is sent with `task`, and the task's `tasks/result` after it, which the
    server answers once the task has ended (asking its questions on the way, as within a call).
    The caller is told that answer, as of any round; cancelled, or timed out waiting for that
    answer, the server is also told to cancel the task."""

    send: Send
    answered: Answered
    current: Round | None = None
    task_id: str | None = None

    @classmethod
    def local(
        cls,
        channel: LocalChannel,
        params: dict[str, Any],
        timeout: float,
        answered: Answered,
        progress: Progress | None,
    ) -> TaskRound:
        """A local server's, over its pipes (see `LocalRound.send`)."""

        def send(method: str, params: dict[str, Any], done: Answered) -> Round:
            return LocalRound.send(channel, params, timeout, done, progress, method)

        return cls.start(send, params, answered)

    @classmethod
    def start(cls, send: Send, params: dict[str, Any], answered: Answered) -> TaskRound:
        """Raises:
        OSError: a local server's stdin is gone.
        ValueError, RecursionError: the params cannot be encoded.
        """
        round_ = cls(send, answered)
        round_.current = send("tools/call", {**params, "task": {}}, round_._created)
        return round_

    def _created(self, result: dict[str, Any] | None, failure: BaseException | None) -> None:
        task = result.get("task") if result is not None else None
        task_id = task.get("taskId") if isinstance(task, dict) else None
        if failure is not None or not isinstance(task_id, str):
            self.current = None
            return self.answered(result, failure)  # an error, or a result after all
        self.task_id = task_id
        try:
            self.current = self.send("tasks/result", {"taskId": task_id}, self._ended)
        except OSError as exc:
            self._ended(None, MCPError(types.CONNECTION_CLOSED, f"Connection closed: {exc}"))
        return None

    def _ended(self, result: dict[str, Any] | None, failure: BaseException | None) -> None:
        if isinstance(failure, TimeoutError):
            self._cancel_task()  # the call is over (the request was cancelled): so is its task
        self.current = self.task_id = None
        meta = result.get("_meta") if result is not None else None
        if result is not None and isinstance(meta, dict) and RELATED_TASK in meta:
            # the server's task is the gateway's business: its id means nothing to the client
            kept = {k: v for k, v in meta.items() if k != RELATED_TASK}
            result = {k: v for k, v in result.items() if k != "_meta"} | ({"_meta": kept} if kept else {})
        self.answered(result, failure)

    def cancel(self, reason: str) -> None:
        if self.current is not None:
            self.current.cancel(reason)
        self._cancel_task()
        self.current = self.task_id = None

    def _cancel_task(self) -> None:
        if self.task_id is not None:
            with contextlib.suppress(OSError):  # the server is gone: nothing left to cancel
                self.send("tasks/cancel", {"taskId": self.task_id}, lambda result, failure: None)


@dataclass(eq=False)
class RemoteRound:
    scope: anyio.CancelScope

    def cancel(self, reason: str) -> None:
        self.scope.cancel()  # the SDK's session tells the server


@dataclass(frozen=True)
class RemoteRequests:
    """How the requests of a round reach a remote server (or a local one before its session has
    stamped an envelope): through its SDK client (`ready`), each in a task of its own in `tg`,
    under `timeout`, sent once more on a new session when the server had forgotten the old one
    (`lost_session`)."""

    tg: anyio.abc.TaskGroup
    ready: Callable[[], Awaitable[Client]]
    timeout: float
    progress: ProgressFnT | None
    lost_session: Callable[[], bool]

    def send(self, method: str, params: dict[str, Any], answered: Answered) -> RemoteRound:
        """A `Send`: `answered` is told once how the request ended, unless it is cancelled.

        Raises:
            ValueError: the params do not make a request of `method`.
        """
        ask = _asked(method, params, self.progress)
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    result = await _send(self.ready, ask, self.timeout, self.lost_session)
                except (TimeoutError, MCPError, ValueError, CellblockError) as exc:  # CellblockError: not up
                    answered(None, exc)
                else:
                    answered(result, None)

        self.tg.start_soon(run)
        return RemoteRound(scope)


# one request of a round sent through a server's client; its answer as JSON
Ask = Callable[[Client], Awaitable[dict[str, Any]]]


def _asked(method: str, params: dict[str, Any], progress: ProgressFnT | None) -> Ask:
    """How a request of a round goes through the SDK's client: a call, or (2025-11-25 tasks) a
    call with `task`, the task's `tasks/result` or its `tasks/cancel`.

    Raises:
        ValueError: the params do not make a request of `method`.
    """
    if method == "tasks/result":  # its answer is the call's
        payload = types.GetTaskPayloadRequest(
            params=types.GetTaskPayloadRequestParams.model_validate(params, by_name=False)
        )
        return lambda client: _json(client.session.send_request(payload, CALL_RESULT, progress_callback=progress))
    if method == "tasks/cancel":
        cancel = types.CancelTaskRequest(params=types.CancelTaskRequestParams.model_validate(params, by_name=False))
        return lambda client: _json(client.session.send_request(cancel, types.CancelTaskResult))
    call = types.CallToolRequest(params=types.CallToolRequestParams.model_validate(params, by_name=False))
    if call.params.task is None:
        return lambda client: _json(client.session.send_request(call, CALL_RESULT, progress_callback=progress))
    # The SDK holds a call's answer to a call's result, which the task made instead (2025-11-25
    # `CreateTaskResult`) is not: this one request goes through the session's dispatcher as it is
    # (a handshake-era session's: its transport sends the negotiated version on every request).
    sent = call.params.model_dump(by_alias=True, mode="json", exclude_none=True)
    options: CallOptions = {} if progress is None else {"on_progress": progress}
    return lambda client: client.session._dispatcher.send_raw_request(call.method, sent, options)


async def _json(answer: Awaitable[M]) -> dict[str, Any]:
    return (await answer).model_dump(by_alias=True, mode="json", exclude_none=True)


async def _send(
    ready: Callable[[], Awaitable[Client]],
    ask: Callable[[Client], Awaitable[T]],
    timeout: float,
    lost_session: Callable[[], bool],
) -> T:
    """`ask` the server's client within `timeout`; once more when a remote server had forgotten
    the session (`lost_session`: it then reconnects)."""
    for attempt in (1, 2):
        client = await ready()
        try:
            with anyio.fail_after(timeout):
                return await ask(client)
        except MCPError:
            if attempt == 1 and lost_session():
                continue  # the server never saw the request; send it again on a new session
            raise
    raise AssertionError("unreachable")


def _error_of(response: dict[str, Any]) -> BaseException:
    """The MCPError an error response stands for (the SDK raises the same for its own requests)."""
    try:
        return MCPError.from_error_data(types.ErrorData.model_validate(response.get("error"), by_name=False))
    except ValueError as exc:
        return exc


def failed_result(
    server: str, tool: str, timeout: float, exc: BaseException, stopped: str | None
) -> types.CallToolResult:
    """The error result the model reads when a call to `tool` on `server` did not complete;
    `stopped`: why the gateway stopped the server, if it did."""
    if isinstance(exc, TimeoutError):
        return error_result(f"call to '{tool}' on server '{server}' took longer than {timeout:g}s and was cancelled")
    if isinstance(exc, DownstreamError | CredentialError):
        return error_result(str(exc))
    if isinstance(exc, MCPError):
        if exc.code == types.CONNECTION_CLOSED:
            if stopped is not None:
                return error_result(f"server '{server}' was stopped during the call to '{tool}': {stopped}")
            return error_result(f"server '{server}' closed the connection during the call to '{tool}'")
        return error_result(f"server '{server}' answered '{tool}' with an error: {exc.message}")
    # a result that does not validate
    return error_result(f"server '{server}' sent an invalid result for '{tool}': {first_line(exc)}")


async def forward_request(
    name: str,
    timeout: float,
    ready_client: Callable[[], Awaitable[Client]],
    lost_session: Callable[[], bool],
    request: Any,
    result_type: type[R],
) -> R:
    """Send a non-call request to server `name` (see `_send`).

    Raises:
        DownstreamError: the server is down, errs, or times out.
    """
    try:
        return await _send(
            ready_client, lambda client: client.session.send_request(request, result_type), timeout, lost_session
        )
    except TimeoutError:
        raise DownstreamError(f"server '{name}' did not answer {request.method} in {timeout:g}s") from None
    except MCPError as exc:
        raise DownstreamError(f"server '{name}': {exc.message}") from exc
