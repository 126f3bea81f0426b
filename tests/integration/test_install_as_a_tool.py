"""Cellblock installed the way tools are (`uv tool install`, `pipx install`), then used from a
client's entry.

uv's installer puts `uv` in `~/.local/bin`; `uv tool install` and `pipx install` put Cellblock in a
virtualenv of their own and link `cellblock` into `~/.local/bin`. `wrap` must write that path into the client's
entry, and that entry, started with only HOME, USER and PATH, must serve a jailed server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.sandbox.installer import REGISTRY_ENV
from tests import peers

pytestmark = [pytest.mark.anyio, pytest.mark.peers, pytest.mark.jail, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("tool", ["uv", "pipx"])
async def test_installed_as_a_tool_cellblock_is_on_path_and_wrap_writes_that_path(tmp_path: Path, tool: str) -> None:
    home = tmp_path / "home"
    bin_dir = home / ".local" / "bin"
    peers.uv_standalone(bin_dir)
    # the checkout's files a build needs, so the build leaves nothing in the checkout
    source = tmp_path / "src"
    shutil.copytree(ROOT / "cellblock", source / "cellblock", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    client = {"HOME": str(home), "USER": "root", "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}
    shell = {**client, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    shell |= {k: os.environ[k] for k in REGISTRY_ENV if k in os.environ}

    if tool == "uv":
        installed = _run(shell, str(bin_dir / "uv"), "tool", "install", "--python", "/usr/bin/python3", str(source))
    else:
        installed = _run(shell, peers.pipx(), "install", str(source))
    assert installed.returncode == 0, installed.stderr
    cellblock = bin_dir / "cellblock"
    assert cellblock.exists(), installed.stderr
    version = _run(shell, "cellblock", "--version")
    assert version.returncode == 0 and version.stdout.startswith("cellblock "), version.stderr

    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    time_server = peers.time_server("--local-timezone", "UTC")
    client_config.write_text(json.dumps({"mcpServers": {"time": {"command": time_server[0], "args": time_server[1:]}}}))
    wrapped = _run(shell, "cellblock", "wrap", str(client_config))
    assert wrapped.returncode == 0, wrapped.stderr
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    assert entry["command"] == str(cellblock)  # the path on PATH, not the tool's virtualenv

    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=client)
    async with Client(params, cache=None) as session:
        assert [t.name for t in (await session.list_tools()).tools] == ["cellblock__status", "cellblock__review"]
    approved = _run(shell, "cellblock", "approve", "--all")
    assert approved.returncode == 0, approved.stderr
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        result = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert not result.is_error, result.content
        assert '"timezone": "UTC"' in "".join(getattr(c, "text", "") for c in result.content)
