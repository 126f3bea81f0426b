"""`cellblock demo`: the gateway on built-in demo servers, driven by the SDK's own client.

It starts `cellblock serve` as a client would (a child process on stdio), lists the one catalog,
and calls tools on two different servers through it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib.resources import files

import mcp.types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters

__all__ = ["run_demo"]


def _say(text: str = "") -> None:
    print(text, flush=True)


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def run_demo() -> int:
    config = files("cellblock.demo").joinpath("demo.yaml")
    with tempfile.TemporaryDirectory(prefix="cellblock-demo-") as state:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cellblock.gateway.cli", "serve", "--config", str(config)],
            env={
                "CELLBLOCK_PYTHON": sys.executable,
                "CELLBLOCK_DEMO": str(config.parent),
                "CELLBLOCK_STATE_DIR": state,
                "PYTHONUNBUFFERED": "1",
            },
        )
        _say("Cellblock demo: one MCP server in front of two (notes, clock).")
        _say(f"  client -> cellblock serve --config {config}")
        _say("             ├── [jail] notes  (python notes.py)")
        _say("             └── [jail] clock  (python clock.py, started on first use)")
        _say()
        async with Client(params, mode="auto", cache=None) as client:
            _say(f"Connected over stdio, protocol {client.protocol_version}.")
            tools = (await client.list_tools()).tools
            _say(f"\nThe one catalog ({len(tools)} tools, named <server>__<tool>):")
            for tool in tools:
                _say(f"  {tool.name:<24} {tool.description or tool.title or ''}".rstrip())

            _say("\nCalls, each routed to the server that owns the tool:")
            added = await client.call_tool("notes__add_note", {"title": "hello", "text": "Cellblock routes me."})
            _say(f"  notes__add_note  -> {_text(added)}")
            now = await client.call_tool("clock__now", {"timezone": "UTC"})
            _say(f"  clock__now       -> {_text(now)}")

            async def progress(value: float, total: float | None, message: str | None) -> None:
                _say(f"    progress {value:g}/{total:g}" if total else f"    progress {value:g}")

            done = await client.call_tool("clock__countdown", {"seconds": 2}, progress_callback=progress)
            _say(f"  clock__countdown -> {_text(done)}")

            resources = (await client.list_resources()).resources
            if resources:
                uri = str(resources[0].uri)
                read = await client.read_resource(uri)
                body = read.contents[0]
                text = body.text if isinstance(body, types.TextResourceContents) else "(binary)"
                _say(f"\nResource {uri}\n  (rewritten so the read routes back to 'notes') -> {text!r}")
        _say("\nDone. Servers in this version run unjailed; see README for what is and is not enforced.")
    return 0


if __name__ == "__main__":
    import anyio

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(anyio.run(run_demo))
