"""A hostile server's items that pass for others: a template built to backtrack, a tool named
`prompt:greet`, through the gateway and the lookalike test server.

The gateway runs in memory (tests/harness.py), but for the template built to backtrack, run by
`cellblock serve`: its bound on the reads holds only while the gateway runs in a process of its own
(a regex that never returns would hold this test's event loop too)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from tests.harness import build, connected
from tests.integration.conftest import eventually, gateway, probe_server, write_config
from tests.integration.test_approvals import Human, cli, pending_ids

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
    async with connected(build(config, state)):  # first contact trusts the catalog, the template with it
        await eventually(lambda: (state / "locks" / "h.json").exists())
    env = {"CELLBLOCK_STATE_DIR": str(state), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    check = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "cellblock.gateway.cli.main", "check", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,  # it never finished before the fix; this keeps a regression from hanging the suite
            check=False,
        )
    )
    assert "h://item/projects/private-notes/*" in check.stdout + check.stderr  # the rule matches no item


ASK_ALL = {
    "tools": {"default": "ask"},
    "prompts": {"rules": {"greet": "ask"}},
    "resources": {"rules": {"h://index": "ask"}},
}


@pytest.mark.parametrize("scope", ["allow_always", "allow_session"])
async def test_approving_a_lookalike_tool_does_not_let_the_prompt_or_resource_through(
    tmp_path: Path, scope: str
) -> None:
    state = tmp_path / "state"
    human = Human(scope)
    server = lookalike({"TOOLS": "prompt:greet,resource:h://index"}, **ASK_ALL)
    async with connected(
        build(write_config(tmp_path, {"h": server}), state), mode="legacy", elicitation_callback=human
    ) as client:
        for name in ("h__prompt_greet", "h__resource_h___index"):
            assert "ran tool" in str((await client.call_tool(name, {})).content[0])
        await client.get_prompt("h__greet", {"name": "x"})
        await client.read_resource("cellblock://h/h://index")
        # control: the approved tools themselves are not asked again
        await client.call_tool("h__prompt_greet", {})
    first_lines = [a.split("\n")[0] for a in human.asked]
    assert len(first_lines) == 4, first_lines
    assert 'tool "prompt:greet"' in first_lines[0] and 'tool "resource:h://index"' in first_lines[1]
    assert 'prompt "greet"' in first_lines[2] and 'resource "h://index"' in first_lines[3]
    if scope == "allow_always":
        listed = await anyio.to_thread.run_sync(
            lambda: cli(tmp_path, "show", "h", "--config", str(tmp_path / "cellblock.yaml"))
        )
        assert "prompt greet" in listed.stdout and "resource h://index" in listed.stdout
        revoked = await anyio.to_thread.run_sync(
            lambda: cli(tmp_path, "revoke", "h:greet", "--kind", "prompt", "--config", str(tmp_path / "cellblock.yaml"))
        )
        assert revoked.returncode == 0 and "revoked prompt h:greet" in revoked.stderr
        stored = json.loads((state / "approvals.json").read_text())
        assert stored["always"] == {"h": ["prompt:greet", "resource:h://index"]}  # the tools' grants stay
        assert stored["items"] == {"h": {"resource": ["h://index"]}}


async def test_a_late_cli_approval_of_a_prompt_does_not_let_the_lookalike_tool_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = lookalike({"TOOLS": "prompt:greet"}, tools={"default": "ask"}, prompts={"rules": {"greet": "ask"}})
    config = write_config(tmp_path, {"h": server}, approvals={"timeout": 1})
    async with connected(build(config, state, runtime=tmp_path / "run")) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _attempt(client.get_prompt("h__greet", {"name": "x"})))
            [ident] = await pending_ids(tmp_path, 1)
        approved = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "approve", ident))
        assert approved.returncode == 0, approved.stderr
        # the same spelled name and arguments, as a tool: asked (and, unanswered, refused)
        tool = await client.call_tool("h__prompt_greet", {"name": "x"})
        # control: the prompt itself, retried, is let through once
        got = await client.get_prompt("h__greet", {"name": "x"})
    assert tool.is_error and "ran tool" not in str(tool.content[0])
    assert "needs the user's approval" in str(tool.content[0])
    assert got.messages
    calls = [(e["tool"], e["decision"], e["rule"]) for e in events(state) if e["event"] == "call"]
    assert ("prompt:greet", "allow", "approval:once") in calls


async def _attempt(coro: Any) -> None:
    with contextlib.suppress(MCPError):  # the get times out waiting; its approval comes later
        await coro


async def test_the_audit_tells_a_tool_named_like_a_prompt_from_the_prompt_get(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = lookalike({"TOOLS": "prompt:greet"}, tools={"default": "allow"}, resources={"rules": {"h://x": "deny"}})
    async with connected(build(write_config(tmp_path, {"h": server}), state)) as client:
        await client.call_tool("h__prompt_greet", {"name": "x"})
        await client.get_prompt("h__greet", {"name": "x"})
        with pytest.raises(MCPError):
            await client.read_resource("cellblock://h/h://x")  # a refusal carries the kind too
    recorded = [e for e in events(state) if e["event"] in ("call", "call_end")]
    assert [(e["event"], e["tool"], e.get("kind")) for e in recorded] == [
        ("call", "prompt:greet", None),  # the tool's records are as they always were
        ("call_end", "prompt:greet", None),
        ("call", "prompt:greet", "prompt"),
        ("call", "resource:h://x", "resource"),
    ]
    assert "kind" not in json.dumps(recorded[0])
    env = {"CELLBLOCK_STATE_DIR": str(state), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    report = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "cellblock.gateway.cli.main", "audit", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    rows = json.loads(report.stdout)["summary"]["h"]["tools"]
    assert rows["prompt:greet"]["calls"] == 1 and rows["prompt greet"]["calls"] == 1
    assert rows["resource h://x"]["denied"] == 1
