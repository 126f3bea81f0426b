"""Inside a jail: keep the server from the host's abstract Unix sockets, then start it.

Run by the gateway's interpreter inside every jail, isolated (``python3 -I -S``)::

    scope.py -- ARGV...

An abstract Unix socket (X11's ``@/tmp/.X11-unix/X0``, a D-Bus bus at ``unix:abstract=``) is a
name in a network namespace, not a file, so no mount hides it. A jail that shares the host's
network (``network: open``) reaches every one the host listens on by name; any other jail does
through a socket made on the host's network and handed to it (``SCM_RIGHTS``), since the name is
looked up where the socket was made. Landlock's abstract-socket scope (ABI 6, Linux 6.12) refuses a
process in a domain to connect or send to one made outside that domain, whatever socket it holds;
the server's own abstract sockets still work. This launcher enters such a domain (it has no rights
to restrict besides: files and ports stay as the jail has them), then replaces itself with ARGV,
which the domain covers with all it starts. If the kernel refuses, nothing is started.

Standard library only: it runs inside the jail, with nothing but the interpreter mounted.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

__all__ = ["main", "scope_abstract_sockets"]

# Landlock system call numbers: the same on x86-64 and aarch64 (the generic syscall table).
SYS_CREATE_RULESET, SYS_RESTRICT_SELF = 444, 446
SCOPE_ABSTRACT_UNIX_SOCKET = 1
PR_SET_NO_NEW_PRIVS = 38
EXIT_CANNOT_START = 126


def scope_abstract_sockets() -> None:
    """Put this process (and what it starts) in a Landlock domain scoped against abstract Unix
    sockets made outside it.

    Raises:
        OSError: the kernel refused (no Landlock, or an ABI before 6).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped (all u64)
    attr = struct.pack("=QQQ", 0, 0, SCOPE_ABSTRACT_UNIX_SOCKET)
    ruleset = libc.syscall(SYS_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock_create_ruleset: {os.strerror(code)}")
    try:
        # bwrap sets it already; restrict_self requires it without CAP_SYS_ADMIN
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"PR_SET_NO_NEW_PRIVS: {os.strerror(code)}")
        if libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"landlock_restrict_self: {os.strerror(code)}")
    finally:
        os.close(ruleset)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--":
        sys.stderr.write("usage: scope.py -- ARGV...\n")
        return EXIT_CANNOT_START
    try:
        scope_abstract_sockets()
    except OSError as exc:
        sys.stderr.write(
            f"cellblock-scope: the host's abstract Unix sockets cannot be closed ({exc.strerror}); not starting\n"
        )
        return EXIT_CANNOT_START
    try:
        os.execv(argv[1], argv[1:])  # absolute: the jail resolved it
    except OSError as exc:
        sys.stderr.write(f"cellblock-scope: cannot run {argv[1]}: {exc.strerror}\n")
    return EXIT_CANNOT_START


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
