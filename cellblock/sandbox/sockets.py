"""The host's Unix sockets no jail may reach, and how each kind is kept from one.

A Unix socket is a door into the program that listens on it, with that program's rights: the
session bus reaches the keyring (every secret Cellblock holds), an ssh-agent signs with your keys,
X11 shows your screen and types into your windows, Docker's socket is root on the machine. A jail
that shows a directory shows the sockets in it, so:

- **Path sockets** (a file) are found here, each with what it is: those the session's environment
  names (`DBUS_SESSION_BUS_ADDRESS`, `SSH_AUTH_SOCK`, `DISPLAY`, `WAYLAND_DISPLAY`, `DOCKER_HOST`,
  `CONTAINER_HOST`, `GPG_AGENT_INFO`, `PULSE_SERVER`), the places they are kept whatever the
  environment says (a client may start the gateway with little more than `HOME` and `PATH`): the
  session's runtime directory, X11's and ICE's socket directories in `/tmp`, Docker's, Podman's, the
  system bus, GnuPG's and OpenSSH's agent sockets in the home; and every socket bound to a path in
  this network namespace (the kernel's `sock_diag`), which is how a bus `dbus-launch` put in `/tmp`
  or an agent's `/tmp/ssh-*/agent.*` is found when nothing names it. The kernel says the path a
  socket was bound to and the inode of its file: where that path no longer leads to that file (a
  directory on the way renamed, which a server with a writable grant can do while the socket is
  hidden from it; a relative path; a path in another mount namespace; another hard link), the
  file is looked for by its device and inode in what the jail shares on that device
  (`sandbox/moved.py`). The gateway hides
  each one inside what a jail shares (`gateway/downstream/private.py`: a directory shown empty, a
  socket as `/dev/null`) and refuses a grant of one.
- **Abstract sockets** (a name in a network namespace, no file: X11's `@/tmp/.X11-unix/X0`, a
  bus at `unix:abstract=`) are looked up in the namespace the socket was made in: a jail that shares
  the host's (`network: open`) reaches them by name, any other through a socket such a jail hands
  it. Every jail is put in a Landlock domain scoped against them (`scope.py`, Landlock ABI 6, Linux
  6.12), where the kernel has it.

What this cannot see: a socket made (or made again) inside a grant after the jail started; one
bound in another network namespace (a container's, another jail's) that nothing names.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from cellblock.sandbox.launchers import launcher_mounts
from cellblock.sandbox.types import Mount, MountMode

__all__ = [
    "ABSTRACT_SCOPE_ABI",
    "SCOPE",
    "Bound",
    "HostSocket",
    "Moved",
    "abstract_gap",
    "abstract_scoped",
    "bound_sockets",
    "bus_paths",
    "host_sockets",
    "named_sockets",
    "socket_kind",
]

# The Landlock ABI whose scope keeps a domain from the abstract Unix sockets made outside it.
ABSTRACT_SCOPE_ABI = 6
# sock_diag (linux/netlink.h, sock_diag.h, unix_diag.h): every socket of this network namespace,
# with the path it was bound to and the inode of the file its bind made (Linux).
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 0x1, 0x300, 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_VFS, UNIX_DIAG_NAME, UNIX_DIAG_VFS = 0x1, 0x2, 0, 1
NLMSG, RTA = "=IHHII", "=HH"  # a netlink message's header, an attribute's
INODE_BITS = 0xFFFF_FFFF  # the kernel gives a socket file's inode number in 32 bits
MINOR_BITS = 20  # and its file system's device as the kernel keeps it: major << 20 | minor
DIAG_SECONDS = 5.0  # the kernel answers at once; a hang here must not hang a server's start
# The launcher that puts every jail in such a domain (run inside it).
SCOPE = str(Path(__file__).resolve().with_name("scope.py"))

_BUS = "a D-Bus bus, which reaches the keyring and every secret Cellblock holds"
_AGENT = "an ssh-agent's socket, which signs with your SSH keys"
_X11 = "an X11 display, which shows your screen and types into your windows"
_DOCKER = "Docker's socket, which is root on this machine"
# What a socket is, by where programs put it (fnmatch patterns on the path; the first match names it).
KINDS = (
    ("*/bus", _BUS),
    ("*/dbus-*", _BUS),
    ("/run/dbus/system_bus_socket", "the system D-Bus bus, which reaches the machine's services"),
    ("*/ssh-*/agent.*", _AGENT),
    ("*/.ssh/agent/*", _AGENT),
    ("*/S.gpg-agent*", "GnuPG's agent, which decrypts and signs with your keys"),
    ("*/keyring/*", "the keyring's own socket"),
    ("*docker.sock", _DOCKER),
    ("*/podman.sock", "Podman's socket, which runs containers as you"),
    ("/tmp/.X11-unix/*", _X11),
    ("*/wayland-*", "a Wayland display, which shows your windows"),
    ("*/pulse/native", "PulseAudio's socket, which records from the microphone"),
    ("*/pipewire-*", "PipeWire's socket, which records the screen and the microphone"),
)
LISTENER = "a Unix socket a program on this machine listens on"
_RUNTIME = (
    "your session's runtime directory: the session bus (which reaches the keyring), the keyring's, "
    "the ssh-agent's, GnuPG's, Wayland's and Docker's sockets"
)
# Directories that hold sockets and nothing else, shown empty: (path, what is in it).
SOCKET_DIRS = (
    ("/tmp/.X11-unix", "X11's sockets, which show your screen and type into your windows"),
    ("/tmp/.ICE-unix", "the session manager's (ICE) sockets"),
)
# Sockets at fixed places (a `~` is the home), with globs for those named per agent or per user.
SOCKET_FILES = (
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/podman/podman.sock",
    "/run/dbus/system_bus_socket",
    "~/.docker/run/docker.sock",
    "~/.docker/desktop/docker.sock",
    "~/.gnupg/S.*",
    "~/.ssh/agent/*",
)


@dataclass(frozen=True, slots=True)
class HostSocket:
    """A socket, or a directory of them, that no jail may reach, and what it is (for messages)."""

    path: str
    why: str


@dataclass(frozen=True, slots=True)
class Moved:
    """A socket bound to a path whose file is not, or not only, there."""

    path: str  # the path it was bound to: relative, in another mount namespace, or leading nowhere now
    device: int  # its file's file system, `os.makedev(major, minor)` (as /proc/self/mountinfo names it)
    inode: int  # its file's inode number, its low 32 bits


@dataclass(frozen=True, slots=True)
class Bound:
    """The sockets bound to a path in this network namespace, by where their files are."""

    # the paths of those whose file is at the path it was bound to, and nowhere else
    at: tuple[str, ...] = ()
    # those whose file is not, or not only, there; None: the kernel would not say (no sock_diag),
    # so any socket file may be one
    elsewhere: tuple[Moved, ...] | None = ()


def socket_kind(path: str) -> str:
    """What the socket at `path` is, by where it lies."""
    return next((why for pattern, why in KINDS if fnmatch.fnmatchcase(path, pattern)), LISTENER)


def host_sockets(
    env: Mapping[str, str] | None = None, home: str | None = None, bound: Bound | None = None
) -> list[HostSocket]:
    """Every socket (and socket directory) of the user's session and the machine that exists now,
    each once (the first reason found is kept): named by the environment, at the usual places, and
    bound to a path in this network namespace (`bound`, default: `bound_sockets()`), where it
    still is. Those no longer there are found in a jail's shares by `moved.sockets_within`."""
    env = os.environ if env is None else env
    bound = bound_sockets() if bound is None else bound
    home = home or env.get("HOME") or os.path.expanduser("~")
    runtime = [env.get("XDG_RUNTIME_DIR", ""), f"/run/user/{os.getuid()}"]
    found = [HostSocket(d, _RUNTIME) for d in runtime]
    found += [*named_sockets(env), *(HostSocket(d, why) for d, why in SOCKET_DIRS)]
    places = [p for place in SOCKET_FILES for p in _expand(home + place[1:] if place[0] == "~" else place)]
    found += [HostSocket(p, socket_kind(p)) for p in [*places, *bound.at]]
    seen: dict[str, HostSocket] = {}
    for item in found:
        # a relative path in a variable names no place a jail shows
        if item.path.startswith("/") and os.path.lexists(item.path):
            seen.setdefault(os.path.normpath(item.path), item)
    return list(seen.values())


def named_sockets(env: Mapping[str, str]) -> list[HostSocket]:
    """The sockets the session's environment names, each with the variable that names it (whether
    or not they exist)."""
    found = [
        HostSocket(p, f"{_BUS} (DBUS_SESSION_BUS_ADDRESS)") for p in bus_paths(env.get("DBUS_SESSION_BUS_ADDRESS", ""))
    ]
    if env.get("SSH_AUTH_SOCK", "").startswith("/"):
        found.append(HostSocket(env["SSH_AUTH_SOCK"], f"{_AGENT} (SSH_AUTH_SOCK)"))
    display = env.get("DISPLAY", "")
    if display.startswith("/"):  # macOS's XQuartz: the socket's path, ":0" and all
        found.append(HostSocket(display, f"{_X11} (DISPLAY)"))
    elif display.partition(":")[0] in ("", "unix") and display.partition(":")[2]:
        number = display.partition(":")[2].partition(".")[0]
        found.append(HostSocket(f"/tmp/.X11-unix/X{number}", f"{_X11} (DISPLAY)"))
    wayland = env.get("WAYLAND_DISPLAY", "")
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if wayland.startswith("/") or (wayland and runtime.startswith("/")):
        found.append(HostSocket(os.path.join(runtime, wayland), "a Wayland display (WAYLAND_DISPLAY)"))
    for variable, why in (("DOCKER_HOST", _DOCKER), ("CONTAINER_HOST", "Podman's socket, which runs containers")):
        scheme, _, path = env.get(variable, "").partition("://")
        if scheme == "unix" and path.startswith("/"):
            found.append(HostSocket(path, f"{why} ({variable})"))
    gpg = env.get("GPG_AGENT_INFO", "").partition(":")[0]
    if gpg.startswith("/"):
        found.append(HostSocket(gpg, "GnuPG's agent (GPG_AGENT_INFO)"))
    for server in env.get("PULSE_SERVER", "").split():
        path = server.removeprefix("unix:")
        if path.startswith("/"):
            found.append(HostSocket(path, "PulseAudio's socket (PULSE_SERVER)"))
    return found


def bus_paths(address: str) -> list[str]:
    """The socket files a D-Bus address leads to: each `unix:path=`, and for `unix:dir=` and
    `unix:tmpdir=` (where the bus makes a `dbus-*` socket of a random name) those there now.
    Values are unescaped as D-Bus escapes them (`%2d`); `abstract=` names no file."""
    found: list[str] = []
    for entry in address.split(";"):
        transport, _, fields = entry.partition(":")
        if transport != "unix":
            continue
        keys = dict(field.partition("=")[::2] for field in fields.split(","))
        if keys.get("path"):
            found.append(unquote(keys["path"]))
        for key in ("dir", "tmpdir"):
            if keys.get(key):
                found += _expand(os.path.join(unquote(keys[key]), "dbus-*"))
    return found


def _expand(path: str) -> list[str]:
    """`path`, or with a `*` in its last part the entries of its directory that match it now."""
    directory, pattern = os.path.split(path)
    if "*" not in pattern:
        return [path]
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, name) for name in fnmatch.filter(names, pattern))


def bound_sockets() -> Bound:
    """Every socket bound to a path in this network namespace (a listener, or a datagram socket a
    program receives on), by whether its file is at that path and nowhere else.

    The kernel keeps the path as it was bound, and the file may have gone on without it: a
    directory on the way renamed (a server can rename one in a writable grant while the socket in
    it is hidden from it, and so find it shown at its next start), a second hard link, a path
    relative to the binder's directory, through `/proc/self/fd`, or in another mount namespace (a
    service's private /tmp). Each such file is known by its device and inode, for `moved.sockets_within`."""
    if not sys.platform.startswith("linux"):
        return Bound()  # macOS: the jail's profile refuses Unix sockets itself
    try:
        listed = _diag_unix()
    except OSError:
        return Bound(elsewhere=None)
    at: set[str] = set()
    elsewhere: set[Moved] = set()
    for name, inode, device in listed:
        try:
            found = os.lstat(name) if name.startswith("/") else None
        except (OSError, ValueError):
            found = None
        if found is not None and stat.S_ISSOCK(found.st_mode) and found.st_ino & INODE_BITS == inode:
            at.add(name)
            if found.st_nlink == 1:
                continue
        elsewhere.add(Moved(name, device, inode))
    return Bound(tuple(sorted(at)), tuple(sorted(elsewhere, key=lambda m: (m.path, m.device, m.inode))))


def _diag_unix() -> list[tuple[str, int, int]]:
    """(the path it was bound to, its file's inode, its file's device) of each socket of this
    network namespace bound to a path, asked of the kernel over netlink (`sock_diag`, as `ss -x`
    does). The device is the file's superblock's (`d_sb->s_dev`), which /proc/self/mountinfo gives
    each mount as `major:minor`, made `os.makedev(major, minor)`.

    Raises:
        OSError: the kernel has no sock_diag for Unix sockets (CONFIG_UNIX_DIAG) or refused.
    """
    # struct unix_diag_req: family, protocol, pad, states (all), ino (any), show, cookie (any)
    request = struct.pack(
        "=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFF_FFFF, 0, UDIAG_SHOW_NAME | UDIAG_SHOW_VFS, *(0xFFFF_FFFF,) * 2
    )
    size = struct.calcsize(NLMSG) + len(request)
    header = struct.pack(NLMSG, size, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    found: set[tuple[str, int, int]] = set()  # an accepted connection repeats its listener's
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(DIAG_SECONDS)
        diag.sendto(header + request, (0, 0))
        while True:
            data = diag.recv(1 << 16)
            for kind, message in _netlink(data, NLMSG):
                if kind == NLMSG_DONE:
                    return sorted(found)
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", message)
                    raise OSError(-code, f"sock_diag: {os.strerror(-code)}")
                # struct unix_diag_msg (16 bytes), then attributes: the name, the file's inode and device
                attributes = dict(_netlink(message[16:], RTA))
                if UNIX_DIAG_NAME in attributes and UNIX_DIAG_VFS in attributes:
                    name = os.fsdecode(attributes[UNIX_DIAG_NAME].split(b"\0", 1)[0])
                    inode, device = struct.unpack_from("=II", attributes[UNIX_DIAG_VFS])
                    found.add((name, inode, os.makedev(device >> MINOR_BITS, device & ((1 << MINOR_BITS) - 1))))
            if not data:
                raise OSError(0, "sock_diag: the kernel ended the answer early")


def _netlink(data: bytes, head: str) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each netlink record in `data`, each a length and a type first and 4-byte
    aligned: messages (`head` NLMSG, a 16-byte header) or a message's attributes (RTA, 4 bytes)."""
    size = struct.calcsize(head)
    offset = 0
    while offset + size <= len(data):
        length, kind = struct.unpack_from(head, data, offset)[:2]
        if length < size:
            return
        yield kind, data[offset + size : offset + length]
        offset += (length + 3) & ~3


def abstract_scoped(
    argv: tuple[str, ...], python: str, home: str, host_path: str
) -> tuple[tuple[str, ...], list[Mount]]:
    """`argv` started by the scope launcher inside its jail (run by `python`, isolated from site
    and home), which keeps it from every abstract Unix socket made outside it; and what the jail
    must show for it."""
    mounts = launcher_mounts(python, home, host_path, role="the gateway's Python, which runs the socket scope")
    mounts.append(Mount(SCOPE, MountMode.READ_ONLY, "keeps the server from the host's abstract Unix sockets"))
    return (python, "-I", "-S", SCOPE, "--", *argv), mounts


def abstract_gap(name: str, abi: int) -> str:
    """Why a `network: open` jail reaches the host's abstract sockets on this kernel, and what to do."""
    have = f"Landlock ABI {abi}" if abi else "no Landlock"
    return (
        f"server '{name}' has network: open, which shares the host's network and with it every abstract Unix "
        "socket the host listens on (X11's, a D-Bus bus at unix:abstract=): closing them needs Landlock ABI "
        f"{ABSTRACT_SCOPE_ABI} (Linux 6.12 or newer), and this kernel has {have}; use network: allowlist or none"
    )
