"""Launch plans built by Cellblock's own code (`launch_plan`, as a gateway starts a server), run
with the real `sandbox-exec`. macOS only: see tests/macos/conftest.py."""

from __future__ import annotations

import json
import select
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.sandbox.types import LaunchPlan

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
# the same releases the Linux test peers pin (./dev)
NPX_SERVER = "@modelcontextprotocol/server-everything@2026.8.31"
UVX_SERVER = "mcp-server-time==2026.10.19"
RUN_TIMEOUT = 60
# a first start fetches the package (unjailed, the control); a jailed start runs from the cache
HANDSHAKE_TIMEOUT = 180
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "macos-test", "version": "0"},
    },
}

# jail settings per profile, grants named by placeholder (`grants`); `False`: the unjailed control
Jail = Mapping[str, object] | bool
PROFILES: dict[str, dict[str, object]] = {
    "none": {"network": "none"},
    "open": {"network": "open"},
    "none, grants": {"network": "none", "read_only": ["ro"], "read_write": ["rw"]},
    "open, grants": {"network": "open", "read_only": ["ro"], "read_write": ["rw"]},
}


def grants(profile: Mapping[str, object], area: Path) -> dict[str, object]:
    """`profile` with its grants made directories in `area` (`ro`, `rw`)."""
    jail = dict(profile)
    for key in ("read_only", "read_write"):
        names = jail.get(key)
        if isinstance(names, list):
            paths = [area / n for n in names]
            for path in paths:
                path.mkdir(exist_ok=True)
            jail[key] = [str(p) for p in paths]
    return jail


def plan(argv: Sequence[str], jail: Jail, private: Path, env: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan a gateway would start `argv` with, jailed per `jail` (or plainly, `False`)."""
    server = LocalServer.model_validate({"command": argv[0], "args": list(argv[1:]), "jail": jail, "env": env or {}})
    made = launch_plan("macos-test", server, private=private)
    jailed = made.argv[0] == SANDBOX_EXEC
    assert jailed == (jail is not False), f"the plan is not what was asked: {made.argv[:2]}"
    return made


def run(made: LaunchPlan) -> subprocess.CompletedProcess[str]:
    """Run a plan to its end, its output captured."""
    return subprocess.run(
        made.argv, env=dict(made.env), cwd=made.cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )


def handshake(made: LaunchPlan) -> str:
    """Start a plan's MCP server, send `initialize`, and return its first line of output (or, if it
    said nothing in time or exited, what it wrote to stderr)."""
    with subprocess.Popen(
        made.argv,
        env=dict(made.env),
        cwd=made.cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            proc.stdin.flush()
            readable, _, _ = select.select([proc.stdout], [], [], HANDSHAKE_TIMEOUT)
            line = proc.stdout.readline().decode(errors="replace") if readable else ""
        finally:
            proc.kill()
        said = proc.stderr.read().decode(errors="replace")
    return line or f"no answer; stderr: {said[-2000:]}"


def answered(line: str) -> bool:
    """Whether `line` is a JSON-RPC result for `initialize`."""
    try:
        reply = json.loads(line)
    except ValueError:
        return False
    return isinstance(reply, dict) and reply.get("id") == 1 and "result" in reply
