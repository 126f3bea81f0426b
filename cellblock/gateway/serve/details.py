"""What `ps` says of a server beyond its state (`cellblock ps --json`, the dashboard's Servers):
the last lines it wrote to stderr while it is failed or restarting, the jail it runs in as the
gateway runs it, the package installed for it, and the status of its lock.

Every value is the gateway's own state or the server's text as the gateway already keeps it: the
stderr lines are the relay's (`downstream/stderr.py`), each with every secret the gateway holds
redacted and what is not text escaped, as in why the server stopped.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio.to_thread

from cellblock.gateway.config.model import Config, LocalServer
from cellblock.gateway.downstream.packages import read_record
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve.locking import Locks, catalog_hash, held_catalog
from cellblock.gateway.state import lock_path
from cellblock.policy.errors import CellblockError
from cellblock.policy.lock import load_lock
from cellblock.sandbox.limits import describe

__all__ = ["details", "jail_of", "lock_status", "package_of", "stderr_of"]


async def details(config: Config, state: Path, locks: Locks, name: str, ds: Downstream) -> dict[str, Any]:
    """The keys `ps` adds to a server's entry: `start`, `stderr`, `jail_detail`, `package`, `lock`."""
    # the lock and the install's record are files: read off the event loop
    lock, package = await anyio.to_thread.run_sync(
        functools.partial(_files, state, locks, name, ds.config, locks.enabled(name))
    )
    return {
        "start": config.start_of(name),
        "stderr": stderr_of(ds),
        "jail_detail": jail_of(ds),
        "package": package,
        "lock": lock,
    }


def _files(
    state: Path, locks: Locks, name: str, config: Any, enabled: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    return lock_status(state, locks.held.get(name, frozenset()), name, enabled), package_of(name, config)


def stderr_of(ds: Downstream) -> list[str]:
    """The last lines (`TAIL_LINES`) a failed or restarting local server wrote to stderr, as its
    relay keeps them: every secret the gateway holds redacted, escaped, each cut."""
    if ds.supervisor.state not in (State.FAILED, State.RESTARTING) or ds.channel is None or ds.channel.stderr is None:
        return []
    return ds.channel.stderr.last_lines()


def jail_of(ds: Downstream) -> dict[str, Any] | None:
    """The jail the gateway runs a local server in: its config as the gateway holds it now (grants a
    `cellblock share` added, hosts `allow-host` added), and what built it at its last start; None
    for a remote or unjailed server (`jail` says which)."""
    config = ds.config
    if not isinstance(config, LocalServer) or config.jail is False:
        return None
    jail, plan, limits = config.jail, ds.plan, ds.limits
    return {
        "backend": plan.backend if plan is not None else None,  # None: not started yet
        "configured_backend": jail.backend,
        "network": jail.network,
        "allow_hosts": list(dict.fromkeys([*jail.allow_hosts, *ds.egress.added])),
        "read_only": list(jail.read_only),
        "read_write": list(jail.read_write),
        "home": jail.home,
        "tmp": jail.tmp,
        "limits": None if limits is None else {"processes": limits.processes, "memory": limits.memory},
        # how this machine enforced them at its last start
        "limits_enforced": describe(plan.limits) if plan is not None and plan.limits is not None else None,
    }


def package_of(name: str, config: Any) -> dict[str, Any] | None:
    """The package a server's `install:` asks for and the one `cellblock install` recorded, with
    its digest (as `cellblock show` gives them); None without `install:`."""
    if not isinstance(config, LocalServer) or config.install is None:
        return None
    record = read_record(name)
    return {
        "package": config.install.package.spec(),
        "installed": record.package.spec() if record is not None else None,
        "digest": record.digest if record is not None else None,
    }


def lock_status(state: Path, held: frozenset[str], name: str, enabled: bool) -> dict[str, Any]:
    """The lock of a server: `off` (not enabled), `held` (`first` contact, or changed since
    approved: the held catalog's sha256, as the review shows it), `approved` (the sha256 of the
    catalog approved, as `cellblock diff` showed it then), or `none` (its catalog not seen yet)."""
    if not enabled:
        return {"status": "off"}
    try:
        if held:
            current = held_catalog(state, name)
            shown = catalog_hash(current) if current is not None else None
            first = not lock_path(state, name).exists()
            return {"status": "held", "first": first, "hash": shown, "items": len(held)}
        lock = load_lock(lock_path(state, name))
        if lock is None:
            return {"status": "none"}
        return {"status": "approved", "hash": catalog_hash(lock.snapshot), "items": len(lock.items)}
    except CellblockError as exc:  # a damaged lock or pending file: said, as the review says it
        return {"status": "error", "error": str(exc)}
