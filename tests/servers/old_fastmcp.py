"""A server on the Python SDK 1.x (`mcp<2`), written as servers before 2026-07-28 are: FastMCP
with a tool `add(a, b)` and a resource `memo://today`.

Run with the Python of `.peers/py1` (`tests.peers.old_python_server`), never the gateway's: that
one has the SDK 2.x, where FastMCP is gone.
"""

from mcp.server.fastmcp import FastMCP

server = FastMCP("old-py")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.resource("memo://today")
def today() -> str:
    """Today's memo."""
    return "buy milk"


if __name__ == "__main__":
    server.run()
