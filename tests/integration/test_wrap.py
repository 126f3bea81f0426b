"""`cellblock wrap` end to end: a Claude-Desktop-style config of real servers, wrapped, started
as the client would start it, every tool seen through the gateway, each server jailed; then
`unwrap` restores the file byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import keyring
import mcp.types as types
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests import peers
from tests.integration.conftest import cli, cli_env

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
    env = cli_env(tmp_path, keyring_env)

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


# --- unwrap gives the original back whole; a project's file stays portable and out of git ---------

SECRET = "sk-" + "Unwrap7q" * 5  # an env secret wrap moves to the keyring: the hostile tests look for it


def wrap_env(tmp_path: Path, keyring_env: dict[str, str]) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return {**keyring_env, "CELLBLOCK_STATE_DIR": str(state), "CELLBLOCK_CONFIG": str(tmp_path / "cellblock.yaml")}


@pytest.mark.parametrize(
    "where",
    [
        {"args": ["-v"], "env": {"API_KEY": SECRET}},
        {"args": ["-v", "--api-key", SECRET]},  # a secret on the command line comes back too
    ],
    ids=["env", "argument"],
)
def test_unwrap_after_the_bak_is_deleted_gives_the_original_back_with_its_secret_and_never_prints_it(
    tmp_path: Path, keyring_env: dict[str, str], where: dict[str, Any]
) -> None:
    env = wrap_env(tmp_path, keyring_env)
    client_config = tmp_path / "claude_desktop_config.json"
    time = peers.time_server()
    original = json.dumps({"mcpServers": {"clock": {"command": time[0], **where}}}, indent=2)
    client_config.write_text(original)

    done = cli(env, "wrap", str(client_config), "--no-install")
    assert done.returncode == 0, done.stderr
    assert SECRET not in client_config.read_text() + (tmp_path / "cellblock.yaml").read_text()
    (tmp_path / "claude_desktop_config.json.bak").unlink()

    restored = cli(env, "unwrap", str(client_config))

    assert restored.returncode == 0, restored.stderr
    assert client_config.read_text() == original  # the secret value included
    assert "1 secret value(s) were written back" in restored.stderr
    # hostile: no value on any output of wrap or unwrap; control: the value did pass through unwrap
    # (it is in the file), and its output is captured (it names the entry)
    assert SECRET not in done.stdout + done.stderr + restored.stdout + restored.stderr
    assert SECRET in client_config.read_text() and "cellblock auth logout" in restored.stderr
    assert not list((tmp_path / "state" / "backups").iterdir())
    assert keyring.get_password("cellblock", "clock-api-key") == SECRET  # cellblock.yaml still uses it


def test_unwrap_with_no_keyring_refuses_and_leaves_the_file_wrapped(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    env = wrap_env(tmp_path, keyring_env)
    client_config = tmp_path / "claude_desktop_config.json"
    original = json.dumps({"mcpServers": {"clock": {"command": peers.time_server()[0], "env": {"API_KEY": SECRET}}}})
    client_config.write_text(original)
    assert cli(env, "wrap", str(client_config), "--no-install").returncode == 0
    wrapped = client_config.read_text()
    gone = tmp_path / "no-bus"

    refused = cli({**env, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={gone}"}, "unwrap", str(client_config))

    assert refused.returncode != 0
    assert "Nothing changed" in refused.stderr and "make the keyring reachable" in refused.stderr
    assert client_config.read_text() == wrapped and (tmp_path / "claude_desktop_config.json.bak").exists()
    assert SECRET not in refused.stdout + refused.stderr
    # control: the same unwrap with the keyring reachable gives the original back
    assert cli(env, "unwrap", str(client_config)).returncode == 0
    assert client_config.read_text() == original


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


async def test_a_projects_mcp_json_gets_a_command_anyone_can_run_and_no_backup_in_the_repository(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    env = wrap_env(tmp_path, keyring_env)
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    time = peers.time_server()
    mcp_json = repo / ".mcp.json"
    original = json.dumps(
        {"mcpServers": {"clock": {"type": "stdio", "command": time[0], "args": ["--local-timezone", "UTC"]}}}, indent=2
    )
    mcp_json.write_text(original)
    git(repo, "add", ".mcp.json")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "servers")

    done = cli(env, "wrap", str(mcp_json), "--no-install")

    assert done.returncode == 0, done.stderr
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == " M .mcp.json\n"  # no .bak
    entry = json.loads(mcp_json.read_text())["mcpServers"]["cellblock"]
    assert entry == {"type": "stdio", "command": "cellblock", "args": ["serve"]}  # no path of this machine
    # whoever has Cellblock on PATH starts it as written
    bin_dir = Path(sys.executable).parent
    params = StdioServerParameters(
        command=entry["command"],
        args=entry["args"],
        env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "USER": "u"},
        cwd=str(repo),
    )
    async with Client(params, cache=None) as client:
        assert "cellblock__status" in [t.name for t in (await client.list_tools()).tools]

    assert cli(env, "unwrap", str(mcp_json)).returncode == 0
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_client_only_keys_are_carried_over_or_named_in_the_notes(tmp_path: Path, keyring_env: dict[str, str]) -> None:
    env = wrap_env(tmp_path, keyring_env)
    settings = tmp_path / "project" / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    server = {"command": peers.time_server()[0], "timeout": 45000, "trust": True, "excludeTools": ["get_time"]}
    settings.write_text(json.dumps({"mcpServers": {"clock": server}}))

    done = cli(env, "wrap", str(settings), "--no-install")

    assert done.returncode == 0, done.stderr
    config = (tmp_path / "cellblock.yaml").read_text()
    assert yaml.safe_load(config)["servers"]["clock"]["timeout"] == 45
    for key in ("timeout=45000", "trust=true", "excludeTools"):
        assert key in config and key in done.stdout, key
