"""What no server may see: Cellblock's own directories and files, the user's session directory
and the sockets of the session and the machine. Every jail hides them where a grant or an
installation holds them (`hidden_paths`), and a grant of them is refused (`refuse_own_grants`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from platformdirs import user_cache_path

from cellblock.gateway.config.model import JailConfig
from cellblock.gateway.state import default_config_path, own_dirs
from cellblock.policy.constraints import within
from cellblock.sandbox.mounts import MOUNTINFO, Mounts, named_again, shown_again
from cellblock.sandbox.sockets import Bound, host_sockets
from cellblock.sandbox.types import JailError

__all__ = ["hidden_paths", "private_paths", "read_mounts", "refuse_own_grants"]


def private_paths(own: Sequence[Path], bound: Bound) -> dict[str, str]:
    """What no server may see, each with what it is: Cellblock's own directories and files (of its
    cache, only what a server is granted: its own package cache), the user's session directory and
    the sockets of the session and the machine (`sandbox/sockets.py`; `bound`: those bound to a
    path now), all as real paths."""
    mine = "Cellblock's own (its config, state, cache, data, sockets or audit log)"
    private = [(str(p), mine) for p in [*own_dirs(), default_config_path(), *own]]
    private += [(s.path, s.why) for s in host_sockets(bound=bound)]
    found: dict[str, str] = {}
    for path, why in private:
        found.setdefault(os.path.realpath(path), why)
    return found


def read_mounts(name: str) -> Mounts:
    """The mounts of the gateway's namespace, read once for a jail.

    Raises:
        JailError: they cannot be read, so where a mount shows a hidden path again is not known.
    """
    try:
        return Mounts.read()
    except OSError as exc:
        raise JailError(
            f"server '{name}': the mounts that could show what its jail hides under another name cannot be "
            f"read ({exc.strerror}: {MOUNTINFO}); nothing was started"
        ) from exc


def refuse_own_grants(name: str, jail: JailConfig, private: Mapping[str, str], mounts: Mounts | None) -> None:
    """A grant of what `hidden_paths` would hide (a jail shows a grant whole) is refused, not emptied,
    by its own name or by another one a mount gives it (`mounts`); so is a grant that is a socket,
    whatever listens on it."""
    cache = os.path.realpath(user_cache_path("cellblock"))
    others = [p for p in private if p != cache]
    for key, paths in (("read_only", jail.read_only), ("read_write", jail.read_write)):
        for path in paths:
            real = os.path.realpath(path)
            place = mounts.where(real) if mounts is not None else None
            if real == cache or (place is not None and mounts is not None and place == mounts.where(cache)):
                named = "" if real == cache else f" under another name ({cache})"
                raise JailError(
                    f"server '{name}': jail.{key} path {path} is Cellblock's cache{named}, which holds every "
                    "server's package cache; grant the server's own directory inside it"
                )
            held = next((p for p in others if within(real, p)), None)
            where = held if real == held else f"inside {held}"
            if held is None and mounts is not None and (held := named_again(real, others, mounts)) is not None:
                inside = "" if place == mounts.where(held) else "inside "
                where = f"{inside}{held} under another name"  # a bind mount shows the one place at both
            if held is None and _is_socket(real):
                held = where = real
            if held is not None:
                why = private.get(held, "a Unix socket, a way into the program that listens on it")
                fix = "grant another directory" if os.path.isdir(held) else f"remove it from jail.{key}"
                raise JailError(
                    f"server '{name}': jail.{key} path {path} is {where}: {why}, which Cellblock keeps from "
                    f"every server; {fix}"
                )


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def hidden_paths(shared: Sequence[str], private: Mapping[str, str], mounts: Mounts | None) -> dict[str, str]:
    """Where, in the jail, the shared directories show what no server may see, with what it is:
    each such path at the place the jail shows it, which for a grant given through a symlink is not
    its real path, and with `mounts` (Linux) at each place a mount shows it under another name (a
    grant that is a bind mount of a directory on its way, or holds one: `sandbox/mounts.py`)."""
    found = {p: why for p, why in private.items() if os.path.lexists(p)}
    hidden: dict[str, str] = {}
    for path in shared:
        real = os.path.realpath(path)
        for p, why in found.items():
            if within(p, real):
                hidden.setdefault(os.path.normpath(os.path.join(path, os.path.relpath(p, real))), why)
    if mounts is not None:
        for place, p in shown_again(shared, found, mounts).items():
            hidden.setdefault(place, f"{found[p]}, shown here by a mount as {p}")
    return dict(sorted(hidden.items()))
