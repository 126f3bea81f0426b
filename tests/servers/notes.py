"""Notes: a server whose resources can be subscribed to, in both eras (the SDK's low-level server).

Resources `note://1`, `note://2` and `note://3`. Tools:

- ``touch(uri)``: the note at `uri` changed: a handshake-era subscriber is sent
  `notifications/resources/updated`, and the event goes on the `subscriptions/listen` bus;
- ``watched()``: the URIs subscribed to now, both eras together, sorted and comma-separated; it
  may run as a task (`execution.taskSupport: optional`), which the SDK lists in the handshake era
  only;
- ``retitle(uri)``: the note at `uri` is listed under another title from now on, and the resource
  list is announced as changed (a change the gateway's lock holds).

Run as ``python tests/servers/notes.py``; the gateway's `protocol:` decides the era. With
``--retitle-at-start``, `note://1` is retitled while the client first reads the catalog: after it
has listed the resources, when it lists their templates.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourcesListChanged, ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Ctx = ServerRequestContext[Any, Any]
NOTES = {"note://1": "the first note", "note://2": "the second note", "note://3": "the third note"}
TITLES = {uri: uri for uri in NOTES}
SCHEMA = {"type": "object", "properties": {"uri": {"type": "string"}}}

bus = InMemorySubscriptionBus()
listening = ListenHandler(bus)
subscribed: dict[str, ServerSession] = {}  # handshake era: URI -> the session that subscribed
listened: list[list[str]] = []  # 2026-07-28: the URIs of each open listen stream


async def list_resources(ctx: Ctx, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(uri=uri, name=TITLES[uri]) for uri in NOTES])


async def list_templates(ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
    if "--retitle-at-start" in sys.argv and TITLES["note://1"] == "note://1":
        await retitle(ctx, "note://1")
    return types.ListResourceTemplatesResult(resource_templates=[])


async def retitle(ctx: Ctx, uri: str) -> None:
    TITLES[uri] = f"{uri}, retitled"
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await bus.publish(ResourcesListChanged())
    else:
        await ctx.session.send_resource_list_changed()


async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents = [types.TextResourceContents(uri=uri, text=NOTES.get(uri, "no such note"))]
    # a server that lets anyone cache its notes for a minute (the gateway must not pass that on)
    return types.ReadResourceResult(contents=contents, ttl_ms=60_000, cache_scope="public")


async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscribed[str(params.uri)] = ctx.session
    return types.EmptyResult()


async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscribed.pop(str(params.uri), None)
    return types.EmptyResult()


async def listen(ctx: Ctx, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
    uris = list(params.notifications.resource_subscriptions or [])
    listened.append(uris)
    try:
        return await listening(ctx, params)
    finally:
        listened.remove(uris)


async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(name="touch", input_schema=SCHEMA),
            types.Tool(
                name="watched",
                input_schema={"type": "object", "properties": {}},
                execution=types.ToolExecution(task_support="optional"),
            ),
            types.Tool(name="retitle", input_schema=SCHEMA),
        ]
    )


async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "touch":
        uri = str((params.arguments or {}).get("uri"))
        session = subscribed.get(uri)
        if session is not None:
            await session.send_resource_updated(uri)
        await bus.publish(ResourceUpdated(uri))
        text = f"touched {uri}"
    elif params.name == "retitle":
        uri = str((params.arguments or {}).get("uri"))
        await retitle(ctx, uri)
        text = f"retitled {uri}"
    else:
        text = ",".join(sorted({*subscribed, *(uri for uris in listened for uri in uris)}))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    server: Server[Any] = Server(
        "notes",
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=listen,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    options = server.create_initialization_options(NotificationOptions(resources_changed=True))
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


if __name__ == "__main__":
    anyio.run(main)
