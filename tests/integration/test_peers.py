"""Smoke tests: each pinned third-party peer starts over stdio and lists its tools.

They pin down what the gateway's integration tests rely on: which protocol era each peer speaks
with the SDK Client in mode="auto", and that the Inspector CLI works as an outside client.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests import peers

pytestmark = pytest.mark.peers


async def _decline(_context: Any, _params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


def _connect(argv: list[str], **callbacks: Any) -> tuple[str, list[str]]:
    """(negotiated protocol version, tool names) of the server started by `argv`."""

    async def run() -> tuple[str, list[str]]:
        params = StdioServerParameters(command=argv[0], args=argv[1:])
        with anyio.fail_after(30):
            async with Client(params, mode="auto", cache=None, **callbacks) as client:
                tools = await client.list_tools()
                return client.protocol_version, [tool.name for tool in tools.tools]

    return anyio.run(run)


def test_everything_speaks_handshake_era_and_hides_elicitation_from_plain_clients() -> None:
    version, tools = _connect(peers.everything())
    assert version in HANDSHAKE_PROTOCOL_VERSIONS
    assert {"echo", "get-sum", "trigger-long-running-operation", "toggle-simulated-logging"} <= set(tools)
    assert "trigger-elicitation-request" not in tools


def test_everything_offers_elicitation_tool_to_eliciting_clients() -> None:
    _, tools = _connect(peers.everything(), elicitation_callback=_decline)
    assert "trigger-elicitation-request" in tools


def test_filesystem_lists_tools(tmp_path: Path) -> None:
    version, tools = _connect(peers.filesystem(tmp_path))
    assert version in HANDSHAKE_PROTOCOL_VERSIONS
    assert {"read_text_file", "write_file", "list_allowed_directories"} <= set(tools)


def test_time_server_speaks_modern_era() -> None:
    version, tools = _connect(peers.time_server("--local-timezone", "UTC"))
    assert version in MODERN_PROTOCOL_VERSIONS
    assert set(tools) == {"get_current_time", "convert_time"}


def test_git_server_speaks_modern_era(tmp_path: Path) -> None:
    argv = peers.git_server(tmp_path)  # first: skips when git is missing
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    version, tools = _connect(argv)
    assert version in MODERN_PROTOCOL_VERSIONS
    assert {"git_status", "git_log", "git_commit"} <= set(tools)


def _inspector(*args: str) -> Any:
    argv = [*peers.inspector_cli(), *peers.everything(), *args]
    done = subprocess.run(argv, env=peers.peer_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_inspector_cli_lists_everything_tools() -> None:
    listed = _inspector("--method", "tools/list")
    assert "echo" in [tool["name"] for tool in listed["tools"]]


def test_inspector_cli_calls_a_tool() -> None:
    result = _inspector("--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=hi")
    assert result["content"] == [{"type": "text", "text": "Echo: hi"}]
