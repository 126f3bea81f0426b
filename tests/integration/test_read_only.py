"""Tools a server marks read-only run without asking once the user says so at review, through
`cellblock review` and the gateway; a later flip of the marks is held and asked again.

The server (tests/servers/annotated.py) writes into a shared folder from its writing tools, so what
ran unasked is judged by the files on the host; the human (the client's form) denies every call.
The gateway runs in memory (tests/harness.py), but where `cellblock wrap` wrote the command the
client starts: that test runs the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests import peers
from tests.harness import build, connected
from tests.integration.conftest import cli, cli_env, eventually, write_config
from tests.integration.test_approvals import Human

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).resolve().parents[1] / "servers" / "annotated.py"


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def setup(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(config, state, the folder the server writes into, the file that flips its marks)."""
    out, marks, state = tmp_path / "out", tmp_path / "marks", tmp_path / "state"
    out.mkdir()
    marks.mkdir()
    flip = marks / "flip"
    server = {
        "command": sys.executable,
        "args": [str(SERVER), str(out), str(flip)],
        "jail": {"read_only": [str(SERVER.parent), str(marks)], "read_write": [str(out)]},
        "tools": {"default": "ask", "read_only": "review"},  # as wrap writes it
        "lock": {"enabled": True, "first": "review"},
    }
    return write_config(tmp_path, {"a": server}), state, out, flip


def review(config: Path, state: Path, answers: str) -> tuple[str, str]:
    done = cli({"CELLBLOCK_STATE_DIR": str(state)}, "review", "--config", str(config), stdin=answers)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


async def calls(config: Path, state: Path, human: Human, *tools: str) -> tuple[set[str], dict[str, Any]]:
    async with connected(build(config, state), elicitation_callback=human) as client:
        results = {tool: await client.call_tool(f"a__{tool}", {}) for tool in tools}
        return {t.name for t in (await client.list_tools()).tools}, results


def calls_in_audit(state: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "call"]


async def test_after_review_read_only_tools_run_without_asking_and_open_world_or_destructive_ones_ask(
    tmp_path: Path,
) -> None:
    config, state, out, _ = setup(tmp_path)
    shown, said = review(config, state, "y\ny\n")
    assert "marks these tools read-only and closed-world: look, tidy" in shown
    assert "'a' runs without asking: look, tidy" in said
    human = Human("deny")
    _, done = await calls(config, state, human, "look", "tidy")
    assert text(done["look"]) == "looked" and text(done["tidy"]) == "nothing to tidy" and not human.asked
    _, asked = await calls(config, state, human, "browse", "erase", "sneak")
    assert all(result.is_error for result in asked.values()) and len(human.asked) == 3
    assert 'tool "browse"' in human.asked[0] and 'tool "erase"' in human.asked[1]
    assert not list(out.iterdir())  # erase and sneak did not run
    rules = {r["tool"]: (r["decision"], r["rule"]) for r in calls_in_audit(state)}
    assert rules["look"] == ("allow", "read_only") and rules["erase"] == ("deny", "default")


async def test_a_review_answered_no_leaves_every_tool_asking(tmp_path: Path) -> None:
    config, state, _, _ = setup(tmp_path)
    _, said = review(config, state, "y\nn\n")
    assert "'a' runs without asking: none; every tool asks" in said
    human = Human("deny")
    _, done = await calls(config, state, human, "look")
    assert done["look"].is_error and len(human.asked) == 1 and 'tool "look"' in human.asked[0]


async def test_a_server_that_flips_its_marks_after_review_is_held_and_asked_again_until_the_user_decides(
    tmp_path: Path,
) -> None:
    config, state, out, flip = setup(tmp_path)
    review(config, state, "y\ny\n")  # look and tidy run without asking; sneak is not read-only
    flip.touch()  # the server now marks sneak read-only, and tidy destructive (and tidy writes)
    human = Human("deny")
    # look (unchanged) starts the server; its catalog is then checked against the lock
    listed, held = await calls(config, state, human, "look", "sneak", "tidy")
    # both flips are held: not listed, and a call puts the changed catalog before the human
    assert "a__sneak" not in listed and "a__tidy" not in listed and text(held["look"]) == "looked"
    assert held["sneak"].is_error and held["tidy"].is_error
    assert len(human.asked) == 2 and all("changed since you approved it" in q for q in human.asked)
    assert "tool:sneak" in human.asked[0] and "readOnlyHint" in human.asked[0]
    assert not list(out.iterdir())  # nothing ran unasked

    # the user reviews the flip: sneak is offered by name, tidy's grant is gone with its old definition
    shown, said = review(config, state, "y\ny\n")
    assert "readOnlyHint" in shown and "marks these tools read-only and closed-world: sneak" in shown
    assert "'a' runs without asking: look, sneak" in said
    human = Human("deny")
    _, done = await calls(config, state, human, "tidy", "sneak")
    assert done["tidy"].is_error and len(human.asked) == 1 and 'tool "tidy"' in human.asked[0]
    assert not (out / "tidied").exists()
    # the control: the flip the human accepted runs without asking, and writes
    assert text(done["sneak"]) == "sneaked" and (out / "sneaked").exists()


async def test_a_granted_tool_whose_marks_flipped_does_not_run_when_it_is_the_call_that_starts_its_server(
    tmp_path: Path,
) -> None:
    # a lazy server is listed from its lock: tidy looks granted until the server, started by this
    # call, shows its new marks; the call must then be refused, not run on the old grant
    config, state, out, flip = setup(tmp_path)
    review(config, state, "y\ny\n")
    flip.touch()
    human = Human("deny")
    listed, done = await calls(config, state, human, "tidy")
    assert done["tidy"].is_error and "changed" in text(done["tidy"]) and "a__tidy" not in listed
    assert not (out / "tidied").exists()


class Chooser(Human):
    """Approves a held catalog with its read-only tools run without asking; denies every call."""

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        decision = "approve_read_only" if "the catalog of server" in params.message else "deny"
        return types.ElicitResult(action="accept", content={"decision": decision})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_clients_form_offers_the_read_only_tools_and_approving_them_lets_them_run_unasked(
    tmp_path: Path, mode: str
) -> None:
    config, state, out, _ = setup(tmp_path)
    human = Chooser("deny")
    async with connected(build(config, state), mode=mode, elicitation_callback=human) as client:
        await client.list_tools()  # the gateway meets the server; its catalog is held
        reviewed = await client.call_tool("cellblock__review", {"server": "a"})
        look = await client.call_tool("a__look", {})
        erase = await client.call_tool("a__erase", {})
    assert "approved the catalog of 'a'" in text(reviewed)
    assert "Marked read-only and closed-world by the server: look, tidy" in human.asked[0]
    assert text(look) == "looked" and erase.is_error and len(human.asked) == 2 and 'tool "erase"' in human.asked[1]
    assert not list(out.iterdir())


@pytest.mark.peers
async def test_server_everythings_read_only_tools_run_unasked_after_review_and_its_open_world_one_asks(
    tmp_path: Path,
) -> None:
    argv = peers.everything()
    server = {
        "command": argv[0],
        "args": argv[1:],
        "timeout": 30,
        "jail": {"read_only": [str(peers.NODE_MODULES)]},
        "tools": {"default": "ask", "read_only": "review"},
        "lock": {"enabled": True, "first": "review"},
    }
    config, state = write_config(tmp_path, {"everything": server}), tmp_path / "state"
    shown, said = review(config, state, "y\ny\n")
    offered = shown.split("marks these tools read-only and closed-world: ")[1].splitlines()[0].split(", ")
    assert {"echo", "get-sum", "get-env"} <= set(offered) and "gzip-file-as-resource" not in offered
    assert f"'everything' runs without asking: {', '.join(offered)}" in said
    human = Human("deny")
    async with connected(build(config, state), elicitation_callback=human) as client:
        echo = await client.call_tool("everything__echo", {"message": "hi"})
        assert not human.asked
        arguments = {"name": "x.gz", "data": "data:text/plain,hi", "outputType": "resource"}
        gzip = await client.call_tool("everything__gzip-file-as-resource", arguments)
    assert "Echo: hi" in text(echo)
    assert gzip.is_error and len(human.asked) == 1 and 'tool "gzip-file-as-resource"' in human.asked[0]


async def test_a_revoked_grant_asks_again_in_the_running_gateway(tmp_path: Path) -> None:
    config, state, _, _ = setup(tmp_path)
    review(config, state, "y\ny\n")
    human = Human("deny")
    env = {"CELLBLOCK_STATE_DIR": str(state)}
    async with connected(build(config, state), elicitation_callback=human) as client:
        assert text(await client.call_tool("a__look", {})) == "looked" and not human.asked
        revoked = cli(env, "revoke", "a:look", "--config", str(config))
        assert revoked.returncode == 0 and "tool look of 'a' (runs without asking)" in revoked.stderr
        results: list[types.CallToolResult] = []

        async def asked_again() -> bool:  # the gateway reads the grants again within a poll
            results.append(await client.call_tool("a__look", {}))
            return bool(human.asked)

        await eventually(asked_again)
        assert results[-1].is_error and 'tool "look"' in human.asked[0]
        asked = len(human.asked)
        assert text(await client.call_tool("a__tidy", {})) == "nothing to tidy" and len(human.asked) == asked


@pytest.mark.peers
@pytest.mark.jail
async def test_after_wrap_and_review_the_wrapped_entry_runs_read_only_tools_without_asking(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    argv = peers.everything()
    client_config = tmp_path / "claude_desktop_config.json"
    client_config.write_text(json.dumps({"mcpServers": {"everything": {"command": argv[0], "args": argv[1:]}}}))
    config, env = tmp_path / "cellblock.yaml", cli_env(tmp_path, keyring_env)
    wrapped = cli(env, "wrap", str(client_config), "--config", str(config))
    assert wrapped.returncode == 0, wrapped.stderr
    reviewed = cli(env, "review", "--config", str(config), stdin="y\ny\n")
    assert reviewed.returncode == 0, reviewed.stderr
    assert "'everything' runs without asking: " in reviewed.stderr and "echo" in reviewed.stderr
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    human = Human("deny")
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
    async with Client(params, elicitation_callback=human, cache=None) as client:
        echo = await client.call_tool("everything__echo", {"message": "unasked"})
        assert "Echo: unasked" in text(echo) and not human.asked
        arguments = {"name": "x.gz", "data": "data:text/plain,hi", "outputType": "resource"}
        gzip = await client.call_tool("everything__gzip-file-as-resource", arguments)
    assert gzip.is_error and len(human.asked) == 1
