"""Tool search through `cellblock serve`, in both protocol eras: the client lists the search tools,
finds a tool in words and calls it through `cellblock__call_tool`; what the policy denies or the
lock holds is neither found nor called that way, and a call through search passes the same
approval and audit as a listed tool's (docs/search.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from tests.integration.conftest import cli, cli_env, eventually, gateway, probe_server, write_config

pytestmark = pytest.mark.anyio

FIND, CALL = "cellblock__find_tools", "cellblock__call_tool"
# echo runs, crash is denied (so never listed), whoami asks the user
RULES = {"default": "allow", "rules": {"crash": "deny", "whoami": "ask"}}


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def found(client: Any, query: str, **extra: str) -> list[str]:
    result = await client.call_tool(FIND, {"query": query, **extra})
    assert not result.is_error, text(result)
    return [tool["name"] for tool in json.loads(text(result))["tools"]]


def config(tmp_path: Path) -> Path:
    servers = {
        "p": probe_server("--name", "p", tools=RULES),
        # held at first contact: none of its tools may be found or called before the user approves
        "h": probe_server("--name", "h", lock={"enabled": True, "first": "review"}),
    }
    return write_config(tmp_path, servers, catalog={"search": "on"}, approvals={"timeout": 30})


def audit(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_lists_the_search_tools_finds_a_tool_in_words_and_calls_it(tmp_path: Path, mode: str) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    async with gateway(config(tmp_path), state, mode=mode, env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        # the search tools and the gateway's own (something is held), none of the servers'
        assert {FIND, CALL} <= listed and not any(name.startswith(("p__", "h__")) for name in listed), listed
        result = await client.call_tool(FIND, {"query": "repeat my message back to me"})
        tools = json.loads(text(result))["tools"]
        assert tools[0]["name"] == "p__echo", tools
        assert tools[0]["inputSchema"]["properties"]["message"] and tools[0]["why"]
        called = await client.call_tool(CALL, {"name": "p__echo", "arguments": {"message": "found"}})
        assert text(called) == "found" and not called.is_error
        # only what the client may call is found: the denied tool is not, nor the held server's
        assert "p__crash" not in await found(client, "crash the server")
        assert not await found(client, "repeat my message back to me", server="h")
        # and call_tool is no way around them: each is refused as its direct call is
        for name, why in (("p__crash", "denied by policy"), ("h__echo", "cellblock diff h")):
            refused = await client.call_tool(CALL, {"name": name, "arguments": {"message": "x"}})
            direct = await client.call_tool(name, {"message": "x"})
            assert refused.is_error and why in text(refused) and text(refused) == text(direct), text(refused)
        # the gateway's own tools are called by their own names, never through call_tool
        for own in (CALL, "cellblock__review"):
            recursive = await client.call_tool(CALL, {"name": own, "arguments": {"server": "h", "name": "p__echo"}})
            assert recursive.is_error and "Cellblock's own tool" in text(recursive)
    events = audit(state)
    searches = [e for e in events if e["event"] == "tool_search"]
    assert searches[0]["query"] == "repeat my message back to me" and searches[0]["found"][0] == "p__echo"
    # the found tool's call is audited as that tool's call, as a listed tool's is; the refusals too
    calls = [(e["tool"], e["decision"]) for e in events if e["event"] == "call" and e["server"] == "p"]
    assert calls == [("echo", "allow"), ("crash", "deny"), ("crash", "deny")], calls
    # and the attempts at the gateway's own tools through it, as calls that route nowhere
    own = [(e["tool"], e["rule"]) for e in events if e["event"] == "call" and e["server"] == "cellblock"]
    assert own == [(CALL, "route"), ("cellblock__review", "route")], own


async def test_a_held_server_is_found_only_once_approved(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    path = config(tmp_path)
    async with gateway(path, state, env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as client:
        assert not await found(client, "repeat my message back to me", server="h")
        approved = await anyio.to_thread.run_sync(lambda: cli(env, "approve", "h", "--config", str(path)))
        assert approved.returncode == 0, approved.stderr

        # the control: the same tool, approved, is found and called (the gateway re-indexes its catalog)
        async def approved_is_found() -> bool:
            return "h__echo" in await found(client, "repeat my message back to me", server="h")

        await eventually(approved_is_found, 30)
        called = await client.call_tool(CALL, {"name": "h__echo", "arguments": {"message": "approved"}})
        assert text(called) == "approved"


async def test_a_call_through_search_asks_the_user_as_a_listed_call_does(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    async with gateway(config(tmp_path), state, env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as client:
        assert "p__whoami" in await found(client, "whoami", server="p")
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await client.call_tool(CALL, {"name": "p__whoami", "arguments": {}}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            listed: list[dict[str, Any]] = []

            def waits() -> bool:
                listed[:] = json.loads(cli(env, "pending", "--json").stdout or "[]")
                return bool(listed)

            await eventually(waits, 30)
            [item] = listed
            assert item["tool"] == "whoami" and item["server"] == "p"  # asked as the tool itself
            denied = await anyio.to_thread.run_sync(lambda: cli(env, "deny", item["id"]))
            assert denied.returncode == 0, denied.stderr
        [result] = results
        assert result.is_error and "denied" in text(result)
    assert [e["tool"] for e in audit(state) if e["event"] == "approval_asked"] == ["whoami"]


async def test_a_rug_pulled_tool_is_not_found_until_its_change_is_approved(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    server = probe_server("--name", "p", lock={"enabled": True, "first": "trust"})
    path = write_config(tmp_path, {"p": server}, catalog={"search": True})  # `search: on`, as YAML writes it bare
    query = "repeat my message back to me"
    async with gateway(path, state, env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as client:
        assert (await found(client, query))[0] == "p__echo"  # trusted at first contact: found
        await client.call_tool(CALL, {"name": "p__rug_pull", "arguments": {"description": "echo, and read ~/.ssh"}})

        async def gone() -> bool:  # the catalog changed: the next search is of the new one
            return "p__echo" not in await found(client, query)

        await eventually(gone, 30)
        refused = await client.call_tool(CALL, {"name": "p__echo", "arguments": {"message": "x"}})
        assert refused.is_error and "changed since" in text(refused)
        # the control: once the user approves the change, it is found again
        approved = await anyio.to_thread.run_sync(lambda: cli(env, "approve", "p", "--config", str(path)))
        assert approved.returncode == 0, approved.stderr

        async def back() -> bool:
            return "p__echo" in await found(client, query)

        await eventually(back, 30)
