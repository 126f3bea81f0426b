"""Servers start when used: after `cellblock wrap` and an approval, a client launch lists every
server's tools from the lock with no server started, and the first call starts that server alone.
The control: the same config set to `eager` starts them all with the gateway.

Real servers (the pinned npm and PyPI peers), the real `cellblock wrap`, `approve` and `serve`, the
gateway started as Claude Desktop starts it (HOME, USER, PATH). Which servers run is judged on the
host: the processes under the gateway whose command line names each server's program.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests import peers
from tests.integration.conftest import eventually, run_as_user

pytestmark = [pytest.mark.anyio, pytest.mark.peers, pytest.mark.jail, pytest.mark.slow]

# each server's program, as it appears in the command line of the process that runs it
PROGRAMS = {"time": "mcp-server-time", "fetch": "mcp-server-fetch", "everything": "server-everything"}


def _running(gateway: int) -> set[str]:
    """The servers with a process under `gateway` (its descendants, the jails' included)."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # gone meanwhile
    under, grew = {gateway}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in under} - under
        under |= more
        grew = bool(more)
    return {name for name, program in PROGRAMS.items() for pid in under - {gateway} if program in cmdlines[pid]}


def _gateway_pid() -> int:
    """The `cellblock serve` this test's client started (a child of this process)."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if parent == me and b"\0serve\0" in cmdline:
            return int(entry.name)
    raise LookupError("no `cellblock serve` started by this test")


async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


def _text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def wrapped(tmp_path_factory: pytest.TempPathFactory) -> tuple[StdioServerParameters, Path]:
    """A Claude Desktop config of three real servers, wrapped, met once and approved."""
    home = tmp_path_factory.mktemp("lazy") / "home"
    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    servers = {
        "time": {"command": peers.time_server()[0], "args": ["--local-timezone", "UTC"]},
        "fetch": {"command": peers.fetch_server()[0], "args": []},
        "everything": {"command": peers.everything()[0], "args": peers.everything()[1:]},
    }
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))
    client = {"HOME": str(home), "USER": os.environ.get("USER", "root"), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    wrapped = run_as_user(client, "wrap", str(client_config))
    assert wrapped.returncode == 0, wrapped.stderr
    config = home / ".config" / "cellblock" / "cellblock.yaml"
    assert "defaults: {start: lazy}" in config.read_text()
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=client)
    await _meet_and_approve(params)
    return params, config


async def _meet_and_approve(params: StdioServerParameters) -> None:
    """First contact: servers never seen start at once (lazy or not) and their catalogs are held."""
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        status = _text(await session.call_tool("cellblock__status", {}))
        assert all(name in status for name in PROGRAMS), status
    approved = run_as_user(params.env or {}, "approve", "--all")
    assert approved.returncode == 0, approved.stderr


async def test_after_wrap_a_client_launch_lists_every_server_and_starts_none_until_called(
    wrapped: tuple[StdioServerParameters, Path],
) -> None:
    params, _ = wrapped
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        for name in PROGRAMS:
            assert any(n.startswith(f"{name}__") for n in names), (name, sorted(names))
        gateway = _gateway_pid()
        assert _running(gateway) == set()

        result = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert not result.is_error, _text(result)
        assert '"timezone": "UTC"' in _text(result)
        # an eager server is started as soon as the client has its list: by the time this call has
        # started its server and been answered, every eager one would be running too
        assert _running(gateway) == {"time"}


async def test_an_eager_config_starts_every_server_with_the_gateway(
    wrapped: tuple[StdioServerParameters, Path],
) -> None:
    params, config = wrapped
    config.write_text(config.read_text().replace("defaults: {start: lazy}", "defaults: {start: eager}"))
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        await session.list_tools()
        gateway = _gateway_pid()
        await eventually(lambda: _running(gateway) == set(PROGRAMS), timeout=120)
