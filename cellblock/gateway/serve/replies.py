"""Where a call's answer goes: the `Reply` of the client's request it came on, and the one the
SDK's handler awaits (`SessionReply`; the fast path's is `fastpath.WireReply`).

A reply carries the call's progress and logs to that request, in order, then its answer, or for
a 2026-07-28 client the question the call waits on; it says what that client can do (a form, a
URL, its model), which decides how the call asks (`serve/calls.py`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.ask.elicitation import Asker, DirectAsker
from cellblock.gateway.serve.approvals import can_elicit, can_elicit_url, can_sample

__all__ = ["Answering", "Reply", "SendLog", "SessionReply"]


class Answering(Protocol):
    """The call a reply waits on (`serve/calls.ToolCall`)."""

    @property
    def parked(self) -> bool:
        """It waits for the client's retry (2026-07-28), which brings it its next reply."""
        ...

    def cancel(self, reason: str) -> None: ...


class Reply(Protocol):
    """The client's request a call answers: where its answer, progress and logs go."""

    modern: bool  # the client speaks 2026-07-28: questions become input_required answers
    # a question is answered by the client's retry of the request (else by tasks/update: a task)
    retried: bool
    wants_progress: bool
    carries_logs: bool  # the server's logs reach the client through this request

    @property
    def can_elicit(self) -> bool: ...
    @property
    def can_elicit_url(self) -> bool:
        """The client can open a URL for the user (an OAuth login)."""
        ...

    @property
    def can_sample(self) -> bool: ...

    @property
    def direct(self) -> Asker | None:
        """Handshake era: asks the client within this request."""
        ...

    def progress(self, value: float, total: float | None, message: str | None) -> None: ...
    def log(self, params: types.LoggingMessageNotificationParams) -> None: ...
    def shape(self, result: dict[str, Any]) -> Any:
        """The result as this request is answered with.

        Raises:
            ValueError: it does not validate as a call result.
        """
        ...

    def answer(self, shaped: Any) -> None: ...
    def ask(self, question: types.InputRequiredResult) -> None: ...


# how the SDK's session sends a log to the client (the gateway's level applied)
SendLog = Callable[[ServerSession, types.LoggingMessageNotificationParams], Awaitable[None]]


class SessionReply:
    """A `tools/call` the SDK's handler answers (see `Reply`): the handler awaits
    `outcome`, which also sends the call's progress and logs, in order, before its answer."""

    def __init__(self, send_log: SendLog, ctx: ServerRequestContext[Any, Any]) -> None:
        session = self.session = ctx.session
        self.send_log = send_log
        self.modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        self.retried = True
        self.can_elicit, self.can_elicit_url = can_elicit(session), can_elicit_url(session)
        self.can_sample = can_sample(session)
        self.wants_progress = (ctx.meta or {}).get("progress_token") is not None
        self.carries_logs = True  # the SDK's session sends each as this request's era allows
        self.direct: Asker | None = None if self.modern else DirectAsker(session, ctx.request_id)
        self._send, self._events = anyio.create_memory_object_stream[Any](math.inf)

    def progress(self, value: float, total: float | None, message: str | None) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait((value, total, message))

    def log(self, params: types.LoggingMessageNotificationParams) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(params)

    async def tell(self, message: str) -> None:
        """Tell the client about its call while it waits, the way it can hear: a progress message
        where it asked for progress, else a log message."""
        if self.wants_progress:
            with contextlib.suppress(Exception):  # the client may be gone; progress is best effort
                await self.session.report_progress(0, None, message)
        else:
            params = types.LoggingMessageNotificationParams(level="warning", logger="cellblock", data=message)
            await self.send_log(self.session, params)

    def shape(self, result: dict[str, Any]) -> Any:
        return types.CallToolResult.model_validate(result, by_name=False)

    def answer(self, shaped: Any) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(shaped)

    def ask(self, question: types.InputRequiredResult) -> None:
        self.answer(question)

    async def outcome(self, tc: Answering) -> types.CallToolResult | types.InputRequiredResult:
        """The call's answer to this request: its result, or (2026-07-28) its question."""
        try:
            while True:
                event = await self._events.receive()
                if isinstance(event, types.LoggingMessageNotificationParams):
                    await self.send_log(self.session, event)
                elif isinstance(event, tuple):
                    with contextlib.suppress(Exception):  # the client may be gone; progress is best effort
                        await self.session.report_progress(*event)
                else:
                    return cast(types.CallToolResult | types.InputRequiredResult, event)
        finally:
            self._send.close()
            if not tc.parked:
                tc.cancel("cancelled by the client")  # a cancelled request takes its call with it
