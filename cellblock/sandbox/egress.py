"""The host-side egress proxy for `network: allowlist`: one per jailed server, on a Unix socket.

The jail has only loopback. A relay inside it (`sandbox/relay.py`) listens on 127.0.0.1 and pipes
each TCP connection to this proxy's Unix socket, which is bind-mounted into the jail. The proxy
speaks just enough HTTP/1.x proxying for ordinary clients:

    CONNECT host:port HTTP/1.1                  -> "200 Connection established", then a raw tunnel
    GET http://host[:port]/path HTTP/1.1        -> the request in origin-form to host, Connection: close

For each request: parse strictly (anything odd is a 400), normalise the host, match the rules
(`policy/hosts.py`), resolve the name, check EVERY resolved address (a listed name must not lead to
loopback or private ranges unless an IP rule names them), record the decision, and only then
connect, to the checked IP itself, so DNS cannot change the answer in between. A refusal is a
403 whose one-line body names the host and the reason.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.buffered import BufferedByteReceiveStream

from cellblock.policy.hosts import HostRule, address_allowed, host_allowed, is_ip, normalize_host
from cellblock.sandbox.bwrap import EGRESS_SOCKET
from cellblock.sandbox.jailnet import relay_names, resolv_mounts
from cellblock.sandbox.launchers import launcher_mounts
from cellblock.sandbox.types import Mount, MountMode
from cellblock.sandbox.unix import accept, bind_private

__all__ = [
    "CONNECT_TIMEOUT",
    "HEADER_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_HEADER_BYTES",
    "RESOLVE_TIMEOUT",
    "Decision",
    "EgressProxy",
    "Resolver",
    "default_resolver",
]

logger = logging.getLogger(__name__)

# One jailed server rarely needs more than a handful of parallel connections; the cap stops it from
# exhausting the gateway's file descriptors. Connections over the cap get a 503 at once, not a queue.
MAX_CONNECTIONS = 64
# Request line + headers. Real proxy requests are well under 4 KiB; 16 KiB leaves room for big
# cookies while bounding what an idle or hostile client can make the gateway buffer.
MAX_HEADER_BYTES = 16 * 1024
# Seconds to send the whole request head. Clients send it at once; this only ends slow-loris
# connections that would otherwise hold a slot forever.
HEADER_TIMEOUT = 10.0
# Seconds for DNS. Longer than a resolver's own retries take on a healthy network.
RESOLVE_TIMEOUT = 10.0
# Seconds to open the upstream TCP connection; a client's own timeout is usually longer, so the
# client sees our 502 rather than a silent hang.
CONNECT_TIMEOUT = 10.0
# Seconds to deliver a refusal or error response; a client that does not read it is dropped.
RESPONSE_TIMEOUT = 5.0
# Bytes per read while piping.
_CHUNK = 64 * 1024
# Longest host text copied into a decision for a request that could not be parsed.
_MAX_REPORTED_HOST = 255

Resolver = Callable[[str, int], Awaitable[list[str]]]

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own; never forwarded upstream.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Decision:
    """One egress decision, reported through `on_decision` before any connection is made.

    `host` is the normalised host ("" when the request could not be parsed that far), `address`
    the IP that will be connected to (allowed) or the one that caused a refusal, `rule` the text
    of the `allow_hosts` entry that matched, if any.
    """

    server: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str | None = None
    rule: str | None = None


class _Refused(Exception):
    """Internal: the request ends with an error response and a refusal decision."""

    def __init__(
        self,
        status: int,
        reason: str,
        host: str = "",
        port: int = 0,
        address: str | None = None,
        rule: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.host = host
        self.port = port
        self.address = address
        self.rule = rule


@dataclass(frozen=True, slots=True)
class _Request:
    host: str  # as written by the client (not yet normalised)
    port: int
    connect: bool
    # absolute-form only: the request head rewritten to origin-form, without the Host line
    method: bytes = b""
    origin: bytes = b""
    version: bytes = b"HTTP/1.1"
    headers: tuple[tuple[bytes, bytes], ...] = ()


async def default_resolver(host: str, port: int) -> list[str]:
    """Resolve `host` with the system resolver, returning every address in the order given."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class EgressProxy:
    """Serves one jailed server's egress on a Unix socket, allowing only what `rules` list."""

    def __init__(
        self,
        server: str,
        rules: Sequence[HostRule],
        socket_path: str,
        on_decision: Callable[[Decision], None],
        resolver: Resolver | None = None,
    ) -> None:
        self.server = server
        self.rules = tuple(rules)
        self.socket_path = socket_path
        self._on_decision = on_decision
        self._resolver = resolver or default_resolver
        self._active = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bind the socket (mode 0600), report started, and serve until cancelled.

        The socket file is removed on the way out.

        Raises:
            OSError: the socket cannot be bound (its directory is missing, or a non-socket file
                is in the way).
        """
        listener = bind_private(self.socket_path, MAX_CONNECTIONS)
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    conn = await accept(listener, f"egress proxy for {self.server!r}")
                    stream = _UnixStream(conn)
                    if self._active >= MAX_CONNECTIONS:
                        tg.start_soon(self._refuse_busy, stream)
                    else:
                        self._active += 1
                        tg.start_soon(self._handle, stream)
        finally:
            listener.close()
            with suppress(FileNotFoundError):
                os.unlink(self.socket_path)

    # -- one connection --------------------------------------------------------------------

    async def _refuse_busy(self, stream: _UnixStream) -> None:
        try:
            async with stream:
                reason = f"too many concurrent connections (limit {MAX_CONNECTIONS})"
                self._record(Decision(self.server, "", 0, allowed=False, reason=reason))
                await self._respond(stream, 503, reason)
        except Exception:
            # top-level supervisor of one refused connection: it is closed either way
            logger.exception("egress proxy for %r: refusing a connection failed", self.server)

    async def _handle(self, stream: _UnixStream) -> None:
        try:
            async with stream:
                try:
                    await self._proxy(stream)
                except _Refused as refusal:
                    self._record(
                        Decision(
                            self.server,
                            refusal.host,
                            refusal.port,
                            allowed=False,
                            reason=refusal.reason,
                            address=refusal.address,
                            rule=refusal.rule,
                        )
                    )
                    await self._respond(stream, refusal.status, refusal.reason, refusal.host, refusal.port)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the client or the destination hung up mid-exchange; the decision is already recorded
        except Exception:
            # Top-level supervisor of one connection (a failing on_decision lands here too): the
            # connection is dropped, nothing was connected after a failed record.
            logger.exception("egress proxy for %r: connection handler failed", self.server)
        finally:
            self._active -= 1

    async def _proxy(self, stream: _UnixStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        head = await _read_head(reader)
        request = _parse_head(head)

        try:
            host = normalize_host(request.host)
        except ValueError as exc:
            raise _Refused(400, f"bad host: {exc}", _clip(request.host), request.port) from exc
        port = request.port

        rule = host_allowed(self.rules, host, port)
        if rule is None:
            raise _Refused(403, f"{_authority(host, port)} is not in allow_hosts", host, port)

        addresses = await self._resolve(host, port)
        for address in addresses:
            if not address_allowed(self.rules, rule, address, port):
                raise _Refused(
                    403,
                    f"{host} resolves to {address}, a loopback, private or reserved address that no "
                    f"IP rule lists (add '{_authority(address, port)}' to allow_hosts if that is intended)",
                    host,
                    port,
                    address,
                    rule.text,
                )
        address = addresses[0]
        # Recorded before connecting: a failing record means no connection.
        self._record(
            Decision(
                self.server,
                host,
                port,
                allowed=True,
                reason=f"allowed by {rule.text!r}",
                address=address,
                rule=rule.text,
            )
        )

        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                upstream = await anyio.connect_tcp(address, port)
        except (OSError, TimeoutError) as exc:
            logger.info("egress proxy for %r: connect to %s failed: %s", self.server, address, exc)
            await self._respond(stream, 502, f"cannot connect to {_authority(address, port)} ({host})", host, port)
            return

        async with upstream:
            if request.connect:
                await stream.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                await upstream.send(_origin_head(request, host, port))
            await _pipe(reader, stream, upstream)

    async def _resolve(self, host: str, port: int) -> list[str]:
        if is_ip(host):
            return [host]
        try:
            with anyio.fail_after(RESOLVE_TIMEOUT):
                found = await self._resolver(host, port)
        except (OSError, TimeoutError) as exc:
            raise _Refused(502, f"cannot resolve {host} ({exc})", host, port) from exc
        addresses = list(dict.fromkeys(found))
        if not addresses:
            raise _Refused(502, f"cannot resolve {host} (no addresses)", host, port)
        return addresses

    def _record(self, decision: Decision) -> None:
        self._on_decision(decision)

    async def _respond(self, stream: _UnixStream, status: int, reason: str, host: str = "", port: int = 0) -> None:
        target = f"egress to {_authority(host, port)}" if host else "egress request"
        body = f"cellblock: {target} refused for server {self.server!r}: {reason}\n".encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n"
        ).encode()
        with anyio.move_on_after(RESPONSE_TIMEOUT), suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.send(head + body)


# -- parsing -------------------------------------------------------------------------------


async def _read_head(reader: BufferedByteReceiveStream) -> bytes:
    try:
        with anyio.fail_after(HEADER_TIMEOUT):
            head = await reader.receive_until(b"\r\n\r\n", MAX_HEADER_BYTES)
    except TimeoutError as exc:
        raise _Refused(408, f"request head not received within {HEADER_TIMEOUT:g} s") from exc
    except anyio.DelimiterNotFound as exc:
        raise _Refused(431, f"request head is longer than {MAX_HEADER_BYTES} bytes") from exc
    except (anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        raise _Refused(400, "connection closed before the request head was complete") from exc
    # receive_until only stops reading once the buffer is over the limit, so one large read can
    # still hold a complete, oversized head: measure it
    if len(head) + 4 > MAX_HEADER_BYTES:
        raise _Refused(431, f"request head is longer than {MAX_HEADER_BYTES} bytes")
    return head


def _parse_head(head: bytes) -> _Request:
    if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
        raise _Refused(400, "bare CR or LF in the request head")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise _Refused(400, "malformed request line (expected 'METHOD target HTTP/1.1')")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target) or version not in _VERSIONS:
        raise _Refused(400, "malformed request line (expected 'METHOD target HTTP/1.1')")
    headers = _parse_headers(lines[1:])

    if method == b"CONNECT":
        host, port = _split_authority(target.decode("ascii"), default_port=None)
        return _Request(host=host, port=port, connect=True)

    lowered = target.lower()
    if lowered.startswith(b"https://"):
        raise _Refused(400, "absolute https:// URIs are not proxied; use CONNECT")
    if not lowered.startswith(b"http://"):
        raise _Refused(400, "not a proxy request (expected CONNECT host:port or an absolute http:// URI)")
    rest = target[len(b"http://") :].decode("ascii")
    end = len(rest)
    for delimiter in "/?#":
        index = rest.find(delimiter)
        if index >= 0:
            end = min(end, index)
    authority, path = rest[:end], rest[end:]
    path = path.partition("#")[0]
    if not path.startswith("/"):
        path = "/" + path
    host, port = _split_authority(authority, default_port=80)
    return _Request(
        host=host,
        port=port,
        connect=False,
        method=method,
        origin=path.encode("ascii"),
        version=version,
        headers=headers,
    )


def _parse_headers(lines: list[bytes]) -> tuple[tuple[bytes, bytes], ...]:
    headers: list[tuple[bytes, bytes]] = []
    for line in lines:
        if not line:
            continue  # the final empty line(s) of the head
        if line[:1] in (b" ", b"\t"):
            raise _Refused(400, "folded header lines are not accepted")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise _Refused(400, "malformed header line")
        value = value.strip(b" \t")
        if b"\x00" in value:
            raise _Refused(400, "NUL in a header value")
        headers.append((name, value))
    lengths = {v for n, v in headers if n.lower() == b"content-length"}
    if len(lengths) > 1 or (lengths and any(n.lower() == b"transfer-encoding" for n, _ in headers)):
        raise _Refused(400, "ambiguous request body length (Content-Length and Transfer-Encoding)")
    return tuple(headers)


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """Split `host[:port]` (IPv6 in brackets); userinfo is dropped as `normalize_host` does."""
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise _Refused(400, "unclosed '[' in the request target", _clip(authority))
        host, rest = authority[: close + 1], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise _Refused(400, "malformed authority in the request target", _clip(authority))
        port_text = rest[1:] if rest else None
    else:
        host, sep, port_text_found = authority.rpartition(":")
        if not sep:
            host, port_text = authority, None
        else:
            port_text = port_text_found
        if ":" in host:
            raise _Refused(400, "IPv6 addresses must be in brackets", _clip(authority))
    if not host:
        raise _Refused(400, "no host in the request target")
    if port_text is None or port_text == "":
        if default_port is None:
            raise _Refused(400, "CONNECT needs host:port", _clip(host))
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
        raise _Refused(400, f"bad port {port_text[:8]!r}", _clip(host))
    return host, int(port_text)


def _origin_head(request: _Request, host: str, port: int) -> bytes:
    """The request head in origin-form, Host set from the URI, hop-by-hop headers dropped."""
    listed = {
        token.strip().lower()
        for name, value in request.headers
        if name.lower() in (b"connection", b"proxy-connection")
        for token in value.decode("latin-1").split(",")
    }
    lines = [request.method + b" " + request.origin + b" " + request.version]
    authority = _authority(host, port) if port != 80 else _authority(host, None)
    lines.append(b"Host: " + authority.encode("ascii"))
    for name, value in request.headers:
        lowered = name.decode("ascii").lower()
        if lowered == "host" or lowered in _HOP_BY_HOP or lowered in listed:
            continue
        lines.append(name + b": " + value)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


# -- piping --------------------------------------------------------------------------------


async def _pipe(reader: BufferedByteReceiveStream, client: _UnixStream, upstream: anyio.abc.SocketStream) -> None:
    """Copy both ways until both sides are done; an EOF is passed on as a half-close."""
    async with anyio.create_task_group() as tg:

        async def copy(source: anyio.abc.ByteReceiveStream, sink: anyio.abc.ByteStream) -> None:
            try:
                while True:
                    await sink.send(await source.receive(_CHUNK))
            except anyio.EndOfStream:
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    await sink.send_eof()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                # a reset on either side ends the whole exchange
                tg.cancel_scope.cancel()

        tg.start_soon(copy, reader, upstream)
        tg.start_soon(copy, upstream, client)


# -- the Unix socket ------------------------------------------------------------------------


class _UnixStream(anyio.abc.ByteStream):
    """A byte stream over an accepted Unix socket, waiting with `anyio.wait_readable/writable`.

    anyio 4.16's own UNIX socket stream (asyncio backend) can raise InvalidStateError from an
    event-loop callback when a pending receive is cancelled just as data arrives, which is how
    every tunnel ends when the proxy stops; `wait_readable` tolerates that race.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._closed = False

    async def receive(self, max_bytes: int = _CHUNK) -> bytes:
        await anyio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = self._sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            if not data:
                raise anyio.EndOfStream
            return data

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        view = memoryview(item)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_writable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            view = view[sent:]

    async def send_eof(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()
        await anyio.lowlevel.checkpoint()


# -- small helpers -------------------------------------------------------------------------


def _authority(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def _clip(text: str) -> str:
    return text[:_MAX_REPORTED_HOST]


# The in-jail end of the egress path: a stdlib script, and the loopback port it listens on (the
# jail has its own network namespace, so a fixed port collides with nothing).
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
RELAY_PORT = 3128


def relayed(
    argv: Sequence[str], python: str, home: str, host_path: str, allow_hosts: Sequence[str] = ()
) -> tuple[tuple[str, ...], list[Mount]]:
    """`argv` started by the egress relay inside its jail (run by `python`, isolated from site and
    home), which carries each connection to the proxy's socket at `EGRESS_SOCKET` and points the
    proxy variables at itself; with the names of `allow_hosts` it also answers their DNS and
    carries their connections (`sandbox/jailnet.py`). And what the jail must show for it."""
    mounts = launcher_mounts(python, home, host_path, role="the gateway's Python, which runs the egress relay")
    mounts.append(Mount(RELAY, MountMode.READ_ONLY, "egress relay"))
    listen = f"127.0.0.1:{RELAY_PORT}"
    relay: tuple[str, ...] = (python, "-I", "-S", RELAY, "--listen", listen, "--socket", EGRESS_SOCKET)
    names, ports = relay_names(allow_hosts)
    if ports:
        relay += ("--names", ",".join(names), "--ports", ",".join(map(str, ports)))
        mounts += resolv_mounts()
    return (*relay, "--set-proxy-env", "--", *argv), mounts
