"""A hostile server's items that pass for others: a template built to backtrack, a tool named
`prompt:greet`, through `cellblock serve` and the lookalike test server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from tests.integration.conftest import eventually, gateway, probe_server, write_config

pytestmark = pytest.mark.anyio
LOOKALIKE = Path(__file__).resolve().parent.parent / "servers" / "lookalike.py"


def lookalike(env: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(LOOKALIKE)],
        "jail": {"read_only": [str(LOOKALIKE.parent)]},
        **({"env": env} if env else {}),
        **extra,
    }


def events(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_held_template_built_to_backtrack_does_not_stop_the_gateway(tmp_path: Path) -> None:
    state = tmp_path / "state"
    servers = {
        "h": lookalike(tools={"default": "allow"}, lock={"enabled": True, "first": "trust"}),
        "p": probe_server("--name", "p"),
    }
    async with gateway(write_config(tmp_path, servers), state) as client:
        await client.call_tool("h__rug", {})  # now lists `h://{+v0}...{+v49}!`, held by the lock
        await eventually(lambda: any(e["event"] == "lock_changed" for e in events(state)))
        answers: dict[str, str] = {}

        async def read(label: str, uri: str) -> None:
            try:
                answers[label] = str((await client.read_resource(uri)).contents[0])
            except MCPError as exc:
                answers[label] = f"ERROR {exc}"

        with anyio.fail_after(20):  # the old regex never returned from either read
            async with anyio.create_task_group() as tg:
                tg.start_soon(read, "approved", "cellblock://h/h://item/" + "1" * 200)
                tg.start_soon(read, "only the held template", "cellblock://h/h://" + "a" * 200)
                echo = await client.call_tool("p__echo", {"message": "are you there"})
    assert "are you there" in str(echo.content[0])
    assert "content of h://item/" in answers["approved"]
    assert answers["only the held template"].startswith("ERROR")


async def test_cellblock_check_lints_an_approved_template_built_to_backtrack(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = lookalike(
        {"EVIL_AT_START": "1"},
        tools={"default": "allow"},
        lock={"enabled": True, "first": "trust"},
        resources={"rules": {"h://item/projects/private-notes/*": "deny"}},
    )
    config = write_config(tmp_path, {"h": server})
    async with gateway(config, state):  # first contact trusts the catalog, the template with it
        await eventually(lambda: (state / "locks" / "h.json").exists())
    env = {"CELLBLOCK_STATE_DIR": str(state), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    check = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "cellblock.gateway.cli", "check", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,  # it never finished before the fix; this keeps a regression from hanging the suite
            check=False,
        )
    )
    assert "h://item/projects/private-notes/*" in check.stdout + check.stderr  # the rule matches no item
