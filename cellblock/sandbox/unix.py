"""Private Unix sockets: the egress proxy and the control socket both listen on one."""

from __future__ import annotations

import os
import socket
import stat
from contextlib import suppress

__all__ = ["bind_private"]


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
        listener.bind(os.fspath(path))
        # before listen(): until then nobody can connect, whatever the umask allowed
        os.chmod(path, 0o600)
        listener.listen(backlog)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    return listener
