"""Outside a held jail: cap what each of its writable tmpfs mounts holds, in bytes and in files.

Run by the gateway's interpreter, isolated (``python3 -I -S``), while the jail waits at bwrap's
`--block-fd` (`sandbox/limits.py`), so nothing in it runs yet::

    tmpfs.py PID PATH=BYTES:FILES ...

A tmpfs's size bounds the bytes of its files, not how many there are: every file, directory and
link takes an inode and a name in the kernel's memory (1 to 1.7 KiB each, measured), and bwrap
leaves `nr_inodes` at its default, half the machine's pages in each mount (3 million on 24 GiB). A
server with a 64 MiB limit could keep 9 million empty files, 9 GiB of kernel memory, in its /tmp,
home and /dev/shm, which no rlimit counts. bwrap has no option for it, and inside the jail no
process may remount (its capabilities are dropped), so this process joins the jail's mount
namespace from outside, through the user namespace that owns it (as that namespace's owner, or as
root), and sets `size` and `nr_inodes` of each mount (`fspick`, `fsconfig`: Linux 5.2), then reads
them back. bwrap names the jail's first process as soon as it exists, before it has made the mounts:
they are all in place once that process has dropped its capabilities, which it does just before it
waits, so that is waited for first. Any step that fails fails the jail: the gateway ends it,
nothing is started.

Standard library only: it is run without site-packages.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import sys
import time

__all__ = ["main", "size_mounts"]

NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
# the new mount API's system call numbers: the same on every architecture (the generic table)
SYS_FSCONFIG, SYS_FSPICK = 431, 433
FSCONFIG_SET_STRING, FSCONFIG_CMD_RECONFIGURE = 1, 7
FSPICK_CLOEXEC, FSPICK_SYMLINK_NOFOLLOW, FSPICK_NO_AUTOMOUNT = 1, 2, 4
AT_FDCWD = -100
# bwrap makes a jail's mounts in milliseconds; the gateway ends a jail not sized within its own bound
SETUP_SECONDS = 5.0
POLL_SECONDS = 0.001  # nothing says when a process drops its capabilities: it is looked at


def _checked(result: int, what: str) -> int:
    """`result` of a libc call, or the OSError its errno stands for."""
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _set_up(pid: int) -> None:
    """Wait until bwrap has made the jail whose first process is `pid`: that process drops its last
    capability once every mount is in place, just before it waits for the gateway.

    Raises:
        OSError: it is gone, or still has capabilities after SETUP_SECONDS.
    """
    deadline = time.monotonic() + SETUP_SECONDS
    while True:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            held = next((line.split()[1] for line in status if line.startswith("CapEff:")), "")
        if int(held or "0", 16) == 0:
            return
        if time.monotonic() >= deadline:
            raise OSError(0, f"bubblewrap did not finish making the jail within {SETUP_SECONDS:g} s")
        time.sleep(POLL_SECONDS)


def size_mounts(pid: int, sizes: dict[str, tuple[int, int]]) -> None:
    """Give each tmpfs mount point in `sizes` (-> bytes, files) of the jail whose first process is
    `pid` that size and that many files at most. This process must have one thread (setns).

    Raises:
        OSError: a namespace cannot be joined, a path is not a mount of its own, or the kernel
            refused the sizes (or did not keep them).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    _set_up(pid)
    mounts = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        # the user namespace bwrap mounted in: the jail's own (with --disable-userns, its first
        # process has gone on into a nested one, which cannot change these mounts)
        owner = _checked(fcntl.ioctl(mounts, NS_GET_USERNS), "the jail's user namespace")
        try:
            _checked(libc.setns(owner, CLONE_NEWUSER), "joining the jail's user namespace")
        finally:
            os.close(owner)
        _checked(libc.setns(mounts, CLONE_NEWNS), "joining the jail's mount namespace")
    finally:
        os.close(mounts)
    for path, (size, files) in sizes.items():
        parent = os.path.dirname(path.rstrip("/")) or "/"
        if os.stat(path, follow_symlinks=False).st_dev == os.stat(parent).st_dev:
            raise OSError(0, f"{path} is not a mount of its own in the jail")
        flags = FSPICK_CLOEXEC | FSPICK_SYMLINK_NOFOLLOW | FSPICK_NO_AUTOMOUNT
        picked = _checked(libc.syscall(SYS_FSPICK, AT_FDCWD, path.encode(), flags), f"fspick {path}")
        try:
            for key, value in (("size", size), ("nr_inodes", files)):
                set_ = libc.syscall(SYS_FSCONFIG, picked, FSCONFIG_SET_STRING, key.encode(), str(value).encode(), 0)
                _checked(set_, f"{key} of {path}")
            _checked(libc.syscall(SYS_FSCONFIG, picked, FSCONFIG_CMD_RECONFIGURE, None, None, 0), f"resizing {path}")
        finally:
            os.close(picked)
        held = os.statvfs(path)
        if held.f_files != files or held.f_blocks * held.f_frsize != size:
            got = f"{held.f_blocks * held.f_frsize} bytes in {held.f_files} files"
            raise OSError(0, f"{path} holds {got} after resizing, not {size} in {files}")


def main(argv: list[str]) -> int:
    try:
        pid = int(argv[0])
        sizes = {}
        for arg in argv[1:]:
            path, _, amounts = arg.rpartition("=")
            size, _, files = amounts.partition(":")
            sizes[path] = (int(size), int(files))
    except (IndexError, ValueError):
        sys.stderr.write("usage: tmpfs.py PID PATH=BYTES:FILES ...\n")
        return 2
    try:
        size_mounts(pid, sizes)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        sys.stderr.write(f"{exc.strerror or exc}{where}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
