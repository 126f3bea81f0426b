"""The disk an install may fill: how much a tree takes, a watch that ends its writer at a cap, and
its removal.

No kernel limit bounds the bytes an unprivileged process writes into one directory (quotas need
root and a file system set up for them; RLIMIT_FSIZE bounds each file, not how many there are). So
an installer's jail is watched while it runs (`spawn.run_bounded` calls `DiskWatch` twenty times a
second): a `statvfs` of the file system the tree is on costs one system call and shows any growth
at once, in blocks and in inodes; when the file system has grown by more than the room left under
the cap, the tree itself is measured (`tree_bytes`), and a tree past its cap ends the jail. The
tree is also measured every second or so whatever the file system says, since another program
freeing space there could hide growth, and once more when each installer step has ended
(`DiskWatch.measure`). A writer goes past the cap by what it writes between two looks (more when
the machine is busy and the gateway waits for the CPU), and RLIMIT_FSIZE (`limits.confine`) keeps
any single file within it.

What a tree takes is what it costs the disk and whatever reads it later: each entry at least one
block of `ENTRY_BYTES` (an empty file takes an inode and no block, and a million of them would use
up the file system's inodes), a file at least its length (a sparse file takes no blocks, but
`packages.manifest` reads every byte of it), each inode once however many links it has.

An installer runs as the user the gateway runs as and may take its own directories' permissions
away (`chmod 0300`: it can still write in one, and nobody without CAP_DAC_OVERRIDE can list it).
A directory the walk cannot read stops the install: nothing an installer needs is hidden from the
user it runs as. Once nothing writes in a tree any more, `remove_tree` gives the owner back what it
needs of each directory before it removes it, which `shutil.rmtree` alone would leave behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterator

from cellblock.sandbox.limits import size

__all__ = ["ENTRY_BYTES", "MEASURE_SECONDS", "DiskWatch", "remove_tree", "tree_bytes"]

# How often the whole tree is measured at least; never more than a twentieth of the time, however
# long a measure takes (a tree of 100,000 files takes a few hundred milliseconds).
MEASURE_SECONDS = 1.0
_SHARE = 20
# What one entry of a tree takes at the least: a block, as most file systems give a file.
ENTRY_BYTES = 4096


def _entries(root: str, opening: bool = False) -> Iterator[os.stat_result]:
    """What `lstat` says of every entry under `root`; an entry removed meanwhile is passed over.
    `opening`: each directory is first opened to its owner (`_opened`): only where nothing writes.

    Raises:
        PermissionError: a directory cannot be read.
    """
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        return
    if opening:
        _opened(root, top.st_mode)
    todo = [root]
    while todo:
        try:
            entries = os.scandir(todo.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed meanwhile, or not a directory any more
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                yield info
                if stat.S_ISDIR(info.st_mode):
                    if opening:
                        _opened(entry.path, info.st_mode)
                    todo.append(entry.path)


def _opened(path: str, mode: int) -> None:
    """Give the owner of the directory `path` (of `mode`) back reading, writing and entering it.
    By its path: only for a tree nothing writes in any more, where no link can take its place."""
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        with contextlib.suppress(OSError):  # gone, or not ours: rmtree then leaves it
            os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXU)


def tree_bytes(root: str) -> int:
    """The bytes the entries under `root` take: each its allocated blocks or its length, whichever
    is more, and at least `ENTRY_BYTES`; each inode once however many links it has.

    Raises:
        PermissionError: a directory in it cannot be read.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for info in _entries(root):
        if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
        total += max(info.st_blocks * 512, info.st_size, ENTRY_BYTES)
    return total


def remove_tree(root: str) -> None:
    """Remove `root` and all under it, whatever permissions were taken from its directories; what
    cannot be removed even then (not the gateway's) stays. Only for a tree nothing writes in any more
    (an installer's, once its jail has ended)."""
    with contextlib.suppress(PermissionError):  # rmtree removes what it can
        for _ in _entries(root, opening=True):
            pass
    shutil.rmtree(root, ignore_errors=True)


def _used(path: str) -> int:
    """The bytes in use on the file system `path` is on, each inode in use counted as
    `ENTRY_BYTES` (0 when it cannot be asked)."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return 0
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize + (fs.f_files - fs.f_ffree) * ENTRY_BYTES


class DiskWatch:
    """Called while an install runs: why it must stop (its tree in `root` is past `cap` bytes), or None."""

    def __init__(self, root: str, cap: int) -> None:
        self.root, self.cap = root, cap
        self.measure()

    def measure(self) -> str | None:
        """Measure the tree now (also when a step has ended: what it did last counts as much); why
        the install must stop, or None."""
        began = time.monotonic()
        self._used = _used(self.root)  # before the walk: what is written during it counts as growth
        try:
            self.measured = tree_bytes(self.root)
        except PermissionError as exc:
            self.measured = self.cap + 1
            self._next = began
            return (
                f"it made {exc.filename}, a directory it keeps the gateway from looking into: no installer "
                "needs one, and the package should not be trusted"
            )
        took = time.monotonic() - began
        self._next = began + max(MEASURE_SECONDS, _SHARE * took)
        return self._past()

    def _past(self) -> str | None:
        if self.measured > self.cap:
            return f"it wrote more than its disk limit of {size(self.cap)} (limits.disk)"
        return None

    def __call__(self) -> str | None:
        grown = _used(self.root) - self._used
        if self.measured + grown > self.cap or time.monotonic() >= self._next:
            return self.measure()
        return self._past()
