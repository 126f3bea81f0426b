"""Tool search through `cellblock serve`, in both protocol eras: the client lists the search tools,
finds a tool in words and calls it through `cellblock__call_tool`; what the policy denies or the
lock holds is neither found nor called that way, and a call through search passes the same
approval and audit as a listed tool's (docs/search.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client
from mcp.types import Implementation

from tests.integration.conftest import cli, cli_env, eventually, gateway, probe_server, write_config
from tests.integration.test_http import serving

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


class Told:
    """The client's side of `notifications/tools/list_changed`, for a handshake-era client."""

    def __init__(self) -> None:
        self.changed = anyio.Event()

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()

    async def wait(self) -> None:
        """Until the client is told (at most 20 s), then ready to hear the next change."""
        with anyio.fail_after(20):
            await self.changed.wait()
        self.changed = anyio.Event()


@asynccontextmanager
async def told_of_a_change(client: Client, told: Told, mode: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Within: `await changed()` returns once the gateway tells `client` that its tool list changed
    (a 2026-07-28 client hears it on its listen stream)."""
    if mode == "legacy":

        async def heard() -> None:
            await told.changed.wait()

        yield heard
        return
    async with client.listen(tools_list_changed=True) as events:

        async def listened() -> None:
            await events.__anext__()

        yield listened


def many_tools(tmp_path: Path, search: str) -> Path:
    """A catalog of more tools than Windsurf takes (50) and fewer than Cursor does (80)."""
    servers = {"p": probe_server("--name", "p", "--extra-tools", "55", tools=RULES)}
    return write_config(tmp_path, servers, catalog={"search": search}, approvals={"timeout": 30})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_auto_searches_for_a_client_whose_known_limit_the_catalog_exceeds(tmp_path: Path, mode: str) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    path = many_tools(tmp_path, "auto")
    # the control: Cursor takes 80 tools, so it is given every tool, and no search
    cursor = Implementation(name="cursor-vscode", version="1")
    async with gateway(path, state, mode=mode, client_info=cursor) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert 50 < len(listed) <= 80 and "p__echo" in listed and FIND not in listed, sorted(listed)
        assert text(await client.call_tool("p__echo", {"message": "listed"})) == "listed"
        assert FIND in (client.instructions or "")  # it is told what auto may do
    windsurf = Implementation(name="Windsurf", version="1")
    async with gateway(path, state, mode=mode, client_info=windsurf) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert {FIND, CALL} <= listed and not any(n.startswith("p__") for n in listed), sorted(listed)
        assert "p__echo" in await found(client, "repeat my message back to me")
        called = await client.call_tool(CALL, {"name": "p__echo", "arguments": {"message": "found"}})
        assert text(called) == "found" and not called.is_error


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_that_lists_again_gets_what_it_found_in_its_list(tmp_path: Path, mode: str) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    told = Told()
    # Cursor is known to list again when told that the tools changed (search/clients.json)
    cursor = Implementation(name="cursor-vscode", version="1")
    async with gateway(config(tmp_path), state, mode=mode, client_info=cursor, message_handler=told.message) as client:
        assert "p__echo" not in {t.name for t in (await client.list_tools()).tools}
        async with told_of_a_change(client, told, mode) as changed:
            assert (await found(client, "repeat my message back to me"))[0] == "p__echo"
            with anyio.fail_after(10):
                await changed()
        listed = {t.name for t in (await client.list_tools()).tools}
        assert {"p__echo", FIND, CALL} <= listed, sorted(listed)
        # called by its own name now, and still through call_tool
        assert text(await client.call_tool("p__echo", {"message": "listed"})) == "listed"
        called = await client.call_tool(CALL, {"name": "p__echo", "arguments": {"message": "found"}})
        assert text(called) == "found"
        # what is denied or held is never found, so never added: and refused by its name too
        assert "p__crash" not in listed and not any(n.startswith("h__") for n in listed)
        assert "denied by policy" in text(await client.call_tool("p__crash", {}))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_not_known_to_list_again_keeps_its_list_and_calls_through_search(
    tmp_path: Path, mode: str
) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    told = Told()
    claude = Implementation(name="claude-ai", version="1")
    async with gateway(config(tmp_path), state, mode=mode, client_info=claude, message_handler=told.message) as client:
        before = {t.name for t in (await client.list_tools()).tools}
        assert (await found(client, "repeat my message back to me"))[0] == "p__echo"
        after = {t.name for t in (await client.list_tools()).tools}
        assert after == before and "p__echo" not in after
        called = await client.call_tool(CALL, {"name": "p__echo", "arguments": {"message": "found"}})
        assert text(called) == "found"
    assert not told.changed.is_set()


async def test_over_http_each_session_lists_what_it_found_and_no_other(
    tmp_path: Path, served_env: dict[str, str]
) -> None:
    cursor = Implementation(name="cursor-vscode", version="1")
    with serving(config(tmp_path), served_env) as url:
        told, other = Told(), Told()
        async with (
            Client(url, mode="legacy", client_info=cursor, message_handler=told.message) as finder,
            Client(url, mode="legacy", client_info=cursor, message_handler=other.message) as bystander,
            Client(url, mode="auto", client_info=cursor) as modern,
        ):
            assert (await found(finder, "repeat my message back to me"))[0] == "p__echo"
            await told.wait()
            assert "p__echo" in {t.name for t in (await finder.list_tools()).tools}
            # the other session's list is its own: it found nothing, so nothing was added, nor was it told
            assert "p__echo" not in {t.name for t in (await bystander.list_tools()).tools}
            # a 2026-07-28 client over HTTP has no session to keep its finds: it calls through search
            assert (await found(modern, "repeat my message back to me"))[0] == "p__echo"
            assert "p__echo" not in {t.name for t in (await modern.list_tools()).tools}
            called = await modern.call_tool(CALL, {"name": "p__echo", "arguments": {"message": "found"}})
            assert text(called) == "found"
            assert text(await finder.call_tool("p__echo", {"message": "listed"})) == "listed"
        assert not other.changed.is_set()
