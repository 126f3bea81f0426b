"""The host-side egress proxy for `network: allowlist` and `ask`: one per jailed server, on a Unix socket.

The jail has only loopback. A relay inside it (`sandbox/relay.py`) listens on 127.0.0.1 and pipes
each TCP connection to this proxy's Unix socket, which is bind-mounted into the jail. The proxy
speaks just enough HTTP/1.x proxying for ordinary clients:

    CONNECT host:port HTTP/1.1                  -> "200 Connection established", then a raw tunnel
    GET http://host[:port]/path HTTP/1.1        -> the request in origin-form to host, Connection: close

For each request: parse strictly (anything odd is a 400), normalise the host, match the rules
(`policy/hosts.py`), resolve the name, check EVERY resolved address (a listed name must not lead to
loopback or private ranges unless an IP rule names them), record the decision, and only then
connect, to the checked IP itself, so DNS cannot change the answer in between (the bytes then go
through `sandbox/tunnel.py`). A refusal is a 403 whose one-line body names the host, the reason
and (`fix`) the command that allows it.

With an `ask` callable (`network: ask`), a host:port no rule lists is put to the human before
anything else is done with it (no DNS leaves the machine before the yes, so a name cannot carry
data out unasked); connections to the same host:port share one question. "once" allows it for
this proxy's life (the server's run), "always" adds it to the rules at once (the caller keeps it
in the config), a "deny" is refused; the special-address check applies after a yes as before.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from cellblock.policy.hosts import (
    HostRule,
    address_allowed,
    host_allowed,
    is_ip,
    is_special_address,
    no_host,
    normalize_host,
    parse_rule,
)
from cellblock.sandbox.bwrap import EGRESS_SOCKET
from cellblock.sandbox.httphead import (
    HEADER_TIMEOUT,
    MAX_HEADER_BYTES,
    Refused,
    authority,
    clip,
    origin_head,
    parse_head,
    read_head,
)
from cellblock.sandbox.jailnet import relay_names, resolv_mounts
from cellblock.sandbox.launchers import launcher_mounts
from cellblock.sandbox.tunnel import UnixStream, pipe
from cellblock.sandbox.types import Mount, MountMode
from cellblock.sandbox.unix import accept, bind_private

__all__ = [
    "ASK_PORTS",
    "CONNECT_TIMEOUT",
    "HEADER_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_HEADER_BYTES",
    "RESOLVE_TIMEOUT",
    "Answer",
    "Asked",
    "Asker",
    "Decision",
    "EgressProxy",
    "Resolver",
    "default_resolver",
]

logger = logging.getLogger(__name__)

# One jailed server rarely needs more than a handful of parallel connections; the cap stops it from
# exhausting the gateway's file descriptors. Connections over the cap get a 503 at once, not a queue.
MAX_CONNECTIONS = 64
# Seconds for DNS. Longer than a resolver's own retries take on a healthy network.
RESOLVE_TIMEOUT = 10.0
# Seconds to open the upstream TCP connection; a client's own timeout is usually longer, so the
# client sees our 502 rather than a silent hang.
CONNECT_TIMEOUT = 10.0
# Seconds to deliver a refusal or error response; a client that does not read it is dropped.
RESPONSE_TIMEOUT = 5.0

Resolver = Callable[[str, int], Awaitable[list[str]]]
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
    # how the human decided (`network: ask`): "once", "always", "deny", ...; None: the rules did
    asked: str | None = None


class Answer(StrEnum):
    """The human's answer to a connection outside the rules."""

    ONCE = "once"
    ALWAYS = "always"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Asked:
    """The answer and how it came (`how`: "once", "always", "deny", "no answer within 120s", ...)."""

    answer: Answer
    how: str


# asks the human whether the server may connect to (host, port); injected by the gateway
Asker = Callable[[str, int], Awaitable[Asked]]


@dataclass(slots=True)
class _Question:
    """One question in flight; connections to the same host:port wait for its answer."""

    done: anyio.Event = field(default_factory=anyio.Event)
    asked: Asked | None = None


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
        ask: Asker | None = None,
        fix: Callable[[str], str] | None = None,
    ) -> None:
        self.server = server
        self.rules = tuple(rules)
        self.socket_path = socket_path
        self._on_decision = on_decision
        self._resolver = resolver or default_resolver
        self._active = 0
        self._ask = ask
        self._fix = fix  # the sentence naming what allows a refused host:port
        self._once: set[tuple[str, int]] = set()
        self._asking: dict[tuple[str, int], _Question] = {}
        self.waiting = 0  # connections waiting for the human's answer

    def allow(self, entry: str) -> None:
        """Add `entry` (an `allow_hosts` entry) to the rules from now on.

        Raises:
            ValueError: `entry` is not a valid entry.
        """
        self.rules = (*self.rules, parse_rule(entry))

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
                    stream = UnixStream(conn)
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

    async def _refuse_busy(self, stream: UnixStream) -> None:
        try:
            async with stream:
                reason = f"too many concurrent connections (limit {MAX_CONNECTIONS})"
                self._record(Decision(self.server, "", 0, allowed=False, reason=reason))
                await self._respond(stream, 503, reason)
        except Exception:
            # top-level supervisor of one refused connection: it is closed either way
            logger.exception("egress proxy for %r: refusing a connection failed", self.server)

    async def _handle(self, stream: UnixStream) -> None:
        try:
            async with stream:
                try:
                    await self._proxy(stream)
                except Refused as refusal:
                    self._record(
                        Decision(
                            self.server,
                            refusal.host,
                            refusal.port,
                            allowed=False,
                            reason=refusal.reason,
                            address=refusal.address,
                            rule=refusal.rule,
                            asked=refusal.asked,
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

    async def _proxy(self, stream: UnixStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        head = await read_head(reader)
        request = parse_head(head)

        try:
            host = normalize_host(request.host)
        except ValueError as exc:
            raise Refused(400, f"bad host: {exc}", clip(request.host), request.port) from exc
        port = request.port

        rule, asked = host_allowed(self.rules, host, port), None
        if rule is None:
            rule, asked = await self._asked(host, port)

        addresses = await self._resolve(host, port)
        for address in addresses:
            if not address_allowed(self.rules, rule, address, port):
                add = f" (add '{authority(address, port)}' to allow_hosts if that is intended"
                raise Refused(
                    403,
                    f"{host} resolves to {address}, a loopback, private or reserved address that no "
                    f"IP rule lists{self._remedy(address, port, add, ')')}",
                    host,
                    port,
                    address,
                    rule.text,
                    asked,
                )
        address = addresses[0]
        # Recorded before connecting: a failing record means no connection.
        self._record(
            Decision(
                self.server,
                host,
                port,
                allowed=True,
                reason=f"allowed by {rule.text!r}" if asked is None else f"allowed by the user ({asked})",
                address=address,
                rule=rule.text,
                asked=asked,
            )
        )

        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                upstream = await anyio.connect_tcp(address, port)
        except (OSError, TimeoutError) as exc:
            logger.info("egress proxy for %r: connect to %s failed: %s", self.server, address, exc)
            await self._respond(stream, 502, f"cannot connect to {authority(address, port)} ({host})", host, port)
            return

        async with upstream:
            if request.connect:
                await stream.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                await upstream.send(origin_head(request, host, port))
            await pipe(reader, stream, upstream)

    def _remedy(self, address: str, port: int, lead: str, end: str) -> str:
        """How the refusal of `address:port` ends: why no rule ever opens it (a metadata service, this
        machine: `hosts.no_host`, what `cellblock allow-host` refuses), never the command that would
        be relayed as the fix; else `lead`, the command that allows it, and `end`."""
        refused = no_host(ipaddress.ip_network(address))
        if refused is not None and refused[1]:
            return (
                f"; it is {refused[0]}: a server reaches a service here only if you open it knowing what listens{end}"
            )
        if refused is not None:
            return f"; it is {refused[0]}, which a server is never let reach: refuse if asked to allow it{end}"
        fix = self._fix(authority(address, port)) if self._fix is not None else ""
        return f"{lead}{': ' if lead and fix else '; ' if fix else ''}{fix}{end}"

    async def _asked(self, host: str, port: int) -> tuple[HostRule, str]:
        """A rule for `host:port`, which no rule lists, once the human allowed it, and how.

        Raises:
            Refused: nobody is asked (no `ask`, or a special address only an IP rule may open), or
                the human denied it or did not answer.
        """
        target = authority(host, port)
        fix = self._remedy(host, port, "", "") if is_ip(host) else f"; {self._fix(target)}" if self._fix else ""
        if self._ask is None or (is_ip(host) and is_special_address(host)):
            raise Refused(403, f"{target} is not in allow_hosts{fix}", host, port)
        key = (host, port)
        if key in self._once:
            return parse_rule(target), "once (asked before)"
        question = self._asking.get(key)
        self.waiting += 1
        try:
            if question is None:  # the first connection asks; the others wait for its answer
                question = self._asking[key] = _Question()
                try:
                    question.asked = await self._ask(host, port)
                finally:
                    del self._asking[key]
                    question.done.set()
            else:
                await question.done.wait()
        finally:
            self.waiting -= 1
        asked = question.asked
        if asked is None or asked.answer is Answer.DENY:
            how = asked.how if asked is not None else "the question failed"
            raise Refused(
                403, f"{target} is not in allow_hosts and the user did not allow it ({how}){fix}", host, port, asked=how
            )
        if asked.answer is Answer.ALWAYS:
            if host_allowed(self.rules, host, port) is None:
                self.allow(target)
        else:
            self._once.add(key)
        return parse_rule(target), asked.how

    async def _resolve(self, host: str, port: int) -> list[str]:
        if is_ip(host):
            return [host]
        try:
            with anyio.fail_after(RESOLVE_TIMEOUT):
                found = await self._resolver(host, port)
        except (OSError, TimeoutError) as exc:
            raise Refused(502, f"cannot resolve {host} ({exc})", host, port) from exc
        addresses = list(dict.fromkeys(found))
        if not addresses:
            raise Refused(502, f"cannot resolve {host} (no addresses)", host, port)
        return addresses

    def _record(self, decision: Decision) -> None:
        self._on_decision(decision)

    async def _respond(self, stream: UnixStream, status: int, reason: str, host: str = "", port: int = 0) -> None:
        target = f"egress to {authority(host, port)}" if host else "egress request"
        body = f"cellblock: {target} refused for server {self.server!r}: {reason}\n".encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n"
        ).encode()
        with anyio.move_on_after(RESPONSE_TIMEOUT), suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.send(head + body)


# The in-jail end of the egress path: a stdlib script, and the loopback port it listens on (the
# jail has its own network namespace, so a fixed port collides with nothing).
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
RELAY_PORT = 3128


# Ports a `network: ask` jail's relay carries for programs that ignore the proxy variables, besides
# the ports `allow_hosts` lists: the web's. Any port still goes through the proxy variables.
ASK_PORTS = (80, 443)


def relayed(
    argv: Sequence[str], python: str, home: str, host_path: str, allow_hosts: Sequence[str] = (), ask: bool = False
) -> tuple[tuple[str, ...], list[Mount]]:
    """`argv` started by the egress relay inside its jail (run by `python`, isolated from site and
    home), which carries each connection to the proxy's socket at `EGRESS_SOCKET` and points the
    proxy variables at itself; with the names of `allow_hosts` it also answers their DNS and
    carries their connections (`sandbox/jailnet.py`); with `ask`, every name's, on `ASK_PORTS`
    too. And what the jail must show for it."""
    mounts = launcher_mounts(python, home, host_path, role="the gateway's Python, which runs the egress relay")
    mounts.append(Mount(RELAY, MountMode.READ_ONLY, "egress relay"))
    listen = f"127.0.0.1:{RELAY_PORT}"
    relay: tuple[str, ...] = (python, "-I", "-S", RELAY, "--listen", listen, "--socket", EGRESS_SOCKET)
    names, ports = relay_names(allow_hosts)
    if ask:
        ports = sorted({*ports, *ASK_PORTS})
        relay += ("--any-name",)
    if ports:
        relay += ("--names", ",".join(names), "--ports", ",".join(map(str, ports)))
        mounts += resolv_mounts()
    return (*relay, "--set-proxy-env", "--", *argv), mounts
