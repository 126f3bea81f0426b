"""FastMCP's proxy in front of stdio servers, served on stdio: a peer the benchmark compares with.

Run by the Python of `.bench/fastmcp` (FastMCP is not a dependency of Cellblock), as
`fastmcp_proxy.py SERVERS_JSON` where SERVERS_JSON maps a server name to its argv. Each server gets
the documented `create_proxy(StdioTransport(...))` with FastMCP's defaults (the transport keeps its
subprocess alive between sessions). One server is served as it is (tool names unchanged); several
are each mounted under their name (`<name>_echo`). Not an `MCPConfig` target: FastMCP opens a fresh
backend session per request for it, which spawns every server again for each call (32 concurrent
calls to 4 servers ran ~200 processes and timed out).
"""

from __future__ import annotations

import json
import sys

from fastmcp import FastMCP
from fastmcp.client.transports import StdioTransport
from fastmcp.server import create_proxy


def _proxy(argv: list[str]) -> FastMCP:
    return create_proxy(StdioTransport(command=argv[0], args=argv[1:]), name="fastmcp-proxy")


def main() -> None:
    servers: dict[str, list[str]] = json.loads(sys.argv[1])
    if len(servers) == 1:
        (argv,) = servers.values()
        server = _proxy(argv)
    else:
        server = FastMCP("fastmcp-proxy")
        for name, argv in servers.items():
            server.mount(_proxy(argv), namespace=name)
    server.run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
