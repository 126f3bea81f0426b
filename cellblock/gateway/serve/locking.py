"""The rug-pull lock as the gateway applies it: what each server may show, and noticing approvals.

For every server with the lock enabled, each catalog the server lists is checked against its lock
file (`<state>/locks/<server>.json`). Items that are new or changed since they were approved are
held: kept out of the catalog and refused when called, and written to a pending file that
`cellblock diff` shows and `cellblock approve` accepts. The gateway looks at the lock files every
`POLL_SECONDS`, so an approval made from another process takes effect without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.compile import policy_for
from cellblock.gateway.config.model import Config
from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.state import lock_path, pending_path, unasked_path
from cellblock.policy.lock import (
    Lock,
    LockError,
    approvable,
    approve,
    check,
    digest,
    item_keys,
    load_lock,
    load_pending,
    save_lock,
    save_pending,
)
from cellblock.policy.unasked import granted, load_unasked, save_unasked, unasked_tools

__all__ = [
    "POLL_SECONDS",
    "Locks",
    "approve_pending",
    "catalog_hash",
    "filter_listing",
    "held_catalog",
    "read_only_offer",
    "revoke_unasked",
    "runs_unasked",
    "unasked_marks",
]

logger = logging.getLogger(__name__)

# the lock's keys of each kind of list (an app goes with the resources it is one of)
_KEY_PREFIXES = {
    "tools": ("tool:",),
    "prompts": ("prompt:",),
    "resources": ("resource:", "app:"),
    "templates": ("template:",),
}

# How often a running gateway looks for approvals made by `cellblock approve` in another process.
POLL_SECONDS = 1.0


def held_catalog(state: Path, server: str) -> dict[str, dict[str, Any]] | None:
    """The catalog held for review of `server`, as it was written to its pending file; None when none is."""
    pending = load_pending(pending_path(state, server))
    return None if pending is None else dict(pending.items)


def catalog_hash(catalog: Mapping[str, Mapping[str, Any]]) -> str:
    """The sha256 (hex) that names a whole catalog (`item_keys`): of its keys and each item's lock
    digest, so it changes exactly when what approving it would lock changes. `cellblock diff` and the
    dashboard show it; `cellblock approve SERVER --hash` and the dashboard's approve are bound to it.

    Raises:
        CatalogError: an item is not plain JSON.
    """
    digests = {key: digest(approvable(key, item)) for key, item in catalog.items()}
    return hashlib.sha256(json.dumps(digests, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def approve_pending(
    state: Path,
    audit: Audit,
    server: str,
    via: str,
    shown: dict[str, dict[str, Any]] | None = None,
    unasked: frozenset[str] = frozenset(),
    shown_hash: str | None = None,
) -> int | None:
    """Accept the held catalog of `server`; how many items it has, or None when nothing is held.

    `shown` (the held catalog as the user saw it) or `shown_hash` (its `catalog_hash`, as a page or
    `cellblock diff` showed it): when the one on disk is no longer that (the server changed it
    meanwhile), nothing is approved and None returned. `unasked`: the tool keys the user lets run
    without asking from now on (`read_only_offer` says which may be); the ones granted before keep
    running so only while their definition is unchanged.
    """
    current = held_catalog(state, server)
    if current is None or (shown is not None and current != shown):
        return None
    # bytes: compare_digest refuses a str that is not ASCII, and a --hash is whatever was typed
    if shown_hash is not None and not hmac.compare_digest(catalog_hash(current).encode(), shown_hash.encode()):
        return None
    result = check(load_lock(lock_path(state, server)), current)
    lock = approve(server, current, time.time())
    grants = granted(load_unasked(unasked_path(state, server)), lock.items, lock.snapshot, unasked)
    save_unasked(unasked_path(state, server), server, grants)  # before the lock, whose change a gateway notices
    save_lock(lock_path(state, server), lock)
    pending_path(state, server).unlink(missing_ok=True)
    extra = {"unasked": sorted(grants)} if grants else {}
    audit.note("lock_approved", server, items=sorted(result.held), removed=sorted(result.removed), via=via, **extra)
    return len(current)


def read_only_offer(config: Config, state: Path, server: str, shown: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What the review of the held catalog `shown` says of tools that run without asking, under
    `tools.read_only: review` (else nothing): (the tool keys it may offer, read-only and
    closed-world by their definition and not granted for it yet; the tool names that keep running
    without asking once it is approved, granted before for this same definition)."""
    if config.tools_of(server).read_only != "review" or not config.lock_of(server).enabled:
        return [], []
    lock = approve(server, shown, 0)
    kept = _unasked_of(state, server, lock)
    tools = {key: sha for key, sha in lock.items.items() if key.startswith("tool:")}
    offer = unasked_tools(tools, lock.items, lock.snapshot) - kept
    return [f"tool:{name}" for name in sorted(offer)], sorted(kept)


def unasked_marks(
    config: Config, server: str, catalog: Mapping[str, Any], granted: Collection[str] = ()
) -> dict[str, bool]:
    """Each tool of `catalog` (item keys) by name, sorted: whether the policy of `server` runs it
    without asking once the catalog is approved, with the tools `granted` at an earlier review."""
    policy = policy_for(config, server)
    tools = sorted(key.removeprefix("tool:") for key in catalog if key.startswith("tool:"))
    return {tool: policy.unasked(tool) or tool in granted for tool in tools}


def runs_unasked(config: Config, state: Path, server: str) -> list[str]:
    """The tools of `server` that run without asking now, by what its lock approves (sorted names)."""
    if config.tools_of(server).read_only != "review" or not config.lock_of(server).enabled:
        return []
    lock = load_lock(lock_path(state, server))
    return [] if lock is None else sorted(_unasked_of(state, server, lock))


def _unasked_of(state: Path, server: str, lock: Lock) -> frozenset[str]:
    try:
        return unasked_tools(load_unasked(unasked_path(state, server)), lock.items, lock.snapshot)
    except LockError as exc:
        logger.error("%s", exc)  # a damaged record grants nothing: those tools ask
        return frozenset()


def filter_listing(listing: Listing, approved: frozenset[str] | None) -> Listing:
    """The part of `listing` whose items are approved (`None`: no lock, everything); which of its
    lists failed stays said."""
    if approved is None:
        return listing
    return replace(
        listing,
        tools=tuple(t for t in listing.tools if f"tool:{t.name}" in approved),
        prompts=tuple(p for p in listing.prompts if f"prompt:{p.name}" in approved),
        resources=tuple(
            r
            for r in listing.resources
            if f"resource:{r.uri}" in approved and (listing.app(str(r.uri)) is None or f"app:{r.uri}" in approved)
        ),
        templates=tuple(t for t in listing.templates if f"template:{t.uri_template}" in approved),
        instructions=listing.instructions if "instructions" in approved else None,
        apps=tuple(app for app in listing.apps if f"app:{app[0]}" in approved),
    )


def unlisted(snapshot: Mapping[str, Any], listing: Listing) -> dict[str, Any]:
    """The approved items (of a lock's `snapshot`) of the kinds `listing` could not list: a failed
    list removes nothing from the lock, and an approval meanwhile keeps them (not shown, not routed)."""
    prefixes = tuple(prefix for kind, _ in listing.failed for prefix in _KEY_PREFIXES[kind])
    return {key: item for key, item in snapshot.items() if key.startswith(prefixes)}


def snapshot_listing(snapshot: Mapping[str, Any]) -> Listing:
    """A catalog rebuilt from a lock's snapshot: what was approved, for a server not started yet."""

    def kind(prefix: str) -> list[Any]:
        return [item for key, item in sorted(snapshot.items()) if key.startswith(prefix)]

    instructions = snapshot.get("instructions", {}).get("text")
    data = {
        "tools": kind("tool:"),
        "prompts": kind("prompt:"),
        "resources": kind("resource:"),
        "templates": kind("template:"),
        "instructions": instructions,
        "apps": kind("app:"),
    }
    return Listing.load(data)


@dataclass
class Locks:
    """Lock decisions for every server, and the lock files' state on disk."""

    config: Config
    state: Path
    audit: Audit
    approved: dict[str, frozenset[str] | None] = field(default_factory=dict)
    held: dict[str, frozenset[str]] = field(default_factory=dict)
    # the tools the user let run without asking, of the definitions the lock approves
    unasked: dict[str, frozenset[str]] = field(default_factory=dict)
    _seen: dict[str, tuple[float, float]] = field(default_factory=dict)

    def enabled(self, server: str) -> bool:
        return self.config.lock_of(server).enabled

    def approved_listing(self, server: str) -> Listing | None:
        """The approved catalog from the lock file, for a lazy server that has not started."""
        if not self.enabled(server):
            return None
        try:
            lock = load_lock(lock_path(self.state, server))
        except LockError as exc:
            logger.error("%s", exc)
            return None
        if lock is None:
            return None
        self.approved[server] = frozenset(lock.items)
        self.unasked[server] = _unasked_of(self.state, server, lock)
        self._seen[server] = self._mtime(server)
        return snapshot_listing(lock.snapshot)

    def review(self, server: str, listing: Listing) -> Listing:
        """Check `listing` against the lock; return the part the client may see."""
        if not self.enabled(server):
            self.approved[server] = None
            self.unasked[server] = frozenset()  # a grant is bound to the lock: without one, every tool asks
            return listing
        current = item_keys(listing.dump())
        path = lock_path(self.state, server)
        try:
            lock = load_lock(path)
        except LockError as exc:
            # a damaged lock approves nothing: hold everything until the user approves again
            logger.error("%s", exc)
            lock = None
        if lock is not None and listing.failed:
            current = {**unlisted(lock.snapshot, listing), **current}
        if lock is None and self.config.lock_of(server).first == "trust":
            lock = approve(server, current, time.time())
            save_lock(path, lock)
            self.audit.note("lock_trusted", server, items=len(current))
        result = check(lock, current)
        held = frozenset(result.held)
        if held:
            save_pending(pending_path(self.state, server), server, current)
        if held and held != self.held.get(server):  # told once, not again at each re-read while held
            event = "lock_held" if lock is None else "lock_changed"
            self.audit.note(event, server, items=sorted(held))
            logger.warning(
                "server '%s': %d item(s) %s; see 'cellblock diff %s', accept with 'cellblock approve %s'",
                server,
                len(held),
                "held for review (first contact)" if lock is None else "changed since they were approved",
                server,
                server,
            )
        if not held:
            pending_path(self.state, server).unlink(missing_ok=True)
        self.approved[server] = result.approved
        granted_now = frozenset() if lock is None else _unasked_of(self.state, server, lock)
        self.unasked[server] = frozenset(n for n in granted_now if f"tool:{n}" in result.approved)
        self.held[server] = held
        self._seen[server] = self._mtime(server)
        return filter_listing(listing, result.approved)

    def changed_on_disk(self) -> list[str]:
        """Servers whose lock file, or file of tools that run without asking, changed since the
        gateway last read it (an approval or a revoke elsewhere)."""
        changed = [s for s in self._seen if self._mtime(s) != self._seen[s]]
        for server in changed:
            # a revoked grant ends now, whether or not the server has started (a grant is only
            # ever added by reading the lock again, when the server's catalog is checked)
            try:
                left = {key.removeprefix("tool:") for key in load_unasked(unasked_path(self.state, server))}
            except LockError as exc:
                logger.error("%s", exc)
                left = set()
            self.unasked[server] = self.unasked.get(server, frozenset()) & left
        return changed

    def _mtime(self, server: str) -> tuple[float, float]:
        return _mtime_of(lock_path(self.state, server)), _mtime_of(unasked_path(self.state, server))


def _mtime_of(path: Path) -> float:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return 0.0


def revoke_unasked(state: Path, server: str, tool: str | None) -> list[str]:
    """Take back the grants of `server` to run without asking (of `tool` alone, if named); the
    tool names they were. A running gateway asks for them again within a poll.

    Raises:
        LockError: the file of grants cannot be read or written.
    """
    path = unasked_path(state, server)
    grants = load_unasked(path)
    gone = sorted(key for key in grants if tool is None or key == f"tool:{tool}")
    if gone:
        save_unasked(path, server, {k: v for k, v in grants.items() if k not in gone})
    return [key.removeprefix("tool:") for key in gone]
