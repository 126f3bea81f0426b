"""Partial: a server whose resource list needs a database that may be down (the SDK's low-level
server, both eras).

Resource `row://1` while the database is up; while it is down, `resources/list` answers an error
of the server's own ("the database is down"). Tools:

- ``echo(text)``: `text` back, whatever the database does;
- ``database(state, quiet)``: the database goes `up` or `down`, and the resource list is announced
  as changed, unless `quiet`.

Run as ``python tests/servers/partial.py``; ``--down`` starts with the database down.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourcesListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Ctx = ServerRequestContext[Any, Any]
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}}
STATE = {
    "type": "object",
    "properties": {"state": {"type": "string", "enum": ["up", "down"]}, "quiet": {"type": "boolean"}},
}

bus = InMemorySubscriptionBus()
database = {"up": "--down" not in sys.argv}


async def list_resources(ctx: Ctx, params: Any) -> types.ListResourcesResult:
    if not database["up"]:
        raise MCPError(types.INTERNAL_ERROR, "the database is down")
    return types.ListResourcesResult(resources=[types.Resource(uri="row://1", name="row 1")])


async def list_templates(ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[])


async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=str(params.uri), text="the first row")])


async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[types.Tool(name="echo", input_schema=TEXT), types.Tool(name="database", input_schema=STATE)]
    )


async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    if params.name == "database":
        database["up"] = arguments.get("state") == "up"
        if arguments.get("quiet"):
            pass
        elif ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await bus.publish(ResourcesListChanged())
        else:
            await ctx.session.send_resource_list_changed()
        text = f"the database is {arguments.get('state')}"
    else:
        text = f"echo: {arguments.get('text')}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server: Server[Any] = Server(
    "partial",
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_subscriptions_listen=ListenHandler(bus),
    on_list_tools=list_tools,
    on_call_tool=call_tool,
)


async def main() -> None:
    async with stdio_server() as streams:
        await server.run(*streams, server.create_initialization_options(NotificationOptions(resources_changed=True)))


if __name__ == "__main__":
    anyio.run(main)
