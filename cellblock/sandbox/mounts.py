"""The mounts of the gateway's mount namespace, and the places a directory shows again through one.

A bind mount shows a directory at a second path: `/data`, a bind mount of `/srv`, shows
`/srv/ssh-Ab12/agent.1` as `/data/ssh-Ab12/agent.1`. A jail hides what no server may see (Cellblock's
own directories, the session's sockets) where its grants hold them, and a grant holds a path by
its name only where no mount shows it under another one. So where a share (a grant, an
installation) or a mount inside it is the same directory (device and inode) as one on the way to a
hidden path, the hidden path is hidden there too (`shown_again`); a share that *is* such a path, or
lies inside one, under another name is told apart by where it is in its file system (`Mounts.where`).

`Mounts` is the tree the kernel walks to find a path: which mount a path is on (a mount over another
one, or over a directory above it, hides it), with its file system's device as the kernel names it
(`major:minor`: the superblock's, which `sock_diag` gives a socket file too, where `stat`'s `st_dev`
differs on a btrfs subvolume or an overlay).

`sandbox/pin.py` reads the mount points again for itself: it runs inside a jail, with nothing but
the standard library.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cellblock.policy.constraints import within

__all__ = ["MOUNTINFO", "MountEntry", "Mounts", "mountinfo", "named_again", "shown_again"]

MOUNTINFO = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")  # the kernel escapes space, tab, newline and backslash


@dataclass(frozen=True, slots=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    root: str  # the part of its file system mounted here
    point: str  # where it is mounted
    fstype: str
    source: str
    options: str  # the file system's own (super) options
    id: int = 0
    parent: int = 0  # the mount it is mounted on (the same point again: over it)
    device: int = 0  # its file system's, `os.makedev(major, minor)`


def mountinfo() -> list[MountEntry]:
    """The mounts of this process's mount namespace, in the order the kernel lists them.

    Raises:
        OSError: /proc/self/mountinfo cannot be read.
    """
    found = []
    for line in Path(MOUNTINFO).read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts, extra = fields.split(), rest.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        root, point = (_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), p) for p in parts[3:5])
        major, _, minor = parts[2].partition(":")
        device = os.makedev(int(major), int(minor))
        found.append(MountEntry(root, point, extra[0], extra[1], extra[2], int(parts[0]), int(parts[1]), device))
    return found


class Mounts:
    """The mount tree of this process's namespace, as the kernel walks it to find a path."""

    def __init__(self, entries: Sequence[MountEntry]) -> None:
        ids = {m.id for m in entries}
        # the root's is the one at / whose parent is not listed (a container's is outside it)
        self._root = next((m for m in entries if m.point == "/" and (m.parent not in ids or m.parent == m.id)), None)
        # what is mounted at a point on a mount (mounted later over the same: the later one)
        self._on = {(m.parent, m.point): m for m in entries if m.id != m.parent}
        self._points = sorted({m.point for m in entries})

    @classmethod
    def read(cls) -> Mounts:
        """The mounts of this process's namespace now.

        Raises:
            OSError: /proc/self/mountinfo cannot be read.
        """
        return cls(mountinfo())

    def at(self, path: str) -> MountEntry | None:
        """The mount the real path `path` is on: at each directory on its way, what is mounted there
        on the mount reached so far (a mount hidden by another one over it, or over a directory
        above it, is never reached). None: no mounts were listed."""
        mount = self._root
        parts = [part for part in path.split("/") if part]
        for prefix in ["/", *("/" + "/".join(parts[: n + 1]) for n in range(len(parts)))]:
            while mount is not None and (over := self._on.get((mount.id, prefix))) is not None:
                mount = over
        return mount

    def inside(self, path: str) -> list[MountEntry]:
        """The mounts shown below the real path `path` (not at it), outermost first."""
        found = []
        for point in self._points:
            if point != path and within(point, path):
                mount = self.at(point)
                if mount is not None and mount.point == point:
                    found.append(mount)
        return found

    def where(self, path: str) -> tuple[int, str] | None:
        """The file system the real path `path` is in (its device) and its path there, the same
        under every name a mount gives it. None: no mounts were listed."""
        mount = self.at(path)
        if mount is None:
            return None
        return mount.device, os.path.normpath(os.path.join(mount.root, os.path.relpath(path, mount.point)))


def shown_again(shares: Sequence[str], hidden: Iterable[str], mounts: Mounts | None = None) -> dict[str, str]:
    """Where, in a jail that shows each of `shares` at its own path (with the mounts inside it), a
    path of `hidden` (real paths) shows under another name: that place -> the hidden path. Each
    share and each mount inside it (of `mounts`, default: read now) is compared, by device and
    inode, with every directory on the way to each hidden path; a place a share shows by the hidden
    path's own name is not listed.

    Raises:
        OSError: /proc/self/mountinfo cannot be read.
    """
    mounts = Mounts.read() if mounts is None else mounts
    places: dict[tuple[int, int], list[tuple[str, str]]] = {}  # what a place is -> (in the jail, on the host)
    for share in shares:
        real = os.path.realpath(share)
        for host in (real, *(m.point for m in mounts.inside(real))):
            identity = _directory(host)
            if identity is not None:
                shown = share if host == real else os.path.join(share, os.path.relpath(host, real))
                places.setdefault(identity, []).append((shown, host))
    found: dict[str, str] = {}
    for path in hidden:
        for above in (path, *map(str, Path(path).parents)):
            for shown, host in places.get(_directory(above) or (-1, -1), []):
                if not within(path, host):  # by its own name: hidden there already
                    found.setdefault(os.path.normpath(os.path.join(shown, os.path.relpath(path, above))), path)
    return found


def named_again(path: str, hidden: Iterable[str], mounts: Mounts) -> str | None:
    """The path of `hidden` (real paths) that the real path `path` is, or lies inside, under another
    name than its own; None: none. Two names of one place are one path in one file system, which a
    bind mount shows at a second point."""
    here = mounts.where(path)
    for hidden_path in hidden:
        there = mounts.where(hidden_path)
        if here is None or there is None or within(path, hidden_path):
            continue
        if there[0] == here[0] and within(here[1], there[1]):
            return hidden_path
    return None


def _directory(path: str) -> tuple[int, int] | None:
    """What the directory `path` is (device and inode); None for anything else, or nothing."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None
