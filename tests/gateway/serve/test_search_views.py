"""What each client lists under `catalog.search` (serve/search.py), in memory: `auto` by the
client's known limit (search/clients.json) and by the token budget, and the found tools added to
the list of a client known to list again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.catalog import CatalogConfig
from cellblock.gateway.search import semantic
from cellblock.gateway.search.clients import known
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.search import MAX_ADDED, Client, Search

pytestmark = pytest.mark.anyio

FIND, CALL = "cellblock__find_tools", "cellblock__call_tool"
WINDSURF, CURSOR = Client("Windsurf", ""), Client("cursor-vscode", "")


def catalog(count: int, description: str = "a tool") -> Catalog:
    names = [f"s__tool_{i}" for i in range(count)]
    tools = tuple(
        types.Tool(name=n, description=f"{description} {i}", input_schema={"type": "object"})
        for i, n in enumerate(names)
    )
    return Catalog(tools=tools, tool_routes={n: ("s", n[3:]) for n in names})


class Told(list[Client]):
    """The clients a Search told that their tool list changed."""

    async def __call__(self, client: Client) -> None:
        self.append(client)


def search(tmp_path: Path, told: Told | None = None, **config: Any) -> Search:
    return Search(CatalogConfig(**config), "__", 64, Audit(tmp_path / "audit.jsonl"), Told() if told is None else told)


def listed(found: Search, whole: Catalog, client: Client) -> list[str]:
    return [t.name for t in found.view(whole, client).tools]


def test_the_table_knows_the_limits_and_who_lists_again() -> None:
    assert known("Windsurf").tools == 50 and known("cursor-vscode").tools == 80
    assert known("Visual Studio Code").tools == 128 and known("Visual Studio Code").list_changed
    assert known("claude-ai").tools is None and not known("claude-ai").list_changed
    assert known(None) == known("no such client") == known("")


def test_auto_searches_only_for_a_client_whose_limit_the_catalog_exceeds(tmp_path: Path) -> None:
    auto, whole = search(tmp_path, search="auto"), catalog(60)
    auto.offer(whole)
    assert listed(auto, whole, WINDSURF) == [FIND, CALL]  # 60 tools, and Windsurf takes 50
    assert listed(auto, whole, CURSOR) == [t.name for t in whole.tools]  # the control: Cursor takes 80
    small = catalog(40)
    auto.offer(small)
    assert listed(auto, small, WINDSURF) == [t.name for t in small.tools]  # under its limit: everything


def test_auto_searches_for_any_client_when_the_list_is_over_the_budget(tmp_path: Path) -> None:
    whole = catalog(10, "x" * 4000)  # about 10,000 tokens
    over, under = search(tmp_path, search="auto", budget=5000), search(tmp_path, search="auto", budget=50_000)
    for each in (over, under):
        each.offer(whole)
    assert 9_000 < over.tokens() < 12_000
    assert listed(over, whole, Client(None, "")) == [FIND, CALL]
    assert listed(under, whole, Client(None, "")) == [t.name for t in whole.tools]


def test_off_and_on_are_the_same_for_every_client(tmp_path: Path) -> None:
    whole = catalog(3)
    off, on = search(tmp_path), search(tmp_path, search="on")
    for each in (off, on):
        each.offer(whole)
    for client in (WINDSURF, CURSOR, Client()):
        assert off.view(whole, client) is whole
        assert listed(on, whole, client) == [FIND, CALL]


async def test_found_tools_join_the_list_of_a_client_that_lists_again_and_no_other(tmp_path: Path) -> None:
    told = Told()
    on, whole = search(tmp_path, told, search="on", results=2), catalog(5, "send a letter")
    on.offer(whole)
    result = await on.find({"query": "send a letter"}, CURSOR, "2025-06-18")
    names = [t["name"] for t in json.loads(result.content[0].text)["tools"]]  # type: ignore[union-attr]
    assert told == [CURSOR] and len(names) == 2 and listed(on, whole, CURSOR) == [FIND, CALL, *names]
    await on.find({"query": "send a letter"}, CURSOR, "2025-06-18")
    assert told == [CURSOR]  # nothing new: not told again
    # one not known to list again; a 2026-07-28 client over HTTP (no key); another HTTP session
    for client in (Client("claude-ai", "s2"), Client("cursor-vscode", None), Client("cursor-vscode", "other")):
        if client.key != "other":
            await on.find({"query": "send a letter"}, client, "2025-06-18")
        assert listed(on, whole, client) == [FIND, CALL]
    assert told == [CURSOR]
    # a tool held or denied since it was found leaves the catalog, and the list with it
    fewer = Catalog(tools=whole.tools[2:], tool_routes={t.name: ("s", t.name) for t in whole.tools[2:]})
    on.offer(fewer)
    kept = [n for n in names if n in fewer.tool_routes]
    assert listed(on, fewer, CURSOR) == [FIND, CALL, *kept]


async def test_a_client_keeps_at_most_the_latest_found_tools(tmp_path: Path) -> None:
    on, whole = search(tmp_path, search="on", results=1), catalog(MAX_ADDED + 5)
    on.offer(whole)
    for i in range(MAX_ADDED + 5):
        await on.find({"query": f"tool {i}", "server": "s"}, CURSOR, "2025-06-18")
    assert len(listed(on, whole, CURSOR)) == 2 + MAX_ADDED


async def test_found_tools_may_run_as_tasks_at_2025_11_25(tmp_path: Path) -> None:
    on, whole = search(tmp_path, search="on"), catalog(3, "send a letter")
    on.offer(whole)
    for version, support in (("2025-11-25", "optional"), ("2025-06-18", None)):
        result = await on.find({"query": "send a letter"}, Client(), version)
        tools = json.loads(result.content[0].text)["tools"]  # type: ignore[union-attr]
        assert tools and all(t.get("execution", {}).get("taskSupport") == support for t in tools), tools


async def test_the_embeddings_load_at_the_first_search_not_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semantic, "_model", None)
    on, whole = search(tmp_path, search="on"), catalog(3, "send a letter")
    on.offer(whole)
    assert semantic._model is None  # a gateway with search starts without them (33 MB)
    await on.find({"query": "send a letter"}, Client(), "2025-06-18")
    assert semantic._model is not None
