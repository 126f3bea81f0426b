"""approvals.json: what the user allowed for good, which every gateway reads and the CLI changes.

approvals.json (version 2) keeps tools under "always" and prompts and resources under "items"; a
version 1 file's "prompt:NAME"/"resource:URI" entries are read as the prompt's or resource's
approval, which is what they granted then. Inside, a grant is (kind, name), a prompt's or
resource's name carrying its kind ("prompt:greet").

Every change (an "always" answered in any gateway, `cellblock revoke`) is made under the state
dir's lock for the file (`state.locked`): the file is read again under it, changed and written
whole, so two writers at once (two gateways, or a gateway and the CLI) never lose each other's
change, and a revoke is never undone by a gateway writing from a copy made before it. Reading
needs no lock, as the file is only ever replaced whole; a gateway reads it again whenever it has
changed on disk: its inode, times or size differ (a write replaces the file with a new one,
whose inode is not the one it replaced, so a write within one tick of a coarse clock is seen).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cellblock.gateway.state import atomic_write_json, locked, read_json

__all__ = ["FILE_VERSION", "ITEM_KINDS", "ITEM_PREFIXES", "Remembered", "read_always"]

FILE_VERSION = 2
ITEM_KINDS = ("prompt", "resource")
# how a prompt's and a resource's name begins inside the gateway ("prompt:greet")
ITEM_PREFIXES = ("prompt:", "resource:")

Table = dict[str, set[tuple[str, str]]]  # server -> {(kind, name)}
T = TypeVar("T")
_UNREAD = (-1, -1, -1, -1)  # what no file is: read it at the next answer
_MISSING = (0, 0, 0, 0)


class Remembered:
    """The always-approvals in `path` (approvals.json): read when changed, changed under its lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._table: Table = {}
        self._seen = _UNREAD  # (inode, mtime, ctime, size) of the file as it was last read

    def table(self) -> Table:
        """server -> {(kind, name)} always allowed; read again when the file changed (a revoke elsewhere)."""
        try:
            info = os.stat(self.path)
            seen = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
        except OSError:
            seen = _MISSING
        if seen != self._seen:
            self._table = read_always(read_json(self.path))
            self._seen = seen
        return self._table

    def stale(self) -> None:
        """Read the file again before the next answer, whatever its time stamp says."""
        self._seen = _UNREAD

    def add(self, server: str, kind: str, name: str) -> None:
        """Allow `name` (of `kind`) of `server` always. It blocks on the lock: call it off the event loop.

        Raises:
            StateWriteError: the file could not be locked or saved (nothing is remembered).
        """
        self._change(lambda table: table.setdefault(server, set()).add((kind, name)))

    def remove(self, server: str, key: tuple[str, str] | None) -> list[tuple[str, str]]:
        """Forget `server`'s always-approval `key` (kind, name), or all of them; what was removed.

        Raises:
            StateWriteError: the file could not be locked or saved (nothing is forgotten).
        """

        def forget(table: Table) -> list[tuple[str, str]]:
            stored = table.pop(server, set())
            gone = sorted(stored if key is None else stored & {key})
            if stored - set(gone):
                table[server] = stored - set(gone)
            return gone

        return self._change(forget)

    def _change(self, edit: Callable[[Table], T]) -> T:
        """`edit` the table as the file holds it under the lock, and write it back if it changed."""
        with locked(self.path):
            table = read_always(read_json(self.path))
            before = _file(table)
            result = edit(table)
            if _file(table) != before:
                atomic_write_json(self.path, _file(table))
        self.stale()
        return result


def _file(table: Table) -> dict[str, Any]:
    tools = {s: sorted(t for k, t in keys if k == "tool") for s, keys in sorted(table.items())}
    items = {
        s: {k: sorted(t.removeprefix(f"{k}:") for kk, t in keys if kk == k) for k in ITEM_KINDS}
        for s, keys in sorted(table.items())
    }
    return {
        "version": FILE_VERSION,
        "always": {s: t for s, t in tools.items() if t},
        "items": {s: {k: n for k, n in kinds.items() if n} for s, kinds in items.items() if any(kinds.values())},
    }


def read_always(data: Any) -> Table:
    """The always-approvals in approvals.json's `data`: server -> {(kind, tool)}; anything malformed is left out."""
    if not isinstance(data, dict):
        return {}
    table: Table = {}
    tools = data.get("always", {})
    for server, names in tools.items() if isinstance(tools, dict) else ():
        if isinstance(server, str) and isinstance(names, list):
            for name in (n for n in names if isinstance(n, str)):
                # version 1 kept a prompt's or resource's approval here as "prompt:NAME"/"resource:URI"
                kind = (
                    name.partition(":")[0]
                    if data.get("version") != FILE_VERSION and name.startswith(ITEM_PREFIXES)
                    else "tool"
                )
                table.setdefault(server, set()).add((kind, name))
    items = data.get("items", {}) if data.get("version") == FILE_VERSION else {}
    for server, kinds in items.items() if isinstance(items, dict) else ():
        for kind in ITEM_KINDS if isinstance(server, str) and isinstance(kinds, dict) else ():
            names = kinds.get(kind, [])
            for name in (n for n in names if isinstance(n, str)) if isinstance(names, list) else ():
                table.setdefault(server, set()).add((kind, f"{kind}:{name}"))
    return table
