"""The tool-search benchmark's data: real servers' catalogs and capability queries (see README.md here).

`load_catalogs()` reads catalogs/*.json (saved by `python -m tests.bench.search_catalogs --save`),
`load_queries()` reads queries.json. A tool is named `server:tool` in the queries' answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CATALOGS",
    "HERE",
    "QUERIES",
    "Catalog",
    "Query",
    "Split",
    "load_catalogs",
    "load_queries",
    "split_of",
    "tool_ids",
]

HERE = Path(__file__).resolve().parent
CATALOGS = HERE / "catalogs"
QUERIES = HERE / "queries.json"

Split = Literal["dev", "held_out"]
# ids whose number modulo 5 is one of these are held out (40%): fixed before any ranking existed
HELD_OUT_REMAINDERS = (2, 4)


@dataclass(frozen=True)
class Catalog:
    """One server's tools as it listed them (name, title, description, inputSchema, outputSchema, annotations)."""

    server: str
    package: str
    version: str
    tools: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Query:
    """A request in a user's words and the tools that answer it.

    `answers`: every acceptable tool; the query is found at k when any of them ranks in the top k.
    `steps`: for a multi-step request, the tools each step needs (empty otherwise).
    """

    id: str
    query: str
    answers: tuple[str, ...]
    split: Split
    names_server: bool
    tags: tuple[str, ...]
    steps: tuple[tuple[str, ...], ...] = ()


def split_of(query_id: str) -> Split:
    """The split the fixed rule gives an id like `q042`."""
    return "held_out" if int(query_id.removeprefix("q")) % 5 in HELD_OUT_REMAINDERS else "dev"


def load_catalogs(directory: Path = CATALOGS) -> dict[str, Catalog]:
    """Every saved catalog, by server name (sorted)."""
    found: dict[str, Catalog] = {}
    for path in sorted(directory.glob("*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        found[raw["server"]] = Catalog(raw["server"], raw["package"], raw["version"], tuple(raw["tools"]))
    return found


def tool_ids(catalogs: dict[str, Catalog]) -> set[str]:
    """Every tool as `server:tool`."""
    return {f"{catalog.server}:{tool['name']}" for catalog in catalogs.values() for tool in catalog.tools}


def load_queries(split: Split | None = None, path: Path = QUERIES) -> list[Query]:
    """The queries in file order, all of them or one split's."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    queries = [
        Query(
            id=entry["id"],
            query=entry["query"],
            answers=tuple(entry["answers"]),
            split=entry["split"],
            names_server=entry["names_server"],
            tags=tuple(entry["tags"]),
            steps=tuple(tuple(step) for step in entry.get("steps", ())),
        )
        for entry in raw["queries"]
    ]
    return [query for query in queries if split is None or query.split == split]
