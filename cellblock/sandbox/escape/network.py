"""Attempts to reach out: a TCP connection, a name lookup, the gateway's control socket, D-Bus, any
Unix socket (an ssh-agent's, by its own protocol)."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

from .attempt import Attempt, error_label, never_raises

__all__ = [
    "CONNECT_TIMEOUT",
    "RESOLVE_TIMEOUT",
    "connect",
    "control_socket",
    "dbus",
    "host_port",
    "resolve",
    "ssh_agent",
    "unix_socket",
]

# Bounded waits: a jail that drops packets must not stall a probe run.
CONNECT_TIMEOUT = 3.0  # seconds for one TCP or Unix-socket connect
RESOLVE_TIMEOUT = 5.0  # seconds for getaddrinfo; glibc's own retry schedule can run far longer
# What a Unix-socket attempt reads of an answer at most.
ANSWER_BYTES = 65536
# The ssh-agent protocol (draft-miller-ssh-agent): ask for the identities, and the answer's type.
AGENTC_REQUEST_IDENTITIES, AGENT_IDENTITIES_ANSWER = 11, 12


def host_port(target: str) -> tuple[str, int]:
    """Split ``host:port`` or ``[v6]:port``.

    Raises:
        ValueError: no port, or a port that is not a number.
    """
    host, sep, port = target.rpartition(":")
    if not sep or not host:
        raise ValueError(f"connect target {target!r} is not host:port")
    return host.strip("[]"), int(port)


@never_raises("connect")
def connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> Attempt:
    """Try a TCP connection to `host`:`port`. Through if it was accepted."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            peer = sock.getpeername()
    except OSError as exc:
        return Attempt("connect", target, False, f"connect: {error_label(exc)}")
    return Attempt("connect", target, True, f"connected to {peer[0]}")


@never_raises("resolve")
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


@never_raises("control")
def control_socket(path: str) -> Attempt:
    """Ask the gateway's control socket at `path` for `ps`, with the token beside it if that can
    be read (what the CLI sends). Through if it answered ok."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
            token, why = _control_token(path)
            request = {"op": "ps"} if token is None else {"op": "ps", "token": token}
            sock.sendall(json.dumps(request).encode("ascii") + b"\n")
            reply = b""
            while b"\n" not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except OSError as exc:
            return Attempt("control", path, False, f"connect: {error_label(exc)}")
    try:
        answer = json.loads(reply.split(b"\n", 1)[0] or b"null")
    except ValueError:
        return Attempt("control", path, False, f"{len(reply)} bytes that are not a reply")
    ok = isinstance(answer, dict) and answer.get("ok") is True
    said = answer.get("error", "") if isinstance(answer, dict) else ""
    return Attempt("control", path, ok, "answered ok" if ok else f"refused: {str(said)[:120]} ({why})")


def _control_token(path: str) -> tuple[str | None, str]:
    """The token the gateway keeps beside its socket (`control-<pid>.token`), and how that went;
    only the token's length is ever reported."""
    base = path[: -len(".sock")] if path.endswith(".sock") else path
    try:
        with open(base + ".token", "rb") as handle:
            token = handle.read(1024).strip().decode("ascii", "replace")
    except OSError as exc:
        return None, f"token: {error_label(exc)}"
    return token, f"sent the {len(token)}-character token"


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


@never_raises("dbus")
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
            results.append(f"{label}: {error_label(exc)}")
        else:
            through = True
            results.append(f"{label}: CONNECTED")
        finally:
            sock.close()
    return Attempt("dbus", address or "(default buses)", through, "; ".join(results))


def _unix_address(target: str) -> str:
    """A socket address: a path, or ``@name`` for an abstract socket (a leading NUL)."""
    return "\0" + target[1:] if target.startswith("@") else target


def _exchange(target: str, request: bytes, timeout: float) -> bytes:
    """Connect to the Unix socket `target`, send `request` (if any) and read the answer, up to
    `ANSWER_BYTES`, until the listener closes or pauses for `timeout`.

    Raises:
        OSError: the connection was refused (the reason the jail stops it).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(_unix_address(target))
        if request:
            sock.sendall(request)
        answer = b""
        try:
            while len(answer) < ANSWER_BYTES:
                chunk = sock.recv(ANSWER_BYTES - len(answer))
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass  # a pause (socket.timeout, not TimeoutError before 3.10) or a reset: it said what it said
    return answer


@never_raises("unix")
def unix_socket(target: str, send: str = "", timeout: float = CONNECT_TIMEOUT) -> Attempt:
    """Connect to the Unix socket `target` (a path, or ``@name`` for an abstract one), send `send`
    and read what the listener answers. Through if it accepted; `amount` is the bytes it gave."""
    try:
        answer = _exchange(target, send.encode(), timeout)
    except OSError as exc:
        return Attempt("unix", target, False, f"connect: {error_label(exc)}")
    return Attempt("unix", target, True, f"connected; it answered {len(answer)} byte(s)", len(answer))


@never_raises("ssh_agent")
def ssh_agent(target: str, timeout: float = CONNECT_TIMEOUT) -> Attempt:
    """Ask the ssh-agent at `target` (``SSH_AUTH_SOCK``; a path or ``@name``) for the keys it holds.
    Through if it answered; `amount` is how many keys it listed (it would sign with each)."""
    try:
        answer = _exchange(target, struct.pack(">IB", 1, AGENTC_REQUEST_IDENTITIES), timeout)
    except OSError as exc:
        return Attempt("ssh_agent", target, False, f"connect: {error_label(exc)}")
    if len(answer) < 9 or answer[4] != AGENT_IDENTITIES_ANSWER:
        return Attempt("ssh_agent", target, True, f"connected; {len(answer)} byte(s) that list no keys", 0)
    (count,) = struct.unpack(">I", answer[5:9])
    return Attempt("ssh_agent", target, True, f"the agent listed {count} key(s)", count)
