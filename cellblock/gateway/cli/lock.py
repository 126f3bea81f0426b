"""`cellblock diff`, `approve SERVER` and `review`: read and accept the catalogs the lock holds."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TextIO

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.cli.meet import meet_unmet, unmet
from cellblock.gateway.cli.options import load
from cellblock.gateway.config.model import Config
from cellblock.gateway.serve.locking import (
    approve_pending,
    catalog_hash,
    held_catalog,
    read_only_offer,
    unasked_marks,
)
from cellblock.gateway.state import lock_path, pending_path, state_dir
from cellblock.policy.lock import check, load_lock
from cellblock.policy.lockdiff import describe
from cellblock.policy.text import visible

__all__ = [
    "approve_all",
    "approve_command",
    "approve_server",
    "diff_all",
    "diff_command",
    "diff_server",
    "held",
    "review",
    "review_command",
    "unasked_line",
]


def diff_command(config_path: str | None, server: str | None) -> int:
    """`cellblock diff SERVER`, or `diff --all` when `server` is None."""
    config, source = load(config_path, server)
    state = state_dir()
    if server is None:
        return diff_all(config, source, state)
    if server in unmet(config, state):  # right after wrap: what it offers is learnt first
        meet_unmet(config, source, state)
    return diff_server(config, state, server)


def approve_command(config_path: str | None, server: str | None, shown_hash: str | None = None) -> int:
    """`cellblock approve SERVER [--hash H]`, or `approve --all` when `server` is None."""
    config, source = load(config_path, server)
    state = state_dir()
    audit = config.audit_log(state)
    if server is None:
        return approve_all(config, source, state, audit)
    if server in unmet(config, state):
        meet_unmet(config, source, state)
    return approve_server(config, state, audit, server, shown_hash)


def review_command(config_path: str | None) -> int:
    config, source = load(config_path)
    state = state_dir()
    return review(config, source, state, config.audit_log(state), sys.stdin)


def diff_server(config: Config, state: Path, server: str) -> int:
    """Print what changed since `server` was approved; 1 when something is held, 0 when not."""
    current = held_catalog(state, server)
    if current is None:
        print(f"cellblock: nothing held for '{server}': its catalog matches its lock", file=sys.stderr)
        return 0
    lock = lock_path(state, server)
    print(describe(check(load_lock(lock), current), server, not lock.exists()))
    shown = catalog_hash(current)
    print(
        f"catalog sha256 {shown}: to approve this one and no later change, 'cellblock approve {server} --hash {shown}'"
    )
    return 1


def approve_server(config: Config, state: Path, audit: Audit, server: str, shown_hash: str | None = None) -> int:
    """Accept the held catalog of `server` (only if its `catalog_hash` is `shown_hash`, when given);
    a running gateway picks it up within a second."""
    count = approve_pending(state, audit, server, via="cli", shown_hash=shown_hash)
    if count is None:
        current = held_catalog(state, server)
        if current is None:
            print(f"cellblock: nothing held for '{server}'; nothing to approve", file=sys.stderr)
        else:
            print(
                f"cellblock: the catalog held for '{server}' is not the one with sha256 {visible(str(shown_hash))} "
                f"(it is now {catalog_hash(current)}); nothing approved: read 'cellblock diff {server}' again",
                file=sys.stderr,
            )
        return 1
    print(f"cellblock: OK: approved the catalog of '{server}' ({count} items)", file=sys.stderr)
    return 0


def held(config: Config, state: Path) -> list[str]:
    """The servers of `config` whose catalog is held for review, in the config's order."""
    return [name for name in config.servers if pending_path(state, name).exists()]


def _nothing_held(config: Config, state: Path) -> None:
    waiting = unmet(config, state)
    later = f"; not met yet: {', '.join(waiting)}" if waiting else ""
    print(f"cellblock: no catalog is held{later}", file=sys.stderr)


def diff_all(config: Config, source: Path, state: Path) -> int:
    """`diff_server` for every held catalog, the servers no gateway has met met first; 1 when
    something is held."""
    meet_unmet(config, source, state)
    servers = held(config, state)
    if not servers:
        _nothing_held(config, state)
        return 0
    for server in servers:
        diff_server(config, state, server)
    return 1


def approve_all(config: Config, source: Path, state: Path, audit: Audit) -> int:
    """Accept every held catalog, the servers no gateway has met met first (as after reading
    `diff --all`); 1 when there was none, or a server could not be met."""
    missed = meet_unmet(config, source, state)
    servers = held(config, state)
    if not servers:
        _nothing_held(config, state)
        return 1
    return max(1 if missed else 0, *(approve_server(config, state, audit, server) for server in servers))


def review(config: Config, source: Path, state: Path, audit: Audit, answers: TextIO) -> int:
    """Meet the servers of `source` no gateway has met, then each held catalog in turn: a summary
    line, the catalog item by item, what of it runs without asking, then approve it or leave it
    held (answers from `answers`).

    0 when nothing is left held, 1 when something is (a "no", or the end of the answers).
    """
    missed = meet_unmet(config, source, state)
    servers = held(config, state)
    if not servers:
        _nothing_held(config, state)
        return 1 if missed else 0
    left = []
    for index, server in enumerate(servers, 1):
        shown = held_catalog(state, server)
        if shown is None:
            continue  # approved meanwhile (by another terminal, or through the client)
        lock = lock_path(state, server)
        print(f"\n[{index}/{len(servers)}] {describe(check(load_lock(lock), shown), server, not lock.exists())}")
        print(unasked_line(config, server, shown, read_only_offer(config, state, server, shown)[1]))
        print(f"Approve the catalog of '{server}'? [y/N] ", end="", flush=True)
        if answers.readline().strip().lower() not in ("y", "yes"):
            left.append(server)
            print(f"cellblock: '{server}' stays held: its tools are not offered", file=sys.stderr)
            continue
        unasked = unasked_choice(config, state, server, shown, answers)
        if (count := approve_pending(state, audit, server, via="cli", shown=shown, unasked=unasked)) is not None:
            print(f"cellblock: OK: approved the catalog of '{server}' ({count} items)", file=sys.stderr)
        else:
            left.append(server)
            print(f"cellblock: '{server}' changed what it offers while you read it; nothing approved", file=sys.stderr)
    return 1 if left or missed else 0


def unasked_choice(
    config: Config, state: Path, server: str, shown: dict[str, dict[str, Any]], answers: TextIO
) -> frozenset[str]:
    """Offer the read-only tools of the held catalog `shown` to run without asking (under
    `tools.read_only: review`); the tool keys the user accepts. Says which tools run without asking."""
    offer, kept = read_only_offer(config, state, server, shown)
    chosen: frozenset[str] = frozenset()
    if offer:
        names = ", ".join(visible(key.removeprefix("tool:")) for key in offer)
        print(f"'{server}' marks these tools read-only and closed-world: {names}")
        print("Let them run without asking? (destructive and open-world tools always ask) [y/N] ", end="", flush=True)
        if answers.readline().strip().lower() in ("y", "yes"):
            chosen = frozenset(offer)
    unasked = sorted({*kept, *(key.removeprefix("tool:") for key in chosen)})
    if offer or kept:
        runs = ", ".join(visible(name) for name in unasked) or "none; every tool asks"
        print(f"cellblock: '{server}' runs without asking: {runs}", file=sys.stderr)
    return chosen


def unasked_line(config: Config, server: str, catalog: Mapping[str, Any], granted: Collection[str] = ()) -> str:
    """What of `catalog` (item keys) the policy of `server` runs without asking once approved, with
    the tools `granted` to run without asking at an earlier review (`read_only_offer`)."""
    marks = unasked_marks(config, server, catalog, granted)
    tools, unasked = list(marks), [visible(tool) for tool, runs in marks.items() if runs]
    if not unasked:
        return "runs without asking: none; every call asks you first" if tools else "runs without asking: no tools"
    return f"runs without asking: {', '.join(unasked)}" + ("" if len(unasked) < len(tools) else " (every tool)")
