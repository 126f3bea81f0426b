"""In-jail relay: 127.0.0.1:PORT -> the egress proxy's Unix socket, then run the server.

    python3 relay.py --listen 127.0.0.1:PORT --socket PATH [--set-proxy-env]
                     [--names NAME,*.SUFFIX,... | --any-name] [--ports 80,443,... [--dns 127.0.0.1:53]] -- ARGV...

Runs INSIDE the jail with whatever python3 is mounted there, so it is one standalone file: stdlib
only, no `cellblock` import. It listens first, then starts ARGV with the inherited stdin, stdout
and stderr (stdout carries MCP, so the relay never writes to it), forwards SIGTERM, SIGINT and
SIGHUP to the child, and exits with the child's exit code, or 128 + N when a signal N ended it.
Each accepted TCP connection is piped to a fresh connection on the Unix socket; the relay does
not look at the bytes, the proxy does all checking.

With `--ports`, the relay also answers DNS (UDP, at `--dns`) inside the jail: an A query for a
name the `--names` patterns cover gets a loopback address of its own (127.100.x.y, one per name,
given at the first query), any other name NXDOMAIN, which is reported to the proxy as a `CONNECT
name:53` it refuses and audits before the program is answered. On each of `--ports` it accepts TCP
on every address; a connection to a name's address is carried to the proxy as `CONNECT name:port`,
one to an address beyond loopback (every IPv4 address is local in the namespace `sandbox/netns.py`
makes) as `CONNECT address:port`, so programs that ignore proxy variables (Node 20's fetch, Go, raw
sockets) reach exactly what the proxy allows. A refusal's response is passed to the client as it
is, then the connection is closed. Ports below 1024 need that namespace too.

With `--any-name` (`network: ask`) every host name is covered: its lookup is answered at once with
an address of its own, and nothing leaves the machine then; its connection is carried to the
proxy, which asks the human while the connection waits (so no DNS timeout decides for them).

With `--set-proxy-env` the child gets http_proxy, https_proxy, HTTP_PROXY and HTTPS_PROXY pointing
at the listener (PORT may then be 0 for an ephemeral port) and no no_proxy/NO_PROXY.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

__all__ = ["ACCEPT_BACKOFF", "MAX_CONNECTIONS", "Names", "dns_answer", "main", "serve_connection"]

# Connections piped at once; more are closed on accept. The proxy has its own, lower limit; this
# only keeps a runaway client from making the relay spawn threads without bound.
MAX_CONNECTIONS = 256
# Names given an address at once; a runaway of lookups under a wildcard cannot grow the table for ever.
MAX_NAMES = 4096
# Refused names reported to the proxy (once each); the audit's own budget bounds the rest.
MAX_REPORTED = 1024
# Where names' addresses are: 127.100.0.1 onwards, all on the jail's loopback.
NAME_NETWORK = "127.100"
# Seconds to open the Unix socket connection; the proxy accepts at once when it is up.
CONNECT_TIMEOUT = 10.0
# Seconds to pause after a failed accept (out of file descriptors) instead of spinning.
ACCEPT_BACKOFF = 0.1
_CHUNK = 64 * 1024
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
_NO_PROXY_VARS = ("no_proxy", "NO_PROXY")
_EXIT_CANNOT_START = 127
_MAX_HEAD = 16 * 1024  # the proxy's answer to CONNECT
_DNS_HEADER = 12
_DNS_MAX = 4096
_TTL = 60
_TYPE_A, _TYPE_AAAA, _CLASS_IN = 1, 28, 1
_NOERROR, _FORMERR, _NXDOMAIN, _NOTIMP = 0, 1, 3, 4
_HOST_NAME = re.compile(rb"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")


def _say(message: str) -> None:
    print(f"cellblock-relay: {message}", file=sys.stderr, flush=True)


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (got {text!r})")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction until EOF, then half-close the sink."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        # a reset on one side: tear down both directions
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Names:
    """The names the relay answers for, each given a loopback address of its own at first use."""

    def __init__(self, patterns: Sequence[str], any_name: bool = False) -> None:
        self._any = any_name  # `network: ask`: the proxy asks about each name as it is connected to
        self._exact = {p for p in patterns if not p.startswith("*.")}
        self._suffixes = tuple(p[1:] for p in patterns if p.startswith("*."))
        self._addresses: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._reported: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def covers(self, name: str) -> bool:
        return self._any or name in self._exact or any(name.endswith(s) for s in self._suffixes)

    def address_for(self, name: str) -> str | None:
        """`name`'s loopback address (given now if new); None if no pattern covers it or all are given."""
        if not self.covers(name):
            return None
        with self._lock:
            if name not in self._addresses:
                if len(self._addresses) >= MAX_NAMES:
                    return None
                index = len(self._addresses) + 1
                address = f"{NAME_NETWORK}.{index >> 8}.{index & 0xFF}"
                self._addresses[name] = address
                self._names[address] = name
            return self._addresses[name]

    def name_at(self, address: str) -> str | None:
        with self._lock:
            return self._names.get(address)

    def refusal(self, name: str) -> tuple[bool, threading.Event | None]:
        """Whether `name`'s refusal is to be reported now (the first time, for up to MAX_REPORTED
        names), and the event set once it has been: answers for the name wait for it."""
        with self._lock:
            if name in self._reported:
                return False, self._reported[name]
            if len(self._reported) >= MAX_REPORTED:
                return False, None
            self._reported[name] = threading.Event()
            return True, self._reported[name]


def dns_answer(query: bytes, names: Names) -> tuple[bytes | None, str | None]:
    """The response to one DNS query, and the name it refused (to report), if any.

    An A query (class IN) for a covered name gets its address; another type for it no answer
    (NOERROR, so a client asking A and AAAA uses the A); any other name NXDOMAIN; a malformed query,
    FORMERR; a response, or a packet too short for a header, nothing."""
    if len(query) < _DNS_HEADER:
        return None, None
    ident, flags, questions = struct.unpack("!HHH", query[:6])
    if flags & 0x8000:
        return None, None
    opcode = (flags >> 11) & 0xF
    keep = (flags & 0x0100) | 0x8080 | (opcode << 11)  # RD as asked, QR, RA

    def reply(rcode: int, question: bytes = b"", answer: bytes = b"") -> bytes:
        counts = (1 if question else 0, 1 if answer else 0, 0, 0)
        return struct.pack("!HH4H", ident, keep | rcode, *counts) + question + answer

    if opcode != 0:
        return reply(_NOTIMP), None
    parsed = _question(query)
    if questions != 1 or parsed is None:
        return reply(_FORMERR), None
    name, qtype, qclass, end = parsed
    question = query[_DNS_HEADER:end]
    address = names.address_for(name) if name is not None else None
    if address is None:
        return reply(_NXDOMAIN, question), name if qtype in (_TYPE_A, _TYPE_AAAA) else None
    if qtype != _TYPE_A or qclass != _CLASS_IN:
        return reply(_NOERROR, question), None
    record = struct.pack("!HHHIH", 0xC00C, _TYPE_A, _CLASS_IN, _TTL, 4) + socket.inet_aton(address)
    return reply(_NOERROR, question, record), None


def _question(query: bytes) -> tuple[str | None, int, int, int] | None:
    """(name lowercased, or None if it is not a host name's letters; type; class; end offset), or
    None if malformed."""
    labels: list[bytes] = []
    at = _DNS_HEADER
    while True:
        if at >= len(query):
            return None
        length = query[at]
        if length & 0xC0:  # no compression in a question
            return None
        at += 1
        if length == 0:
            break
        labels.append(query[at : at + length])
        at += length
    if at + 4 > len(query) or at - _DNS_HEADER > 255:
        return None
    qtype, qclass = struct.unpack("!HH", query[at : at + 4])
    joined = b".".join(labels).lower()
    # a host name's letters only: nothing else is ever a listed name, nor put in a request line
    name = joined.decode("ascii") if _HOST_NAME.fullmatch(joined) else None
    return name, qtype, qclass, at + 4


def _report(name: str, socket_path: str) -> None:
    """Tell the proxy of a lookup the relay refused, as a CONNECT it refuses and audits."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        upstream.settimeout(CONNECT_TIMEOUT)
        upstream.connect(socket_path)
        upstream.sendall(f"CONNECT {name}:53 HTTP/1.1\r\nHost: {name}:53\r\n\r\n".encode("ascii"))
        upstream.recv(_CHUNK)


def _dns_loop(server: socket.socket, names: Names, socket_path: str) -> None:
    while True:
        try:
            query, peer = server.recvfrom(_DNS_MAX)
        except OSError as exc:
            _say(f"DNS receive failed: {exc}")
            time.sleep(ACCEPT_BACKOFF)
            continue
        response, refused = dns_answer(query, names)
        if response is None:
            continue
        first, reported = names.refusal(refused) if refused else (False, None)
        if reported is not None and (first or not reported.is_set()):
            # the program is answered once the proxy has recorded the refusal, so the audit holds it
            # first; off this loop, which a slow proxy must not stall
            work = (server, response, peer, refused if first else None, reported, socket_path)
            threading.Thread(target=_answer_reported, args=work, daemon=True).start()
            continue
        with contextlib.suppress(OSError):
            server.sendto(response, peer)


def _answer_reported(
    server: socket.socket,
    response: bytes,
    peer: tuple[str, int],
    name: str | None,
    reported: threading.Event,
    socket_path: str,
) -> None:
    """Report `name` (None: another query's thread reports it), then answer."""
    if name is not None:
        try:
            _report(name, socket_path)
        finally:
            reported.set()
    else:
        reported.wait(CONNECT_TIMEOUT)
    with contextlib.suppress(OSError):
        server.sendto(response, peer)


def _connect_name(client: socket.socket, upstream: socket.socket, name: str, port: int) -> bool:
    """Ask the proxy for `name:port`; True if it connected. A refusal is passed on to the client."""
    upstream.sendall(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode("ascii"))
    head = b""
    while b"\r\n\r\n" not in head:
        data = upstream.recv(_CHUNK)
        if not data or len(head) + len(data) > _MAX_HEAD:
            return False
        head += data
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status) >= 2 and status[1] == b"200":
        extra = head.split(b"\r\n\r\n", 1)[1]
        if extra:
            client.sendall(extra)
        return True
    with contextlib.suppress(OSError):
        client.sendall(head)
        client.sendall(upstream.recv(_CHUNK))
    return False


def serve_connection(
    client: socket.socket, socket_path: str, slots: threading.BoundedSemaphore, names: Names | None, proxy: bool
) -> None:
    """Carry the accepted `client` to the proxy's socket at `socket_path`: as a proxy client (`proxy`),
    or as a CONNECT to the name or address it was made to; then close it and free its slot. The
    gateway's Landlock gate (`sandbox/connects.py`) carries its connections here too."""
    try:
        local = client.getsockname()
        name = names.name_at(local[0]) if names is not None else None
        if name is None and names is not None and not local[0].startswith("127."):
            name = local[0]  # a raw address (every IPv4 address is local here): the proxy judges it
        if name is None and not proxy:
            return  # the jail's own loopback: nothing to carry it to
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.settimeout(CONNECT_TIMEOUT)
            upstream.connect(socket_path)
            upstream.settimeout(None)  # the proxy answers CONNECT within its own resolve and connect timeouts
            if name is not None and not _connect_name(client, upstream, name, local[1]):
                upstream.close()
                return
        except OSError as exc:
            _say(f"cannot reach the egress proxy at {socket_path}: {exc}")
            upstream.close()
            return
        with upstream:
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
    finally:
        client.close()
        slots.release()


def _accept_loop(listener: socket.socket, socket_path: str, names: Names | None, proxy: bool) -> None:
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            _say(f"accept failed: {exc}")
            time.sleep(ACCEPT_BACKOFF)
            continue
        if not slots.acquire(blocking=False):
            client.close()
            continue
        work = (client, socket_path, slots, names, proxy)
        threading.Thread(target=serve_connection, args=work, daemon=True).start()


def _listen(host: str, port: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, kind)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    if kind == socket.SOCK_STREAM:
        listener.listen(128)
    return listener


def _ports(text: str) -> list[int]:
    ports = [p for p in text.split(",") if p]
    if not all(p.isdigit() and 1 <= int(p) <= 65535 for p in ports):
        raise argparse.ArgumentTypeError(f"expected PORT,PORT,... (got {text!r})")
    return sorted({int(p) for p in ports})


def _carry(names: Names, dns_at: tuple[str, int], ports: Sequence[int], socket_path: str) -> None:
    """Answer DNS at `dns_at` and carry connections on `ports`; or, where the jail does not let
    the relay bind them, say so and carry nothing (the proxy variables still work)."""
    opened: list[socket.socket] = []
    try:
        opened.append(_listen(dns_at[0], dns_at[1], socket.SOCK_DGRAM))
        opened += [_listen("0.0.0.0", p) for p in ports]
    except OSError as exc:
        for each in opened:
            each.close()
        _say(
            f"cannot listen for DNS and the allowed ports ({exc}): programs that ignore the proxy "
            "variables reach nothing from this jail (see 'cellblock doctor')"
        )
        return
    dns, *carried = opened
    threading.Thread(target=_dns_loop, args=(dns, names, socket_path), daemon=True).start()
    for carrier in carried:
        threading.Thread(target=_accept_loop, args=(carrier, socket_path, names, False), daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="relay.py", description="Relay 127.0.0.1:PORT to the egress proxy, then run ARGV."
    )
    parser.add_argument("--listen", required=True, type=_parse_listen, help="HOST:PORT to listen on (loopback)")
    parser.add_argument("--socket", required=True, help="the egress proxy's Unix socket")
    parser.add_argument("--set-proxy-env", action="store_true", help="point the child's *_proxy variables here")
    parser.add_argument("--names", default="", help="NAME,*.SUFFIX,... to answer DNS for")
    parser.add_argument("--any-name", action="store_true", help="answer DNS for every name (network: ask)")
    parser.add_argument("--ports", type=_ports, default=[], help="PORT,... to carry names' connections on")
    parser.add_argument("--dns", type=_parse_listen, default=("127.0.0.1", 53), help="HOST:PORT for DNS (UDP)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV of the server to run")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("no command given after --")

    listen_host, listen_port = args.listen
    if listen_port in args.ports:
        listen_host = "0.0.0.0"  # a name's connections on this port come here too
    try:
        listener = _listen(listen_host, listen_port)
    except OSError as exc:
        _say(f"cannot listen on {args.listen[0]}:{args.listen[1]}: {exc}")
        return _EXIT_CANNOT_START
    host, port = args.listen[0], listener.getsockname()[1]
    names = Names([n for n in args.names.split(",") if n], args.any_name) if args.ports else None
    threading.Thread(target=_accept_loop, args=(listener, args.socket, names, True), daemon=True).start()
    if names is not None:
        _carry(names, args.dns, [p for p in args.ports if p != port], args.socket)

    env = dict(os.environ)
    if args.set_proxy_env:
        shown = f"[{host}]" if ":" in host else host
        for name in _PROXY_VARS:
            env[name] = f"http://{shown}:{port}"
        for name in _NO_PROXY_VARS:
            env.pop(name, None)

    # Handlers go in before the child exists, so a signal in between is kept and passed on.
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
        else:
            with contextlib.suppress(OSError):
                child.send_signal(signum)

    for each in _FORWARDED:
        signal.signal(each, forward)

    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        _say(f"cannot start {command[0]!r}: {exc}")
        return _EXIT_CANNOT_START
    for waiting in pending:
        child.send_signal(waiting)

    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
