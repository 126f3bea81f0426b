"""The rug-pull lock: what a server's catalog looked like when the user approved it.

Every tool, prompt, resource, resource template and the server's instructions is one *item*,
keyed `tool:<name>`, `prompt:<name>`, `resource:<uri>`, `template:<uriTemplate>` or
`instructions` (`item_keys`). Each item is hashed on its own (`digest`), so a change holds back
that item only (`check`), and `describe` (policy/lockdiff.py) shows what changed, item by item,
for `cellblock diff`.

What the digest covers: the whole wire dict, every field, including ones a server may change
without meaning harm (`title`, `icons`, its own `_meta`). Excluding a field would give a server
somewhere to hide an instruction, so the only exclusion is `_meta` keys under
`io.modelcontextprotocol/` at the top of an item: protocol stamps that may change from one
response to the next. The gateway strips the same keys (`without_protocol_meta`) from every item
before the client sees it, so nothing the lock does not cover reaches the client. A `_meta` left
empty by that is dropped, so `{}` and no `_meta` hash the same.

One field of a tool is approved without being locked: `execution`, which says whether the tool
runs as a task (2025-11-25's `taskSupport`, one of three words, never text) and which only the
handshake era lists, so that a server spoken to in either era has one approved catalog (the
gateway speaks to a server in its client's era). The gateway never shows it to a client. A lock
approves each tool without it (`approve`); a lock written with it still matches the tool as it
was listed then (`check`).

Files (DESIGN.md "State on disk"), written atomically and 0600 by `policy.files`:

    lock     {"version": 1, "server": S, "approved_at": T, "items": {key: sha256},
              "snapshot": {key: item as approved}}
    pending  {"version": 1, "server": S, "items": {key: item}}   seen, not approved yet

The snapshot is what `describe` diffs against and what the gateway may serve for a lazy server
before it starts; `load_lock` checks that each snapshot item still hashes to its digest.

Errors (both are `CellblockError`, see `policy/errors.py`):

    CellblockError
    ├── LockError       a lock or pending file cannot be read, written or trusted
    └── CatalogError    a server's catalog cannot be locked (no name, a clashing twin, not JSON)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from cellblock.policy.errors import CellblockError
from cellblock.policy.files import atomic_write_json
from cellblock.policy.text import visible as _visible

__all__ = [
    "INSTRUCTIONS",
    "KINDS",
    "LOCK_VERSION",
    "Catalog",
    "CatalogError",
    "Item",
    "Lock",
    "LockCheck",
    "LockError",
    "Pending",
    "approvable",
    "approve",
    "canonical",
    "check",
    "digest",
    "item_keys",
    "load_lock",
    "load_pending",
    "save_lock",
    "save_pending",
    "stable",
    "without_protocol_meta",
]

LOCK_VERSION = 1

Item = dict[str, Any]

# (catalog field, key prefix, the field that names the item)
KINDS: tuple[tuple[str, str, str], ...] = (
    ("tools", "tool", "name"),
    ("prompts", "prompt", "name"),
    ("resources", "resource", "uri"),
    ("templates", "template", "uriTemplate"),
    ("apps", "app", "uri"),  # an MCP App's ui:// resource by its content's digest: a changed app is held
)
_PREFIXES = frozenset(prefix for _, prefix, _ in KINDS)
INSTRUCTIONS = "instructions"
_PROTOCOL_META = "io.modelcontextprotocol/"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class LockError(CellblockError):
    """A lock or pending file is unreadable, corrupt or unwritable; the message names the file and the fix."""


class CatalogError(CellblockError):
    """A server's catalog cannot be locked: an item without a name, two different items under one key, or not JSON."""


class Catalog(TypedDict):
    """One server's catalog as the gateway hands it over: MCP wire dicts (camelCase keys)."""

    tools: list[Item]
    prompts: list[Item]
    resources: list[Item]
    templates: list[Item]
    instructions: str | None


# -- items and digests ------------------------------------------------------------------------


def canonical(value: Any) -> str:
    """`value` as canonical JSON text.

    Raises:
        CatalogError: `value` holds NaN, an infinity or something that is not JSON.
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CatalogError(f"a catalog item is not plain JSON ({exc}); Cellblock cannot lock it") from exc


def without_protocol_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """An item's `_meta` without the protocol's own stamps, the keys the digest leaves out."""
    return {k: v for k, v in meta.items() if not (isinstance(k, str) and k.startswith(_PROTOCOL_META))}


def stable(item: Mapping[str, Any]) -> Item:
    """`item` without the protocol's own `_meta` stamps (see the module docstring)."""
    stable = dict(item)
    meta = stable.get("_meta")
    if isinstance(meta, Mapping):
        kept = without_protocol_meta(meta)
        if kept:
            stable["_meta"] = kept
        else:
            del stable["_meta"]
    return stable


def digest(item: Mapping[str, Any]) -> str:
    """The sha256 (hex) of `item` as canonical JSON, protocol `_meta` stamps left out.

    Raises:
        CatalogError: `item` is not plain JSON (NaN, infinities, other Python objects).
    """
    # surrogatepass: a lone surrogate from a "\\ud800" escape on the wire must hash, not crash
    return hashlib.sha256(canonical(stable(item)).encode("utf-8", "surrogatepass")).hexdigest()


def _plain(item: Mapping[str, Any]) -> Item:
    """A deep copy of `item` made of JSON types only (tuples become lists)."""
    copy: Item = json.loads(canonical(item))
    return copy


def item_keys(catalog: Catalog | Mapping[str, Any]) -> dict[str, Item]:
    """Split a catalog into items keyed `tool:<name>`, `prompt:<name>`, `resource:<uri>`,
    `template:<uriTemplate>`, `app:<uri>` and `instructions` (as `{"text": ...}`, only when non-empty).

    Raises:
        CatalogError: an item is not an object or has no name, or two different items share a key.
    """
    source: Mapping[str, Any] = catalog
    keys: dict[str, Item] = {}
    for field, prefix, id_field in KINDS:
        entries = source.get(field) or []
        if not isinstance(entries, list | tuple):
            raise CatalogError(f"the catalog's {field} is not a list")
        for entry in entries:
            if not isinstance(entry, Mapping):
                raise CatalogError(f"the catalog's {field} holds something that is not an object")
            ident = entry.get(id_field)
            if not isinstance(ident, str) or not ident:
                raise CatalogError(f"a {prefix} in the catalog has no {id_field!r}; Cellblock cannot lock it")
            key = f"{prefix}:{ident}"
            item = dict(entry)
            # two different items under one name: the lock cannot say which one was approved
            if key in keys and canonical(keys[key]) != canonical(item):
                raise CatalogError(f"the catalog lists {_visible(key)} twice, differently; Cellblock cannot lock it")
            keys[key] = item
    instructions = source.get(INSTRUCTIONS)
    if instructions is not None and not isinstance(instructions, str):
        raise CatalogError("the server's instructions are not a string")
    if instructions:
        keys[INSTRUCTIONS] = {"text": instructions}
    return dict(sorted(keys.items()))


def _is_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    prefix, sep, rest = key.partition(":")
    return key == INSTRUCTIONS or (bool(sep) and prefix in _PREFIXES and bool(rest))


def _check_keys(keys: Iterable[object]) -> None:
    """Raise ValueError naming each of `keys` that is not an item key."""
    bad = sorted(repr(k) for k in keys if not _is_key(k))
    if bad:
        raise ValueError(f"not item keys: {', '.join(bad)} (expected tool:NAME, prompt:NAME, ... or instructions)")


# -- the lock ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lock:
    """What the user approved for one server: a digest and a snapshot per item."""

    server: str
    items: Mapping[str, str]  # key -> digest
    snapshot: Mapping[str, Item]  # key -> the item as approved
    approved_at: float  # seconds since the epoch

    def __post_init__(self) -> None:
        if set(self.items) != set(self.snapshot):
            raise ValueError("a lock's items and snapshot must name the same keys")
        object.__setattr__(self, "items", MappingProxyType(dict(sorted(self.items.items()))))
        object.__setattr__(self, "snapshot", MappingProxyType(dict(sorted(self.snapshot.items()))))


@dataclass(frozen=True)
class Pending:
    """A catalog the gateway saw for `server` that the user has not approved yet."""

    server: str
    items: Mapping[str, Item]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", MappingProxyType(dict(sorted(self.items.items()))))


@dataclass(frozen=True)
class LockCheck:
    """How a current catalog compares with the lock. Changed and added items are held back."""

    approved: frozenset[str]  # unchanged since approval: may be listed and called
    changed: Mapping[str, tuple[Item, Item]]  # key -> (approved item, current item)
    added: Mapping[str, Item]
    removed: frozenset[str]  # approved, no longer offered: simply gone, nothing to hold

    def __post_init__(self) -> None:
        object.__setattr__(self, "changed", MappingProxyType(dict(sorted(self.changed.items()))))
        object.__setattr__(self, "added", MappingProxyType(dict(sorted(self.added.items()))))

    @property
    def held(self) -> frozenset[str]:
        """Keys that must not be listed or called until the user approves them."""
        return frozenset(self.changed) | frozenset(self.added)

    @property
    def clean(self) -> bool:
        """True when the current catalog is exactly the approved one (a removal is not clean, holds nothing)."""
        return not (self.changed or self.added or self.removed)


def approve(server: str, current: Mapping[str, Mapping[str, Any]], now: float) -> Lock:
    """A lock that approves every item of `current` for `server`, as of `now`.

    Raises:
        CatalogError: an item is not plain JSON.
        ValueError: `server` is empty or a key is not an item key.
    """
    if not server:
        raise ValueError("a lock needs a server name")
    _check_keys(current)
    snapshot = {key: _plain(approvable(key, item)) for key, item in current.items()}
    return Lock(server, {key: digest(item) for key, item in snapshot.items()}, snapshot, float(now))


def approvable(key: str, item: Mapping[str, Any]) -> Mapping[str, Any]:
    """The item of `key` as a lock approves it: a tool without its `execution` (see the module
    docstring); any other item as it is."""
    if key.startswith("tool:") and "execution" in item:
        return {k: v for k, v in item.items() if k != "execution"}
    return item


def check(lock: Lock | None, current: Mapping[str, Mapping[str, Any]]) -> LockCheck:
    """Compare `current` (from `item_keys`) with `lock`; with no lock every item is new.

    Raises:
        CatalogError: a current item is not plain JSON.
    """
    digests: Mapping[str, str] = lock.items if lock is not None else {}
    snapshot: Mapping[str, Item] = lock.snapshot if lock is not None else {}
    approved: set[str] = set()
    changed: dict[str, tuple[Item, Item]] = {}
    added: dict[str, Item] = {}
    for key, item in current.items():
        shown = approvable(key, item)  # what approving it would lock, and what a diff shows
        if key not in digests:
            added[key] = dict(shown)
        elif digest(item) == digests[key] or (shown is not item and digest(shown) == digests[key]):
            approved.add(key)
        else:
            changed[key] = (dict(approvable(key, snapshot[key])), dict(shown))
    return LockCheck(frozenset(approved), changed, added, frozenset(digests.keys() - current.keys()))


# -- files ------------------------------------------------------------------------------------


class _BadShape(Exception):
    """A state file parsed but does not have the shape Cellblock writes; the message says where."""


def _server_from(path: Path) -> str:
    name = path.name.removesuffix(".json")
    return name.removesuffix(".pending")


def _lock_error(path: Path, why: str) -> LockError:
    return LockError(
        f"lock file {path} {why}; remove it and approve the server again with 'cellblock approve {_server_from(path)}'"
    )


def _pending_error(path: Path, why: str) -> LockError:
    server = _server_from(path)
    return LockError(
        f"pending catalog file {path} {why}; remove it, start '{server}' again so the gateway"
        f" records its catalog, and approve it with 'cellblock approve {server}'"
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("an object names the same key twice")
    return found


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read(path: Path) -> Any:
    """The parsed JSON in `path` (a file holding `null` is corrupt, not missing).

    Raises:
        FileNotFoundError: there is no such file.
        _BadShape: the file cannot be read or is not strict JSON.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _BadShape(f"cannot be read ({exc.strerror or exc})") from exc
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _BadShape(f"is not valid JSON ({exc})") from exc


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _BadShape(f"is corrupt: {what} is not an object")
    return value


def _header(doc: Any, fields: set[str]) -> tuple[dict[str, Any], str]:
    top = _object(doc, "the file")
    if set(top) != fields:
        raise _BadShape(f"is corrupt: expected the fields {sorted(fields)}, got {sorted(top)}")
    if top["version"] != LOCK_VERSION:
        raise _BadShape(f"has an unknown version (got {top['version']!r}, expected {LOCK_VERSION})")
    server = top["server"]
    if not isinstance(server, str) or not server:
        raise _BadShape("is corrupt: 'server' is not a name")
    return top, server


def _items(value: Any, what: str) -> dict[str, Any]:
    items = _object(value, f"'{what}'")
    bad = [k for k in items if not _is_key(k)]
    if bad:
        raise _BadShape(f"is corrupt: {_visible(repr(bad[0]))} in '{what}' is not an item key")
    return items


def _parse_lock(doc: Any) -> Lock:
    top, server = _header(doc, {"version", "server", "approved_at", "items", "snapshot"})
    approved_at = top["approved_at"]
    if isinstance(approved_at, bool) or not isinstance(approved_at, int | float) or not math.isfinite(approved_at):
        raise _BadShape("is corrupt: 'approved_at' is not a time")
    digests = _items(top["items"], "items")
    snapshot = _items(top["snapshot"], "snapshot")
    if set(digests) != set(snapshot):
        raise _BadShape("is corrupt: 'items' and 'snapshot' name different keys")
    for key in sorted(digests):
        value, item = digests[key], snapshot[key]
        if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
            raise _BadShape(f"is corrupt: the digest of {_visible(key)} is not a sha256")
        if not isinstance(item, dict):
            raise _BadShape(f"is corrupt: the snapshot of {_visible(key)} is not an object")
        try:
            matches = digest(item) == value
        except CatalogError as exc:
            raise _BadShape(f"is corrupt: the snapshot of {_visible(key)} is not plain JSON") from exc
        if not matches:
            raise _BadShape(f"is corrupt: the snapshot of {_visible(key)} does not match its digest")
    return Lock(server, digests, snapshot, float(approved_at))


def load_lock(path: str | os.PathLike[str]) -> Lock | None:
    """The lock in `path`, or None when there is none (the server was never approved).

    Raises:
        LockError: the file exists but is unreadable, corrupt or of another shape; names the fix.
    """
    path = Path(path)
    try:
        return _parse_lock(_read(path))
    except FileNotFoundError:
        return None
    except _BadShape as exc:
        raise _lock_error(path, str(exc)) from exc


def save_lock(path: str | os.PathLike[str], lock: Lock) -> None:
    """Write `lock` to `path` atomically, 0600.

    Raises:
        LockError: the file could not be written; the old one, if any, is untouched.
        CatalogError: a snapshot item is not plain JSON.
    """
    path = Path(path)
    doc = {
        "version": LOCK_VERSION,
        "server": lock.server,
        "approved_at": lock.approved_at,
        "items": dict(lock.items),
        "snapshot": {key: _plain(item) for key, item in lock.snapshot.items()},
    }
    try:
        atomic_write_json(path, doc)
    except OSError as exc:
        raise LockError(f"cannot write lock file {path} ({exc.strerror or exc}); the old lock is kept") from exc


def load_pending(path: str | os.PathLike[str]) -> Pending | None:
    """The pending catalog in `path`, or None when there is none.

    Raises:
        LockError: the file exists but is unreadable or corrupt; names the fix.
    """
    path = Path(path)
    try:
        top, server = _header(_read(path), {"version", "server", "items"})
        items = _items(top["items"], "items")
        for key in sorted(items):
            _object(items[key], f"the item {_visible(key)}")
        return Pending(server, items)
    except FileNotFoundError:
        return None
    except _BadShape as exc:
        raise _pending_error(path, str(exc)) from exc


def save_pending(path: str | os.PathLike[str], server: str, items: Mapping[str, Mapping[str, Any]]) -> None:
    """Record `items` (from `item_keys`) as what `server` offers, not yet approved; atomic, 0600.

    Raises:
        LockError: the file could not be written; the old one, if any, is untouched.
        CatalogError: an item is not plain JSON.
        ValueError: `server` is empty or a key is not an item key.
    """
    path = Path(path)
    if not server:
        raise ValueError("a pending catalog needs a server name")
    _check_keys(items)
    doc = {"version": LOCK_VERSION, "server": server, "items": {key: _plain(item) for key, item in items.items()}}
    try:
        atomic_write_json(path, doc)
    except OSError as exc:
        raise LockError(f"cannot write pending catalog file {path} ({exc.strerror or exc})") from exc
