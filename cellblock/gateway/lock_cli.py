"""`cellblock diff SERVER` and `cellblock approve SERVER`: review and accept a held catalog."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from cellblock.gateway.audit import Audit
from cellblock.gateway.config import Config
from cellblock.gateway.locking import lock_path, pending_path
from cellblock.policy.lock import approve, check, describe, load_lock, load_pending, save_lock

__all__ = ["approve_pending", "approve_server", "diff_server"]


def _pending(state: Path, server: str) -> dict[str, dict[str, Any]] | None:
    pending = load_pending(pending_path(state, server))
    return None if pending is None else dict(pending.items)


def diff_server(config: Config, state: Path, server: str) -> int:
    """Print what changed since `server` was approved; 1 when something is held, 0 when not."""
    current = _pending(state, server)
    if current is None:
        print(f"cellblock: nothing held for '{server}': its catalog matches its lock", file=sys.stderr)
        return 0
    print(describe(check(load_lock(lock_path(state, server)), current), server))
    return 1


def approve_pending(state: Path, audit: Audit, server: str, via: str) -> int | None:
    """Accept the held catalog of `server`; how many items it has, or None when nothing is held."""
    current = _pending(state, server)
    if current is None:
        return None
    result = check(load_lock(lock_path(state, server)), current)
    save_lock(lock_path(state, server), approve(server, current, time.time()))
    pending_path(state, server).unlink(missing_ok=True)
    audit.write("lock_approved", server, items=sorted(result.held), removed=sorted(result.removed), via=via)
    return len(current)


def approve_server(config: Config, state: Path, audit: Audit, server: str) -> int:
    """Accept the held catalog of `server`; a running gateway picks it up within a second."""
    count = approve_pending(state, audit, server, via="cli")
    if count is None:
        print(f"cellblock: nothing held for '{server}'; nothing to approve", file=sys.stderr)
        return 1
    print(f"cellblock: OK: approved the catalog of '{server}' ({count} items)", file=sys.stderr)
    return 0
