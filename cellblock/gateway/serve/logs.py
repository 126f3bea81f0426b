"""The servers' logs on their way to the client: at or above the level it set, with no secret.

A client sets the least level it wants with `logging/setLevel` (`set_level`); a log a server sends
during a call goes to that call's request (`send`), one outside any call to a handshake-era client
as a notification (`idle`). Either way every secret the gateway holds is taken out first, and a
log too deep to check is not passed on. Logs are best effort: a client that is gone fails no call.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession

from cellblock.gateway.scrub import Scrubbed, scrub

__all__ = ["LOG_LEVELS", "ClientLogs", "log_passes"]

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def log_passes(level: str, threshold: str | None) -> bool:
    """A log at `level` reaches a client that set `threshold` with logging/setLevel (None: all)."""
    return threshold is None or LOG_LEVELS.index(level) >= LOG_LEVELS.index(threshold)


@dataclass
class ClientLogs:
    """See the module docstring."""

    secrets: Callable[[], re.Pattern[str] | None]  # the values no log may carry to the client
    notify: Callable[[str, dict[str, Any] | None], None]  # a notification outside any request
    level: str | None = None  # the least level the client wants (None: it set none, so all)

    async def set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        self.level = params.level
        return types.EmptyResult()

    async def send(self, session: ServerSession, params: types.LoggingMessageNotificationParams) -> None:
        if not log_passes(params.level, self.level):
            return
        with contextlib.suppress(Exception):  # logs are best effort; a gone client must not fail a call
            (data, logger_name), _ = scrub([params.data, params.logger], self.secrets())
            await session.send_log_message(params.level, data, logger=logger_name)

    def idle(self, params: types.LoggingMessageNotificationParams) -> None:
        if not log_passes(params.level, self.level):
            return
        with contextlib.suppress(Scrubbed):  # a log too deep to check for secrets is not passed on
            body, _ = scrub(params.model_dump(by_alias=True, mode="json", exclude_none=True), self.secrets())
            self.notify("notifications/message", body)
