"""Escape attempts: the one list of things a jailed server must not be able to do.

Each attempt is a function that tries one thing and returns an `Attempt` saying whether it got
through; none of them raises. `cellblock probe` and the hostile-server tests both run this list.

This file is also run as a script inside a jail, by whatever ``python3`` the jail mounts, so it
imports the standard library only (no cellblock, no mcp) and keeps to Python 3.8 syntax at runtime:

    python3 escape.py --json '[{"kind": "read", "target": "/root/.ssh/id_ed25519"}]'
    python3 escape.py --json - < spec.json

It prints one JSON list of results to stdout and exits 1 if anything got through, 0 if nothing
did, 2 on a bad spec. Kinds and their fields (``target`` is always a string):

- ``read``: target=path. Through if any byte was read.
- ``list``: target=dir, ``expect``=[names]. Through if a listed entry is expected (any entry if empty).
- ``write``: target=path, optional ``text``. Through if a new file was created (then removed) or an
  existing one opened for writing (left unchanged).
- ``connect``: target="host:port" (``[::1]:80`` for IPv6). Through if a TCP connection was made.
- ``resolve``: target=name. Through if it resolved to any address.
- ``exec``: ``argv``=[...] (target defaults to argv[0]). Through if it ran: exit 0 or any output on stdout.
- ``control``: target=the path of a gateway's control socket. Through if it answered a request
  (``ps``) with ``ok``: a server that can do that can approve its own calls.
- ``sysctl``: target=a file under /proc/sys. Through if its own value could be written back (uid 0
  may write sysctls without a capability; ``kernel.core_pattern`` runs a program as host root).
- ``load_copy``: target=a writable path, ``source``=a program. Copies the program there and runs the
  copy through the dynamic loader (``ld.so TARGET``), which maps it rather than executing it.
  Through if it ran.
- ``memfd_exec``: target=a program. Copies it into a memfd and executes ``/proc/self/fd/N``.
  Through if it ran.
- ``dbus``: target=D-Bus address or socket path ("" for the defaults), optional ``abstract``=[names].
  Through if any candidate socket accepted a connection.
- ``processes``: optional ``pid``. Through if /proc shows that PID or too many foreign sessions.
- ``capabilities``: through if CapEff is non-zero.
- ``userns``: through if unshare(CLONE_NEWUSER) succeeds (tried in a forked child).
- ``remount``: target=a read-only path. Through if mount(MS_REMOUNT|MS_BIND) makes it rw (tried in a
  forked child, in a private mount namespace when it can make one).
- ``privileges``: target=a read-only path: ``capabilities``, ``userns`` and ``remount`` in one result.
- ``keyring``: target=the description of a "user" key in the user's kernel keyrings, optional
  ``rings``=[serials of keyrings to link, besides those /proc/keys lists]. Through if any byte of
  its payload was read (tried in a forked child, in a session keyring of its own).
- ``fork``: optional ``ceiling`` (forks at most, default 1000) and ``hold`` (seconds the children
  stay, default 0: they exit as the attempt ends). Through if all ``ceiling`` children were made.
- ``memory``: ``mib`` (to allocate and touch) and optional ``step`` (MiB at a time, default 64).
  Through if all of it was had; it is freed again at the end.

Reported details carry sizes, counts and error names, never the bytes of what was read;
``amount`` is what an attempt got when that is a quantity (processes made, MiB had).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run as a script, this directory comes first on sys.path, and its types.py (cellblock's)
    # would shadow the standard library's `types` on the next import. os and sys are loaded already.
    _here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _here]

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "KINDS",
    "Attempt",
    "capabilities",
    "connect",
    "control_socket",
    "dbus",
    "exec_binary",
    "fork_bomb",
    "host_processes",
    "keyring",
    "list_dir",
    "listed_keys",
    "load_copy",
    "main",
    "memfd_exec",
    "memory_hog",
    "new_user_namespace",
    "privileges",
    "read_file",
    "remount_rw",
    "resolve",
    "run_spec",
    "sysctl",
    "write_file",
]

# Bounded waits: a jail that drops packets must not stall a probe run.
CONNECT_TIMEOUT = 3.0  # seconds for one TCP or Unix-socket connect
RESOLVE_TIMEOUT = 5.0  # seconds for getaddrinfo; glibc's own retry schedule can run far longer
EXEC_TIMEOUT = 5.0  # seconds for an exec'd binary to finish; still running counts as having run
CHILD_TIMEOUT = 5.0  # seconds for a forked privilege-test child to report
FOREIGN_SESSION_HANDFUL = 5  # more processes than this outside our session means the host's /proc

WRITE_TEXT = "cellblock escape probe: this file should not exist\n"

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_LINK = 8
KEYCTL_SEARCH = 10
KEYCTL_READ = 11
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4
# glibc has no keyctl() wrapper, so the system call is made by number
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219}
KEY_READ_MAX = 4096  # bytes of a payload read at most (only the size is reported)
CHILD_REPORT_MAX = 4096  # bytes a child reports through its pipe: less than a pipe holds, so it never blocks
FORK_CEILING = 1000  # forks a fork bomb makes at most: far above a test's limit, and harmless to the machine
FORK_HOLD_MAX = 120  # seconds a forked child lives at most, whatever becomes of its parent
MEMORY_STEP = 64  # MiB a memory hog takes at a time


@dataclass(frozen=True)
class Attempt:
    """The outcome of one escape attempt. `got_through` True means the jail failed to stop it."""

    name: str  # the kind, e.g. "read"
    target: str
    got_through: bool
    detail: str
    amount: int | None = None  # what it got, when that is a quantity (processes made, MiB had)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for humans: ``GOT THROUGH read /etc/shadow: read 1 byte(s)``."""
        verdict = "GOT THROUGH" if self.got_through else "blocked"
        return f"{verdict} {self.name} {self.target}: {self.detail}"


def _err(exc: BaseException) -> str:
    """An error's class and errno name, without the paths or data some messages carry."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return f"{type(exc).__name__} {errno.errorcode[code]}"
    return type(exc).__name__


def _never_raises(kind: str) -> Callable[[Callable[..., Attempt]], Callable[..., Attempt]]:
    """Turn any error an attempt did not expect into a blocked result that names the error.

    An attempt that crashed proves nothing either way; the honest controls (run unjailed, expected
    to get through) are what catch an attempt that is broken rather than blocked.
    """

    def wrap(fn: Callable[..., Attempt]) -> Callable[..., Attempt]:
        def attempt(*args: Any, **kwargs: Any) -> Attempt:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # top level of one attempt: report, never crash the probe
                target = str(args[0]) if args else str(kwargs.get("path", kwargs.get("target", "")))
                return Attempt(kind, target, False, f"attempt failed unexpectedly: {_err(exc)}")

        attempt.__name__ = fn.__name__
        attempt.__qualname__ = fn.__qualname__
        attempt.__doc__ = fn.__doc__
        return attempt

    return wrap


# --- files ---------------------------------------------------------------------------------


@_never_raises("read")
def read_file(path: str) -> Attempt:
    """Try to read one byte of `path`. Through if a byte came back."""
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the probe
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        return Attempt("read", path, False, f"open: {_err(exc)}")
    try:
        data = os.read(fd, 1)
    except OSError as exc:
        return Attempt("read", path, False, f"opened, read: {_err(exc)}")
    finally:
        os.close(fd)
    if not data:
        return Attempt("read", path, False, "opened but read 0 bytes")
    return Attempt("read", path, True, "read 1 byte")


@_never_raises("list")
def list_dir(path: str, expect: Sequence[str] = ()) -> Attempt:
    """List `path`. Through if an entry in `expect` is listed; with no `expect`, if any entry is."""
    try:
        entries = set(os.listdir(path))
    except OSError as exc:
        return Attempt("list", path, False, f"listdir: {_err(exc)}")
    if expect:
        seen = sorted(set(expect) & entries)
        detail = f"{len(entries)} entries; expected names seen: {seen or 'none'} of {len(set(expect))}"
        return Attempt("list", path, bool(seen), detail)
    return Attempt("list", path, bool(entries), f"{len(entries)} entries (no names given: any entry counts)")


@_never_raises("write")
def write_file(path: str, text: str = WRITE_TEXT, keep: bool = False) -> Attempt:
    """Try to write at `path`. Through if a new file was created or an existing one opened for writing.

    A file this creates is removed again, unless `keep` (so a caller outside can look for it on
    the host). An existing file is never changed: opening it for writing is the proof (a read-only
    mount, Landlock and permissions all refuse at open).
    """
    if os.path.lexists(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            return Attempt("write", path, False, f"exists; open for writing: {_err(exc)}")
        os.close(fd)
        return Attempt("write", path, True, "exists; opened for writing (left unchanged)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return Attempt("write", path, False, f"create: {_err(exc)}")
    try:
        written = os.write(fd, text.encode())
        detail = f"created and wrote {written} bytes"
    except OSError as exc:
        detail = f"created, write: {_err(exc)}"
    finally:
        os.close(fd)
    if keep:
        return Attempt("write", path, True, detail + "; kept")
    try:
        os.unlink(path)
        detail += "; removed"
    except OSError as exc:
        detail += f"; NOT removed: {_err(exc)}"
    return Attempt("write", path, True, detail)


# --- network -------------------------------------------------------------------------------


def _host_port(target: str) -> tuple[str, int]:
    """Split ``host:port`` or ``[v6]:port``.

    Raises:
        ValueError: no port, or a port that is not a number.
    """
    host, sep, port = target.rpartition(":")
    if not sep or not host:
        raise ValueError(f"connect target {target!r} is not host:port")
    return host.strip("[]"), int(port)


@_never_raises("connect")
def connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> Attempt:
    """Try a TCP connection to `host`:`port`. Through if it was accepted."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            peer = sock.getpeername()
    except OSError as exc:
        return Attempt("connect", target, False, f"connect: {_err(exc)}")
    return Attempt("connect", target, True, f"connected to {peer[0]}")


@_never_raises("resolve")
def resolve(name: str, timeout: float = RESOLVE_TIMEOUT) -> Attempt:
    """Try to resolve `name`. Through if it resolved to any address.

    Runs getaddrinfo on a daemon thread: it has no timeout of its own.
    """
    box: list[Any] = []

    def lookup() -> None:
        try:
            box.append(socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP))
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            box.append(exc)

    thread = threading.Thread(target=lookup, name="escape-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    if not box:
        return Attempt("resolve", name, False, f"no answer within {timeout:g}s")
    if isinstance(box[0], BaseException):
        exc = box[0]
        code = exc.args[0] if isinstance(exc, socket.gaierror) and exc.args else None
        return Attempt("resolve", name, False, f"getaddrinfo: {type(exc).__name__} {code}")
    addresses = sorted({info[4][0] for info in box[0]})
    return Attempt("resolve", name, bool(addresses), f"resolved to {', '.join(addresses) or 'nothing'}")


# --- exec ----------------------------------------------------------------------------------


@_never_raises("exec")
def exec_binary(argv: Sequence[str], timeout: float = EXEC_TIMEOUT, pass_fds: Sequence[int] = ()) -> Attempt:
    """Try to run `argv`. Through if it ran: exit status 0, output on stdout, or still running at the deadline."""
    argv = [str(a) for a in argv]
    target = argv[0] if argv else ""
    if not argv:
        return Attempt("exec", target, False, "empty argv")
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False, pass_fds=pass_fds
        )
    except subprocess.TimeoutExpired:
        return Attempt("exec", target, True, f"still running after {timeout:g}s (killed)")
    except OSError as exc:
        return Attempt("exec", target, False, f"exec: {_err(exc)}")
    # stderr does not count: a loader or interpreter that refuses to run the target says so there
    ran = proc.returncode == 0 or len(proc.stdout) > 0
    detail = f"exit status {proc.returncode}, {len(proc.stdout)} bytes on stdout, {len(proc.stderr)} on stderr"
    return Attempt("exec", target, ran, detail)


@_never_raises("control")
def control_socket(path: str) -> Attempt:
    """Ask the gateway's control socket at `path` for `ps`. Through if it answered ok."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
            sock.sendall(b'{"op":"ps"}\n')
            reply = b""
            while b"\n" not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except OSError as exc:
            return Attempt("control", path, False, f"connect: {_err(exc)}")
    try:
        answer = json.loads(reply.split(b"\n", 1)[0] or b"null")
    except ValueError:
        return Attempt("control", path, False, f"{len(reply)} bytes that are not a reply")
    ok = isinstance(answer, dict) and answer.get("ok") is True
    said = answer.get("error", "") if isinstance(answer, dict) else ""
    return Attempt("control", path, ok, "answered ok" if ok else f"refused: {str(said)[:120]}")


@_never_raises("sysctl")
def sysctl(path: str) -> Attempt:
    """Write a sysctl's own value back to it. Through if the write succeeded (nothing changes)."""
    with open(path) as handle:
        value = handle.read()
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as exc:
        return Attempt("sysctl", path, False, f"write: {_err(exc)}")
    return Attempt("sysctl", path, True, f"wrote {len(value)} bytes back")


# The dynamic loaders of the machines the jail runs on, first that exists wins.
LOADERS = (
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/ld-linux-armhf.so.3",
    "/lib/ld-linux.so.2",
)


def _copy(source: str, target: str) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read())
    os.chmod(target, 0o755)


@_never_raises("load_copy")
def load_copy(target: str, source: str) -> Attempt:
    """Copy the program `source` to `target` and run it through the dynamic loader. Through if it ran."""
    loader = next((path for path in LOADERS if os.path.exists(path)), None)
    if loader is None:
        return Attempt("load_copy", target, False, "no dynamic loader here")
    try:
        _copy(source, target)
    except OSError as exc:
        return Attempt("load_copy", target, False, f"could not copy {source}: {_err(exc)}")
    try:
        outcome = exec_binary([loader, target])
    finally:
        with contextlib.suppress(OSError):
            os.unlink(target)
    return Attempt("load_copy", target, outcome.got_through, f"{loader} {target}: {outcome.detail}")


@_never_raises("memfd_exec")
def memfd_exec(source: str) -> Attempt:
    """Copy the program `source` into a memfd and execute it from there. Through if it ran."""
    try:
        fd = os.memfd_create("cellblock-probe", 0)
    except OSError as exc:
        return Attempt("memfd_exec", source, False, f"memfd_create: {_err(exc)}")
    try:
        with open(source, "rb") as src:
            os.write(fd, src.read())
        outcome = exec_binary([f"/proc/self/fd/{fd}"], pass_fds=(fd,))
    except OSError as exc:
        return Attempt("memfd_exec", source, False, f"could not copy {source}: {_err(exc)}")
    finally:
        os.close(fd)
    return Attempt("memfd_exec", source, outcome.got_through, outcome.detail)


# --- D-Bus ---------------------------------------------------------------------------------


def _dbus_candidates(address: str, abstract: Sequence[str]) -> list[tuple[str, str]]:
    """(label, sockaddr) pairs; a sockaddr starting with NUL is an abstract socket name."""
    found: list[tuple[str, str]] = []
    for entry in filter(None, address.split(";")):
        if entry.startswith("/"):
            found.append((entry, entry))
        elif entry.startswith("@"):
            found.append((entry, "\0" + entry[1:]))
        elif entry.startswith("unix:"):
            fields = dict(kv.partition("=")[::2] for kv in entry[len("unix:") :].split(","))
            if "path" in fields:
                found.append((fields["path"], fields["path"]))
            elif "abstract" in fields:
                found.append(("@" + fields["abstract"], "\0" + fields["abstract"]))
    env_address = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    if env_address and env_address != address:
        found.extend(_dbus_candidates(env_address, ()))
    for name in abstract:
        name = name[1:] if name.startswith("@") else name
        found.append(("@" + name, "\0" + name))
    if hasattr(os, "getuid"):
        path = f"/run/user/{os.getuid()}/bus"
        found.append((path, path))
    found.append(("/run/dbus/system_bus_socket", "/run/dbus/system_bus_socket"))
    unique: dict[str, str] = {}
    for label, sockaddr in found:
        unique.setdefault(label, sockaddr)
    return list(unique.items())


@_never_raises("dbus")
def dbus(address: str = "", abstract: Sequence[str] = (), timeout: float = CONNECT_TIMEOUT) -> Attempt:
    """Try to connect to a D-Bus socket. Through if any candidate accepted.

    Candidates: `address` (a D-Bus address such as ``unix:path=...`` or ``unix:abstract=...``, ``;``-
    separated, or a bare path, or ``@name``), this process's $DBUS_SESSION_BUS_ADDRESS,
    each name in `abstract` (abstract sockets cannot be listed or globbed), ``/run/user/<uid>/bus``
    and the system bus socket.
    """
    results: list[str] = []
    through = False
    for label, sockaddr in _dbus_candidates(address, abstract):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            results.append(f"{label}: {_err(exc)}")
        else:
            through = True
            results.append(f"{label}: CONNECTED")
        finally:
            sock.close()
    return Attempt("dbus", address or "(default buses)", through, "; ".join(results))


# --- processes -----------------------------------------------------------------------------


def _session_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[3])  # state ppid pgrp session
    except (IndexError, ValueError):
        return None


@_never_raises("processes")
def host_processes(pid: int | None = None, handful: int = FOREIGN_SESSION_HANDFUL) -> Attempt:
    """Look for the host's processes in /proc. Through if `pid` is listed, or if more than `handful`
    processes belong to other sessions.

    PIDs are per namespace: pass a PID that the jail's own few processes (1, 2, ...) cannot have.
    """
    target = str(pid) if pid is not None else "/proc"
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError as exc:
        return Attempt("processes", target, False, f"listdir /proc: {_err(exc)}")
    own = os.getsid(0)
    foreign = sum(1 for p in pids if _session_of(p) not in (own, None))
    seen = pid is not None and str(pid) in pids and int(pid) != os.getpid()
    through = seen or foreign > handful
    pid_note = "" if pid is None else f"pid {pid} {'listed' if seen else 'not listed'}; "
    detail = f"{pid_note}{len(pids)} processes, {foreign} outside our session (limit {handful})"
    return Attempt("processes", target, through, detail)


# --- privileges ----------------------------------------------------------------------------


def _status_fields() -> dict[str, str]:
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in f)}


@_never_raises("capabilities")
def capabilities() -> Attempt:
    """Read CapEff from /proc/self/status. Through if it is non-zero."""
    try:
        status = _status_fields()
    except OSError as exc:
        return Attempt("capabilities", "/proc/self/status", False, f"read: {_err(exc)}")
    cap_eff = status.get("CapEff", "")
    if not cap_eff:
        return Attempt("capabilities", "/proc/self/status", False, "no CapEff line")
    shown = ", ".join(f"{k}={status.get(k, '?')}" for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"))
    return Attempt("capabilities", "/proc/self/status", int(cap_eff, 16) != 0, shown)


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _in_child(action: Callable[[], int], timeout: float = CHILD_TIMEOUT) -> int | str:
    """Run `action` in a forked child and return its result (0..255), or a string saying what went wrong.

    Namespace and mount changes must not touch the caller: unshare(CLONE_NEWUSER) also refuses a
    multithreaded process, which an MCP server is.
    """
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            code = action()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"child still running after {timeout:g}s (killed)"
        time.sleep(0.01)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return f"child died by signal {os.WTERMSIG(status)}"


def _text_in_child(action: Callable[[], str], timeout: float = CHILD_TIMEOUT) -> str:
    """Run `action` in a forked child and return the text it returned, or what went wrong."""
    read_end, write_end = os.pipe()

    def report() -> int:
        os.close(read_end)
        os.write(write_end, action().encode()[:CHILD_REPORT_MAX])
        return 0

    try:
        code = _in_child(report, timeout)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        text = reader.read().decode("utf-8", "replace")
    if code != 0 or not text:
        return code if isinstance(code, str) else f"child exited with status {code}"
    return text


def _errno_code(rc: int) -> int:
    return 0 if rc == 0 else (ctypes.get_errno() or 255) & 0xFF


def _errno_name(code: int | str) -> str:
    if isinstance(code, str):
        return code
    return errno.errorcode.get(code, f"error {code}")


@_never_raises("userns")
def new_user_namespace() -> Attempt:
    """Try unshare(CLONE_NEWUSER) in a forked child. Through if it succeeded."""
    if not sys.platform.startswith("linux"):
        return Attempt("userns", "unshare(CLONE_NEWUSER)", False, "not Linux")
    libc = _libc()
    code = _in_child(lambda: _errno_code(libc.unshare(CLONE_NEWUSER)))
    if code == 0:
        return Attempt("userns", "unshare(CLONE_NEWUSER)", True, "created a user namespace")
    return Attempt("userns", "unshare(CLONE_NEWUSER)", False, f"unshare: {_errno_name(code)}")


@_never_raises("remount")
def remount_rw(path: str) -> Attempt:
    """Try mount(path, MS_REMOUNT|MS_BIND) without MS_RDONLY in a forked child. Through if it succeeded.

    The child first tries to move into a private mount namespace so a success changes nothing
    outside it; with no right to do that it tries in the current one and, if that succeeds, puts
    MS_RDONLY back. Either success means the data under `path` is writable.
    """
    if not sys.platform.startswith("linux"):
        return Attempt("remount", path, False, "not Linux")
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    target = os.fsencode(path)

    def attempt() -> int:
        private = libc.unshare(CLONE_NEWNS) == 0 and libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
        code = _errno_code(libc.mount(None, target, None, MS_REMOUNT | MS_BIND, None))
        if code == 0 and not private:
            libc.mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        return code

    code = _in_child(attempt)
    if code == 0:
        return Attempt("remount", path, True, "remounted read-write")
    return Attempt("remount", path, False, f"mount: {_errno_name(code)}")


@_never_raises("privileges")
def privileges(ro_path: str) -> Attempt:
    """Run `capabilities`, `new_user_namespace` and `remount_rw(ro_path)`. Through if any got through."""
    parts = [capabilities(), new_user_namespace(), remount_rw(ro_path)]
    detail = "; ".join(f"{p.name} {'THROUGH' if p.got_through else 'blocked'} ({p.detail})" for p in parts)
    return Attempt("privileges", ro_path, any(p.got_through for p in parts), detail)


# --- kernel keyring ------------------------------------------------------------------------


def listed_keys() -> list[tuple[int, str, str]]:
    """(serial, type, description) of each key /proc/keys shows this process."""
    found: list[tuple[int, str, str]] = []
    with open("/proc/keys", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split(None, 8)  # serial flags usage timeout perm uid gid type "description: summary"
            if len(fields) == 9:
                found.append((int(fields[0], 16), fields[7], fields[8].rsplit(": ", 1)[0]))
    return found


def _read_key(number: int, description: str, rings: Sequence[int]) -> str:
    """In a child: link the user keyrings into a new session keyring, then find and read the key.

    Returns a JSON object: ``read`` (bytes of the payload read) and ``detail``.
    """
    libc = _libc()
    libc.syscall.restype = ctypes.c_long

    def keyctl(*args: Any) -> int:
        return int(libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args)))

    def outcome(read: int, detail: str) -> str:
        return json.dumps({"read": read, "detail": detail})

    if keyctl(KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        return outcome(0, f"keyctl(JOIN_SESSION_KEYRING): {_errno_name(ctypes.get_errno())}")
    linked = sum(
        1 for ring in (KEY_SPEC_USER_KEYRING, *rings) if keyctl(KEYCTL_LINK, ring, KEY_SPEC_SESSION_KEYRING) == 0
    )
    key = keyctl(KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", description.encode(), 0)
    if key < 0:
        return outcome(0, f"linked {linked} user keyring(s); search: {_errno_name(ctypes.get_errno())}")
    buffer = ctypes.create_string_buffer(KEY_READ_MAX)
    size = keyctl(KEYCTL_READ, key, buffer, KEY_READ_MAX)
    if size < 0:
        return outcome(0, f"linked {linked} user keyring(s), found the key; read: {_errno_name(ctypes.get_errno())}")
    return outcome(size, f"linked {linked} user keyring(s), found the key; read {size} bytes of it")


@_never_raises("keyring")
def keyring(description: str, rings: Sequence[int] = ()) -> Attempt:
    """Try to read the "user" key `description` from the user's kernel keyrings. Through if a byte of it was read.

    Keyrings have no namespace of their own, and a jail runs as its user's kernel uid. The user
    keyrings /proc/keys lists (``_uid.N``, found by serial: inside a new user namespace
    KEY_SPEC_USER_KEYRING names another one) are linked into a new session keyring, which makes
    their keys the process's own and so readable; then the key is searched for and read. That runs
    in a forked child, so the caller's keyrings stay as they were. `rings` are serials the
    attacker learnt otherwise (a jail masks /proc/keys), tried as well.
    """
    machine = os.uname().machine
    number = KEYCTL_SYSCALL.get(machine)
    if number is None:
        return Attempt("keyring", description, False, f"no keyctl system call number known for {machine}")
    try:
        listed = listed_keys()
        named = any(kind == "user" and name == description for _, kind, name in listed)
        seen = f"/proc/keys shows {len(listed)} keys, the target {'among them' if named else 'not among them'}"
    except OSError as exc:
        listed, seen = [], f"/proc/keys: {_err(exc)}"
    found = [serial for serial, kind, name in listed if kind == "keyring" and name.startswith("_uid.")]
    text = _text_in_child(lambda: _read_key(number, description, [*found, *rings]))
    try:
        result = json.loads(text)
        read, detail = int(result["read"]), str(result["detail"])
    except (ValueError, KeyError, TypeError):
        read, detail = 0, text
    return Attempt("keyring", description, read > 0, f"{seen}; {detail}")


# --- resources ------------------------------------------------------------------------------


@_never_raises("fork")
def fork_bomb(ceiling: int = FORK_CEILING, hold: float = 0) -> Attempt:
    """Fork children that sleep, up to `ceiling`. Through if all `ceiling` of them were made.

    They exit when the attempt ends, or with `hold` that many seconds later, counting against the
    jail's processes meanwhile (its parent then returns at once); never later than
    `FORK_HOLD_MAX` seconds, nor than their parent.
    """
    target = f"{ceiling} processes"
    read_end, write_end = os.pipe()  # the children wait for its end: their parent's end, or its release
    children: list[int] = []

    def release() -> None:
        os.close(write_end)
        for child in children:
            os.waitpid(child, 0)

    # started before the forks: a jail at its limit has no thread to spare for it later
    timer = threading.Timer(hold, release) if hold > 0 else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    refused = "none refused"
    try:
        for _ in range(ceiling):
            try:
                pid = os.fork()
            except OSError as exc:
                refused = f"fork: {_errno_name(exc.errno or 0)}"
                break
            if pid == 0:
                try:
                    os.close(write_end)
                    signal.alarm(FORK_HOLD_MAX)
                    os.read(read_end, 1)
                finally:
                    os._exit(0)
            children.append(pid)
    finally:
        os.close(read_end)
        if timer is None:
            release()
    made = len(children)
    return Attempt("fork", target, made >= ceiling, f"made {made} of {ceiling} ({refused})", amount=made)


@_never_raises("memory")
def memory_hog(mib: int, step: int = MEMORY_STEP) -> Attempt:
    """Allocate and touch `mib` MiB, `step` MiB at a time. Through if all of it was had (then freed)."""
    chunks: list[bytes] = []
    try:
        while len(chunks) * step < mib:
            chunks.append(b"\x01" * (step << 20))  # written, so every page is really taken
    except MemoryError:
        had = len(chunks) * step
        chunks.clear()
        return Attempt("memory", f"{mib} MiB", False, f"had {had} MiB of {mib}, then MemoryError", amount=had)
    had = len(chunks) * step
    chunks.clear()
    return Attempt("memory", f"{mib} MiB", True, f"had all {had} MiB", amount=had)


# --- spec and CLI --------------------------------------------------------------------------


def _strs(entry: dict[str, Any], key: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key!r} must be a list of strings (got {value!r})")
    return value


def _pid(entry: dict[str, Any]) -> int | None:
    value = entry.get("pid")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"'pid' must be an integer (got {value!r})")
    return value


def _number(entry: dict[str, Any], key: str, default: float) -> float:
    value = entry.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key!r} must be a number of at least 0 (got {value!r})")
    return value


def _text(entry: dict[str, Any]) -> str:
    value = entry.get("text", WRITE_TEXT)
    if not isinstance(value, str):
        raise ValueError(f"'text' must be a string (got {value!r})")
    return value


KINDS = (
    "read",
    "list",
    "write",
    "connect",
    "resolve",
    "exec",
    "dbus",
    "processes",
    "capabilities",
    "userns",
    "remount",
    "privileges",
    "keyring",
    "load_copy",
    "memfd_exec",
    "fork",
    "memory",
    "sysctl",
    "control",
)
_NEEDS_TARGET = frozenset(
    {
        *("read", "list", "write", "connect", "resolve", "remount", "privileges", "keyring"),
        *("load_copy", "memfd_exec", "sysctl", "control"),
    }
)


def _bind(kind: str, entry: dict[str, Any]) -> Callable[[], Attempt]:
    """The attempt one spec entry describes, ready to run.

    Raises:
        ValueError: the entry lacks a field its kind needs, or a field has the wrong type.
    """
    target = entry.get("target", "")
    if not isinstance(target, str) or (kind in _NEEDS_TARGET and not target):
        raise ValueError(f"{kind!r} needs 'target' as a non-empty string (got {target!r})")
    if kind == "read":
        return lambda: read_file(target)
    if kind == "list":
        expect = _strs(entry, "expect")
        return lambda: list_dir(target, expect)
    if kind == "write":
        text, keep = _text(entry), entry.get("keep") is True
        return lambda: write_file(target, text, keep)
    if kind == "connect":
        host, port = _host_port(target)
        return lambda: connect(host, port)
    if kind == "resolve":
        return lambda: resolve(target)
    if kind == "exec":
        argv = _strs(entry, "argv")
        if not argv:
            raise ValueError("'exec' needs 'argv' as a non-empty list of strings")
        return lambda: exec_binary(argv)
    if kind == "dbus":
        abstract = _strs(entry, "abstract")
        return lambda: dbus(target, abstract)
    if kind == "processes":
        pid = _pid(entry)
        return lambda: host_processes(pid)
    if kind == "capabilities":
        return capabilities
    if kind == "userns":
        return new_user_namespace
    if kind == "remount":
        return lambda: remount_rw(target)
    if kind == "privileges":
        return lambda: privileges(target)
    if kind == "keyring":
        rings = entry.get("rings", [])
        if not isinstance(rings, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in rings):
            raise ValueError(f"'rings' must be a list of key serials (got {rings!r})")
        return lambda: keyring(target, rings)
    if kind == "load_copy":
        source = entry.get("source")
        if not isinstance(source, str) or not source:
            raise ValueError("'load_copy' needs 'source' as a non-empty string (a program to copy)")
        return lambda: load_copy(target, source)
    if kind == "memfd_exec":
        return lambda: memfd_exec(target)
    if kind == "sysctl":
        return lambda: sysctl(target)
    if kind == "control":
        return lambda: control_socket(target)
    if kind == "fork":
        ceiling, hold = int(_number(entry, "ceiling", FORK_CEILING)), _number(entry, "hold", 0)
        return lambda: fork_bomb(ceiling, hold)
    if kind == "memory":
        mib, step = int(_number(entry, "mib", 0)), int(_number(entry, "step", MEMORY_STEP)) or MEMORY_STEP
        return lambda: memory_hog(mib, step)
    raise ValueError(f"unknown kind {kind!r}; known kinds: {', '.join(KINDS)}")


def _plan(spec: Any) -> list[Callable[[], Attempt]]:
    """Check a whole spec before anything runs.

    Raises:
        ValueError: the spec is not a list of ``{"kind": ..., ...}`` objects of known kinds with
            the fields their kind needs.
    """
    if not isinstance(spec, list):
        raise ValueError(f"spec must be a JSON list of attempts (got {type(spec).__name__})")
    plan: list[Callable[[], Attempt]] = []
    for i, entry in enumerate(spec):
        if not isinstance(entry, dict):
            raise ValueError(f"attempt {i} must be an object (got {entry!r})")
        try:
            plan.append(_bind(str(entry.get("kind")), entry))
        except ValueError as exc:
            raise ValueError(f"attempt {i}: {exc}") from exc
    return plan


def run_spec(spec: Any) -> list[Attempt]:
    """Run every attempt a JSON-shaped spec describes, in order.

    Raises:
        ValueError: the spec is malformed (nothing has run).
    """
    return [thunk() for thunk in _plan(spec)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: run ``--json SPEC`` (``-`` reads stdin), print the results, return 1 if anything got through."""
    parser = argparse.ArgumentParser(prog="escape.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, metavar="SPEC", help="JSON list of attempts, or - for stdin")
    args = parser.parse_args(argv)
    try:
        spec = json.loads(sys.stdin.read() if args.json == "-" else args.json)
        results = run_spec(spec)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        print(f"escape: bad spec: {exc}", file=sys.stderr)
        return 2
    json.dump([r.to_dict() for r in results], sys.stdout)
    sys.stdout.write("\n")
    for r in results:
        print(f"escape: {r.line()}", file=sys.stderr)
    return 1 if any(r.got_through for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
