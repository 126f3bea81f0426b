"""The mark on every server's processes: a cgroup (or systemd scope) of the server's own, named
`cellblock-<gateway pid>-<server>-<n>`, which everything the server starts is born in, whatever
it forks or however it detaches. Every gateway's control socket refuses a process so marked
(`cgroups.marked`), whichever gateway runs the server: a server may not answer for the user.

A jailed server's limits put its jail in such a cgroup or scope already (`sandbox/limits.py`). A
`jail: false` server gets one here, without limits: where jails' limits use a systemd scope, a
scope of its own (`systemd-run --scope` moves itself into the scope before it starts the
server); else a cgroup the gateway makes when it starts the server, which the server's first
process joins itself (`/bin/sh` writes 0 to its `cgroup.procs`, then execs the server), so
nothing the server runs is ever born outside it. Where neither exists (an ordinary user without
a service manager the gateway can use, nor a cgroup of their own), the server runs unmarked and
`cellblock serve` says so: the control socket then knows its processes only by their process
tree, which a double fork leaves.

What the mark does not stop: a process may move itself to any cgroup whose `cgroup.procs` it can
write. Root can write every one, and so can the user in the subtree their service manager was
delegated (where a user's scopes live): a `jail: false` server that moves itself out, or has
another of the user's processes act for it, is not stopped (docs/approvals.md says what it can do).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from cellblock.sandbox.cgroups import mark_base, name_for, prepare, remove
from cellblock.sandbox.limits import enforcement
from cellblock.sandbox.types import LaunchPlan, MarkPlan

__all__ = ["JOIN", "MARK_PROCS", "Mark", "how_marked", "made", "mark_plan"]

# Where the path of the `cgroup.procs` the server joins goes in its argv, once the cgroup is made.
MARK_PROCS = "<mark-procs>"
# The server's first process joins its cgroup ($0), then becomes the server; if it cannot join,
# nothing runs. What it writes is shown as the server's own stderr, so it names Cellblock and why.
JOIN = (
    'echo 0 >"$0" 2>/dev/null || { echo "cellblock: could not join $0, the cgroup made to mark this '
    'server; nothing was started" >&2; exit 126; }; exec "$@"'
)
SHELL = "/bin/sh"
ENV = "/usr/bin/env"


@dataclass(eq=False)
class Mark:
    """The cgroup made for one run of an unjailed server; `close` removes it once it is empty."""

    path: Path

    def close(self) -> bool:
        """Remove the cgroup; False while a task is still in it (call again a moment later)."""
        return remove(self.path)


@functools.cache
def _place() -> tuple[str, Path | None] | None:
    """("systemd", None) or ("cgroup", base) where servers' marks are made here; None where neither."""
    if enforcement().scope:
        return "systemd", None
    base = mark_base()
    return ("cgroup", base) if base is not None else None


def how_marked() -> str | None:
    """How this machine marks an unjailed server's processes, in words; None where it cannot."""
    place = _place() if sys.platform.startswith("linux") else None
    if place is None:
        return None
    kind, base = place
    return "a systemd scope of its own" if kind == "systemd" else f"a cgroup of its own in {base}"


def mark_plan(plan: LaunchPlan, server: str) -> LaunchPlan:
    """`plan` (an unjailed server's command) run in a marked cgroup or scope of its own; `plan`
    as it is where this machine offers neither (`how_marked` is None)."""
    place = _place() if sys.platform.startswith("linux") else None
    if place is None:
        return plan
    kind, base = place
    if kind == "cgroup" and base is not None:
        return replace(plan, argv=(SHELL, "-c", JOIN, MARK_PROCS, *plan.argv), mark=MarkPlan(server, str(base)))
    how = enforcement()
    # what systemd-run needs in its environment stays out of the server's, as it was without the scope
    added = [key for key in (*how.scope_env, "INVOCATION_ID") if key not in plan.env]
    unset = (ENV, *(arg for key in added for arg in ("-u", key))) if added else ()
    prefix = (*how.scope, f"--unit={name_for(server)}", f"--description=Cellblock server {server} (unjailed)", "--")
    return replace(plan, argv=(*prefix, *unset, *plan.argv), env={**plan.env, **how.scope_env})


def made(plan: MarkPlan) -> Mark:
    """The cgroup of one run of `plan`'s server, made now (empty until the server joins it).

    Raises:
        OSError: it cannot be made.
    """
    return Mark(prepare(Path(plan.base), name_for(plan.server)))
