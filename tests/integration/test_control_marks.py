"""A server's processes answer for the user on no gateway's control socket, however they detach.

Before, the socket refused only the processes in the process tree of the servers of its own
gateway: a `jail: false` server's double-forked grandchild (no longer a descendant) was let
through, and so was a direct child at *another* gateway's socket. Now every server's processes
run in a cgroup (or scope) marked as a server's, which every gateway refuses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.sandbox.marks import how_marked
from tests.integration.conftest import cli, eventually, gateway, probe_server, write_config

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.jail,
    pytest.mark.skipif(how_marked() is None, reason="this machine gives no cgroup or scope to mark a server in"),
]

DETACHER = Path(__file__).resolve().parents[1] / "servers" / "detacher.py"
ASK_ECHO = {"default": "deny", "rules": {"echo": "ask"}}


def environment(tmp_path: Path, state: str) -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "CELLBLOCK_STATE_DIR": str(tmp_path / state)}


def approve_argv(env: dict[str, str], ident: str) -> list[str]:
    """`cellblock approve ID` as the user would type it, in the test's runtime dir."""
    variables = [f"{key}={value}" for key, value in env.items()]
    return ["/usr/bin/env", *variables, sys.executable, "-m", "cellblock.gateway.cli.main", "approve", ident]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def pending(env: dict[str, str], count: int = 1) -> list[str]:
    """The ids `cellblock pending` shows, once there are `count` (another process: each look is a CLI run)."""
    with anyio.fail_after(30):
        while True:
            done = await anyio.to_thread.run_sync(lambda: cli(env, "pending", "--json"))
            ids = [str(item["id"]) for item in json.loads(done.stdout or "[]")]
            if len(ids) >= count:
                return ids


def refusals(state: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    return [event for event in events if event["event"] == "control_refused"]


async def attempt(asking: Any, loose: Any, env: dict[str, str], out: Path, detach: bool) -> None:
    """With a call of `asking` waiting for the user, have the unjailed server of `loose` start
    `cellblock approve ID` (detached, or as its child): refused, and the call still waits; then the
    control, the same command from the user's terminal (the test), approves it."""
    results: list[types.CallToolResult] = []

    async def call() -> None:
        results.append(await asking.call_tool("p__echo", {"message": "held"}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        [ident] = await pending(env)
        arguments = {"argv": approve_argv(env, ident), "out": str(out), "detach": detach}
        started = await loose.call_tool("loose__run", arguments)
        assert not started.is_error, text(started)
        await eventually(out.exists, timeout=60)
        said = await anyio.Path(out).read_text()
        assert said.rstrip().endswith("exit 1"), said
        assert "a process of a server Cellblock runs" in said and "a server's cgroup" in said, said
        assert await pending(env) == [ident] and not results  # the call still waits, unanswered
        approved = await anyio.to_thread.run_sync(lambda: cli(env, "approve", ident))
        assert approved.returncode == 0, approved.stderr
    assert text(results[0]) == "held"


async def test_a_double_forked_grandchild_of_an_unjailed_server_cannot_approve_its_call(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    env = environment(tmp_path, "state")
    servers = {
        "loose": {"command": sys.executable, "args": [str(DETACHER)], "jail": False},
        "p": probe_server("--name", "p", tools=ASK_ECHO),
    }
    config = write_config(tmp_path, servers, approvals={"timeout": 60})
    async with gateway(config, tmp_path / "state", env=env) as client:
        await attempt(client, client, env, tmp_path / "grandchild.txt", detach=True)
    [refused] = refusals(tmp_path / "state")
    assert refused["op"] == "approve" and "a server's cgroup" in refused["reason"], refused


async def test_a_child_of_one_gateways_unjailed_server_cannot_approve_at_another_gateway(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    loose_env, asking_env = environment(tmp_path, "loose-state"), environment(tmp_path, "asking-state")
    for name in ("loose", "asking"):
        (tmp_path / name).mkdir()
    loose = write_config(
        tmp_path / "loose", {"loose": {"command": sys.executable, "args": [str(DETACHER)], "jail": False}}
    )
    asking = write_config(
        tmp_path / "asking", {"p": probe_server("--name", "p", tools=ASK_ECHO)}, approvals={"timeout": 60}
    )
    async with (
        gateway(loose, tmp_path / "loose-state", env=loose_env) as first,
        gateway(asking, tmp_path / "asking-state", env=asking_env) as second,
    ):
        await attempt(second, first, asking_env, tmp_path / "child.txt", detach=False)
    # the gateway holding the call refused the child of the other gateway's server, by its mark
    [refused] = refusals(tmp_path / "asking-state")
    assert refused["op"] == "approve" and "a server's cgroup" in refused["reason"], refused
    assert isinstance(refused["peer_pid"], int) and refused["peer_pid"] != os.getpid()
