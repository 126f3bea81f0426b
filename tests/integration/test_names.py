"""A server cannot take another server's exposed name through the separator (issue: `a` + `b-c`
against `a-b` + `c` with separator `-`). `cellblock check` and `serve` refuse it as they start; the
control's gateway runs in memory (tests/harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.harness import build, connected
from tests.integration.conftest import PROBE, cli, write_config

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
    async with connected(build(hijack, tmp_path / "state")) as client:
        listed = sorted(t.name for t in (await client.list_tools()).tools if not t.name.startswith("cellblock"))
        assert listed == ["a-_b-c", "a-b-_c"]
        for name, who in (("a-_b-c", "a answered b-c"), ("a-b-_c", "a-b answered c")):
            result = await client.call_tool(name, {})
            assert isinstance(result.content[0], types.TextContent) and result.content[0].text == who


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_server_without_a_prefix_is_offered_and_routed_under_its_own_names(tmp_path: Path, mode: str) -> None:
    def probe(*args: str, prefix: bool = True) -> dict[str, object]:
        entry: dict[str, object] = {"command": sys.executable, "args": [str(PROBE), *args]}
        return {**entry, "jail": {"read_only": [str(PROBE.parent)]}, "prefix": prefix}

    config = write_config(tmp_path, {"p": probe(prefix=False), "q": probe("--name", "q")})
    async with connected(build(config, tmp_path / "state"), mode=mode) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"echo", "link", "files_read", "q__echo", "q__files_read"} <= tools
        # `files.read` wanted `files_read` too, which p's own `files_read` keeps: it takes p's prefix
        assert [name for name in tools if name.startswith("p__")] == ["p__files_read"]
        echoed = await client.call_tool("echo", {"message": "hi"})
        assert not echoed.is_error and "hi" in str(echoed.content[0])

        resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert resources == {"probe://static/readme", "cellblock://q/probe://static/readme"}
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert templates == {"probe://item/{id}", "cellblock://q/probe://item/{id}"}
        read = await client.read_resource("probe://item/7")
        assert str(read.contents[0].uri) == "probe://item/7" and "item 7" in str(read.contents[0])
        via_q = await client.read_resource("cellblock://q/probe://item/8")
        assert str(via_q.contents[0].uri) == "cellblock://q/probe://item/8"
        with pytest.raises(MCPError, match="not one a server without a prefix lists"):
            await client.read_resource("nowhere://x")

        # links in a result: as they are where they route back to p alone, wrapped where they do not
        for uri, shown in (("probe://item/3", "probe://item/3"), ("nowhere://x", "cellblock://p/nowhere://x")):
            linked = await client.call_tool("link", {"uri": uri})
            assert [str(getattr(c, "uri", None) or c.resource.uri) for c in linked.content] == [shown, shown]  # type: ignore[union-attr]
        linked = await client.call_tool("q__link", {"uri": "probe://item/3"})
        assert str(linked.content[0].uri) == "cellblock://q/probe://item/3"  # type: ignore[union-attr]
