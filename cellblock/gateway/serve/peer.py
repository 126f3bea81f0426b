"""Who connected to the control socket, and whether they may use it (`serve/control.py`).

The kernel gives the peer's credentials: on Linux its pid and uid (`SO_PEERCRED`), and from 6.5 a
handle on the very process that connected (`SO_PEERPIDFD`); on macOS and the BSDs its uid only
(`getpeereid`). A peer is refused, each time with why:

1. unless its uid is the gateway's own;
2. where its pid is known, if it is a process of a server that any gateway runs: it is in a
   cgroup or systemd scope made for a server (`sandbox/marks.py`: every server's processes are
   born in one, which no fork or setsid leaves);
3. if it is one of the processes this gateway started for its servers, or runs under one of them
   (its process tree: the second line, for a server that could not be marked on this machine);
4. if it exited before it was checked: its pid may name another process by then.

A peer in a pid namespace the gateway cannot see (pid 0) is no server's: a server's processes are
always visible from the gateway's namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import struct

from cellblock.policy.text import visible
from cellblock.sandbox.cgroups import marked

__all__ = ["peer", "peer_refusal"]

# How far up a peer's process tree is followed, and how often when it changes while it is read.
MAX_ANCESTRY = 4096
ANCESTRY_TRIES = 3
# Linux 6.5's option for a pidfd of the peer (pinned when it connected); Python names it only later.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)
# A cgroup path is the user's to name: shown escaped, and cut.
MAX_SHOWN = 160


def peer(conn: socket.socket, servers: set[int]) -> tuple[int | None, int | None, str | None]:
    """The peer's pid (None where the OS does not give it) and uid, and why it may not use the
    control socket, if it may not; `servers` are the pids of the processes this gateway started
    for its servers."""
    try:
        pid, uid = _peer_credentials(conn)
    except OSError as exc:
        return None, None, f"refused a connection whose peer credentials could not be read ({exc.strerror or exc})"
    if uid != os.geteuid():
        return pid, uid, peer_refusal(uid)
    if pid is None or pid <= 0:
        return pid, uid, None
    pidfd = _pidfd(conn, pid)
    try:
        if pidfd is not None and not _alive(pidfd):
            return pid, uid, _exited(pid)
        refusal = _refused_mark(pid) or _refused_ancestry(pid, servers)
        # what was read from /proc by pid must have been the process that connected: it still lives
        if refusal is None and pidfd is not None and not _alive(pidfd):
            refusal = _exited(pid)
        return pid, uid, refusal
    finally:
        if pidfd is not None and pidfd >= 0:
            os.close(pidfd)


def peer_refusal(uid: int) -> str:
    return f"refused a connection from uid {uid}: only the gateway's own uid may use its control socket"


def _peer_credentials(conn: socket.socket) -> tuple[int | None, int]:
    """(pid, uid) of the peer. Linux gives both (`SO_PEERCRED`; pid 0 for a peer in a pid
    namespace the gateway cannot see); macOS and the BSDs give the uid (`getpeereid`).

    Raises:
        OSError: the credentials cannot be read, or this OS offers neither way.
    """
    if hasattr(socket, "SO_PEERCRED"):
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return pid, uid
    return None, _getpeereid(conn.fileno())


def _getpeereid(fd: int) -> int:
    """The effective uid of the peer of the Unix socket `fd`: `getpeereid(2)` of libc (macOS, BSDs).

    Raises:
        OSError: the call failed, or libc has no `getpeereid`.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "getpeereid", None)
    if call is None:
        raise OSError(errno.ENOSYS, "this system gives no peer credentials for a Unix socket")
    uid, gid = ctypes.c_uint32(), ctypes.c_uint32()  # uid_t and gid_t are 32-bit unsigned
    call.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]
    call.restype = ctypes.c_int
    if call(fd, ctypes.byref(uid), ctypes.byref(gid)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return uid.value


def _pidfd(conn: socket.socket, pid: int) -> int | None:
    """A pidfd of the peer: the kernel's (pinned at connect, Linux 6.5), else one opened now
    (older kernels: it only narrows the time in which the pid could be reused); None where the
    kernel has no pidfds."""
    with contextlib.suppress(OSError):
        return int(conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1  # already gone: `_alive` says so
    except OSError:
        return None


def _alive(pidfd: int) -> bool:
    if pidfd < 0:
        return False
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists; the signal was refused for another reason
    return True


def _exited(pid: int) -> str:
    return f"refused a connection from process {pid}, which exited before it could be checked"


def _refused_mark(pid: int) -> str | None:
    """Why the peer may not use the control socket, if it runs in a server's cgroup or scope, of
    this gateway or of any other; its cgroups unreadable is a refusal too."""
    try:
        path = marked(pid)
    except OSError:
        return f"refused a connection from process {pid}, whose cgroups could not be read"
    if path is None:
        return None
    shown = visible(path if len(path) <= MAX_SHOWN else f"{path[:MAX_SHOWN]}…")
    return (
        f"refused a connection from a process of a server Cellblock runs (it is in {shown}, a server's "
        "cgroup): a server may not answer for the user"
    )


def _refused_ancestry(peer: int, servers: set[int]) -> str | None:
    """Why the peer may not use the control socket, if it may not: a server the gateway runs (the
    process it started, jailed or not, or anything that one runs) must never approve its own
    calls, whatever it can see.

    An ancestry that changes while it is read (a parent exiting) is read again; one that cannot be
    read at all is refused.
    """
    if not servers:
        return None
    for _ in range(ANCESTRY_TRIES):
        ancestry = _ancestry(peer)
        if ancestry is not None:
            if servers & set(ancestry):
                return "refused a connection from a process the gateway started: a server may not answer for the user"
            return None
    return f"refused a connection from process {peer}, whose ancestry could not be read"


def _ancestry(pid: int) -> list[int] | None:
    """`pid` and its parents up to pid 1; None when one of them exited while they were read."""
    found = [pid]
    while pid > 1 and len(found) < MAX_ANCESTRY:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        found.append(pid)
    return found
