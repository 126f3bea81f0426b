"""The SDK's server the client talks to: each request's handler registered, and the four lists
answered from the catalog the client is shown (tools through search's view of it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mcp.types as types
from mcp.server.apps import EXTENSION_ID as APPS_EXTENSION
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from cellblock import __version__
from cellblock.gateway.serve.callhandler import CallHandler
from cellblock.gateway.serve.handshake_tasks import HandshakeTasks
from cellblock.gateway.serve.keeper import CatalogKeeper
from cellblock.gateway.serve.listeners import ChangingServer, Listeners
from cellblock.gateway.serve.logs import ClientLogs
from cellblock.gateway.serve.reads import Reads
from cellblock.gateway.serve.search import Search, client_of
from cellblock.gateway.serve.subscriptions import Subscriptions
from cellblock.gateway.serve.tasks import Tasks

__all__ = ["Lists", "upstream_server"]

Ctx = ServerRequestContext[Any, Any]


@dataclass
class Lists:
    """tools/list, prompts/list, resources/list and resources/templates/list (the fast path
    answers the same from the same catalog: `FastPath._take_list`)."""

    keeper: CatalogKeeper
    search: Search
    listeners: Listeners  # each list is a request: the client's connection is met

    async def tools(self, ctx: Ctx, params: Any) -> types.ListToolsResult:
        self.listeners.met(ctx)
        catalog = self.search.view(await self.keeper.client_catalog(), client_of(ctx))
        return types.ListToolsResult(tools=catalog.listed_tools(ctx.protocol_version))

    async def prompts(self, ctx: Ctx, params: Any) -> types.ListPromptsResult:
        self.listeners.met(ctx)
        return types.ListPromptsResult(prompts=list((await self.keeper.client_catalog()).prompts))

    async def resources(self, ctx: Ctx, params: Any) -> types.ListResourcesResult:
        self.listeners.met(ctx)
        return types.ListResourcesResult(resources=list((await self.keeper.client_catalog()).resources))

    async def templates(self, ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
        self.listeners.met(ctx)
        return types.ListResourceTemplatesResult(
            resource_templates=list((await self.keeper.client_catalog()).templates)
        )


def upstream_server(
    lists: Lists,
    reads: Reads,
    subscriptions: Subscriptions,
    calls: CallHandler,
    logs: ClientLogs,
    tasks: Tasks,
    handshake_tasks: HandshakeTasks,
) -> Server[Any]:
    """The SDK's low-level server with every handler the gateway answers in."""
    server: Server[Any] = ChangingServer(
        "cellblock",
        version=__version__,
        on_list_tools=lists.tools,
        on_list_prompts=lists.prompts,
        on_get_prompt=reads.get_prompt,
        on_list_resources=lists.resources,
        on_list_resource_templates=lists.templates,
        on_read_resource=reads.read_resource,
        on_completion=reads.complete,
        on_subscribe_resource=subscriptions.subscribe,
        on_unsubscribe_resource=subscriptions.unsubscribe,
        on_subscriptions_listen=subscriptions.listen,
    )
    # registered directly: a task is a result the SDK has no model of (typed as a dict)
    server.add_request_handler("tools/call", types.CallToolRequestParams, calls.handle)
    # registered directly: the constructor argument warns that logging is deprecated in 2026
    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, logs.set_level)
    tasks.serve(server)  # a call may be answered with a task
    server.middleware = []  # no tracing span per message on the hot path
    handshake_tasks.serve(server)  # ...and in 2025-11-25 too (its middleware answers those calls)
    server.extensions[APPS_EXTENSION] = {}  # the servers' apps are passed through (docs/apps.md)
    return server
