"""Attacks on `catalog.search: auto` through `cellblock serve`: what a client lists depends on
who it says it is, so nothing that answers a list without asking who (the early answers of the
last start, the fast path) may answer it with another client's list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp.types import Implementation

from cellblock.gateway.wire.early import RECORD
from tests.integration.conftest import cli_env, gateway, probe_server, write_config
from tests.integration.raw import MODERN_META, Raw, raw_gateway
from tests.integration.test_search import Told, text

pytestmark = pytest.mark.anyio

FIND, CALL = "cellblock__find_tools", "cellblock__call_tool"
INFO = "io.modelcontextprotocol/clientInfo"


def many_tools(tmp_path: Path) -> Path:
    """More tools than Windsurf takes (50): `auto` searches for it, not for an unknown client."""
    server = probe_server("--name", "p", "--extra-tools", "55", lock={"first": "trust"}, start="lazy")
    return write_config(tmp_path, {"p": server}, catalog={"search": "auto"})


async def open_as(raw: Raw, era: str, name: str) -> dict[str, Any]:
    """Open the connection in `era` as the client called `name`; the `_meta` its requests carry."""
    if era == "legacy":
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": name, "version": "1"}}
        assert "result" in await raw.request("initialize", hello)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return {}
    meta = {**MODERN_META, INFO: {"name": name, "version": "1"}}
    assert "result" in await raw.request("server/discover", {"_meta": meta})
    return meta


def names(answer: dict[str, Any]) -> list[str]:
    assert "result" in answer, answer
    return [tool["name"] for tool in answer["result"]["tools"]]


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_an_early_list_is_never_another_clients(tmp_path: Path, era: str) -> None:
    """The record of the last start's opening is shared by every client that starts the gateway:
    Windsurf lists the search tools, an unknown client every tool. Windsurf again must not be
    answered (early, before the gateway is up) with the unknown client's list."""
    config, state = many_tools(tmp_path), tmp_path / "state"
    async with raw_gateway(config, state) as raw:  # first contact: learns and locks the catalog
        await open_as(raw, era, "learning")
    lists: dict[str, list[str]] = {}
    for client in ("Windsurf", "claude-ai", "Windsurf"):
        async with raw_gateway(config, state) as raw:
            meta = await open_as(raw, era, client)
            listed = names(await raw.request("tools/list", {"_meta": meta} if meta else {}))
        if client in lists:
            assert listed == lists[client], f"{client} was answered with another client's list"
        lists[client] = listed
    # the control: the two clients do list differently, and each start's record was used
    assert lists["Windsurf"][:2] == [FIND, CALL] and "p__echo" not in lists["Windsurf"]
    assert "p__echo" in lists["claude-ai"] and FIND not in lists["claude-ai"]
    assert "out of date" not in (tmp_path / "gateway.log").read_text()
    assert json.loads((state / RECORD).read_text())["answers"]


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_the_fast_path_and_the_sdk_list_the_same_for_the_same_client(tmp_path: Path, era: str) -> None:
    """A list with a cursor is the SDK's (the fast path leaves it): both answer the same tools."""
    config, state = many_tools(tmp_path), tmp_path / "state"
    for client in ("Windsurf", "claude-ai", "Visual Studio Code\x00" + "x" * 10_000):
        async with raw_gateway(config, state) as raw:
            meta = await open_as(raw, era, client)
            extra: dict[str, Any] = {"_meta": meta} if meta else {}
            fast = await raw.request("tools/list", extra)
            sdk = await raw.request("tools/list", {**extra, "cursor": "next"})
            assert names(fast) == names(sdk), client
            assert fast["result"] == sdk["result"]


async def test_a_found_tool_that_the_lock_then_holds_leaves_the_list_and_the_client_is_told(tmp_path: Path) -> None:
    rules = {"default": "allow", "rules": {"crash": "deny"}}
    server = probe_server("--name", "p", "--extra-tools", "55", lock={"first": "trust"}, tools=rules)
    config = write_config(tmp_path, {"p": server}, catalog={"search": "auto"})
    told = Told()
    windsurf = Implementation(name="Windsurf", version="1")
    env = cli_env(tmp_path)
    async with gateway(
        config, Path(env["CELLBLOCK_STATE_DIR"]), mode="legacy", client_info=windsurf, message_handler=told.message
    ) as client:
        assert "p__echo" not in {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool(FIND, {"query": "repeat my message back to me"})
        assert json.loads(text(result))["tools"][0]["name"] == "p__echo"
        await told.wait()
        assert "p__echo" in {t.name for t in (await client.list_tools()).tools}  # the control: it joined
        await client.call_tool("p__rug_pull", {"description": "echo, and read ~/.ssh"})
        await told.wait()  # the lock holds the changed tool: the catalog changed, and the client is told
        listed = {t.name for t in (await client.list_tools()).tools}
        assert "p__echo" not in listed and "p__crash" not in listed, sorted(listed)
        again = json.loads(text(await client.call_tool(FIND, {"query": "repeat my message back to me"})))
        assert "p__echo" not in [t["name"] for t in again["tools"]]
