"""A root installer's changes of mode in a Landlock jail, made by the gateway beneath the install alone.

Landlock governs no file's mode, and root owns the system's files: a Landlock jail run as root may
not change a mode by path (`seccomp.LANDLOCK_ROOT_RULES`), or it could `chmod 0666 /etc/shadow`.
But npm, pip and uv change the modes of what they install (a program made executable). So an
installer's jail of root hands its `chmod`, `fchmodat` and `fchmodat2` to the gateway
(`seccomp.LANDLOCK_ROOT_INSTALL_RULES`, answered by the jail's gate, `sandbox/connects.py`), which:

- reads the path from the caller's memory, once;
- refuses a set-user-ID or set-group-ID mode;
- resolves the path where the caller would (its working directory, or the directory its descriptor
  names) and opens it with `openat2` beneath the install's directory (`RESOLVE_BENEATH`: no `..`,
  no link, no mount point leads out of it), never following a last link the call said not to;
- changes the mode of what it opened: the file it judged, whatever the caller's memory or
  directories hold a moment later.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Sequence

from cellblock.sandbox.callers import AT_FDCWD, read_path, signed, start_of

__all__ = ["MODE_CALLS", "change_mode"]

MODE_CALLS = ("chmod", "fchmodat", "fchmodat2")
_LIBC = ctypes.CDLL(None, use_errno=True)
SYS_OPENAT2 = 437  # the same on x86-64 and aarch64
RESOLVE_NO_MAGICLINKS, RESOLVE_BENEATH = 0x02, 0x08
AT_SYMLINK_NOFOLLOW = 0x100
_SET_ID = 0o6000


def change_mode(pid: int, call: str, args: Sequence[int], beneath: int, root: str, waiting: Callable[[], bool]) -> int:
    """Make `pid`'s `call` (one of `MODE_CALLS`, with its raw `args`) if what it names is beneath
    the directory `root` (open at descriptor `beneath`), and if the call still `waiting` once its
    path is read (its pid may have been reused); its error number (0: made)."""
    if call == "chmod":
        dirfd, path, mode, flags = AT_FDCWD, args[0], args[1], 0
    else:
        dirfd = signed(args[0])
        path, mode, flags = args[1], args[2], args[3] if call == "fchmodat2" else 0
    mode &= 0o7777
    if mode & _SET_ID:
        return errno.EPERM
    try:
        name = read_path(pid, path)
        start = start_of(pid, dirfd)
    except OSError as exc:
        return exc.errno or errno.EFAULT
    if not waiting():
        return errno.EINTR  # not read by anyone: the call is gone
    if not name:
        return errno.ENOENT
    full = name if name.startswith("/") else f"{start}/{name}"
    if not (full + "/").startswith(root.rstrip("/") + "/"):
        return errno.EPERM
    inside = full[len(root.rstrip("/")) :].lstrip("/") or "."
    nofollow = os.O_NOFOLLOW if flags & AT_SYMLINK_NOFOLLOW else 0
    how = struct.pack("=QQQ", os.O_PATH | os.O_CLOEXEC | nofollow, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    opened = _LIBC.syscall(SYS_OPENAT2, beneath, os.fsencode(inside), how, len(how))
    if opened < 0:
        code = ctypes.get_errno()
        return errno.EPERM if code == errno.EXDEV else code  # EXDEV: it leads out of the install
    try:
        os.chmod(f"/proc/self/fd/{opened}", mode)  # the file opened, whatever its path names now
    except OSError as exc:
        return exc.errno or errno.EPERM
    finally:
        os.close(opened)
    return 0
