"""Tracing a jailed server: the strace command that wraps a jail, and its output as typed events.

strace runs outside the jail, as the parent of bwrap: a process may trace its own children
without any privilege, and attached before bwrap makes its namespaces it follows every process the
jail starts (`-f`), whatever namespace it is in. It shows each call's result, so a refusal by the
jail is seen as the server sees it: ENOENT for a path the jail does not show, EROFS for one shown
read-only, EPERM from the seccomp filter, ENETUNREACH or ECONNREFUSED from the jail's network.

What bwrap does before the server's command runs (its mounts, its own reads of the host) is
left out, and so is what Cellblock's launchers do inside the jail before it (the socket scope, the
egress relay, the exec pin: the gateway's Python running `sandbox/scope.py`, `relay.py`, `pin.py`):
the server starts at the first program executed by a process other than bwrap's own that is not
one of those launchers.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from cellblock.sandbox.types import JailError

__all__ = [
    "Event",
    "Kind",
    "Trace",
    "find_strace",
    "jail_refused",
    "parse_trace",
    "traced",
]

# The calls traced: every one that names a file, every socket call, and every process call (for
# the process tree and what is executed). Reads and writes of descriptors are not traced: they
# would cost the server most of its speed and say nothing a path does not.
CALLS = "trace=%file,%network,%process"
# How much of a string argument strace shows: paths are shown whole anyway; this is for a DNS
# query's bytes and a program's arguments.
STRING_BYTES = "512"
# Cellblock's launchers, run in a jail before the server (`python -I -S LAUNCHER -- ...`).
LAUNCHERS = frozenset(
    str(Path(__file__).resolve().with_name(n)) for n in ("scope.py", "relay.py", "pin.py", "landlocked.py")
)


class Kind(StrEnum):
    READ = "read"  # a file opened for reading, a directory listed
    WRITE = "write"  # a file opened for writing, created, removed, renamed, linked or changed
    LOOK = "look"  # a path's metadata looked at (stat, access, readlink): nothing of its content
    EXEC = "exec"  # a program executed
    CONNECT = "connect"  # a connection attempt (or a datagram sent) to an address
    LOOKUP = "lookup"  # a name lookup sent to a name server


@dataclass(frozen=True, slots=True)
class Event:
    """One thing the server did: `target` is a path, `host:port` or a Unix socket's path, or for
    a lookup the name looked up (or the name server's address, when the name cannot be read).

    A path's `target` has `.`, `..` and doubled slashes collapsed as text; `named` is the path as
    the call gave it to the kernel (made absolute against its directory), kept when the two
    differ. They differ in meaning too: the kernel resolves `missing/..` only if `missing` is
    there, and `link/..` from where the link leads."""

    ts: float  # seconds since the epoch, as strace saw the call
    pid: int
    kind: Kind
    target: str
    call: str  # the system call
    errno: str | None = None  # None: it succeeded
    named: str = ""  # the path as the kernel was given it, when that is not `target`

    @property
    def ok(self) -> bool:
        return self.errno is None

    @property
    def as_named(self) -> str:
        """The path as the kernel was given it (the target, for what is not a path)."""
        return self.named or self.target


@dataclass(frozen=True, slots=True)
class Trace:
    """What a traced jail did once its server started (`started` is when, or None if it never did)."""

    started: float | None
    events: tuple[Event, ...]
    command: str | None = None  # the program the jail started first

    def between(self, start: float, end: float) -> list[Event]:
        return [e for e in self.events if start < e.ts <= end]


def find_strace() -> str:
    """The strace binary.

    Raises:
        JailError: strace is not installed (a scan never runs a server without it).
    """
    found = shutil.which("strace")
    if found is None:
        raise JailError(
            "strace is not installed, and a scan traces the jailed server with it; install it "
            "(Debian/Ubuntu: apt-get install strace, Fedora: dnf install strace)"
        )
    return found


def traced(argv: Sequence[str], output: str, strace: str = "strace") -> tuple[str, ...]:
    """`argv` (a bwrap command) run under strace, which writes what it sees to `output`."""
    options = ("-f", "-ttt", "-qq", "-y", "-s", STRING_BYTES, "-e", CALLS, "-o", output)
    return (strace, *options, "--", *argv)


_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<ts>\d+\.\d+)\s+(?P<rest>.*)$")
_RESUMED = re.compile(r"^<\.\.\. (?P<call>\w+) resumed>(?P<args>.*)$")
_CALL = re.compile(r"^(?P<call>\w+)\((?P<args>.*)$")
_RESULT = re.compile(
    r"\)\s+=\s+(?P<ret>-?\d+|\?|0x[0-9a-f]+)(?:<[^>]*>)?(?:\s+(?P<errno>E[A-Z0-9]+)(?:\s+\(.*\))?)?\s*$"
)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\.\.\.)?')
_AT_DIR = re.compile(r"^(?:AT_FDCWD|\d+)<(?P<dir>[^>]*)>$")
_PORT = re.compile(r"sin6?_port=htons\((\d+)\)")
_ADDR4 = re.compile(r'sin_addr=inet_addr\("([^"]+)"\)')
_ADDR6 = re.compile(r'inet_pton\(AF_INET6,\s*"([^"]+)"')
_UNIX = re.compile(r'sun_path=(@?)"((?:[^"\\]|\\.)*)"')

_OPENS = {"open": 0, "openat": 1, "openat2": 1, "creat": 0}
_LOOKS = {
    **{c: 0 for c in ("stat", "lstat", "stat64", "lstat64", "access", "readlink", "statfs", "chdir", "getxattr")},
    **{c: 0 for c in ("lgetxattr", "listxattr", "llistxattr")},
    **{c: 1 for c in ("newfstatat", "fstatat64", "statx", "faccessat", "faccessat2", "readlinkat")},
}
_WRITES = {
    **{c: (0,) for c in ("mkdir", "rmdir", "unlink", "chmod", "chown", "lchown", "truncate", "mknod", "utime")},
    **{c: (0,) for c in ("utimes", "setxattr", "lsetxattr", "removexattr", "lremovexattr")},
    **{c: (1,) for c in ("mkdirat", "unlinkat", "fchmodat", "fchownat", "mknodat", "utimensat", "futimesat")},
    "rename": (0, 1),
    "link": (0, 1),
    "symlink": (1,),
    "renameat": (1, 3),
    "renameat2": (1, 3),
    "linkat": (1, 3),
    "symlinkat": (2,),
}
_EXECS = {"execve": 0, "execveat": 1}
_SENDS = ("connect", "sendto", "sendmsg", "sendmmsg")
_WRITING_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")


def parse_trace(text: str | Iterable[str], command: str | None = None) -> Trace:
    """The events of strace's output (as `traced` asks for it), from the server's start.

    The start is the first successful execve by a process other than those bwrap was before
    it that does not start one of `LAUNCHERS` (`command`, when given, must be what is executed:
    the jail's own program); in a Landlock jail, by its first process once it ran the launcher.
    Lines split by strace (`<unfinished ...>`, `<... resumed>`) are joined first.
    """
    lines = text.splitlines() if isinstance(text, str) else list(text)
    calls = _joined(lines)
    if not calls:
        return Trace(None, ())
    root = calls[0][0]
    setup: set[int] = {root}
    started: float | None = None
    first: str | None = None
    events: list[Event] = []
    # a Landlock jail forks nothing: its first process becomes a launcher, which becomes the server
    launcher_root = False
    for pid, ts, call, args, errno in calls:
        if started is None:
            if call in _EXECS and errno is None and (pid != root or launcher_root):
                path = _path_at(args, _EXECS[call])
                if (command is None or path == command) and not _launches(args, _EXECS[call]):
                    started, first = ts, path
                    setup.discard(pid)
                    continue
            launcher_root |= pid == root and call in _EXECS and errno is None and _launches(args, _EXECS[call])
            setup.add(pid)
            continue
        if pid in setup:
            continue
        events.extend(_events(pid, ts, call, args, errno))
    return Trace(started, tuple(events), first)


def _joined(lines: Sequence[str]) -> list[tuple[int, float, str, str, str | None]]:
    """Each finished call: pid, time, name, its arguments and result text, errno (None: success)."""
    waiting: dict[int, tuple[float, str, str]] = {}
    done: list[tuple[int, float, str, str, str | None]] = []
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        pid, ts, rest = int(match["pid"]), float(match["ts"]), match["rest"]
        if rest.startswith(("+++", "---")):
            continue
        resumed = _RESUMED.match(rest)
        if resumed is not None:
            started = waiting.pop(pid, None)
            if started is None:
                continue
            ts, call, head = started
            rest = f"{call}({head}{resumed['args']}"
        if rest.endswith("<unfinished ...>"):
            called = _CALL.match(rest)
            if called is not None:
                waiting[pid] = (ts, called["call"], called["args"].removesuffix("<unfinished ...>"))
            continue
        called = _CALL.match(rest)
        if called is None:
            continue
        result = _RESULT.search(called["args"])
        if result is None:
            continue
        errno = result["errno"] if result["ret"].startswith("-") else None
        done.append((pid, ts, called["call"], called["args"][: result.start() + 1], errno))
    return done


def _strings(args: str) -> list[tuple[int, str]]:
    """The string arguments of a call: where each starts, and its text unescaped."""
    return [(m.start(), _unescape(m.group(1))) for m in _STRING.finditer(args)]


def _arguments(args: str) -> list[str]:
    """A call's top-level arguments, split at commas outside strings, brackets and braces."""
    parts, depth, current, quoted, escaped = [], 0, [], False, False
    for char in args[:-1] if args.endswith(")") else args:
        if quoted:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            continue
        if char == '"':
            quoted = True
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if current:
        parts.append("".join(current).strip())
    return parts


def _launches(args: str, index: int) -> bool:
    """Whether an execve's argument vector (after its path at `index`) starts one of `LAUNCHERS`."""
    parts = _arguments(args)
    if index + 1 >= len(parts):
        return False
    vector = [_unescape(m.group(1)) for m in _STRING.finditer(parts[index + 1])][:4]
    return any(word in LAUNCHERS for word in vector)


def _path_at(args: str, index: int) -> str | None:
    """The path argument at `index` as the call gave it, made absolute against the directory
    descriptor before it (strace's `-y` shows its path) when it is relative; nothing collapsed.
    None for a string strace cut (`"..."...`): a part of a path is no path."""
    parts = _arguments(args)
    if index >= len(parts):
        return None
    strings = list(_STRING.finditer(parts[index]))
    if not strings or not parts[index].startswith('"') or strings[0].group(2):
        return None
    path = _unescape(strings[0].group(1))
    if not path.startswith("/") and index > 0:
        at = _AT_DIR.match(parts[index - 1])
        if at is not None:
            path = os.path.join(at["dir"], path) if path else at["dir"]
    return path or None


def _events(pid: int, ts: float, call: str, args: str, errno: str | None) -> list[Event]:
    def at(index: int, kind: Kind) -> list[Event]:
        named = _path_at(args, index)
        if not named:
            return []
        target = os.path.normpath(named)
        return [Event(ts, pid, kind, target, call, errno, "" if named == target else named)]

    if call in _OPENS:
        parts = _arguments(args)
        flags = parts[_OPENS[call] + 1] if len(parts) > _OPENS[call] + 1 else ""
        kind = Kind.LOOK if "O_PATH" in flags else Kind.READ
        if call == "creat" or any(f in flags for f in _WRITING_FLAGS):
            kind = Kind.WRITE
        return at(_OPENS[call], kind)
    if call in _LOOKS:
        return at(_LOOKS[call], Kind.LOOK)
    if call in _WRITES:
        return [e for i in _WRITES[call] for e in at(i, Kind.WRITE)]
    if call in _EXECS:
        # a PATH search tries each directory: a program that is not there was not executed
        return [] if errno == "ENOENT" else at(_EXECS[call], Kind.EXEC)
    if call in _SENDS:
        return _network(pid, ts, call, args, errno)
    return []


def _network(pid: int, ts: float, call: str, args: str, errno: str | None) -> list[Event]:
    unix = _UNIX.search(args)
    if unix is not None:
        name = ("@" if unix.group(1) else "") + _unescape(unix.group(2))
        return [Event(ts, pid, Kind.CONNECT, name, call, errno)] if call == "connect" else []
    port = _PORT.search(args)
    address = _ADDR4.search(args) or _ADDR6.search(args)
    if port is None or address is None:
        return []
    host = address.group(1)
    target = f"[{host}]:{port.group(1)}" if ":" in host else f"{host}:{port.group(1)}"
    if port.group(1) == "53":
        if call == "connect" and errno is None:
            return []  # the query that follows says what is looked up
        if call == "connect":  # refused before any query: the name is not known
            return [Event(ts, pid, Kind.LOOKUP, f"a name, through {target}", call, errno)]
        return [Event(ts, pid, Kind.LOOKUP, _query_name(args) or target, call, errno)]
    return [Event(ts, pid, Kind.CONNECT, target, call, errno)]


def _query_name(args: str) -> str | None:
    """The name a DNS query in a send's buffer asks for, in DNS's presentation format: each label
    as it was sent, a dot or backslash in a label escaped (`\\.`), any byte that is not printable
    ASCII as `\\DDD`, so that labels `0.0.0.0/0` and `0`, `0`, `0`, `0/0` read differently."""
    for _, text in _strings(args):
        data = text.encode("latin-1", "replace")
        if len(data) < 13:
            continue
        labels, at = [], 12
        while at < len(data) and data[at] != 0:
            size = data[at]
            if size > 63 or at + 1 + size > len(data):
                break
            labels.append(_label(data[at + 1 : at + 1 + size]))
            at += 1 + size
        if labels and at < len(data) and data[at] == 0:
            return ".".join(labels)
    return None


def _label(data: bytes) -> str:
    """One DNS label in presentation format (RFC 1035, 5.1)."""
    return "".join(f"\\{chr(b)}" if chr(b) in ".\\" else chr(b) if 0x21 <= b <= 0x7E else f"\\{b:03d}" for b in data)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "v": "\v", "f": "\f", "\\": "\\", '"': '"'}


def _unescape(text: str) -> str:
    """strace's C string escapes (\\n, \\ooo octal, \\xHH) back to characters (bytes as latin-1)."""
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "x" and re.match(r"[0-9a-fA-F]{2}", text[i + 2 : i + 4]):
            out.append(chr(int(text[i + 2 : i + 4], 16)))
            i += 4
        elif nxt.isdigit():
            digits = re.match(r"[0-7]{1,3}", text[i + 1 : i + 4])
            size = len(digits.group(0)) if digits else 1
            out.append(chr(int(text[i + 1 : i + 1 + size], 8)) if digits else nxt)
            i += 1 + size
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def jail_refused(event: Event, exists: Callable[[str], bool] = os.path.lexists) -> bool:
    """Whether the jail, not the host, refused `event`: a path the host has but the jail does not
    show (ENOENT), one shown read-only (EROFS), a call the seccomp filter or the dropped
    capabilities refuse (EPERM, EACCES), a network the jail does not have (ENETUNREACH,
    ECONNREFUSED on the jail's own loopback)."""
    if event.errno is None:
        return False
    if event.kind in (Kind.CONNECT, Kind.LOOKUP):
        return event.errno in ("ENETUNREACH", "ECONNREFUSED", "EHOSTUNREACH", "EACCES", "EPERM", "ENOENT")
    if event.errno == "ENOENT":  # the path as the kernel resolved it: `missing/..` is not there
        return exists(event.as_named)
    return event.errno in ("EROFS", "EPERM", "EACCES", "EXDEV")
