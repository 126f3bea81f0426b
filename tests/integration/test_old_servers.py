"""Old and partial servers behind `cellblock serve` and `cellblock review`: a server whose list of
one kind fails keeps its other kinds, is neither refused nor restarted, and the gateway's discovery
probe makes no old server print a dump.

Real old servers (pinned by `./dev peers`): a low-level server on the TypeScript SDK 1.x
(tests/servers/old_ts.cjs) that declares resources and answers resources/templates/list with
"Method not found", and a FastMCP server on the Python SDK 1.x (tests/servers/old_fastmcp.py), which
logs a pydantic dump for any request it cannot validate. Each control talks to the same server
with the SDK's own client, directly: the failure and the dump are real, so the gateway's handling
is what keeps them out.

The tests that judge by what `cellblock serve` writes to its log run it; the gateway after
`cellblock review` runs in memory (tests/harness.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from tests import peers
from tests.harness import build, connected
from tests.integration.conftest import cli, cli_env, eventually, gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]

PARTIAL = Path(__file__).resolve().parent.parent / "servers" / "partial.py"
# what the Python SDK 1.x logs about a request it cannot validate (the start of its dump)
DUMP = "validation error"
# what the gateway's log says when a server is refused, restarted or given up on
TROUBLE = ("restarting in", "failed:", "is restarted", "protocol error")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def entry(argv: list[str], **extra: Any) -> dict[str, Any]:
    jail = {"read_only": [str(peers.PEERS), str(peers.SERVERS)]}
    resources = {"default": "allow"}
    return {"command": argv[0], "args": argv[1:], "timeout": 30, "jail": jail, "resources": resources, **extra}


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_a_typescript_sdk_1_low_level_server_is_served_though_it_has_no_resource_templates(
    tmp_path: Path,
) -> None:
    # the control: the server itself, asked by the SDK's client, declares resources and refuses their templates
    argv = peers.old_ts_server()
    direct = StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(direct, mode="legacy") as client:
        assert client.server_capabilities.resources is not None
        with pytest.raises(MCPError, match="Method not found"):
            await client.list_resource_templates()
    log = tmp_path / "gateway.log"
    async with gateway(write_config(tmp_path, {"old": entry(argv)}), tmp_path / "state", stderr=log) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["old__echo"]
        assert text(await client.call_tool("old__echo", {"text": "hi"})) == "echo: hi"
        resources = (await client.list_resources()).resources
        assert [r.name for r in resources] == ["one"]
        assert (await client.read_resource(str(resources[0].uri))).contents
        assert (await client.list_resource_templates()).resource_templates == []
    said = log.read_text()
    assert "server 'old' did not list its resource templates (Method not found (-32601)" in said
    assert "[old stderr] old-ts server running on stdio" in said
    assert not [line for line in said.splitlines() if any(word in line for word in TROUBLE)], said


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_python_sdk_1_server_is_served_and_its_dump_about_the_probe_is_not_passed_on(
    tmp_path: Path, mode: str
) -> None:
    argv = peers.old_python_server()
    # the control: the SDK's client probes it as the gateway does, and the server writes its dump
    errlog = tmp_path / "direct.log"
    with errlog.open("w") as sink:
        async with Client(stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]), errlog=sink)) as client:
            assert (await client.call_tool("add", {"a": 2, "b": 3})).content
    assert errlog.read_text().count(DUMP) == 1 and len(errlog.read_text().splitlines()) > 20
    log = tmp_path / "gateway.log"
    async with gateway(
        write_config(tmp_path, {"py": entry(argv)}), tmp_path / "state", mode=mode, stderr=log
    ) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["py__add"]
        assert text(await client.call_tool("py__add", {"a": 2, "b": 3})) == "5"
        assert [str(r.uri) for r in (await client.list_resources()).resources] == ["cellblock://py/memo://today"]
    said = log.read_text()
    assert DUMP not in said and "Failed to validate request" not in said, said
    assert not [line for line in said.splitlines() if any(word in line for word in TROUBLE)], said


async def test_a_server_whose_resource_list_errors_keeps_its_tools_and_offers_its_resources_once_they_list(
    tmp_path: Path,
) -> None:
    log = tmp_path / "gateway.log"
    changes: list[anyio.Event] = [anyio.Event()]

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceListChangedNotification):
            changes[-1].set()

    async def changed() -> None:
        with anyio.fail_after(30):
            await changes[-1].wait()
        changes.append(anyio.Event())

    partial = entry([sys.executable, str(PARTIAL), "--down"])
    config = write_config(tmp_path, {"db": partial})
    async with gateway(config, tmp_path / "state", mode="legacy", stderr=log, message_handler=on_message) as client:
        assert text(await client.call_tool("db__echo", {"text": "hi"})) == "echo: hi"
        assert (await client.list_resources()).resources == []
        assert "server 'db' did not list its resources (error -32603: the database is down)" in log.read_text()
        # the database comes up, and the server does not say so: the gateway lists them again by
        # itself (after RETRY_FIRST seconds), offers them and tells the client its list changed
        await client.call_tool("db__database", {"state": "up", "quiet": True})
        await changed()
        uris = [str(r.uri) for r in (await client.list_resources()).resources]
        assert len(uris) == 1 and "row" in uris[0]
        assert "server 'db' lists its resources again" in log.read_text()
        # down again: the re-read fails and the last good list is kept
        await client.call_tool("db__database", {"state": "down"})
        await eventually(lambda: "its last list of them is kept" in log.read_text(), timeout=30)
        assert [str(r.uri) for r in (await client.list_resources()).resources] == uris
        assert text(await client.call_tool("db__echo", {"text": "still"})) == "echo: still"
    said = log.read_text()
    assert not [line for line in said.splitlines() if any(word in line for word in TROUBLE)], said


async def test_review_meets_both_old_servers_without_a_dump_or_a_refusal_and_the_gateway_serves_them(
    tmp_path: Path,
) -> None:
    review_first = {"enabled": True, "first": "review"}
    servers = {
        "ts": entry(peers.old_ts_server(), lock=review_first),
        "py": entry(peers.old_python_server(), lock=review_first),
    }
    config = write_config(tmp_path, servers)
    env = cli_env(tmp_path)
    walked = cli(env, "review", "--config", str(config), stdin="y\ny\n")
    assert walked.returncode == 0, walked.stderr
    assert "Approve the catalog of 'py'?" in walked.stdout and "Approve the catalog of 'ts'?" in walked.stdout
    # what the gateway and the servers said while they were met is in the meeting's log, not the terminal
    said = (tmp_path / "state" / "meeting.log").read_text()
    assert "server 'ts' did not list its resource templates" in said
    assert DUMP not in said + walked.stderr and "Failed to validate request" not in said + walked.stderr, said
    assert not [line for line in walked.stderr.splitlines() if any(word in line for word in TROUBLE)]
    async with connected(build(config, tmp_path / "state")) as client:
        assert text(await client.call_tool("py__add", {"a": 1, "b": 1})) == "2"
        assert text(await client.call_tool("ts__echo", {"text": "hi"})) == "echo: hi"
