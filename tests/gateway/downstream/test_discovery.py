"""OAuth discovery goes only where the MCP server's own origin and its named authorization servers are.

The guard's rules are driven with a fake resolver (a public name that resolves to 169.254.169.254
needs no DNS of its own); the provider runs inside a real httpx2 client against `MockTransport`,
next to the SDK's bare provider as the control that the same 401 steers it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler

import anyio
import httpx2
import pytest
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthToken

from cellblock.gateway.credentials import Keyring
from cellblock.gateway.downstream.discovery import (
    PEER,
    PIN,
    DiscoveryGuard,
    DiscoveryRefused,
    PinnedTransport,
    show_origin,
)
from cellblock.gateway.downstream.oauth import KeyringTokenStorage, client_metadata, oauth_provider
from tests.servers.threaded import serving

pytestmark = pytest.mark.anyio

SERVER = "https://mcp.example/mcp"
AUTH = "https://auth.example"
DEADLINE = 5
DNS: Mapping[str, list[str]] = {
    "mcp.example": ["93.184.215.14"],
    "auth.example": ["93.184.215.15", "2606:2800:21f:cb07::1"],
    "metadata.example": ["169.254.169.254"],  # a public-looking name for the cloud metadata service
    "intranet.example": ["10.1.2.3"],
    "split.example": ["93.184.215.16", "192.168.1.1"],  # one good address does not excuse a bad one
    "mapped.example": ["::ffff:169.254.169.254"],
    "lan-mcp.example": ["10.9.9.9"],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def resolve(host: str, port: int) -> list[str]:
    if host not in DNS:
        raise OSError(f"no such host {host}")
    return DNS[host]


def answered_from(address: str) -> httpx2.Response:
    """A response of the MCP server that came over a connection to `address`, as `PinnedTransport` notes it."""
    return httpx2.Response(401, extensions={PEER: address})


def guard(url: str = SERVER) -> tuple[DiscoveryGuard, list[DiscoveryRefused]]:
    told: list[DiscoveryRefused] = []
    return DiscoveryGuard("notes", url, told.append, resolver=resolve), told


@pytest.mark.parametrize(
    ("url", "servers", "address"),
    [
        ("https://mcp.example/.well-known/oauth-protected-resource/mcp", [], None),  # its own host: as configured
        ("https://mcp.example/register", [], None),
        ("https://auth.example/.well-known/oauth-authorization-server", [AUTH], "93.184.215.15"),
        ("https://auth.example:443/token", [f"{AUTH}/tenant/"], "93.184.215.15"),  # the origin counts, not the path
        ("https://93.184.215.20/token", ["https://93.184.215.20"], "93.184.215.20"),
    ],
)
async def test_the_servers_origin_and_its_named_authorization_servers_are_admitted(
    url: str, servers: list[str], address: str | None
) -> None:
    check, told = guard()
    assert await check.admit(url, servers) == address
    assert told == []


@pytest.mark.parametrize(
    ("url", "servers", "reason"),
    [
        ("https://elsewhere.example/token", [AUTH], "neither the server's own origin"),
        ("https://auth.example:8443/token", [AUTH], "neither the server's own origin"),
        ("http://mcp.example/register", [], "neither the server's own origin"),  # another scheme, another origin
        ("https://mcp.example@evil.example/token", [], "neither the server's own origin"),
        ("http://auth.example/token", ["http://auth.example"], "must be https:"),
        ("http://127.0.0.1:9000/token", ["http://127.0.0.1:9000"], "must be https:"),  # loopback, not the server's
        (
            "https://metadata.example/latest/meta-data",
            ["https://metadata.example"],
            "is at 169.254.169.254, an address",
        ),
        ("https://intranet.example/token", ["https://intranet.example"], "is at 10.1.2.3"),
        ("https://split.example/token", ["https://split.example"], "is at 192.168.1.1"),
        ("https://mapped.example/token", ["https://mapped.example"], "is at ::ffff:a9fe:a9fe, an address"),
        ("https://169.254.169.254/latest", ["https://169.254.169.254"], "169.254.169.254 is an address"),
        ("https://[::ffff:a9fe:a9fe]/latest", ["https://[::ffff:a9fe:a9fe]"], "::ffff:a9fe:a9fe is an address"),
        ("https://127.0.0.1/token", ["https://127.0.0.1"], "127.0.0.1 is an address"),
        ("https://[fd00::1]/token", ["https://[fd00::1]"], "fd00::1 is an address"),
        ("https://224.0.0.1/token", ["https://224.0.0.1"], "224.0.0.1 is an address"),
        ("https://0x7f.1/token", ["https://0x7f.1"], "not a plain name or IP address"),
        ("ftp://auth.example/token", ["ftp://auth.example"], "not an http(s) URL"),
        ("https://auth.example:99999/token", [AUTH], "not an http(s) URL"),
    ],
)
async def test_anything_else_is_refused_told_and_named_by_origin(url: str, servers: list[str], reason: str) -> None:
    check, told = guard()
    with pytest.raises(DiscoveryRefused) as caught:
        await check.admit(url, servers)
    assert told == [caught.value]
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"server 'notes': OAuth discovery refused {show_origin(url)}: ")


async def test_the_refusal_carries_the_origin_only_never_the_path_query_or_userinfo() -> None:
    check, _ = guard()
    with pytest.raises(DiscoveryRefused) as caught:
        await check.admit("https://user:pw@elsewhere.example:8443/a/b?token=s3cr3t-value#frag", [])
    assert caught.value.origin == "https://elsewhere.example:8443"
    assert "s3cr3t" not in str(caught.value) and "pw" not in str(caught.value) and "/a/b" not in str(caught.value)


@pytest.mark.parametrize(
    ("server", "url", "servers", "address"),
    [
        # the server is on loopback over http: its own host may be used over http on any port
        ("http://127.0.0.1:8000/mcp", "http://127.0.0.1:9000/token", ["http://127.0.0.1:9000"], None),
        ("http://localhost:8000/mcp", "http://localhost:8000/register", [], None),
        ("http://[::1]:8000/mcp", "http://[::1]:9000/token", ["http://[::1]:9000"], None),
        # the server itself is on a private address: that one address may be used, no other
        ("https://10.9.9.9/mcp", "https://lan-mcp.example/token", ["https://lan-mcp.example"], "10.9.9.9"),
        ("https://lan-mcp.example/mcp", "https://10.9.9.9:8443/token", ["https://10.9.9.9:8443"], "10.9.9.9"),
    ],
)
async def test_a_special_address_is_admitted_only_where_the_server_itself_is(
    server: str, url: str, servers: list[str], address: str | None
) -> None:
    check, told = guard(server)
    host = httpx2.URL(server).host
    if host in DNS:  # the server was reached where its name pointed when the client connected
        check.connected(answered_from(DNS[host][0]))
    assert await check.admit(url, servers) == address
    assert told == []


async def test_a_special_address_the_servers_name_resolves_to_later_opens_nothing() -> None:
    """The server's name, asked again, says 10.9.9.9 (a rebinding DNS): that is not where the
    server was reached, so an authorization server there is refused."""
    check, told = guard("https://lan-mcp.example/mcp")
    check.connected(answered_from("93.184.215.14"))
    with pytest.raises(DiscoveryRefused, match="the server itself was not reached on"):
        await check.admit("https://10.9.9.9:8443/token", ["https://10.9.9.9:8443"])
    assert len(told) == 1
    # the honest control: reached on 10.9.9.9, the same URL is admitted, pinned there
    check.connected(answered_from("10.9.9.9"))
    assert await check.admit("https://10.9.9.9:8443/token", ["https://10.9.9.9:8443"]) == "10.9.9.9"


@pytest.mark.parametrize(
    ("server", "url"),
    [
        ("http://127.0.0.1:8000/mcp", "http://127.0.0.2:9000/token"),  # loopback, but another address
        ("http://127.0.0.1:8000/mcp", "http://localhost:9000/token"),  # a name, not the server's host
        ("https://10.9.9.9/mcp", "https://10.9.9.8/token"),
        ("https://lan-mcp.example/mcp", "https://intranet.example/token"),
        ("https://127.0.0.1/mcp", "https://metadata.example/token"),
    ],
)
async def test_the_servers_own_special_address_opens_no_other(server: str, url: str) -> None:
    check, told = guard(server)
    with pytest.raises(DiscoveryRefused):
        await check.admit(url, [url])
    assert len(told) == 1


async def test_a_name_that_does_not_resolve_is_a_connection_failure_not_a_refusal() -> None:
    check, told = guard()
    with pytest.raises(httpx2.ConnectError, match=r"cannot resolve nowhere\.example"):
        await check.admit("https://nowhere.example/token", ["https://nowhere.example"])
    assert told == []


def challenge(url: str) -> httpx2.Response:
    request = httpx2.Request("POST", SERVER)
    return httpx2.Response(401, headers={"WWW-Authenticate": f'Bearer resource_metadata="{url}"'}, request=request)


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://mcp.example/.well-known/oauth-protected-resource/mcp", False),
        ("https://mcp.example/any/path/at/all", False),
        ("https://auth.example/.well-known/oauth-protected-resource", True),  # even a named AS: not the resource's
        ("http://127.0.0.1:9000/prm", True),
        ("http://169.254.169.254/latest/meta-data/", True),
        ("https://mcp.example:8443/prm", True),
    ],
)
def test_a_401_may_name_its_metadata_on_the_servers_own_origin_only(url: str, refused: bool) -> None:
    check, told = guard()
    if refused:
        with pytest.raises(DiscoveryRefused, match="must be on its own origin"):
            check.check_challenge(challenge(url))
    else:
        check.check_challenge(challenge(url))
    assert len(told) == int(refused)


# -- the provider in a real client ------------------------------------------------------------

STEERED = "http://127.0.0.1:9/latest/meta-data/?token=s3cr3t-value"


def steering(seen: list[str], metadata: str) -> httpx2.MockTransport:
    """A server whose 401 points its resource metadata at `metadata`; everything else is a 404."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        if str(request.url) == SERVER:
            return httpx2.Response(401, headers={"WWW-Authenticate": f'Bearer resource_metadata="{metadata}"'})
        return httpx2.Response(404)

    return httpx2.MockTransport(handle)


class Memory:
    """The SDK's `TokenStorage` in memory, for a provider that needs no keyring."""

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        pass

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        pass


async def no_browser(url: str) -> None:
    raise AssertionError(f"opened {url}")


async def no_callback() -> AuthorizationCodeResult:
    raise AssertionError("waited for a callback")


async def test_the_sdks_bare_provider_follows_a_steered_401_which_is_the_attack() -> None:
    """The control: without the guard the same 401 sends the gateway to the URL the server chose."""
    seen: list[str] = []
    bare = OAuthClientProvider(
        SERVER, client_metadata("http://127.0.0.1:33418/callback", None), Memory(), no_browser, no_callback
    )
    with anyio.fail_after(DEADLINE):
        async with httpx2.AsyncClient(transport=steering(seen, STEERED), auth=bare) as client:
            with pytest.raises(Exception):  # noqa: B017 - whatever the SDK makes of the 404s
                await client.post(SERVER, content=b"{}")
    assert STEERED in seen


@pytest.mark.parametrize("metadata", [STEERED, "http://169.254.169.254/latest/meta-data/", "https://mcp.example:444/"])
async def test_cellblocks_provider_refuses_a_steered_401_before_any_request(metadata: str, keyring_env: object) -> None:
    seen: list[str] = []
    told: list[DiscoveryRefused] = []
    check = DiscoveryGuard("notes", SERVER, told.append, resolver=resolve)
    storage = KeyringTokenStorage(Keyring(), "t-steered")
    auth = oauth_provider(
        "notes", SERVER, storage, "http://127.0.0.1:33418/callback", None, no_browser, no_callback, check
    )
    with anyio.fail_after(DEADLINE):
        async with httpx2.AsyncClient(transport=steering(seen, metadata), auth=auth) as client:
            with pytest.raises(DiscoveryRefused) as caught:
                await client.post(SERVER, content=b"{}")
    assert seen == [SERVER]  # the 401, and nothing after it
    assert told == [caught.value] and caught.value.origin == show_origin(metadata)
    assert "s3cr3t" not in str(caught.value)


async def test_a_pinned_request_goes_to_the_checked_address_with_its_own_name_and_no_reuse() -> None:
    sent: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, json={"ok": True})

    transport = PinnedTransport(httpx2.MockTransport(handle))
    async with httpx2.AsyncClient(transport=transport) as client:
        request = client.build_request("POST", "https://auth.example:8443/token?x=1", content=b"grant")
        request.extensions[PIN] = "93.184.215.15"
        response = await client.send(request)
        await client.get("https://other.example/plain")
    assert json.loads(response.content) == {"ok": True}
    pinned, plain = sent
    assert str(pinned.url) == "https://93.184.215.15:8443/token?x=1"
    assert pinned.headers["host"] == "auth.example:8443"
    assert pinned.extensions["sni_hostname"] == "auth.example"  # the certificate is checked for the name
    assert pinned.headers["connection"] == "close" and pinned.read() == b"grant"
    assert PIN not in pinned.extensions
    assert str(plain.url) == "https://other.example/plain" and "sni_hostname" not in plain.extensions


def authorization_server(seen: list[str], foreign: str | None) -> httpx2.MockTransport:
    """A server whose metadata is on its origin and names `AUTH`, whose metadata in turn puts the
    `foreign` endpoint (registration, authorization or token) on another host."""
    endpoints = {kind: f"{AUTH}/{kind}" for kind in ("registration", "authorization", "token")}
    if foreign is not None:
        endpoints[foreign] = f"https://elsewhere.example/{foreign}"
    prm = {"resource": SERVER, "authorization_servers": [f"{AUTH}/"]}
    asm = {
        "issuer": f"{AUTH}/",
        "authorization_endpoint": endpoints["authorization"],
        "token_endpoint": endpoints["token"],
        "registration_endpoint": endpoints["registration"],
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
    }
    client = {
        "client_id": "cid",
        "redirect_uris": ["http://127.0.0.1:33418/callback"],
        "token_endpoint_auth_method": "none",
    }
    routes = {
        "https://mcp.example/.well-known/oauth-protected-resource/mcp": httpx2.Response(200, json=prm),
        f"{AUTH}/.well-known/oauth-authorization-server": httpx2.Response(200, json=asm),
        endpoints["registration"]: httpx2.Response(201, json=client),
        endpoints["token"]: httpx2.Response(200, json={"access_token": "at-1", "token_type": "Bearer"}),
    }

    def handle(request: httpx2.Request) -> httpx2.Response:
        url = str(request.url).split("?")[0]
        seen.append(url)
        if url == SERVER:
            if "authorization" in request.headers:
                return httpx2.Response(200, json={})
            metadata = "https://mcp.example/.well-known/oauth-protected-resource/mcp"
            return httpx2.Response(401, headers={"WWW-Authenticate": f'Bearer resource_metadata="{metadata}"'})
        return routes.get(url, httpx2.Response(404))

    return httpx2.MockTransport(handle)


@pytest.mark.parametrize("foreign", [None, "registration", "authorization", "token"])
async def test_the_authorization_servers_metadata_cannot_put_an_endpoint_elsewhere(
    foreign: str | None, keyring_env: object
) -> None:
    seen: list[str] = []
    opened: list[str] = []

    async def browser(url: str) -> None:
        opened.append(url)

    async def callback() -> AuthorizationCodeResult:
        state = httpx2.URL(opened[0]).params["state"]
        return AuthorizationCodeResult(code="code-1", state=state)

    told: list[DiscoveryRefused] = []
    check = DiscoveryGuard("notes", SERVER, told.append, resolver=resolve)
    storage = KeyringTokenStorage(Keyring(), f"t-endpoints-{foreign}")
    auth = oauth_provider("notes", SERVER, storage, "http://127.0.0.1:33418/callback", None, browser, callback, check)
    try:
        with anyio.fail_after(DEADLINE):
            async with httpx2.AsyncClient(transport=authorization_server(seen, foreign), auth=auth) as client:
                if foreign is None:  # the control: everything on the named authorization server, and it works
                    assert (await client.post(SERVER, content=b"{}")).status_code == 200
                else:
                    with pytest.raises(DiscoveryRefused) as caught:
                        await client.post(SERVER, content=b"{}")
                    assert told == [caught.value] and caught.value.origin == "https://elsewhere.example:443"
    finally:
        await storage.forget_tokens()
        await storage.forget_client()
    assert not any("elsewhere.example" in url for url in seen + opened)
    assert (foreign is None) == (told == [])
    if foreign == "token":
        assert len(opened) == 1  # refused after the browser came back, before the code was sent anywhere
    elif foreign is not None:
        assert opened == []


async def test_a_pinned_request_reaches_the_checked_address_without_asking_dns_again() -> None:
    """`pinned.invalid` resolves nowhere: the request still arrives, at the pinned address, under its name."""
    hosts: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hosts.append(self.headers.get("Host"))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as base, anyio.fail_after(DEADLINE):
        port = base.rsplit(":", 1)[1]
        async with httpx2.AsyncClient(transport=PinnedTransport()) as client:
            request = client.build_request("GET", f"http://pinned.invalid:{port}/x")
            request.extensions[PIN] = "127.0.0.1"
            assert (await client.send(request)).status_code == 204
            with pytest.raises(httpx2.ConnectError):  # the control: unpinned, the name goes to DNS
                await client.get(f"http://pinned.invalid:{port}/x")
    assert hosts == [f"pinned.invalid:{port}"]


async def test_the_address_a_real_connection_went_to_is_what_the_guard_learns() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as base, anyio.fail_after(DEADLINE):
        check, _ = guard(f"http://localhost:{base.rsplit(':', 1)[1]}/mcp")
        async with httpx2.AsyncClient(transport=PinnedTransport()) as client:
            check.connected(await client.post(f"{base}/mcp"))
        # reached on 127.0.0.1 by name: that loopback address may be used, and no other
        assert await check.admit("https://127.0.0.1/token", ["https://127.0.0.1"]) == "127.0.0.1"
        with pytest.raises(DiscoveryRefused):
            await check.admit("https://127.0.0.2/token", ["https://127.0.0.2"])
