"""`cellblock wrap` end to end: a Claude-Desktop-style config of real servers, wrapped, started
as the client would start it, every tool seen through the gateway, each server jailed; then
`unwrap` restores the file byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keyring
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests import peers
from tests.integration.conftest import cli

pytestmark = [pytest.mark.anyio, pytest.mark.peers, pytest.mark.jail]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


TOKEN = "ghp_" + "Zq8" * 12  # the shape of a GitHub token: wrap must move it to the keyring


async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


async def test_wrap_a_claude_desktop_config_of_real_servers_then_unwrap(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("wrapped and jailed\n")
    node_fs, node_ev = peers.filesystem(project), peers.everything()
    client_config = tmp_path / "claude_desktop_config.json"
    original = json.dumps(
        {
            "globalShortcut": "Ctrl+Space",
            "mcpServers": {
                "filesystem": {"command": node_fs[0], "args": node_fs[1:]},
                "everything": {"command": node_ev[0], "args": node_ev[1:], "env": {"EVERYTHING_TOKEN": TOKEN}},
                "Time Zones": {"command": peers.time_server()[0], "args": ["--local-timezone", "UTC"]},
            },
        },
        indent=2,
    )
    client_config.write_text(original)
    config = tmp_path / "cellblock.yaml"
    # the session's runtime dir is kept from every server, so it must not hold the project
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {**keyring_env, "CELLBLOCK_STATE_DIR": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(run)}

    dry = cli(env, "wrap", str(client_config), "--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert client_config.read_text() == original and not config.exists()
    assert TOKEN not in dry.stdout + dry.stderr

    done = cli(env, "wrap", str(client_config), "--config", str(config))
    assert done.returncode == 0, done.stderr
    wrapped = json.loads(client_config.read_text())
    assert wrapped["globalShortcut"] == "Ctrl+Space"
    assert list(wrapped["mcpServers"]) == ["cellblock"]
    assert TOKEN not in config.read_text() + client_config.read_text()
    assert TOKEN not in (tmp_path / "claude_desktop_config.json.bak").read_text()
    assert keyring.get_password("cellblock", "everything-everything-token") == TOKEN

    again = cli(env, "wrap", str(client_config), "--config", str(config))
    assert again.returncode == 0 and "already wrapped" in again.stderr

    # the client starts exactly what the entry says; the catalogs are held until approved
    entry = wrapped["mcpServers"]["cellblock"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
    servers = ("filesystem", "everything", "time-zones")
    async with Client(params, elicitation_callback=allow_once, cache=None) as client:
        # the status tool only, which says what is held and what to run
        assert [t.name for t in (await client.list_tools()).tools] == ["cellblock__status", "cellblock__review"]
    for name in servers:
        approved = cli(env, "approve", name, "--config", str(config))
        assert approved.returncode == 0, approved.stderr
    async with Client(params, elicitation_callback=allow_once, cache=None) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        for name in servers:
            assert any(n.startswith(f"{name}__") for n in names), (name, sorted(names))
        read = await client.call_tool("filesystem__read_text_file", {"path": str(project / "notes.txt")})
        assert "wrapped and jailed" in read.content[0].text  # type: ignore[union-attr]
        outside = await client.call_tool("filesystem__read_text_file", {"path": str(tmp_path / "cellblock.yaml")})
        assert outside.is_error
    shown = cli(env, "show", "--config", str(config), "--json")
    jails = {item["name"]: item["jail"] for item in json.loads(shown.stdout)}
    assert jails == dict.fromkeys(servers, "bubblewrap")

    restored = cli(env, "unwrap", str(client_config), "--secrets", "--config", str(config))
    assert restored.returncode == 0, restored.stderr
    assert client_config.read_text() == original
    assert not (tmp_path / "claude_desktop_config.json.bak").exists()
