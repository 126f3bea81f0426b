"""What a client is known to take, by the name it gives itself (`clients.json`, kept as data).

`catalog.search: auto` turns search on for a client whose known limit the catalog exceeds, and
adds the tools a search found to the list of a client known to list again when told to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["Known", "known"]


@dataclass(frozen=True)
class Known:
    tools: int | None = None  # the tools it takes well; None: no known limit
    list_changed: bool = False  # it lists the tools again when told that they changed


@cache
def _table() -> dict[str, Known]:
    loaded = json.loads((Path(__file__).parent / "clients.json").read_text(encoding="utf-8"))
    clients: dict[str, dict[str, object]] = loaded["clients"]
    return {name: Known(_limit(e.get("tools")), e.get("list_changed") is True) for name, e in clients.items()}


def _limit(value: object) -> int | None:
    return value if isinstance(value, int) else None


def known(name: str | None) -> Known:
    """What the client called `name` is known to take; an unknown or unnamed one: nothing known."""
    return _table().get(name or "", Known())
