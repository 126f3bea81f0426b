"""The files a database keeps beside a lone granted file, made by the gateway for a Landlock jail.

A `read_write` grant of one file lets a Landlock jail write that file and nothing beside it: the
directory around it is not the jail's (often it is the user's home). SQLite keeps its journal
(`NAME-journal`, or `NAME-wal` and `NAME-shm`) beside the database and removes it after each
commit, so a database granted alone is read-only to it ("attempt to write a readonly database").
A bwrap jail shows the file inside a tmpfs where the journal can go; Landlock has no such place.

So the jail of such a grant hands its `open`, `openat`, `creat`, `unlink` and `unlinkat` to the
gateway (`seccomp.LANDLOCK_SIDECAR_RULES`, answered by the jail's gate, `sandbox/connects.py`):

- a call that names anything but one of those three names beside a lone file goes on as the jail
  made it (the filter's CONTINUE), where Landlock judges it as it would have: that the path is read
  again by the kernel afterwards changes nothing, since the gateway granted nothing for it;
- for one of those names, the gateway reads the path from the caller's memory once, finds the
  directory it names as the kernel would for the caller (from the caller's own working directory
  or descriptor, through `/proc`, links followed by the kernel: never by a walk of the gateway's,
  which a chain of thousands of links would stop), and acts on its own descriptor of the file's
  directory, held since the jail started, with the name it judged: it opens the file (a regular
  file only, never through a link, never one with other links, truncated only once it is known to
  be one, with the caller's flags less those that are not for a plain file) and hands the caller
  that descriptor, or removes it. The jail is given nothing else in that directory.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cellblock.sandbox.callers import AT_FDCWD, read_path, signed

__all__ = ["FILE_CALLS", "SUFFIXES", "Opened", "Sidecars"]

# SQLite's: its rollback journal, and its write-ahead log with its shared-memory index
SUFFIXES = ("-journal", "-wal", "-shm")
FILE_CALLS = ("open", "openat", "creat", "unlink", "unlinkat")
_AT_REMOVEDIR = 0x200
# what an open of a plain file may ask for; anything else (O_PATH, O_TMPFILE, O_DIRECTORY) is refused
_FLAGS = (
    os.O_ACCMODE
    | os.O_CREAT
    | os.O_EXCL
    | os.O_TRUNC
    | os.O_APPEND
    | os.O_NONBLOCK
    | os.O_SYNC
    | os.O_DSYNC
    | os.O_NOFOLLOW
    | os.O_NOCTTY
    | os.O_CLOEXEC
    | getattr(os, "O_LARGEFILE", 0)
    | 0o100000  # O_LARGEFILE as a 32-bit x86 process passes it
)


@dataclass(frozen=True, slots=True)
class Opened:
    """A file the gateway opened for the caller: hand it `fd` (close-on-exec if it asked)."""

    fd: int
    cloexec: bool


class Sidecars:
    """The sidecar files of the lone granted `files` (each a regular file whose directory the jail
    may not write). Holds a descriptor of each file's directory until `close`.

    Raises:
        OSError: a directory cannot be opened.
    """

    def __init__(self, files: Sequence[str]) -> None:
        # by the directory's identity (device, inode): how the directory a call names is recognised
        self._dirs: dict[tuple[int, int], tuple[int, frozenset[str]]] = {}
        self._names = frozenset[str]()
        try:
            for file in files:
                where, name = os.path.split(os.path.realpath(file))
                names = frozenset(name + suffix for suffix in SUFFIXES)
                fd = os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    key = _identity(os.fstat(fd))
                except OSError:
                    os.close(fd)
                    raise
                if key in self._dirs:
                    os.close(fd)
                    fd, known = self._dirs[key]
                    names |= known
                self._dirs[key] = (fd, names)
                self._names |= names
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for fd, _ in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def answer(self, pid: int, call: str, args: Sequence[int], waiting: Callable[[], bool]) -> int | Opened | None:
        """`pid`'s `call` (one of `FILE_CALLS`, with its raw `args`): None when it is to go on as the
        jail made it; else what it gets: an error number (0: done) or a descriptor to hand it."""
        if call == "unlinkat" and args[2] & _AT_REMOVEDIR:
            return None
        at, path = (AT_FDCWD, args[0]) if call in ("open", "creat", "unlink") else (signed(args[0]), args[1])
        try:
            name = read_path(pid, path)
        except OSError:
            return None  # the kernel reads it again, and answers as it would have
        head, tail = os.path.split(name)
        if tail not in self._names:
            return None
        # the directory as the caller's kernel finds it: relative to the caller's own working directory
        # or descriptor (its magic link in /proc), each link followed by the kernel (40 at most)
        start = f"/proc/{pid}/cwd" if at == AT_FDCWD else f"/proc/{pid}/fd/{at}"
        try:
            held = os.stat(head if name.startswith("/") else os.path.join(start, head))
        except OSError:
            return None
        found = self._dirs.get(_identity(held))
        if found is None or tail not in found[1]:
            return None
        if not waiting():
            return errno.EINTR  # not read by anyone: the call is gone
        directory = found[0]
        if call in ("unlink", "unlinkat"):
            try:
                os.unlink(tail, dir_fd=directory)
            except OSError as exc:
                return exc.errno or errno.EACCES
            return 0
        if call == "creat":
            flags, mode = os.O_CREAT | os.O_WRONLY | os.O_TRUNC, args[1]
        else:
            flags, mode = (args[1], args[2]) if call == "open" else (args[2], args[3])
        return _open(directory, tail, flags & 0xFFFFFFFF, mode & 0o666 & ~_umask(pid))


def _open(directory: int, name: str, flags: int, mode: int) -> int | Opened:
    """Open `name` in `directory` as a plain file, with the caller's `flags`: the file, or an error number."""
    truncate = bool(flags & os.O_TRUNC)
    if flags & ~_FLAGS or (truncate and flags & os.O_ACCMODE == os.O_RDONLY):
        return errno.EACCES
    # truncated below, once it is known to be a plain file of its own: O_TRUNC would empty another
    # name's file before the check
    own = (flags & _FLAGS & ~os.O_TRUNC & ~getattr(os, "O_LARGEFILE", 0) & ~0o100000) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        # not blocking while it opens: a FIFO put there by another process does not hold the gate
        fd = os.open(name, own | os.O_NONBLOCK, mode, dir_fd=directory)
    except OSError as exc:
        return exc.errno or errno.EACCES
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode) or held.st_nlink != 1:
            raise OSError(errno.EACCES, "not a plain file of its own")
        if truncate:
            os.ftruncate(fd, 0)
        if not flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
    except OSError as exc:
        os.close(fd)
        return exc.errno or errno.EACCES
    return Opened(fd, bool(flags & os.O_CLOEXEC))


def _identity(held: os.stat_result) -> tuple[int, int]:
    return held.st_dev, held.st_ino


def _umask(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o077
