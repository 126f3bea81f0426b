"""The disk an install may fill: how much a tree takes, and a watch that ends its writer at a cap.

No kernel limit bounds the bytes an unprivileged process writes into one directory (quotas need
root and a file system set up for them; RLIMIT_FSIZE bounds each file, not how many there are). So
an installer's jail is watched while it runs (`spawn.run_bounded` calls `DiskWatch` twenty times a
second): a `statvfs` of the file system the tree is on costs one system call and shows any growth
at once; when the file system has grown by more than the room left under the cap, the tree itself
is measured (the blocks its files take, each inode once), and a tree past its cap ends the jail.
The tree is also measured every second or so whatever the file system says, since another program
freeing space there could hide growth. A writer goes past the cap by what it writes between two
looks (more when the machine is busy and the gateway waits for the CPU), and RLIMIT_FSIZE
(`limits.confine`) keeps any single file within it.
"""

from __future__ import annotations

import os
import stat
import time

from cellblock.sandbox.limits import size

__all__ = ["MEASURE_SECONDS", "DiskWatch", "tree_bytes"]

# How often the whole tree is measured at least; never more than a twentieth of the time, however
# long a measure takes (a tree of 100,000 files takes a few hundred milliseconds).
MEASURE_SECONDS = 1.0
_SHARE = 20


def tree_bytes(root: str) -> int:
    """The bytes the entries under `root` take on the disk: their allocated
    blocks, each inode once however many links it has. What cannot be read counts nothing."""
    seen: set[tuple[int, int]] = set()
    total, todo = 0, [root]
    while todo:
        try:
            entries = os.scandir(todo.pop())
        except OSError:
            continue  # removed meanwhile, or not a directory any more
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    todo.append(entry.path)
    return total


def _used(path: str) -> int:
    """The bytes in use on the file system `path` is on (0 when it cannot be asked)."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return 0
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


class DiskWatch:
    """Called while an install runs: why it must stop (its tree in `root` is past `cap` bytes), or None."""

    def __init__(self, root: str, cap: int) -> None:
        self.root, self.cap = root, cap
        self._measure()

    def _measure(self) -> None:
        began = time.monotonic()
        self._used = _used(self.root)  # before the walk: what is written during it counts as growth
        self.measured = tree_bytes(self.root)
        took = time.monotonic() - began
        self._next = began + max(MEASURE_SECONDS, _SHARE * took)

    def __call__(self) -> str | None:
        grown = _used(self.root) - self._used
        if self.measured + grown > self.cap or time.monotonic() >= self._next:
            self._measure()
        if self.measured > self.cap:
            return f"it wrote more than its disk limit of {size(self.cap)} (limits.disk)"
        return None
