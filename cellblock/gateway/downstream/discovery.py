"""Where OAuth discovery may go, so that a remote server cannot steer the gateway's requests (SSRF).

A remote server's 401 names its protected resource metadata; that document names authorization
servers, and their metadata names the registration, authorization and token endpoints. The
server chooses every one of these URLs, so each is checked before the SDK's OAuth flow fetches it
(or shows it to the user to open), after the MCP security best practices on SSRF:

1. protected resource metadata comes only from the MCP server's own origin;
2. every other URL is on that origin or on an authorization server that this metadata (or the
   authorization server metadata kept from the last login) names;
3. `https:` only, except `http:` to a loopback host that is the MCP server's own host;
4. never a loopback, private, link-local, multicast or otherwise special address, unless the MCP
   server itself was reached on that address (its URL names it, or a connection that answered as
   the server went there; never what its name resolves to later, which a rebinding DNS could
   choose): names are resolved and every address must pass, and the request then goes to the
   checked address (`PinnedTransport`), so DNS cannot answer otherwise at connect time. Redirects
   the flow follows are requests like the others and pass the same check.

A refusal is told to `on_refused` (the audit log) and raised as `DiscoveryRefused`, naming the
server, the refused URL's origin (never its path or query) and why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import anyio
import httpx2
from mcp.client.auth.utils import extract_resource_metadata_from_www_auth

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.credentials import CredentialError
from cellblock.policy.hosts import is_ip, is_loopback, is_special_address, normalize_host
from cellblock.sandbox.egress import RESOLVE_TIMEOUT, Resolver, default_resolver

__all__ = ["PEER", "PIN", "DiscoveryGuard", "DiscoveryRefused", "Origin", "PinnedTransport", "origin", "show_origin"]

# The request extension that carries the checked address an auth-flow request must be sent to.
PIN = "cellblock.pinned_address"
# The response extension that carries the address the connection it came on went to.
PEER = "cellblock.peer_address"

Origin = tuple[str, str, int | None]


def origin(url: str | httpx2.URL) -> Origin:
    """(scheme, host in lower case, port with the scheme's default filled in) of `url`.

    Raises:
        ValueError: the port is not a number from 0 to 65535.
    """
    parts = urlsplit(str(url))
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def show_origin(url: str | httpx2.URL) -> str:
    """`scheme://host:port` of `url`, for messages: no userinfo, path or query, which may carry secrets."""
    try:
        scheme, host, port = origin(url)
    except ValueError:
        return "an unreadable URL"
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


class DiscoveryRefused(CredentialError):
    """An OAuth URL a remote server pointed the gateway at, which it will not fetch or open."""

    def __init__(self, server: str, url: str | httpx2.URL, reason: str) -> None:
        self.server, self.origin, self.reason = server, show_origin(url), reason
        super().__init__(f"server '{server}': OAuth discovery refused {self.origin}: {reason}")

    def record(self, audit: Audit) -> None:
        """Write the `oauth_refused` event: the server, the origin and why (never a path, query or token)."""
        audit.note("oauth_refused", self.server, origin=self.origin, reason=self.reason)


class DiscoveryGuard:
    """The checks for one remote server at `url`; `on_refused` is told each refusal before it is raised."""

    def __init__(
        self,
        server: str,
        url: str,
        on_refused: Callable[[DiscoveryRefused], None] | None = None,
        resolver: Resolver = default_resolver,
    ) -> None:
        self.server, self.url = server, url
        self.own = origin(url)
        self._own_host = _canonical(self.own[1])
        self._on_refused = on_refused
        self._resolver = resolver
        # the addresses the MCP server was reached on: special ones among them may be used
        self._own_addresses = {self._own_host} if self._own_host is not None and is_ip(self._own_host) else set()

    def connected(self, response: httpx2.Response) -> None:
        """Note the address a response of the MCP server itself came from (`PinnedTransport` notes it)."""
        peer = response.extensions.get(PEER)
        address = _canonical(peer) if isinstance(peer, str) else None
        if address is not None:
            self._own_addresses.add(address)

    def check_challenge(self, response: httpx2.Response) -> None:
        """A 401 (or 403) may name its protected resource metadata only on the server's own origin.

        Raises:
            DiscoveryRefused: it names another origin.
        """
        named = extract_resource_metadata_from_www_auth(response)
        if named is not None and _origin_or_none(named) != self.own:
            raise self._refuse(
                named,
                f"its protected resource metadata must be on its own origin ({show_origin(self.url)}), "
                "not where its 401 points",
            )

    async def admit(self, url: str | httpx2.URL, authorization_servers: Iterable[str]) -> str | None:
        """Check a URL of the flow; `authorization_servers` are those the server's vetted metadata names.

        Returns:
            The address to connect to, or None for the MCP server's own host (connected as configured).

        Raises:
            DiscoveryRefused: the URL breaks one of the rules in the module docstring.
            httpx2.ConnectError: its host does not resolve.
        """
        target = _origin_or_none(url)
        if target is None or target[0] not in ("http", "https") or not target[1]:
            raise self._refuse(url, "it is not an http(s) URL with a host")
        allowed = {self.own} | {o for o in map(_origin_or_none, authorization_servers) if o is not None}
        if target not in allowed:
            raise self._refuse(
                url,
                f"it is neither the server's own origin ({show_origin(self.url)}) "
                "nor an authorization server its resource metadata names",
            )
        host = _canonical(target[1])
        if host is None:
            raise self._refuse(url, "its host is not a plain name or IP address")
        own_host = host == self._own_host
        if target[0] == "http" and not (own_host and is_loopback(host)):
            raise self._refuse(url, "OAuth URLs must be https: (http: only to the server's own loopback host)")
        if own_host:
            return None
        port = target[2] or 443
        addresses = [host] if is_ip(host) else await self._resolve(host, port)
        for address in addresses:
            if is_special_address(address) and address not in self._own_addresses:
                where = f"{host} is at {address}, an" if address != host else f"{address} is an"
                raise self._refuse(
                    url, f"{where} address (loopback, private, link-local...) the server itself was not reached on"
                )
        return addresses[0]

    def _refuse(self, url: str | httpx2.URL, reason: str) -> DiscoveryRefused:
        refused = DiscoveryRefused(self.server, url, reason)
        if self._on_refused is not None:
            self._on_refused(refused)
        return refused

    async def _resolve(self, host: str, port: int) -> list[str]:
        try:
            with anyio.fail_after(RESOLVE_TIMEOUT):
                found = await self._resolver(host, port)
        except (OSError, TimeoutError) as exc:
            raise httpx2.ConnectError(f"cannot resolve {host} ({exc})") from exc
        addresses = list(dict.fromkeys(a for a in map(_canonical, found) if a is not None))
        if not addresses:
            raise httpx2.ConnectError(f"cannot resolve {host} (no addresses)")
        return addresses


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends a request that carries a `PIN` to that checked address, with the TLS name and Host of
    its URL; every other request as it is, its response noting (`PEER`) the address it came from
    while the connection is still open. A pinned connection is not kept for reuse: another host
    on the same address must not get a connection made for this one's name."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        address = request.extensions.get(PIN)
        if not isinstance(address, str):
            response = await self._inner.handle_async_request(request)
            peer = _peer(response)
            if peer is not None:
                response.extensions[PEER] = peer
            return response
        headers = request.headers.copy()
        headers["Connection"] = "close"
        extensions = {key: value for key, value in request.extensions.items() if key != PIN}
        extensions["sni_hostname"] = request.url.host
        pinned = httpx2.Request(
            request.method,
            request.url.copy_with(host=address),
            headers=headers,
            stream=request.stream,
            extensions=extensions,
        )
        return await self._inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _peer(response: httpx2.Response) -> str | None:
    stream = response.extensions.get("network_stream")
    try:
        peer = stream.get_extra_info("server_addr") if stream is not None else None
    except (OSError, AttributeError):  # the connection is gone, or it is not a socket
        return None
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


def _origin_or_none(url: str | httpx2.URL) -> Origin | None:
    try:
        return origin(url)
    except ValueError:
        return None


def _canonical(host: str) -> str | None:
    try:
        return normalize_host(host)
    except ValueError:
        return None
