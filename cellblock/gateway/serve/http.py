"""`cellblock serve --http`: the gateway as a Streamable HTTP server at `/mcp`.

The SDK's Streamable HTTP app serves both eras: handshake-era sessions (`Mcp-Session-Id`, SSE for
the server's own requests, so approvals can ask) and stateless 2026-07-28 requests. In front of it,
`Guard` checks every request before the SDK sees it:

- **Host** (loopback binds): one of the loopback names with the bound port. A web page that rebinds
  its own DNS name to 127.0.0.1 still sends its own name, and is refused (DNS rebinding).
- **Origin**, when a browser sends one: a loopback origin for a loopback bind, else the very
  host the request was sent to (same origin). A page elsewhere cannot drive the gateway.
- **Authorization**: `Bearer <token>` with the token in the keyring entry `HTTP_TOKEN_ENTRY`,
  compared in constant time. Required whenever a token is set. Without one the gateway does not
  start beyond loopback, nor on loopback while one of its own servers can connect to the port as
  any program of the user's can (`reaching`): such a server would call every tool and answer its
  own approvals.

How many connections it holds, and for how long, is `connections.py`'s.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from cellblock.gateway.config.model import Config, LocalServer
from cellblock.gateway.credentials import HTTP_TOKEN_ENTRY, CredentialError, Keyring
from cellblock.gateway.downstream.ratelimit import Budget
from cellblock.policy.hosts import parse_rule

if TYPE_CHECKING:
    from cellblock.gateway.serve.gateway import Gateway

__all__ = ["MCP_PATH", "Bind", "BudgetedLog", "Guard", "http_token", "parse_bind", "reaching", "serve_http"]

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# Lines about trouble a client can cause, at most: 20 at once, then one every 10 s.
_TELL_RATE, _TELL_BURST = 0.1, 20.0


@dataclass(frozen=True)
class Bind:
    """Where to listen: an IP address (or `localhost`) and a port (0: any free one)."""

    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return self.host == "localhost" or ipaddress.ip_address(self.host).is_loopback

    def socket(self) -> socket.socket:
        """The socket, bound and listening (so the port is known before the server starts).

        Raises:
            OSError: the address cannot be bound (in use, not on this machine).
        """
        host = "127.0.0.1" if self.host == "localhost" else self.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(128)  # from now on a client's connection waits in the backlog, even before the server runs
        sock.set_inheritable(False)
        return sock


def parse_bind(text: str) -> Bind:
    """`[HOST:]PORT` as given to `--http`: `8080`, `127.0.0.1:8080`, `[::1]:8080`, `0.0.0.0:8080`.

    Raises:
        ValueError: not of that form, or HOST is neither an IP address nor `localhost`.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    # isdigit alone takes any script's digits
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http {text!r}: expected [HOST:]PORT with PORT 0-65535, such as 127.0.0.1:8080")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"--http {text!r}: HOST must be an IP address or localhost (a name could resolve anywhere)"
            ) from None
    return Bind(host, int(port))


class BudgetedLog(logging.Filter):
    """Passes a logger's records within one budget: what a client can make the gateway log (a
    refused Host or Origin, a request uvicorn cannot parse) must not grow the log as fast as the
    client sends. One for all of it (`Guard.told`, a filter on uvicorn's log too)."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = Budget(rate=_TELL_RATE, burst=_TELL_BURST)

    def filter(self, record: logging.LogRecord) -> bool:
        return self.budget.take()


def _loopback_host(host: str) -> bool:
    name = host[1 : host.index("]")] if host.startswith("[") and "]" in host else host.partition(":")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    """Host, Origin and bearer token, checked on every HTTP request before `app` sees it."""

    def __init__(self, app: ASGIApp, bind: Bind, port: int, token: str | None) -> None:
        self.app = app
        self.loopback = bind.loopback
        # the address it listens on (127.0.0.2, say) is a name clients use as well
        own = f"[{bind.host}]" if ":" in bind.host else bind.host
        names = {*_LOOPBACK_NAMES, own} if bind.loopback else set()
        self.hosts = frozenset({f"{name}:{port}" for name in names} | (names if port == 80 else set()))
        self._expected = f"Bearer {token}".encode() if token is not None else None
        # a client decides how often a refusal is logged: a line each would let it grow the log at will
        self.told = BudgetedLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a WebSocket: MCP has none, and it would pass no check here
            await send({"type": "websocket.close", "code": 1008})
            return
        refusal = self._refusal(Headers(scope=scope))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, headers: Headers) -> Response | None:
        host = headers.get("host", "")
        if self.loopback and host not in self.hosts:
            if self.told.budget.take():
                logger.warning("refused an HTTP request for Host %r: not this gateway's loopback address", host[:100])
            return Response("Invalid Host header", status_code=421)
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            if self.told.budget.take():
                logger.warning("refused an HTTP request from Origin %r", origin[:100])
            return Response("Invalid Origin header", status_code=403)
        if self._expected is not None:
            given = headers.get("authorization", "").encode("latin-1", errors="replace")
            if not hmac.compare_digest(given, self._expected):
                return Response(
                    "Unauthorized: send Authorization: Bearer <the token in the keyring, set by "
                    "`cellblock auth set --http`>",
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="cellblock"'},
                )
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        try:
            parts = urlsplit(origin)
        except ValueError:  # Python's newer releases refuse a bracketed host that is no address
            return False
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        if "@" in parts.netloc or parts.path or parts.query or parts.fragment:
            return False  # an origin is scheme://host[:port]; `localhost:1@evil.example` is evil.example's
        if self.loopback:
            return _loopback_host(parts.netloc)
        return parts.netloc == host


def reaching(config: Config, bind: Bind, port: int) -> list[str]:
    """The servers of `config` that can connect to a loopback gateway at `bind`, `port`, each with
    why: unjailed, on the host's network (`network: open`), or with an `allow_hosts` IP rule the
    egress proxy would follow to it (the address, or the unspecified one Linux connects to
    loopback, and the port). A name rule never leads to loopback; `network: none` has its own.

    Remote servers are not counted: one elsewhere cannot reach this machine's loopback, and one
    run on it is a program of the user's, outside any jail of Cellblock's.
    """
    host = "127.0.0.1" if bind.host == "localhost" else bind.host
    targets = (host, "::" if ":" in host else "0.0.0.0")
    found: list[str] = []
    for name, server in sorted(config.servers.items()):
        if not isinstance(server, LocalServer):
            continue
        if server.jail is False:
            found.append(f"'{name}' (jail: false)")
        elif server.jail.network == "open":
            found.append(f"'{name}' (network: open)")
        elif server.jail.proxied:  # ask never asks about a loopback address: only a rule opens it
            rules = [r for r in map(parse_rule, server.jail.allow_hosts) if r.allows_port(port)]
            led = [r.text for r in rules if any(r.covers(target) for target in targets)]
            if led:
                found.append(f"'{name}' (allow_hosts: {led[0]})")
    return found


def http_token(config: Config, bind: Bind, port: int) -> str | None:
    """The token HTTP clients must send, from the keyring; None only on a loopback bind without one,
    and none of the servers `reaching` it.

    Raises:
        CredentialError: the keyring cannot be read, or there is no token for a bind beyond
            loopback or one that a server reaches. Either way the gateway does not start: serving
            without the token a user set, or open to its own servers, would be weaker.
    """
    try:
        token = Keyring(config.credentials.allow_insecure).get(HTTP_TOKEN_ENTRY)
    except CredentialError as exc:
        raise CredentialError(
            f"cannot serve HTTP: the keyring, which holds the token HTTP clients must send, is not readable:\n{exc}"
        ) from None
    if token is None and not bind.loopback:
        raise CredentialError(
            f"refusing to serve HTTP on {bind.host}, which is not a loopback address, without a token: anyone "
            "who reaches the port could call every tool as you. Store one with `cellblock auth set --http` "
            "(read from stdin; for example `openssl rand -hex 32`), give it to your client as "
            "`Authorization: Bearer <token>`, and put TLS in front (see docs/http.md)"
        )
    servers = reaching(config, bind, port) if token is None else []
    if servers:
        raise CredentialError(
            f"refusing to serve HTTP on port {port} without a token: {'server' if len(servers) == 1 else 'servers'} "
            f"{', '.join(servers)} can connect to it as any program of yours can, and would call every tool as you "
            "and answer its own approvals. "
            "Store a token in the keyring with `cellblock auth set --http` (read from stdin; for example "
            "`openssl rand -hex 32`, keeping a copy) and give it to your client as `Authorization: Bearer <token>`; "
            "or give those servers network: none, or allow_hosts without this loopback address and port "
            "(see docs/http.md)"
        )
    return token


async def serve_http(gateway: Gateway, bind: Bind, sock: socket.socket, token: str | None) -> None:
    """Serve `gateway` on `sock` (bound to `bind`) until SIGINT or SIGTERM; every server is stopped after."""
    import uvicorn  # only an HTTP gateway needs it
    from mcp.server.transport_security import TransportSecuritySettings

    from cellblock.gateway.serve.connections import Connection, Connections, connection_cap, open_files

    app = gateway.server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        # Host and Origin are the Guard's, for both eras alike
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=int(gateway.config.defaults.max_message_size),
    )
    port = sock.getsockname()[1]
    files = open_files()
    pool = Connections(connection_cap(files))
    logger.debug("serve --http: up to %d connections at once (open files: %d)", pool.cap, files)
    if token is not None:  # redacted wherever it turns up, and no call may carry it to a server
        gateway.audit.add_secret(token, name=f"HTTP token (keyring entry '{HTTP_TOKEN_ENTRY}')")

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own handlers raise the signal again once it has stopped, and SIGTERM's
            # default action then ends the process before the gateway stops its servers
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=[])  # the app's lifespan only: the pool accepts the connections
            if self.started:
                made = functools.partial(Connection, pool, self.config, self.server_state, self.lifespan.state)
                tg.start_soon(pool.serve, sock, made)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            pool.stop()
            await super().shutdown()

    guard = Guard(app, bind, port, token)
    # no WebSocket (MCP has none), so no request leaves the HTTP protocol the pool counts
    config = uvicorn.Config(guard, http="h11", ws="none", lifespan="on", log_level="warning", access_log=False)
    # what a client can make uvicorn log (a bad request line) shares the budget of the Guard's refusals
    logging.getLogger("uvicorn.error").addFilter(guard.told)
    server = Server(config)
    try:
        async with gateway.running() as tg:
            tg.start_soon(_exit_on_signal, server)
            host = f"[{bind.host}]" if ":" in bind.host else bind.host
            logger.info(
                "serving on http://%s:%d%s (%s)",
                host,
                port,
                MCP_PATH,
                "a bearer token required" if token is not None else "loopback only, no token",
            )
            await server.serve()
    finally:
        gateway.audit.close()


async def _exit_on_signal(server: Any) -> None:
    """SIGTERM or SIGINT: uvicorn shuts down (a second SIGINT: at once), then the gateway stops its servers."""
    if sys.platform == "win32":  # no signal handlers on Windows' event loop
        return
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for sig in signals:
            server.force_exit = server.should_exit and sig == signal.SIGINT
            server.should_exit = True
