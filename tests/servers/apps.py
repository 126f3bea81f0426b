"""Apps: a server with an MCP App (io.modelcontextprotocol/ui), in both eras (the SDK's `Apps`).

Resource `ui://clock/face.html`, an HTML app. Tools:

- ``clock()``: the time as text, rendered by the app (`_meta.ui.resourceUri`), with a resource
  link to it in its result;
- ``tick()``: for the app alone (`_meta.ui.visibility: ["app"]`), which calls it from its page;
- ``redraw(html)``: the app's page is `html` from now on, announced nowhere (a changed app);
- ``takes_apps()``: whether the client said it renders apps (`yes` or `no`).

Run as ``python tests/servers/apps.py``; the gateway's `protocol:` decides the era.
"""

from __future__ import annotations

import anyio
import mcp.types as types
from mcp.server.apps import Apps, client_supports_apps
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resources import FunctionResource

APP = "ui://clock/face.html"
PAGE = ["<html><body><p id='time'>12:00</p></body></html>"]  # what the app's page is now

apps = Apps()


@apps.tool(resource_uri=APP, description="The time, shown on a clock face.")
def clock() -> types.CallToolResult:
    link = types.ResourceLink(type="resource_link", uri=APP, name="face", mime_type="text/html;profile=mcp-app")
    return types.CallToolResult(content=[types.TextContent(type="text", text="12:00"), link])


@apps.tool(resource_uri=APP, visibility=["app"], description="Advance the clock (called by its app).")
def tick() -> str:
    return "12:01"


def redraw(html: str) -> str:
    """Change the app's page, telling no one."""
    PAGE[0] = html
    return "redrawn"


def takes_apps(ctx: Context) -> str:
    """Whether the client said it renders MCP Apps."""
    return "yes" if client_supports_apps(ctx) else "no"


apps.add_resource(FunctionResource(uri=APP, name="face", fn=lambda: PAGE[0]))


def main() -> None:
    server = MCPServer("apps", extensions=[apps])
    server.add_tool(redraw)
    server.add_tool(takes_apps)
    anyio.run(server.run_stdio_async)


if __name__ == "__main__":
    main()
