"""Where the gateway's notifications outside any request go: a list changed, a server's log.

Only handshake-era clients have a channel for them (a 2026-07-28 client hears of changes on
`subscriptions/listen`, which the SDK's bus serves): the stdio client's wire, and each HTTP
session, by its `Mcp-Session-Id`, through a session object of its latest request (its connection
carries notifications outside any request until the session ends).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio.abc
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.wire.client import Wire

__all__ = ["ChangingServer", "Listeners"]

logger = logging.getLogger(__name__)

# the notifications sent outside any request, by method, as the SDK's session sends them
_NOTIFICATIONS: dict[str, Any] = {
    "notifications/tools/list_changed": types.ToolListChangedNotification,
    "notifications/prompts/list_changed": types.PromptListChangedNotification,
    "notifications/resources/list_changed": types.ResourceListChangedNotification,
    "notifications/message": types.LoggingMessageNotification,
    "notifications/resources/updated": types.ResourceUpdatedNotification,
}


class ChangingServer(Server[Any]):
    """The SDK's server, announcing to every handshake-era client (stdio or HTTP session) that its
    lists may change: the catalog changes whenever a server's or an approval does."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        changes = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
        return super().create_initialization_options(
            notification_options or changes, experimental_capabilities, extensions
        )


class Listeners:
    """The handshake-era clients of one gateway that take notifications outside any request."""

    def __init__(self) -> None:
        self.wire: Wire | None = None  # the stdio client's (`serve/stdio.py: serve_wire` sets it)
        self.sessions: dict[str, ServerSession] = {}

    @staticmethod
    def key(ctx: ServerRequestContext[Any, Any]) -> str:
        """Which listener a request came from: its HTTP session's id, or "" for the stdio client."""
        headers = getattr(ctx.request, "headers", None)
        return str(headers.get("mcp-session-id") or "") if headers is not None else ""

    def met(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """Note the HTTP session a request came on, if it is a handshake-era one."""
        sid = self.key(ctx)
        if sid and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self.sessions[sid] = ctx.session

    def notify(
        self,
        tasks: anyio.abc.TaskGroup,
        method: str,
        params: dict[str, Any] | None,
        only: frozenset[str] | None = None,
    ) -> None:
        """Send `method` to every listener (or those `only` names, by `key`); a gone one is
        dropped, never an error."""
        for sid, session in list(self.sessions.items()):
            if only is None or sid in only:
                tasks.start_soon(self._to_session, sid, session, method, params)
        wire = self.wire
        if wire is None or wire.modern or wire.version is None or (only is not None and "" not in only):
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        with contextlib.suppress(OSError):  # the client left
            wire.send(message)

    async def _to_session(self, sid: str, session: ServerSession, method: str, params: dict[str, Any] | None) -> None:
        notification = _NOTIFICATIONS[method].model_validate({"method": method, "params": params})
        try:
            await session.send_notification(notification)
        except Exception as exc:  # noqa: BLE001 - a gone client never fails a notification: forget its session
            logger.debug("HTTP session %s takes no more notifications: %s", sid[:16], exc)
            self.sessions.pop(sid, None)
