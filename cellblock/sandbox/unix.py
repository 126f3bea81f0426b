"""Private Unix sockets: the egress proxy and the control socket both listen on one.

A socket's path must fit in `sun_path` (108 bytes on Linux, 104 on macOS), and a runtime
directory under a deep home or a test's temp dir may not leave room. On Linux such a socket is
bound and reached through `/proc/self/fd/N/NAME`, where N is its directory opened for the
purpose: the same file, by a short name (`reachable`).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["SUN_PATH", "bind_private", "reachable"]

# sun_path's size, with its terminating NUL
SUN_PATH = 104 if sys.platform == "darwin" else 108


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
