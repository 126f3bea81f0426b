"""Private Unix sockets: the egress proxy and the control socket both listen on one, and accept alike
(as `serve --http` does its TCP connections).

A socket's path must fit in `sun_path` (108 bytes on Linux, 104 on macOS), and a runtime
directory under a deep home or a test's temp dir may not leave room. On Linux such a socket is
bound and reached through `/proc/self/fd/N/NAME`, where N is its directory opened for the
purpose: the same file, by a short name (`reachable`).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import anyio

__all__ = ["ACCEPT_BACKOFF", "ACCEPT_TELL_SECONDS", "SUN_PATH", "accept", "bind_private", "reachable"]

logger = logging.getLogger(__name__)

# sun_path's size, with its terminating NUL
SUN_PATH = 104 if sys.platform == "darwin" else 108
# Out of file descriptors or buffers: accepting again at once would spin; a short pause lets others close.
ACCEPT_BACKOFF = 0.1
# While accepts keep failing, one log line per this many seconds says how many did: a line per
# failure would grow the log by ten lines a second for as long as it lasts.
ACCEPT_TELL_SECONDS = 10.0
# per listener (by its name in the log): failures not told yet, and when the last were
_untold: dict[str, tuple[int, float]] = {}
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# Errors of the connection being accepted, not of the listener (accept(2)): the next one may do.
_ITS_OWN = frozenset(
    getattr(errno, name, -1)
    for name in ("ENETDOWN", "EPROTO", "ENOPROTOOPT", "EHOSTDOWN", "ENONET", "EHOSTUNREACH", "ENETUNREACH")
)


@contextmanager
def reachable(path: str | os.PathLike[str]) -> Iterator[str]:
    """An address that binds or connects to the socket file at `path`, valid inside the block.

    Raises:
        OSError: the path is too long for a socket and this system has no `/proc/self/fd`
            (ENAMETOOLONG, naming the path and the fix), or its directory cannot be opened.
    """
    text = os.fspath(path)
    if len(os.fsencode(text)) < SUN_PATH:
        yield text
        return
    directory, name = os.path.split(text)
    if not os.path.isdir("/proc/self/fd") or len(os.fsencode(name)) > SUN_PATH - 32:
        raise OSError(
            errno.ENAMETOOLONG,
            f"the socket path {text} is longer than a Unix socket allows ({SUN_PATH - 1} bytes); "
            "set XDG_RUNTIME_DIR (or CELLBLOCK_STATE_DIR) to a directory with a shorter path",
        )
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def bind_private(path: str | os.PathLike[str], backlog: int) -> socket.socket:
    """A non-blocking listener on `path` with mode 0600; a stale socket file there is replaced.

    Raises:
        OSError: the path cannot be bound (in use by a live socket, a missing directory...).
    """
    with suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with reachable(path) as address:
            listener.bind(address)
        # before listen(): until then nobody can connect, whatever the umask allowed
        os.chmod(path, 0o600)
        listener.listen(backlog)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    return listener


async def accept(listener: socket.socket, what: str) -> socket.socket:
    """The next connection to the non-blocking `listener`, itself non-blocking. A peer that gave up
    before it was accepted is waited past; while the process is out of descriptors or memory, the
    accept is retried after `ACCEPT_BACKOFF` (logged as `what`'s, once per `ACCEPT_TELL_SECONDS`).

    Raises:
        OSError: any other failure to accept.
    """
    while True:
        await anyio.wait_readable(listener)
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            continue  # another waiter took it, or the peer gave up between readiness and accept
        except OSError as exc:
            if exc.errno in _ITS_OWN:
                continue
            if exc.errno not in _EXHAUSTED:
                raise
            failed, told = _untold.get(what, (0, -math.inf))
            if time.monotonic() - told < ACCEPT_TELL_SECONDS:
                _untold[what] = (failed + 1, told)
            else:
                logger.warning("%s: accept failed %d time(s) (%s); backing off", what, failed + 1, exc.strerror)
                _untold[what] = (0, time.monotonic())
            await anyio.sleep(ACCEPT_BACKOFF)
            continue
        conn.setblocking(False)
        return conn
