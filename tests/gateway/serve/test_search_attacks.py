"""Attacks on what each client lists under `catalog.search` (serve/search.py), in memory: a client
that finds without end, sessions that come and go without end, and names no client would give."""

from __future__ import annotations

import json
from pathlib import Path

import mcp.types as types
import pytest
from mcp.types import Implementation

from cellblock.gateway.serve.search import MAX_ADDED, MAX_CLIENTS, Client
from tests.gateway.serve.test_search_views import CALL, FIND, catalog, listed, search
from tests.harness import build, connected
from tests.integration.conftest import probe_server, write_config

pytestmark = pytest.mark.anyio

# names a client may give itself: huge, with control characters and a bidi override, a known
# client's name with a character more, and a known client's name given by anyone at all
HOSTILE = ["x" * 1_000_000, "Windsurf\x00\u202e\n\x1b[31m", "cursor-vscode ", "Windsurf"]
RULES = {"default": "allow", "rules": {"crash": "deny"}}  # through the gateway: crash is denied


async def test_one_client_finding_without_end_keeps_one_view(tmp_path: Path) -> None:
    """Each find that changes what a client found makes its list anew: the lists it had before
    are not kept (each holds its serialized JSON once listed)."""
    on, whole = search(tmp_path, search="on", results=1), catalog(MAX_ADDED * 3)
    on.offer(whole)
    cursor = Client("cursor-vscode", "s1")
    for i in range(MAX_ADDED * 3):
        await on.find({"query": f"tool {i}", "server": "s"}, cursor, "2025-06-18")
        on.view(whole, cursor).wire("tools", "2025-06-18", {})
    assert len(listed(on, whole, cursor)) == 2 + MAX_ADDED
    assert len(on._views) == 1, len(on._views)


async def test_sessions_that_come_and_go_are_not_kept_without_end(tmp_path: Path) -> None:
    """The gateway is not told when an HTTP session ends: what each found is kept for the latest
    MAX_CLIENTS to find, the latest finder's kept whole (the control)."""
    on, whole = search(tmp_path, search="on", results=1), catalog(3, "send a letter")
    on.offer(whole)
    for i in range(MAX_CLIENTS + 50):
        session = Client("cursor-vscode", f"session-{i}")
        await on.find({"query": "send a letter"}, session, "2025-06-18")
        on.view(whole, session)
    assert len(on._found) == MAX_CLIENTS and len(on._views) <= MAX_CLIENTS
    latest, first = Client("cursor-vscode", f"session-{MAX_CLIENTS + 49}"), Client("cursor-vscode", "session-0")
    assert len(listed(on, whole, latest)) == 3 and listed(on, whole, first) == [FIND, CALL]


@pytest.mark.parametrize("name", HOSTILE, ids=["huge", "control", "near", "claimed"])
async def test_a_hostile_name_changes_only_what_is_listed(tmp_path: Path, name: str) -> None:
    """A name is only a name: it picks the list, at most, never what is found or called, and the
    audit does not take it."""
    auto, whole = search(tmp_path, search="auto"), catalog(60, "send a letter")
    auto.offer(whole)
    client = Client(name, "s")
    names = listed(auto, whole, client)
    assert names == [FIND, CALL] or names == [t.name for t in whole.tools]
    result = await auto.find({"query": "send a letter"}, client, "2025-06-18")
    found = [t["name"] for t in json.loads(result.content[0].text)["tools"]]  # type: ignore[union-attr]
    assert found and set(found) <= set(whole.tool_routes)
    # the same search by a client of no name finds the same
    again = await auto.find({"query": "send a letter"}, Client(None, None), "2025-06-18")
    assert [t["name"] for t in json.loads(again.content[0].text)["tools"]] == found  # type: ignore[union-attr]
    # what it may list is the catalog's, whatever it found
    assert set(listed(auto, whole, client)) <= {FIND, CALL, *whole.tool_routes}
    audit = (tmp_path / "audit.jsonl").read_text()
    assert name.strip() not in audit and "\x1b" not in audit


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_hostile_name_calls_nothing_another_client_could_not(tmp_path: Path, mode: str) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p", tools=RULES)}, catalog={"search": "auto"})
    state = tmp_path / "state"
    gateway = build(config, state)
    async with connected(
        gateway, mode=mode, client_info=Implementation(name=HOSTILE[1] + "x" * 100_000, version="1")
    ) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert "p__crash" not in listed and "p__echo" in listed  # a small catalog: listed whole
        direct = await client.call_tool("p__crash", {})
        through = await client.call_tool(CALL, {"name": "p__crash", "arguments": {}})
        assert direct.is_error and "denied by policy" in text(direct) and text(through) == text(direct)
        assert text(await client.call_tool("p__echo", {"message": "hi"})) == "hi"  # the control
    audit = (state / "audit.jsonl").read_text()
    assert "x" * 1000 not in audit and "\u202e" not in audit and "\x1b" not in audit
