"""A server's catalog change notices: its catalog re-read once for any number of notices, at
most every REFRESH_SECONDS, and the 2026-07-28 stream that carries the notices."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError

from cellblock.gateway.downstream.connection import failure_text

__all__ = ["REFRESH_SECONDS", "Refresher", "listen"]

logger = logging.getLogger(__name__)

# A server that announces catalog changes without end is re-read at most this often: each re-read
# lists its whole catalog and reviews it against the lock.
REFRESH_SECONDS = 1.0


@dataclass(eq=False)
class Refresher:
    """Runs `refresh` after change notices: outside the dispatcher's receive path, which must not
    block, and once for any number of notices that arrive meanwhile."""

    refresh: Callable[[], Awaitable[None]]
    _due: bool = False  # a notice came since the last re-read began
    _running: bool = False

    def soon(self, tg: anyio.abc.TaskGroup) -> None:
        self._due = True
        if not self._running:
            self._running = True
            tg.start_soon(self._while_due)

    async def _while_due(self) -> None:
        try:
            while self._due:
                self._due = False
                began = anyio.current_time()
                await self.refresh()
                if self._due:  # announced again meanwhile: once more, but not at once
                    await anyio.sleep(max(0.0, began + REFRESH_SECONDS - anyio.current_time()))
        finally:
            self._running = False


async def listen(name: str, client: Client, changed: Callable[[], None]) -> None:
    """Tell `changed` of each change a 2026-07-28 server announces: it does so only on a
    `subscriptions/listen` stream."""
    caps = client.server_capabilities
    tools = bool(caps.tools and caps.tools.list_changed)
    prompts = bool(caps.prompts and caps.prompts.list_changed)
    resources = bool(caps.resources and caps.resources.list_changed)
    if not (tools or prompts or resources):
        return
    try:
        async with client.listen(
            tools_list_changed=tools, prompts_list_changed=prompts, resources_list_changed=resources
        ) as events:
            async for _ in events:
                changed()
    except (MCPError, SubscriptionLost, ListenNotSupportedError) as exc:
        logger.info("server '%s': no change notifications (%s)", name, failure_text(exc))
