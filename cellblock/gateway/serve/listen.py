"""A 2026-07-28 `subscriptions/listen` stream: one request, whose answer is the notifications the
client asked for, for as long as it keeps the request open.

The SDK's `ListenHandler` carries the core kinds only (list changes, resource updates). The
gateway's stream also carries the tasks extension's `notifications/tasks` for the task ids its
filter names (`serve/tasks.py`), which the acknowledgement must name too, so the stream is served
here: the acknowledgement first, then each event the filter admits, in order. Each stream's
backlog is bounded: a client that stops reading has its stream ended (it listens again and
reads afresh, as after any end: nothing is replayed).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import SUBSCRIPTION_ID_META_KEY, InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ServerEvent, event_matches, event_to_notification
from pydantic import BaseModel

from cellblock.gateway.serve.tasks import Tasks

__all__ = ["Listen"]

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]
MAX_STREAMS = 1024
MAX_BACKLOG = 1024


class _Notification(BaseModel):
    """A notification the SDK has no model of (`notifications/tasks`), as the session sends one."""

    method: str
    params: dict[str, Any]


class Listen:
    """Serves `subscriptions/listen`; see the module docstring."""

    def __init__(self, bus: InMemorySubscriptionBus, tasks: Tasks) -> None:
        self.bus, self.tasks = bus, tasks
        self._streams = 0

    async def __call__(
        self, ctx: Ctx, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        stream = ctx.request_id
        if stream is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen requires a request id")
        if self._streams >= MAX_STREAMS:
            raise MCPError(types.INTERNAL_ERROR, "Subscription limit reached")
        wanted = params.notifications
        task_ids = self.tasks.watchable(ctx, (wanted.model_extra or {}).get("taskIds"))
        honored = types.SubscriptionFilter(
            tools_list_changed=True if wanted.tools_list_changed else None,
            prompts_list_changed=True if wanted.prompts_list_changed else None,
            resources_list_changed=True if wanted.resources_list_changed else None,
            resource_subscriptions=list(wanted.resource_subscriptions or ()) or None,
            **({"taskIds": task_ids} if task_ids else {}),
        )
        uris = frozenset(honored.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: stream}
        send, receive = anyio.create_memory_object_stream[BaseModel](MAX_BACKLOG)

        def deliver(notification: BaseModel) -> None:
            try:
                send.send_nowait(notification)
            except anyio.WouldBlock:
                logger.warning("listen stream %r: the client is not reading; the stream is ended", stream)
                send.close()
            except anyio.ClosedResourceError:
                pass

        def event(item: ServerEvent) -> None:
            if event_matches(honored, uris, item):
                deliver(event_to_notification(item, meta))

        def task(view: dict[str, Any]) -> None:
            deliver(_Notification(method="notifications/tasks", params={**view, "_meta": meta}))

        # watched before the acknowledgement is sent, so nothing that happens meanwhile is lost
        unwatch = [self.bus.subscribe(event), *(self.tasks.watch(i, task) for i in task_ids)]
        self._streams += 1
        try:
            ack = types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=meta)
            await ctx.session.send_notification(types.SubscriptionsAcknowledgedNotification(params=ack), stream)
            async for notification in receive:
                await ctx.session.send_notification(cast(types.ServerNotification, notification), stream)
        finally:
            self._streams -= 1
            for undo in unwatch:
                undo()
            send.close()
            receive.close()
        return types.SubscriptionsListenResult(_meta=meta)
