"""How a local downstream server is started: the one place a jail will plug in.

Every local server is launched from the plan this module returns. Today the plan runs the
server's command directly, unjailed; the sandbox package will turn the same config into a
bubblewrap (Linux) or sandbox-exec (macOS) command line here, and nowhere else.
"""

from __future__ import annotations

from mcp.client.stdio import StdioServerParameters

from cellblock.gateway.config import LocalServer

__all__ = ["launch_plan"]


def launch_plan(server: LocalServer) -> StdioServerParameters:
    """The command line, environment and working directory that start `server`."""
    return StdioServerParameters(
        command=server.command,
        args=list(server.args),
        # merged by the SDK over its allow-listed default environment (PATH, HOME, ...), so the
        # gateway's own variables (tokens in the user's shell) do not reach the server
        env=dict(server.env),
        cwd=server.cwd,
    )
