"""What a call waiting on the gate names: its raw arguments read as the caller meant them.

The gate (`sandbox/connects.py`) makes some of a Landlock jail's calls itself: a root installer's
changes of mode (`sandbox/modes.py`) and the files beside a lone granted file
(`sandbox/sidecars.py`). Both read the path the call names from the caller's memory, once, and
resolve it where the caller would have.
"""

from __future__ import annotations

import errno
import os
import struct

__all__ = ["AT_FDCWD", "read_path", "signed", "start_of"]

AT_FDCWD = -100
_PATH_MAX = 4096


def signed(value: int) -> int:
    """A descriptor argument as the int it is (AT_FDCWD is negative), from its raw 64-bit value."""
    return int(struct.unpack("=i", struct.pack("=I", value & 0xFFFFFFFF))[0])


def start_of(pid: int, dirfd: int) -> str:
    """Where `pid` resolves a relative path given with `dirfd`: its working directory for AT_FDCWD.

    Raises:
        OSError: the process, or the descriptor, is gone.
    """
    return os.readlink(f"/proc/{pid}/cwd" if dirfd == AT_FDCWD else f"/proc/{pid}/fd/{dirfd}")


def read_path(pid: int, address: int) -> str:
    """The NUL-ended path at `address` in `pid`'s memory.

    Raises:
        OSError: it cannot be read, or runs past PATH_MAX (ENAMETOOLONG).
    """
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
        data = b""
        while len(data) < _PATH_MAX:
            try:
                chunk = os.pread(memory.fileno(), 256, address + len(data))
            except (OverflowError, ValueError) as exc:
                raise OSError(errno.EFAULT, "a path outside the caller's memory") from exc
            if not chunk:
                raise OSError(errno.EFAULT, "a path outside the caller's memory")
            end = chunk.find(b"\0")
            if end >= 0:
                return os.fsdecode(data + chunk[:end])
            data += chunk
    raise OSError(errno.ENAMETOOLONG, "a path longer than PATH_MAX")
