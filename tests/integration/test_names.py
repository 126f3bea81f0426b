"""A server cannot take another server's exposed name through the separator (issue: `a` + `b-c`
against `a-b` + `c` with separator `-`)."""

from __future__ import annotations

import sys
from pathlib import Path

import mcp.types as types
import pytest

from tests.integration.conftest import cli, gateway, write_config

pytestmark = pytest.mark.anyio

# A server with one tool, named by its first argument, that answers with its own identity.
ONE_TOOL = """
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("one")
me, tool = sys.argv[1], sys.argv[2]


@server.tool(name=tool)
def answer() -> str:
    return f"{me} answered {tool}"


server.run()
"""


def servers(script: Path) -> dict[str, object]:
    def entry(me: str, tool: str) -> dict[str, object]:
        return {"command": sys.executable, "args": [str(script), me, tool], "jail": {"read_only": [str(script.parent)]}}

    # `a-b`'s `c` sorts after `a`'s `b-c`: with separator `-` the former would lose its name to the latter
    return {"a": entry("a", "b-c"), "a-b": entry("a-b", "c")}


async def test_a_separator_that_would_let_a_server_take_anothers_name_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "one.py"
    script.write_text(ONE_TOOL)
    hijack = write_config(tmp_path, servers(script), names={"separator": "-"})
    env = {"CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
    for command in ("check", "serve"):
        done = cli(env, command, "--config", str(hijack))
        assert done.returncode == 2, done.stderr
        assert "names.separator: separator '-' could be part of a server name" in done.stderr

    # control: with a separator no server name can hold, each name reaches its own server
    write_config(tmp_path, servers(script), names={"separator": "-_"})
    async with gateway(hijack, tmp_path / "state") as client:
        listed = sorted(t.name for t in (await client.list_tools()).tools if not t.name.startswith("cellblock"))
        assert listed == ["a-_b-c", "a-b-_c"]
        for name, who in (("a-_b-c", "a answered b-c"), ("a-b-_c", "a-b answered c")):
            result = await client.call_tool(name, {})
            assert isinstance(result.content[0], types.TextContent) and result.content[0].text == who
