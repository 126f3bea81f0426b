"""The search of a jail's grants for the listening sockets whose files are not where they were bound.

The kernel knows such a socket's file by its device and inode only (`sockets.Bound.elsewhere`): a
directory on its way renamed (a server with a writable grant can do it while the socket is hidden
from it), the file deleted, another hard link, a path in a service's private /tmp. A jail shows it
wherever a grant holds that file, so each start looks through the grants for it, and bounds what
that costs:

- **Only where it can be.** A file is on one file system, and the device `sock_diag` gives a
  socket's file is its superblock's, which /proc/self/mountinfo gives each mount (`Mounts`). A
  grant is looked through only where it, or a mount inside it, is on the file system of such a
  socket, and never into a mount of another one: a grant of a big tree on the disk costs nothing
  for a socket moved in a tmpfs, and a network or FUSE mount is not entered for a socket elsewhere.
- **Not past a deadline** (`SEARCH_SECONDS`). What is left is looked through by a thread of its
  own, which the start waits on: a listing that does not return (a mount that does not answer)
  holds that thread, never the start. Past the deadline the server does not start, and the message
  names the grant and the socket; the thread stops at its next directory, and while one is held in
  a listing no other start looks through that file system (one thread per such file system, however
  often servers are restarted).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from cellblock.policy.constraints import within
from cellblock.sandbox.mounts import Mounts
from cellblock.sandbox.sockets import INODE_BITS, LISTENER, Bound, HostSocket
from cellblock.sandbox.types import JailError

__all__ = ["MOVED", "SEARCH_SECONDS", "UNSEEN", "sockets_within"]

# How long a start waits for the search of its grants. A file costs 2-4 µs (a directory listed
# from a cold disk more), so this is millions of files: far more than a server's work needs. A grant
# that takes longer (a home, `/`, a mount that does not answer) is to be narrowed; a server never
# starts with such a socket possibly shown to it.
SEARCH_SECONDS = 10.0
# Kernel file systems, which hold no socket file a program binds: no search goes into them.
PSEUDO = ("/proc", "/sys")
MOVED = f"{LISTENER}, found by its inode: it is not, or not only, at the path it was bound to"
UNSEEN = "a directory Cellblock cannot look into for a listening socket that is not where it was bound"
ANY_DEVICE = -1  # the mounts are not known (macOS): every grant is looked through whole

_LOCK = threading.Lock()  # guards _HELD and each search's `finished`, `stopped`
_HELD: set[_Search] = set()  # searches a start gave up on that are still in a listing


@dataclass(frozen=True, slots=True)
class _Start:
    """A directory to look through: a grant, or a mount inside one, on the file system `device`."""

    grant: str  # as the config gives it, for messages
    directory: str  # a real path
    device: int


class _Search:
    """One start's look through its grants, run by a thread of its own."""

    def __init__(self, starts: list[_Start], stops: set[str], moved: dict[int, set[int]] | None) -> None:
        self.starts, self.stops, self.moved = starts, stops, moved
        self.found: list[HostSocket] = []
        self.done = threading.Event()
        self.finished = self.stopped = False
        self.now = starts[0]  # where it is: the start, and the directory being listed
        self.listing = starts[0].directory

    def run(self) -> None:
        try:
            self._walk()
        finally:
            with _LOCK:
                self.finished = True
                _HELD.discard(self)
            self.done.set()

    def _walk(self) -> None:
        seen: set[str] = set()  # a grant inside another one
        for start in self.starts:
            inodes = self._inodes(start.device)
            pending = [start.directory]
            while pending and not self.stopped:
                directory = pending.pop()
                if directory in seen:
                    continue
                seen.add(directory)
                self.now, self.listing = start, directory
                try:
                    with os.scandir(directory) as entries:
                        listed = list(entries)
                except OSError as exc:
                    if directory == start.directory and isinstance(exc, FileNotFoundError | NotADirectoryError):
                        continue  # a grant that is a file, or not there yet, holds no socket
                    self.found.append(HostSocket(directory, UNSEEN))  # the jail may reach a name in it: emptied
                    continue
                for entry in listed:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in self.stops and entry.path not in PSEUDO:
                            pending.append(entry.path)
                    elif _is_one(entry, inodes):
                        self.found.append(HostSocket(entry.path, MOVED))

    def _inodes(self, device: int) -> set[int] | None:
        """The inodes of the moved sockets on `device`; None: any socket file."""
        if self.moved is None:
            return None
        if device == ANY_DEVICE:
            return {inode for inodes in self.moved.values() for inode in inodes}
        return self.moved.get(device, set())


def _is_one(entry: os.DirEntry[str], inodes: set[int] | None) -> bool:
    """Whether `entry` (not a directory) is the file of a moved socket: `inodes`, or any socket (None)."""
    if entry.is_file(follow_symlinks=False) or entry.is_symlink():
        return False  # the kind its directory lists: no call for the many files and links
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISSOCK(info.st_mode) and (inodes is None or info.st_ino & INODE_BITS in inodes)


def sockets_within(
    name: str, grants: Sequence[str], bound: Bound, mounts: Mounts | None, seconds: float | None = None
) -> list[HostSocket]:
    """The socket files inside the directories `grants` of server `name` whose listener is not at
    the path it was bound to (`bound.elsewhere`; any socket file when the kernel would not say),
    and the directories there that cannot be listed, which may hold one. A grant is looked through
    by its real path, not through symlinks, not into /proc or /sys, and (with `mounts`) only where
    it or a mount inside it is on the file system of such a socket. Nothing is looked through when
    every bound socket is where it was bound.

    Raises:
        JailError: the search did not end within `seconds` (default `SEARCH_SECONDS`), or an earlier
            one is still held in a listing of a file system this one would look through.
    """
    if bound.elsewhere is not None and not bound.elsewhere:
        return []
    starts, stops = _plan(grants, bound, mounts)
    if not starts:
        return []
    devices = {start.device for start in starts}
    with _LOCK:
        held = next((s for s in _HELD if s.now.device in devices), None)
    if held is not None:
        start = next(s for s in starts if s.device == held.now.device)
        raise JailError(
            f"server '{name}': jail grant {start.grant} is on the file system where an earlier start's search "
            f"for {_what(bound, start.device)} has been held for more than {SEARCH_SECONDS:g} s listing "
            f"{held.listing!r} (a network or FUSE mount that does not answer?); nothing was started; bring that "
            "mount back, or narrow the grant so that it holds nothing of that file system"
        )
    moved: dict[int, set[int]] | None = None
    if bound.elsewhere is not None:
        moved = {}
        for socket in bound.elsewhere:
            moved.setdefault(socket.device, set()).add(socket.inode)
    search = _Search(starts, stops, moved)
    try:
        threading.Thread(target=search.run, name="cellblock-socket-search", daemon=True).start()
    except RuntimeError as exc:  # no thread to be had (the gateway's own limits)
        raise JailError(
            f"server '{name}': the search of its grants for {_what(bound, starts[0].device)} cannot start ({exc}); "
            "nothing was started; try again when the gateway runs fewer threads"
        ) from exc
    limit = SEARCH_SECONDS if seconds is None else seconds
    if not search.done.wait(limit):
        with _LOCK:
            search.stopped = True
            if not search.finished:
                _HELD.add(search)
        if not search.finished:
            now = search.now
            raise JailError(
                f"server '{name}': jail grant {now.grant} could hold {_what(bound, now.device)}, and looking "
                f"through it took more than {limit:g} s (it was listing {search.listing!r}); nothing was "
                "started, since the server could reach that socket. Each start looks through every grant on "
                "that socket's file system, a few µs a file: narrow the grant to what the server needs, or "
                "end the program listening there (`ss -xlp` names it)"
            )
    return search.found


def _plan(grants: Sequence[str], bound: Bound, mounts: Mounts | None) -> tuple[list[_Start], set[str]]:
    """Where to look (each grant, and each mount inside one, on a file system where a moved socket's
    file is) and where never to go down (every mount point inside a grant: each is a start of its
    own, or on another file system)."""
    devices = None if bound.elsewhere is None else {socket.device for socket in bound.elsewhere}
    starts: list[_Start] = []
    stops: set[str] = set()
    for grant in grants:
        real = os.path.realpath(grant)
        if any(within(real, p) for p in PSEUDO):
            continue
        if mounts is None:
            starts.append(_Start(grant, real, ANY_DEVICE))
            continue
        inside = mounts.inside(real)
        stops.update(m.point for m in inside)
        shown = [(m.point, m) for m in inside if not any(within(m.point, p) for p in PSEUDO)]
        for directory, mount in [(real, mounts.at(real)), *shown]:
            device = ANY_DEVICE if mount is None else mount.device
            if devices is None or device == ANY_DEVICE or device in devices:
                starts.append(_Start(grant, directory, device))
    return starts, stops


def _what(bound: Bound, device: int) -> str:
    """The socket a search on `device` looks for, by the path it was bound to, for messages."""
    if bound.elsewhere is None:
        return "a listening socket whose file is not where it was bound (this kernel does not say which)"
    paths = [s.path for s in bound.elsewhere if device in (s.device, ANY_DEVICE)] or ["?"]
    more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    return f"the file of the socket bound at {paths[0]!r}{more}, which is not, or not only, there any more"
