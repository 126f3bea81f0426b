"""A server's catalog change notices: its catalog re-read once for any number of notices, at
most every REFRESH_SECONDS, and the 2026-07-28 stream that carries the notices (and the updates of
the resources the gateway watches there). A catalog one kind of which failed with an error of the
server's own (a database that is down) is also re-read later by itself, RETRY_FIRST seconds after,
then twice as long each time up to RETRY_MAX, until that kind lists: a server seldom announces
that a list which failed now works."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from cellblock.gateway.downstream.connection import failure_text
from cellblock.gateway.downstream.watch import Watched

__all__ = ["REFRESH_SECONDS", "RETRY_FIRST", "RETRY_MAX", "Refresher", "listen"]

logger = logging.getLogger(__name__)

# A server that announces catalog changes without end is re-read at most this often: each re-read
# lists its whole catalog and reviews it against the lock.
REFRESH_SECONDS = 1.0
RETRY_FIRST = 5.0
RETRY_MAX = 300.0


@dataclass(eq=False)
class Refresher:
    """Runs `refresh` after change notices: outside the dispatcher's receive path, which must not
    block, and once for any number of notices that arrive meanwhile. A notice that comes while a
    connection's first catalog is being read may be about what was read already: it is kept, and
    acted on once that catalog is in (`open`)."""

    refresh: Callable[[], Awaitable[None]]
    # whether a kind of the catalog as read last failed with an error that may pass
    failing: Callable[[], bool] = lambda: False
    _tg: anyio.abc.TaskGroup | None = None  # where re-reads run; None while a first catalog is read
    _due: bool = False  # a notice came since the last re-read began
    _running: bool = False
    _retrying: bool = False  # a re-read of a failed kind is waited for
    _retry_wait: float = RETRY_FIRST

    def soon(self) -> None:
        self._due = True
        if self._tg is not None and not self._running:
            self._running = True
            self._tg.start_soon(self._while_due)

    def open(self, tg: anyio.abc.TaskGroup) -> None:
        """The connection's catalog is in: notices are acted on in `tg` from now on, and one that
        came while it was read, at once."""
        self._tg, self._retry_wait = tg, RETRY_FIRST
        if self._due:
            self.soon()
        else:
            self._retry_if_failing()

    def close(self) -> None:
        """The connection ended: notices wait for the next one's catalog."""
        self._tg = None

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
        self._retry_if_failing()

    def _retry_if_failing(self) -> None:
        if not self.failing():
            self._retry_wait = RETRY_FIRST
        elif self._tg is not None and not self._retrying:
            self._retrying = True
            self._tg.start_soon(self._retry, self._retry_wait)
            self._retry_wait = min(self._retry_wait * 2, RETRY_MAX)

    async def _retry(self, wait: float) -> None:
        try:
            await anyio.sleep(wait)
        finally:
            self._retrying = False
        self.soon()


async def listen(name: str, client: Client, changed: Callable[[], None], watched: Watched) -> None:
    """Tell `changed` of each catalog change a 2026-07-28 server announces, and `watched` of each
    update to a resource it watches: the server does so only on a `subscriptions/listen` stream,
    whose filter names the resources, so the stream is opened again whenever they change."""
    caps = client.server_capabilities
    flags = {
        "tools_list_changed": bool(caps.tools and caps.tools.list_changed),
        "prompts_list_changed": bool(caps.prompts and caps.prompts.list_changed),
        "resources_list_changed": bool(caps.resources and caps.resources.list_changed),
    }
    subscribable = Watched.offered(client)
    while True:
        again = watched.next_change()
        uris = sorted(watched.uris) if subscribable else []
        if not any(flags.values()) and not uris:
            if not subscribable:
                return
            await again.wait()
            continue
        refused: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on, again, tg.cancel_scope)
            try:  # inside the group: an error out of it would come as a group, and end the connection
                async with client.listen(**flags, resource_subscriptions=uris) as events:
                    # no replay: what changed before this stream (since the catalog was first read,
                    # or between two streams) is read again
                    changed()
                    async for event in events:
                        if isinstance(event, ResourceUpdated):
                            watched.updated(event.uri)
                        else:
                            changed()
            except (MCPError, SubscriptionLost, ListenNotSupportedError) as exc:
                refused = exc
            tg.cancel_scope.cancel()
        if refused is not None:
            logger.info("server '%s': no change notifications (%s)", name, failure_text(refused))
            return
        if not again.is_set():
            return  # the server ended the stream itself


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
