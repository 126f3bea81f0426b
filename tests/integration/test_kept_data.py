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

from tests.integration.conftest import ROOT, cli, gateway, write_config

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


def keeper(**jail: Any) -> dict[str, Any]:
    """The keeper server, jailed with `jail` besides a read-only share of its own folder."""
    shared = [str(KEEPER.parent), *jail.pop("read_only", [])]
    return {"command": sys.executable, "args": [str(KEEPER)], "jail": {"read_only": shared, **jail}}


def kept_at(home: Path, server: str) -> Path:
    """Where `server`'s kept home is on the host: in Cellblock's data directory of that home."""
    return home / ".local" / "share" / "cellblock" / "homes" / server


async def test_what_a_server_keeps_in_its_home_survives_a_restart_and_a_throwaway_home_loses_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = client_env(home, tmp_path)
    config = write_config(tmp_path, {"kept": keeper(), "thrown": keeper(home="throwaway")})
    # a path of its own choosing in its home (one a call named would be asked about: test_shared_paths.py)
    saved = {"path": ".config/keeper/settings.json", "text": '{"theme": "dark"}'}
    async with gateway(config, tmp_path / "state", env=env) as client:
        for name in ("kept", "thrown"):
            done = await client.call_tool(f"{name}__save", saved)
            assert not done.is_error, _text(done)
    # on the host: in the server's own directory, 0700, not in the user's ~/.config
    on_host = kept_at(home, "kept") / ".config" / "keeper" / "settings.json"
    assert on_host.read_text() == saved["text"]
    assert kept_at(home, "kept").stat().st_mode & 0o777 == 0o700
    assert not (home / ".config").exists() and not kept_at(home, "thrown").exists()
    async with gateway(config, tmp_path / "state", env=env) as client:  # the gateway started again
        again = await client.call_tool("kept__load", {"path": saved["path"]})
        assert not again.is_error and _text(again) == saved["text"]
        # the control: a throw-away home is empty at each start
        lost = await client.call_tool("thrown__load", {"path": saved["path"]})
        assert lost.is_error and "No such file" in _text(lost)


def _jailed_pid_with(variable: str) -> int:
    """A process of a jail (in a mount namespace not the host's) whose environment holds `variable`
    (set in the server's config; bwrap, outside, has it too)."""
    host = os.readlink("/proc/self/ns/mnt")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                held = variable.encode() in (entry / "environ").read_bytes().split(b"\0")
                if held and os.readlink(entry / "ns" / "mnt") != host:
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no jailed process has {variable}")


async def test_a_server_cannot_read_another_servers_kept_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".local" / "share").mkdir(parents=True)
    env = client_env(home, tmp_path)
    servers = {
        "owner": keeper() | {"env": {"KEEPER_ROLE": "owner"}},
        # the thief is granted ~/.local, which holds Cellblock's data directory and every kept home
        "thief": keeper(read_only=[str(home / ".local")]),
        "unjailed": {"command": sys.executable, "args": [str(KEEPER)], "jail": False},
    }
    config = write_config(tmp_path, servers)
    secret = "the owner's own settings"
    async with gateway(config, tmp_path / "state", env=env) as client:
        done = await client.call_tool("owner__save", {"path": ".config/secret.txt", "text": secret})
        assert not done.is_error, _text(done)
        on_host = kept_at(home, "owner") / ".config" / "secret.txt"
        assert on_host.read_text() == secret
        pid = _jailed_pid_with("KEEPER_ROLE=owner")
        attempts = [
            str(on_host),  # by its host path, inside the grant of ~/.local
            ".config/secret.txt",  # in its own home, at the same place
            f"/proc/{pid}/root{home}/.config/secret.txt",  # through the owner's process
            f"/proc/{pid}/cwd/.config/secret.txt",
        ]
        for path in attempts:
            stolen = await client.call_tool("thief__load", {"path": path})
            assert stolen.is_error and secret not in _text(stolen), path
        # the control: the same read by a process without a jail gets it
        control = await client.call_tool("unjailed__load", {"path": str(on_host)})
        assert not control.is_error and _text(control) == secret
        if os.geteuid() == 0:  # another process's root is open to root alone (or a ptracer)
            through = await client.call_tool("unjailed__load", {"path": attempts[2]})
            assert not through.is_error and _text(through) == secret
