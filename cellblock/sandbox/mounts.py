"""The mounts of the gateway's mount namespace, and the places a directory shows again through one.

A bind mount shows a directory at a second path: `/data`, a bind mount of `/srv`, shows
`/srv/ssh-Ab12/agent.1` as `/data/ssh-Ab12/agent.1`. A jail hides what no server may see (Cellblock's
own directories, the session's sockets) where its grants hold them, and a grant holds a path by
its name only where no mount shows it under another one. So where a share (a grant, an
installation) or a mount inside it is the same directory (device and inode) as one on the way to a
hidden path, the hidden path is hidden there too (`shown_again`).

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

__all__ = ["MOUNTINFO", "MountEntry", "mountinfo", "shown_again"]

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
        found.append(MountEntry(root, point, extra[0], extra[1], extra[2]))
    return found


def shown_again(shares: Sequence[str], hidden: Iterable[str]) -> dict[str, str]:
    """Where, in a jail that shows each of `shares` at its own path (with the mounts inside it), a
    path of `hidden` (real paths) shows under another name: that place -> the hidden path. Each
    share and each mount inside it is compared, by device and inode, with every directory on the
    way to each hidden path; a place a share shows by the hidden path's own name is not listed.

    Raises:
        OSError: /proc/self/mountinfo cannot be read.
    """
    points = [m.point for m in mountinfo()]
    places: dict[tuple[int, int], list[tuple[str, str]]] = {}  # what a place is -> (in the jail, on the host)
    for share in shares:
        real = os.path.realpath(share)
        inside = [p for p in points if p != real and within(p, real)]
        for host in (real, *inside):
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


def _directory(path: str) -> tuple[int, int] | None:
    """What the directory `path` is (device and inode); None for anything else, or nothing."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None
