"""The cgroup filesystem, for jails' limits and servers' marks: where the gateway may make a
cgroup, making one with its limits (or none), reading what happened in it, and removing what is
left of it.

Both versions are handled, one controller at a time: on a cgroup v1 (or hybrid) machine `pids`
and `memory` are hierarchies of their own, on cgroup v2 one hierarchy holds both. A jail's cgroup
is made under the gateway's own, so whatever bounds the gateway bounds its jails too.

Every cgroup (and systemd scope) made for a server is named `cellblock-<gateway pid>-<server>-<n>`:
that name is the mark by which every gateway knows a process of any gateway's server (`marked`).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from cellblock.policy.constraints import within
from cellblock.sandbox.mounts import mountinfo
from cellblock.sandbox.types import Limits

__all__ = [
    "CGROUP_ROOT",
    "CONTROLLERS",
    "PREFIX",
    "Cgroup",
    "bases",
    "limit_file",
    "make",
    "mark_base",
    "marked",
    "name_for",
    "own_cgroups",
    "prepare",
    "remove",
    "scope_cgroups",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "cellblock-"  # of every cgroup (and systemd scope) made for a server, followed by the gateway's pid
CONTROLLERS = ("pids", "memory")
# A cgroup path component that marks a server's cgroup or scope (never the `-trial` ones, which hold no task).
_MARK = re.compile(rf"^{PREFIX}[0-9]+-(?!trial$)")
# One cgroup made, tried or swept at a time in a process: jails' plans are built in worker
# threads, and a sweep would take another thread's new, still empty cgroup (or its trial) for a
# leftover, so that one thread found no place for a limit and another's jail could not start.
_LOCK = threading.Lock()
# The cgroups this process made for servers that join them themselves (`prepare`), until removed:
# empty until the server's first process has joined, and never a leftover for a sweep meanwhile.
_PREPARED: set[Path] = set()
_NAMES = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One controller's cgroup of a jail."""

    controller: str  # pids | memory
    version: int  # 1 or 2
    path: Path

    def reached(self) -> bool:
        """The kernel refused the jail a task (`pids`), or killed one of its processes for memory (`memory`)."""
        if self.controller == "pids":
            return _count(self.path / "pids.events", "max") > 0
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        return _count(self.path / events, "oom_kill") > 0

    def limit(self) -> str:
        """The limit as the kernel reads it back (memory rounded down to whole pages).

        Raises:
            OSError: the cgroup is gone.
        """
        return (self.path / limit_file(self.controller, self.version)).read_text().strip()


def name_for(server: str) -> str:
    """A new name for a cgroup or systemd scope of `server`'s, unique in this process, with the mark."""
    return f"{PREFIX}{os.getpid()}-{server}-{next(_NAMES)}"


def limit_file(controller: str, version: int) -> str:
    return "pids.max" if controller == "pids" else "memory.max" if version == 2 else "memory.limit_in_bytes"


def _count(path: Path, key: str) -> int:
    """The number after `key` in a cgroup's flat-keyed file; 0 when it cannot be read."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def own_cgroups(pid: int | str = "self") -> dict[str, str]:
    """Controller -> the cgroup of `pid` in that controller's hierarchy ("" for the cgroup v2 one).

    Raises:
        OSError: /proc/PID/cgroup cannot be read (the process is gone).
    """
    own: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            own[""] = path
        for controller in filter(None, controllers.split(",")):
            own[controller] = path
    return own


def marked(pid: int) -> str | None:
    """The cgroup of `pid` that marks it as a process of a server some gateway runs (its cgroup or
    a parent of it made for a server, in any hierarchy), or None.

    Raises:
        OSError: /proc/PID/cgroup cannot be read (the process is gone).
    """
    with open(f"/proc/{pid}/cgroup", "rb") as handle:
        return _marked_in(handle.read().decode("utf-8", "replace"))


def _marked_in(listing: str) -> str | None:
    """The first cgroup path of a /proc/PID/cgroup `listing` that has a server's mark on it, or a parent."""
    for line in listing.splitlines():
        path = line.split(":", 2)[-1]
        if any(_MARK.match(part) for part in path.split("/")):
            return path
    return None


def _mounts() -> dict[str, tuple[Path, str]]:
    """Controller -> (mount point, the part of the hierarchy mounted there) of each cgroup
    filesystem ("" for cgroup v2).

    Raises:
        OSError: /proc/self/mountinfo cannot be read.
    """
    mounts: dict[str, tuple[Path, str]] = {}
    for mount in mountinfo():
        if mount.fstype == "cgroup2":
            mounts.setdefault("", (Path(mount.point), mount.root))
        elif mount.fstype == "cgroup":
            for option in mount.options.split(","):
                mounts.setdefault(option, (Path(mount.point), mount.root))
    return mounts


def bases() -> dict[str, tuple[int, Path]]:
    """Controller -> (cgroup version, directory) where the gateway can make a jail's cgroup: its
    own cgroup in that controller's hierarchy, when it may make children there that get the
    controller (tried: a cgroup is made and removed)."""
    try:
        own, mounts = own_cgroups(), _mounts()
    except OSError:
        return {}
    found: dict[str, tuple[int, Path]] = {}
    for controller in CONTROLLERS:
        version = 1 if controller in mounts else 2
        base = _own_dir(own, mounts, controller if version == 1 else "")
        if base is None:
            continue
        if version == 2 and controller not in _words(base / "cgroup.subtree_control"):
            continue  # cgroup v2 gives children only the controllers their parent enables for them
        if _trial(base, limit_file(controller, version)):
            found[controller] = (version, base)
    return found


def mark_base() -> Path | None:
    """Where the gateway can make a cgroup that a server's first process may join itself (no
    controller needed): its own cgroup in the cgroup v2 hierarchy, else in the v1 `pids` or
    `memory` one; None where it can make none (tried: a cgroup is made and removed)."""
    try:
        own, mounts = own_cgroups(), _mounts()
    except OSError:
        return None
    for key in ("", *CONTROLLERS):
        base = _own_dir(own, mounts, key)
        # joining moves a process from the gateway's cgroup to the new one: both must take it
        usable = base is not None and os.access(base / "cgroup.procs", os.W_OK)
        if base is not None and usable and _trial(base, "cgroup.procs", os.W_OK):
            return base
    return None


def _own_dir(own: dict[str, str], mounts: dict[str, tuple[Path, str]], key: str) -> Path | None:
    """The directory of the gateway's own cgroup in hierarchy `key` ("" for v2), if it is mounted."""
    if key not in mounts or key not in own:
        return None
    point, root = mounts[key]
    path, root = own[key], root.rstrip("/")
    if not within(path, root):
        return None  # the gateway's cgroup is outside what is mounted (another cgroup namespace)
    return point / path[len(root) :].lstrip("/")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _trial(base: Path, file: str, mode: int = os.F_OK) -> bool:
    """Can a cgroup be made in `base` (and removed again), with `file` in it that `mode` (`os.access`) allows?"""
    trial = base / f"{PREFIX}{os.getpid()}-trial"
    with _LOCK:
        try:
            trial.mkdir()
        except OSError:
            return False
        try:
            return os.access(trial / file, mode)
        finally:
            trial.rmdir()


def make(base: Path, name: str, controllers: list[tuple[str, int]], limits: Limits, pid: int) -> list[Cgroup]:
    """Cgroup `name` in `base` with the limits of `controllers`, and `pid` moved into it (what it
    starts from then on is born there). A memory limit covers swap too, where the kernel accounts it.

    Raises:
        OSError: the cgroup cannot be made or written (what was made of it is removed again).
    """
    with _LOCK:
        return _make(base, name, controllers, limits, pid)


def _make(base: Path, name: str, controllers: list[tuple[str, int]], limits: Limits, pid: int) -> list[Cgroup]:
    _sweep(base)
    path = base / name
    path.mkdir()
    try:
        made = []
        for controller, version in controllers:
            if controller == "pids":
                (path / "pids.max").write_text(str(limits.processes))
            elif version == 2:
                (path / "memory.max").write_text(str(limits.memory))
                _write_if_there(path / "memory.swap.max", "0")
                _write_if_there(path / "memory.oom.group", "1")  # an OOM kill ends the whole jail
            else:
                (path / "memory.limit_in_bytes").write_text(str(limits.memory))
                _write_if_there(path / "memory.memsw.limit_in_bytes", str(limits.memory))
            made.append(Cgroup(controller, version, path))
        (path / "cgroup.procs").write_text(str(pid))
    except OSError:
        remove(path)
        raise
    return made


def prepare(base: Path, name: str) -> Path:
    """An empty cgroup `name` in `base`, with no limits, for a server's first process to join
    itself (by writing 0 to its `cgroup.procs`) before it runs the server; `remove` it once the
    server has ended.

    Raises:
        OSError: it cannot be made.
    """
    with _LOCK:
        _sweep(base)
        path = base / name
        path.mkdir()
        _PREPARED.add(path)
    return path


def _write_if_there(path: Path, value: str) -> None:
    """Write a file the kernel offers only with some options (swap accounting, newer versions).

    Raises:
        OSError: it is there and cannot be written.
    """
    if path.exists():
        path.write_text(value)


def remove(path: Path) -> bool:
    """Remove a jail's cgroup; False while a task is still in it (it exits a moment after its jail ends)."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    _PREPARED.discard(path)
    return True


def _sweep(base: Path) -> None:
    """Remove the empty jail cgroups in `base` left by this gateway, or by one that is no longer running."""
    for path in base.glob(f"{PREFIX}*"):
        owner = path.name.removeprefix(PREFIX).split("-", 1)[0]
        if not owner.isdigit() or path in _PREPARED:
            continue
        if int(owner) != os.getpid():
            try:
                os.kill(int(owner), 0)
                continue  # another gateway's, in use or about to be
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        remove(path)


def scope_cgroups(pid: int) -> list[Cgroup]:
    """The cgroup v2 of the systemd scope `pid` runs in, when that scope was made for a jail.

    Raises:
        OSError: `pid` is gone, or is not in such a scope.
    """
    path = own_cgroups(pid).get("", "")
    directory = CGROUP_ROOT / path.lstrip("/")
    if not directory.name.startswith(PREFIX):
        raise OSError(f"it runs in cgroup {path or '?'}, not in a systemd scope made for it")
    return [Cgroup(controller, 2, directory) for controller in CONTROLLERS]
