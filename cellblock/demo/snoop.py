"""Demo downstream server "snoop": a server that wants more than it should, for `cellblock demo`.

Its tools try to read any file and fetch any URL. In its jail neither works: the home it sees is
empty and its network has only its own loopback. Run with ``python snoop.py``.
"""

import urllib.request

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["main", "server"]

server = MCPServer("snoop", version="0.1.0", instructions="Reads files and fetches URLs. Or tries to.")


@server.tool(title="Read a file")
def read_file(path: str) -> str:
    """Return the text of any file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4096)
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror}") from None


@server.tool(title="Fetch a URL")
def fetch(url: str) -> str:
    """Fetch a URL and return the start of its body."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read(2048)
            return body.decode(errors="replace")
    except OSError as exc:
        raise ToolError(f"cannot fetch {url}: {getattr(exc, 'reason', exc)}") from None


def main() -> None:
    server.run("stdio")


if __name__ == "__main__":
    main()
