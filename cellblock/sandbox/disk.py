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
user it runs as; so does a path too long to measure (directories nested past PATH_MAX). Once
nothing writes in a tree any more, `remove_tree` gives the owner back what it needs of each
directory before it removes it, which `shutil.rmtree` alone would leave behind, and removes a tree
however deep, which that (recursive, by path) cannot.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import time
from collections.abc import Iterator

from cellblock.sandbox.limits import size

__all__ = ["ENTRY_BYTES", "MEASURE_SECONDS", "DiskWatch", "remove_tree", "tree_bytes"]

# How often the whole tree is measured at least; never more than a twentieth of the time, however
# long a measure takes (a tree of 100,000 files takes a few hundred milliseconds).
MEASURE_SECONDS = 1.0
_SHARE = 20
SHOWN = 200  # characters of a path a message shows
# What one entry of a tree takes at the least: a block, as most file systems give a file.
ENTRY_BYTES = 4096


def _directory(root: str) -> os.stat_result | None:
    """What `lstat` says of `root` where it is a directory (not a link to one); None otherwise."""
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return None
    return top if stat.S_ISDIR(top.st_mode) else None


def _entries(root: str) -> Iterator[os.stat_result]:
    """What `lstat` says of every entry under `root`; an entry removed meanwhile is passed over.

    Raises:
        OSError: a directory cannot be read (PermissionError), or its path is longer than the
            kernel takes (an installer can nest directories past PATH_MAX).
    """
    if _directory(root) is None:
        return
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
                    todo.append(entry.path)


def tree_bytes(root: str) -> int:
    """The bytes the entries under `root` take: each its allocated blocks or its length, whichever
    is more, and at least `ENTRY_BYTES`; each inode once however many links it has.

    Raises:
        OSError: a directory in it cannot be read (see `_entries`).
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
    """Remove the directory `root` and all under it, however deep it is nested and whatever
    permissions were taken from its directories; what cannot be removed even then (not the
    gateway's) stays. Only for a tree nothing writes in any more (an installer's, once its jail has
    ended).

    By directory descriptors, never by a path from `root` (an installer can nest directories past
    PATH_MAX) and without recursion (or past Python's recursion limit, where `shutil.rmtree` of
    Python 3.11 stops): each directory is emptied with its subdirectories first moved up into
    `root`, so no directory is ever more than one below it."""
    top = _directory(root)
    if top is None:
        return
    with contextlib.suppress(OSError):
        _owned(root, top.st_mode)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone, or not ours to open: it stays
    try:
        _empty(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(root)


def _empty(top: int) -> None:
    """Remove everything in the directory `top` (a descriptor): each directory in it is emptied,
    what it holds removed or, a directory, moved up into `top` under a new name to be emptied in
    its turn. Errors leave what they meet."""
    names = os.listdir(top)
    moved = itertools.count()
    while names:
        name = names.pop()
        try:
            mode = os.lstat(name, dir_fd=top).st_mode
            if not stat.S_ISDIR(mode):
                os.unlink(name, dir_fd=top)
                continue
            _owned(name, mode, top)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        except OSError:
            continue  # gone meanwhile, or not the gateway's: it stays
        try:
            with os.scandir(inner) as listed:
                held = list(listed)  # listed whole first: the directory changes as it is emptied
            for entry in held:
                with contextlib.suppress(OSError):
                    if not entry.is_dir(follow_symlinks=False):
                        os.unlink(entry.name, dir_fd=inner)
                        continue
                    # moving a directory rewrites its `..`: it must be writable (rename(2))
                    _owned(entry.name, entry.stat(follow_symlinks=False).st_mode, inner)
                    up = _unused(top, moved)
                    os.rename(entry.name, up, src_dir_fd=inner, dst_dir_fd=top)
                    names.append(up)
        except OSError:
            pass  # it cannot be listed even now: it stays
        finally:
            os.close(inner)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=top)


def _owned(name: str, mode: int, directory: int | None = None) -> None:
    """Give the owner of the directory `name` (of `mode`; relative to the descriptor `directory`)
    back reading, writing and entering it. By its name: only for a tree nothing writes in any more.

    Raises:
        OSError: it is gone, or not the gateway's.
    """
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        os.chmod(name, stat.S_IMODE(mode) | stat.S_IRWXU, dir_fd=directory)


def _unused(directory: int, counter: Iterator[int]) -> str:
    """A name nothing in `directory` has: a rename onto an empty directory would replace it."""
    while True:
        name = f".cellblock-removing-{next(counter)}"
        try:
            os.lstat(name, dir_fd=directory)
        except FileNotFoundError:
            return name


def _used(path: str) -> int:
    """The bytes in use on the file system `path` is on, each inode in use counted as
    `ENTRY_BYTES` (0 when it cannot be asked)."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return 0
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize + (fs.f_files - fs.f_ffree) * ENTRY_BYTES


def _shown(path: object) -> str:
    """A path an installer made, short enough for a message (one nested past PATH_MAX is not)."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}… ({len(text):,} characters)"


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
        except OSError as exc:  # what cannot be measured is past the cap: the install stops
            self.measured = self.cap + 1
            self._next = began
            made = _shown(exc.filename)
            if isinstance(exc, PermissionError):
                return (
                    f"it made {made}, a directory it keeps the gateway from looking into: no installer "
                    "needs one, and the package should not be trusted"
                )
            return (
                f"it made {made}, which the gateway cannot measure ({exc.strerror}): no installer needs "
                "one, and the package should not be trusted"
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
