"""Real MCP servers (the pinned peers) run in a Landlock jail, spoken to over stdio as a client does."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.jailspec import jail_spec
from cellblock.sandbox.landlock import landlock_abi, landlock_plan
from cellblock.sandbox.launchers import launcher_mounts
from cellblock.sandbox.spawn import spawn_args
from cellblock.sandbox.types import JailSpec, LaunchPlan, Network
from tests import peers

pytestmark = [
    pytest.mark.jail,
    pytest.mark.peers,
    pytest.mark.skipif(landlock_abi() < 4, reason="network: none on Landlock needs ABI 4 (Linux 6.7)"),
]
# a Node or Python server starts in well under this, even on a loaded machine
ANSWER_SECONDS = 60.0
PATH = "/usr/bin:/bin"
HELLO = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


def plan_for(tmp_path: Path, argv: list[str], **extra: Any) -> LaunchPlan:
    """A Landlock plan for `argv`, sharing what runs it as the gateway does (`launcher_mounts`)."""
    home = str(tmp_path / "user")
    launchers = launcher_mounts(argv[0], home, f"{os.path.dirname(argv[0])}:{PATH}")
    spec = JailSpec(name="peer", argv=tuple(argv), env={"PATH": PATH, "HOME": home}, network=Network.NONE, **extra)
    return landlock_plan(spec, launchers, str(tmp_path / "private"))


def call(plan: LaunchPlan, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Initialize a session with the server of `plan` over stdio and call `tool`; its result."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HELLO},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}},
    ]
    with spawn_args(plan) as spawn:
        pipes = dict.fromkeys(("stdin", "stdout", "stderr"), subprocess.PIPE)
        process = subprocess.Popen(spawn.argv, env=dict(plan.env), pass_fds=spawn.pass_fds, **pipes)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        process.stdin.flush()
        deadline, buffer = time.monotonic() + ANSWER_SECONDS, b""
        while (left := deadline - time.monotonic()) > 0 and select.select([process.stdout], [], [], left)[0]:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            for line in buffer.splitlines():
                message = json.loads(line) if line.strip().startswith(b"{") else {}
                if message.get("id") == 2:
                    result: dict[str, Any] = message["result"]
                    return result
        process.kill()
        raise AssertionError(f"no answer to the call; stderr: {process.communicate()[1].decode()[-2000:]}")
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def text(result: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in result["content"])


def test_a_python_server_answers_in_a_landlock_jail(tmp_path: Path) -> None:
    result = call(plan_for(tmp_path, peers.time_server()), "get_current_time", {"timezone": "UTC"})
    assert not result.get("isError") and "UTC" in text(result)


def test_a_node_server_reads_its_grant_in_a_landlock_jail_and_nothing_else(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "note.txt").write_text("granted words")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("DECOY")
    # the server itself is told both folders: what keeps it from the second is the jail
    argv = peers.filesystem(granted, outside)
    plan = plan_for(tmp_path, argv, read_only=(str(peers.NODE_MODULES),), read_write=(str(granted),))
    assert text(call(plan, "read_text_file", {"path": str(granted / "note.txt")})) == "granted words"
    refused = call(plan, "read_text_file", {"path": str(outside / "secret.txt")})
    assert "DECOY" not in text(refused)


@pytest.mark.parametrize("jail", [{"network": "none"}, {"network": "none", "exec": {"allow": ["/bin/true"]}}])
def test_the_jail_spec_the_gateway_makes_runs_on_landlock_without_the_bwrap_jails_wrappers(
    tmp_path: Path, jail: dict[str, Any]
) -> None:
    server = LocalServer.model_validate({"command": peers.time_server()[0], "jail": jail})
    assert server.jail is not False
    spec, launchers = jail_spec("time", server, server.jail)
    plan = landlock_plan(spec, launchers, str(tmp_path / "private"))
    assert plan.argv[plan.argv.index("--") + 1 :] == (peers.time_server()[0],)  # the scope launcher and pin left out
    result = call(plan, "get_current_time", {"timezone": "UTC"})
    assert not result.get("isError") and "UTC" in text(result)
