"""Section 10, tool search: how well `cellblock__find_tools` ranks, what it saves the client, how fast.

- recall@1 and recall@5 of the ranking over the saved catalogs of real servers
  (tests/bench/search/catalogs) for capability queries written as a user asks
  (tests/bench/search/queries.json), on the queries it was tuned on (dev) and on those held out;
- the client's list with search off and on, and one search round (the request and its answer), in
  tokens (characters / 4: no tokenizer ships offline, and the ratio is what matters);
- the time of one search over 2,000 tools (the catalogs repeated), of building the index, and of
  loading the embeddings (once per process);
- the same recall with the lexical rankings alone, the control for the semantic one.

The ranking is the gateway's own: the catalogs are turned into the tools a client would be offered
(`server__tool`) and ranked by `serve/search.py`'s entries and `search/index.py`'s index.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import mcp.types as types

from cellblock.gateway.search import semantic
from cellblock.gateway.search.index import Index
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.search import Client, entry_of
from tests.bench.report import Table
from tests.bench.search import Query, load_catalogs, load_queries
from tests.bench.spawn import Scratch

LARGE = 2_000
SEP = "__"


def _catalog(copies: int = 1) -> Catalog:
    """The saved catalogs as the gateway's catalog: each tool under `server__tool`, `copies` times."""
    tools: list[types.Tool] = []
    routes: dict[str, tuple[str, str]] = {}
    for copy in range(copies):
        for catalog in load_catalogs().values():
            server = catalog.server if copy == 0 else f"{catalog.server}{copy}"
            for raw in catalog.tools:
                tool = types.Tool.model_validate({**raw, "name": f"{server}{SEP}{raw['name']}"})
                tools.append(tool)
                routes[tool.name] = (server, raw["name"])
    return Catalog(tools=tuple(tools), tool_routes=routes)


def _recall(index: Index, queries: list[Query]) -> tuple[float, float]:
    at1 = at5 = 0
    for query in queries:
        top = [m.name.replace(SEP, ":", 1) for m in index.find(query.query, 5)]
        answers = set(query.answers)
        at1 += bool(top) and top[0] in answers
        at5 += bool(answers & set(top))
    return at1 / len(queries), at5 / len(queries)


def _tokens(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) // 4


async def search_cost(scratch: Scratch, quick: bool) -> list[Table]:
    catalog = _catalog()
    index = Index([entry_of(t, catalog) for t in catalog.tools])
    ranking = Table(
        f"10. Tool search: recall over {len(catalog.tools)} tools of {len(load_catalogs())} real servers",
        ["queries", "n", "recall@1", "recall@5"],
    )
    lexical = Index([entry_of(t, catalog) for t in catalog.tools], meaning=False)
    for split, label in (("dev", "tuned on (dev)"), ("held_out", "held out"), (None, "all")):
        queries = load_queries(split)  # type: ignore[arg-type]
        at1, at5 = _recall(index, queries)
        ranking.add([label, str(len(queries)), f"{at1:.2f}", f"{at5:.2f}"], split=split, at1=at1, at5=at5)
    for split, label in (("dev", "dev, the lexical rankings alone"), ("held_out", "held out, lexical alone")):
        queries = load_queries(split)  # type: ignore[arg-type]
        at1, at5 = _recall(lexical, queries)
        ranking.add([label, str(len(queries)), f"{at1:.2f}", f"{at5:.2f}"], split=split, at1=at1, at5=at5, lexical=True)
    ranking.notes.append("a query is found at k when any of its acceptable tools ranks in the top k")
    ranking.notes.append("lexical alone: the two BM25 rankings without the semantic one (the control)")

    listed = [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in catalog.tools]
    from cellblock.gateway.audit.log import Audit
    from cellblock.gateway.config.catalog import CatalogConfig
    from cellblock.gateway.serve.search import Search

    search = Search(CatalogConfig(search="on"), SEP, 64, Audit(scratch.path("search-audit.jsonl")))
    search.offer(catalog)
    offered = search.view(catalog, Client())
    small = [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in offered.tools]
    rounds = []
    for query in load_queries():
        asked = {"name": search.find_name, "arguments": {"query": query.query}}
        answer = await search.find({"query": query.query}, Client(), "2025-06-18")
        rounds.append(_tokens(asked) + _tokens(answer.model_dump(by_alias=True, mode="json", exclude_none=True)))
    tokens = Table("10. Tool search: what the client reads, in tokens (characters / 4)", ["what", "tokens"])
    tokens.add([f"the list, search off ({len(listed)} tools)", f"{_tokens(listed):,}"], tokens=_tokens(listed))
    tokens.add([f"the list, search on ({len(small)} tools)", f"{_tokens(small):,}"], tokens=_tokens(small))
    typical = int(statistics.median(rounds))
    tokens.add(["one search round (request and answer, median)", f"{typical:,}"], tokens=typical)

    semantic.reset()
    started = time.perf_counter()
    semantic.model()
    loaded = time.perf_counter() - started
    large = _catalog(-(-LARGE // len(catalog.tools)))
    entries = [entry_of(t, large) for t in large.tools][:LARGE]
    started = time.perf_counter()
    big = Index(entries)
    built = time.perf_counter() - started
    times = []
    for query in load_queries()[: 30 if quick else None]:
        started = time.perf_counter()
        big.find(query.query, 5)
        times.append(time.perf_counter() - started)
    speed = Table(f"10. Tool search over {len(entries):,} tools", ["what", "ms"])
    speed.add(["one search (median)", f"{statistics.median(times) * 1000:.2f}"], ms=statistics.median(times) * 1000)
    speed.add(["building the index (once per catalog, at the first search)", f"{built * 1000:.0f}"], ms=built * 1000)
    speed.add(
        ["loading the embeddings (once per process, at the first search)", f"{loaded * 1000:.0f}"], ms=loaded * 1000
    )
    return [ranking, tokens, speed]
