"""A network namespace for an allowlist jail where ports below 1024 need no capability, then bwrap.

    python3 netns.py -- BWRAP_ARGV...

Runs on the host, just before bwrap, by the gateway's Python isolated from site and home, so it is
one standalone file: stdlib only, no `cellblock` import. It makes a user namespace (mapping only
the caller's own uid and gid, to themselves) and a network namespace owned by it, sets that
namespace's `net.ipv4.ip_unprivileged_port_start` to 0, brings its loopback up, and executes bwrap
there (bwrap then makes no network namespace of its own). The in-jail relay can then answer DNS on
127.0.0.1:53 and take connections on :80 and :443 with no capability at all: the jail keeps
`--cap-drop ALL` and `--disable-userns`. Inside bwrap's own user namespace, which is nested in this
one, no capability over this network namespace is left: the sysctl was the only thing done with it.

If the namespaces cannot be made, it ends here with exit code 126 and one line on stderr: nothing
is started. If the port sysctl or the route is refused, it says so on stderr and goes on: the jail
is then as it was without them (the proxy variables work, names do not resolve).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys
from collections.abc import Sequence

__all__ = ["main"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sh14x"  # struct ifreq: the name, then ifr_flags in the union
_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
# rtnetlink: one route, "local 0.0.0.0/0 dev lo table local", acknowledged
_RTM_NEWROUTE = 24
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_NLMSG_ERROR = 2
_RT_TABLE_LOCAL, _RTPROT_BOOT, _RT_SCOPE_HOST, _RTN_LOCAL = 255, 3, 254, 2
_RTA_OIF = 4
_EXIT_CANNOT_START = 126


def _say(message: str) -> None:
    print(f"cellblock-netns: {message}", file=sys.stderr, flush=True)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as file:
        file.write(text)


def prepare() -> None:
    """Enter a new user and network namespace, low ports open to all, loopback up.

    Raises:
        OSError: any step was refused by the kernel.
    """
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare (user and network namespace): {os.strerror(errno)}")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
    # Without these the jail is as it was before them: the proxy variables still work, and the
    # relay says what does not (a read-only /proc/sys, as in some containers, refuses the first).
    try:
        _write(_PORT_START, "0")
    except OSError as exc:
        _say(f"ports below 1024 stay closed to the relay ({exc}): listed names will not resolve in the jail")
    try:
        _local_default_route(socket.if_nametoindex("lo"))
    except OSError as exc:
        _say(f"raw addresses will not reach the relay ({exc})")


def _local_default_route(loopback: int) -> None:
    """Make every IPv4 address local to the namespace (there is nothing but loopback to reach), so
    a connection to an address, not a name, reaches the relay's listener on its port and the relay
    sees where it was meant to go.

    Raises:
        OSError: the kernel refused the route.
    """
    rtmsg = struct.pack(
        "BBBBBBBBI", socket.AF_INET, 0, 0, 0, _RT_TABLE_LOCAL, _RTPROT_BOOT, _RT_SCOPE_HOST, _RTN_LOCAL, 0
    )
    oif = struct.pack("HHI", 8, _RTA_OIF, loopback)
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_EXCL | _NLM_F_CREATE
    body = rtmsg + oif
    message = struct.pack("IHHII", 16 + len(body), _RTM_NEWROUTE, flags, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as netlink:
        netlink.sendall(message)
        reply = netlink.recv(4096)
    kind = struct.unpack("IHHII", reply[:16])[1]
    code = struct.unpack("i", reply[16:20])[0] if kind == _NLMSG_ERROR else 0
    if code:
        raise OSError(-code, f"adding the local default route: {os.strerror(-code)}")


def main(argv: Sequence[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        _say("no command given after --")
        return _EXIT_CANNOT_START
    try:
        prepare()
    except OSError as exc:
        _say(
            f"cannot make the allowlist jail's network namespace ({exc}); the kernel must allow "
            "unprivileged user and network namespaces (see 'cellblock doctor')"
        )
        return _EXIT_CANNOT_START
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _say(f"cannot start {command[0]!r}: {exc}")
    return _EXIT_CANNOT_START


if __name__ == "__main__":
    sys.exit(main())
