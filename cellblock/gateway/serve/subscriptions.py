"""Resource subscriptions: what clients subscribe to, routed to the servers, and their updates back.

A handshake-era client subscribes with `resources/subscribe` (and leaves with
`resources/unsubscribe`); a 2026-07-28 client names the resources in the filter of its
`subscriptions/listen` stream, for as long as the stream lasts. Either way the exposed URI is
routed and judged as a read would be (`Reads.watched`: the lock, and a policy that denies the read
denies the subscription), and the server is subscribed once however many clients ask
(`downstream/watch.py`). An update comes back under the URI the client subscribed to, to the
handshake-era subscribers of that URI and on the listen streams that name it; an update of a
resource the lock now holds is not passed on, since the client could not read it either.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp.shared.exceptions import MCPError

from cellblock.gateway.downstream.rounds import DownstreamError
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.watch import Watched
from cellblock.gateway.serve.listen import Listen
from cellblock.gateway.serve.listeners import Listeners
from cellblock.gateway.serve.reads import Reads
from cellblock.gateway.serve.tasks import Tasks

__all__ = ["Subscriptions"]

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]


class Subscriptions:
    """The SDK handlers for resources/subscribe, resources/unsubscribe and subscriptions/listen."""

    def __init__(
        self,
        downstreams: dict[str, Downstream],
        reads: Reads,  # a subscription is routed and judged as a read is
        listeners: Listeners,
        bus: InMemorySubscriptionBus,  # what the 2026-07-28 listen streams hear
        client_tasks: Tasks,
        tasks: Callable[[], anyio.abc.TaskGroup],
    ) -> None:
        self.downstreams, self.reads, self.listeners, self.bus, self.tasks = downstreams, reads, listeners, bus, tasks
        self._listen = Listen(bus, client_tasks)
        # (server, URI) -> the exposed URIs clients subscribed to it under, each with its subscribers
        self._names: dict[tuple[str, str], Counter[str]] = {}
        # exposed URI -> what it was routed to, and the handshake-era listeners on it (`Listeners.key`)
        self._handshake: dict[str, tuple[tuple[str, str], set[str]]] = {}
        for ds in downstreams.values():
            ds.watched.updated = functools.partial(self.updated, ds)

    async def subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        exposed, key = str(params.uri), Listeners.key(ctx)
        known = self._handshake.get(exposed)
        if known is None or key not in known[1]:
            target = known[0] if known is not None else await self.reads.watched(exposed)
            await self._hold(target, exposed)
            self._handshake.setdefault(exposed, (target, set()))[1].add(key)
            self.listeners.met(ctx)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        exposed, key = str(params.uri), Listeners.key(ctx)
        known = self._handshake.get(exposed)
        if known is not None and key in known[1]:
            known[1].discard(key)
            if not known[1]:
                del self._handshake[exposed]
            await self._release(known[0], exposed)
        return types.EmptyResult()

    async def listen(self, ctx: Ctx, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        """A 2026-07-28 listen stream; a resource it may not watch is left out of what the
        acknowledgement says is honoured, and logged."""
        wanted = params.notifications.resource_subscriptions or []
        held: list[tuple[tuple[str, str], str]] = []
        try:
            for exposed in dict.fromkeys(wanted):
                try:
                    target = await self.reads.watched(exposed)
                    await self._hold(target, exposed)
                except MCPError as exc:
                    logger.info("subscriptions/listen: %s is not watched: %s", exposed, exc.message)
                    continue
                held.append((target, exposed))
            honoured = [exposed for _, exposed in held]
            if honoured != list(wanted):
                notifications = params.notifications.model_copy(update={"resource_subscriptions": honoured or None})
                params = params.model_copy(update={"notifications": notifications})
            return await self._listen(ctx, params)
        finally:
            with anyio.CancelScope(shield=True):
                for target, exposed in held:
                    await self._release(target, exposed)

    def updated(self, ds: Downstream, uri: str) -> None:
        """Server `ds` says its resource `uri` changed: tell whoever subscribed to it."""
        names = self._names.get((ds.name, uri))
        if not names:
            return  # nobody asked (or nobody any more)
        if self.reads.holds(ds.name, uri):
            logger.info("server '%s': an update of %s, which the lock holds, is not passed on", ds.name, uri)
            return
        tasks = self.tasks()
        for exposed in names:
            tasks.start_soon(self.bus.publish, ResourceUpdated(exposed))
            known = self._handshake.get(exposed)
            if known is not None:
                only = frozenset(known[1])
                self.listeners.notify(tasks, "notifications/resources/updated", {"uri": exposed}, only=only)

    async def _hold(self, target: tuple[str, str], exposed: str) -> None:
        """One more subscriber of `target` under `exposed`: the server is subscribed at the first.

        Raises:
            MCPError: the server offers no subscriptions, or refused this one.
        """
        server, uri = target
        ds = self.downstreams[server]
        try:
            client = await ds.ready_client()
        except DownstreamError as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
        if not Watched.offered(client):
            raise MCPError(types.INVALID_PARAMS, f"server '{server}' offers no resource subscriptions")
        if target not in self._names:
            await ds.watched.add(uri)
        self._names.setdefault(target, Counter())[exposed] += 1

    async def _release(self, target: tuple[str, str], exposed: str) -> None:
        names = self._names.get(target)
        if names is None:
            return
        names[exposed] -= 1
        if names[exposed] <= 0:
            del names[exposed]
        if not names:
            del self._names[target]
            await self.downstreams[target[0]].watched.remove(target[1])
