"""What a tool call needs of the server it goes to.

`Target` is the seam between one call (`serve/calls.ToolCall`) and its server
(`downstream/server.Downstream`): wait until it is up, log in through the client, send a round,
say how a call failed, track the calls in flight (what the server's questions and logs reach),
answer its questions, and read its catalog again. A test stands in for the server with an
object of these members alone.
"""

from __future__ import annotations

from typing import Any, Protocol

import mcp.types as types

from cellblock.gateway.ask.elicitation import Asker
from cellblock.gateway.downstream.rounds import Answered, Caller, Progress, Round

__all__ = ["Answers", "Soon", "Target"]


class Answers(Protocol):
    async def answer(self, request: types.InputRequest, caller: Caller) -> types.InputResponse:
        """The answer to one of a 2026-07-28 server's input requests during `caller`'s call."""
        ...


class Soon(Protocol):
    def soon(self) -> None:
        """Read the server's catalog again, soon."""


class Target(Protocol):
    """One server, as a tool call sees it; see the module docstring."""

    @property
    def name(self) -> str: ...

    @property
    def needs_login(self) -> bool:
        """Its OAuth flow wants an authorization the client can carry."""
        ...

    @property
    def questions(self) -> Answers: ...

    @property
    def changes(self) -> Soon: ...

    async def ready_client(self) -> object:
        """Wait until it is up (raises `DownstreamError` when it is not)."""
        ...

    async def login_through_client(self, asker: Asker) -> None: ...

    def track(self, caller: Caller) -> None: ...

    def untrack(self, caller: Caller) -> None: ...

    def send_call(
        self, params: dict[str, Any], answered: Answered, progress: Progress | None, logs: bool = True
    ) -> Round: ...

    def failed_call(self, tool: str, exc: BaseException) -> types.CallToolResult: ...
