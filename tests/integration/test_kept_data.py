"""Nothing a server keeps is silently lost (docs/jail.md, "The home"; docs/wrap.md): a path its
command line names that does not exist yet is created where the user asked, and what it keeps in
its home survives a restart, in a home no other server can see.

Each test runs the keeper test server (tests/servers/keeper.py: a SQLite database at
`--db-path`, files under its home) through the real `cellblock wrap` or `cellblock serve`, with
a home of the test's own (HOME), as a client starts it (HOME, USER, PATH).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.integration.conftest import ROOT, cli

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

KEEPER = ROOT / "tests" / "servers" / "keeper.py"


def _text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def client_env(home: Path, tmp_path: Path) -> dict[str, str]:
    """What a client passes (HOME, USER, PATH), with a state and runtime directory of the test's own."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    return {
        "HOME": str(home),
        "USER": os.environ.get("USER", "root"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CELLBLOCK_STATE_DIR": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(run),
    }


async def test_a_wrapped_server_creates_its_database_where_its_command_line_says(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    client_config = home / "claude_desktop_config.json"
    servers = {
        # a database in the home itself (never shared whole), and one in a folder not made yet
        "sqlite": {"command": sys.executable, "args": [str(KEEPER), "--db-path", "~/test.db"]},
        "nested": {"command": sys.executable, "args": [str(KEEPER), "--db-path", "~/data/2026/kept.db"]},
    }
    client_config.write_text(json.dumps({"mcpServers": servers}))
    config = tmp_path / "cellblock.yaml"
    env = client_env(home, tmp_path)

    done = cli(env, "wrap", str(client_config), "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "read_write: ~/test.db (does not exist yet" in config.read_text()
    assert "read_write: ~/data/2026 (~/data/2026/kept.db does not exist yet" in config.read_text()
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)

    async def allow(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})

    async with Client(params, cache=None) as client:  # the first contact: the catalogs are held
        await client.list_tools()
    for name in ("sqlite", "nested"):
        approved = cli(env, "approve", name, "--config", str(config))
        assert approved.returncode == 0, approved.stderr
    async with Client(params, elicitation_callback=allow, cache=None) as client:
        for name in ("sqlite", "nested"):
            put = await client.call_tool(f"{name}__put", {"key": "answer", "value": f"kept by {name}"})
            assert not put.is_error, _text(put)
    # on the host, where the user asked, after the servers are gone
    for name, db in (("sqlite", home / "test.db"), ("nested", home / "data" / "2026" / "kept.db")):
        with sqlite3.connect(db) as read:
            assert read.execute("SELECT value FROM kept").fetchall() == [(f"kept by {name}",)]
