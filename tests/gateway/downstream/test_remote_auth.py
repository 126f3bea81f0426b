"""A remote server's credential goes to its own origin only, and failures are explained plainly.

`BearerAuth` and `HttpWatch` run inside a real httpx2 client, against `MockTransport` for
arbitrary hosts and against two small HTTP servers on loopback for `remote_client` itself.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import anyio
import httpx2
import pytest
from keyring.backends import SecretService
from keyring.errors import PasswordDeleteError

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import RemoteServer
from cellblock.gateway.credentials import SERVICE, CredentialError, Keyring
from cellblock.gateway.downstream.httpwatch import HttpWatch
from cellblock.gateway.downstream.oauth import LoginNeeded
from cellblock.gateway.downstream.remote import BearerAuth, explain, remote_client
from tests.servers.threaded import serving

pytestmark = pytest.mark.anyio

TOKEN = "tok-3f9a1c"
URL = "https://mcp.example/mcp"
# Everything here is local: a second is plenty; five leaves slack for a loaded machine.
DEADLINE = 5


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def remote(url: str = URL, auth: str = "none", headers: str = "{}", secrets: str = "{}") -> RemoteServer:
    text = (
        f"version: 1\nservers:\n  notes:\n    url: {url}\n    headers: {headers}\n    auth: {{type: {auth}}}\n"
        f"    secrets: {secrets}\n"
    )
    server = parse_config(text).servers["notes"]
    assert isinstance(server, RemoteServer)
    return server


Seen = list[tuple[str, str | None]]


def recording(seen: Seen, route: Callable[[httpx2.Request], httpx2.Response] | None = None) -> httpx2.MockTransport:
    """A transport that notes (url, Authorization) of every request and answers 200 unless `route` says otherwise."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append((str(request.url), request.headers.get("authorization")))
        return route(request) if route is not None else httpx2.Response(200, text="ok")

    return httpx2.MockTransport(handle)


@pytest.mark.parametrize(
    ("target", "sent"),
    [
        ("https://mcp.example/mcp", True),
        ("https://mcp.example/other?x=1", True),  # the origin, not the path, is what counts
        ("https://mcp.example:443/mcp", True),
        ("https://MCP.Example/mcp", True),
        ("http://mcp.example/mcp", False),
        ("https://mcp.example:8443/mcp", False),
        ("https://evil.example/mcp", False),
        ("https://mcp.example.evil.example/mcp", False),
        ("https://evil.example/?next=https://mcp.example/mcp", False),
        ("https://mcp.example@evil.example/mcp", False),
        ("https://127.0.0.1/mcp", False),
    ],
)
async def test_the_token_goes_to_the_servers_own_origin_only(target: str, sent: bool) -> None:
    seen: Seen = []
    async with httpx2.AsyncClient(transport=recording(seen), auth=BearerAuth(TOKEN, URL)) as client:
        await client.get(target)
    assert seen[0][1] == (f"Bearer {TOKEN}" if sent else None)


@pytest.mark.parametrize(
    ("location", "sent"),
    [
        ("/elsewhere", True),  # same origin: the control
        ("https://mcp.example:8443/mcp", False),
        ("https://evil.example/mcp", False),
        ("http://mcp.example/mcp", False),
    ],
)
async def test_a_redirect_away_from_the_origin_does_not_carry_the_token(location: str, sent: bool) -> None:
    seen: Seen = []

    def route(request: httpx2.Request) -> httpx2.Response:
        if str(request.url) == URL:
            return httpx2.Response(307, headers={"Location": location})
        return httpx2.Response(200, text="ok")

    transport = recording(seen, route)
    async with httpx2.AsyncClient(transport=transport, auth=BearerAuth(TOKEN, URL), follow_redirects=True) as client:
        response = await client.post(URL, content=b"{}")
    assert response.status_code == 200 and len(seen) == 2
    assert seen[0] == (URL, f"Bearer {TOKEN}")
    assert seen[1][1] == (f"Bearer {TOKEN}" if sent else None)


async def test_an_upgrade_from_http_to_https_on_the_same_host_keeps_the_token() -> None:
    """httpx keeps Authorization on a plain http -> https redirect of the same host; the token
    already crossed in clear on the first request, so this exposes nothing more."""
    seen: Seen = []

    def route(request: httpx2.Request) -> httpx2.Response:
        if request.url.scheme == "http":
            return httpx2.Response(301, headers={"Location": "https://mcp.example/mcp"})
        return httpx2.Response(200)

    auth = BearerAuth(TOKEN, "http://mcp.example/mcp")
    async with httpx2.AsyncClient(transport=recording(seen, route), auth=auth, follow_redirects=True) as client:
        await client.get("http://mcp.example/mcp")
    assert [header for _, header in seen] == [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]


def test_the_repr_of_bearer_auth_shows_the_origin_not_the_token() -> None:
    auth = BearerAuth(TOKEN, URL)
    assert TOKEN not in repr(auth) and TOKEN not in str(auth)
    assert "mcp.example" in repr(auth)


@pytest.mark.parametrize(
    ("status", "session", "unauthorized", "session_lost"),
    [
        (200, True, False, False),
        (401, False, True, False),
        (404, True, False, True),
        (404, False, False, False),  # a 404 before any session is the wrong URL, not a lost session
        (403, True, False, False),
        (500, True, False, False),
    ],
)
async def test_the_watch_notes_401_and_a_lost_session(
    status: int, session: bool, unauthorized: bool, session_lost: bool
) -> None:
    watch = HttpWatch()
    transport = httpx2.MockTransport(lambda request: httpx2.Response(status))
    headers = {"Mcp-Session-Id": "abc"} if session else {}
    async with httpx2.AsyncClient(transport=transport, event_hooks={"response": [watch.on_response]}) as client:
        await client.post(URL, headers=headers)
    assert (watch.unauthorized, watch.session_lost, watch.login) == (unauthorized, session_lost, None)


async def test_a_session_id_only_in_the_response_is_not_a_lost_session() -> None:
    watch = HttpWatch()
    transport = httpx2.MockTransport(lambda request: httpx2.Response(404, headers={"Mcp-Session-Id": "abc"}))
    async with httpx2.AsyncClient(transport=transport, event_hooks={"response": [watch.on_response]}) as client:
        await client.post(URL)
    assert watch.session_lost is False


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        ("bearer", f"{URL} refused the token (HTTP 401): run `cellblock auth set notes` with a valid one"),
        ("oauth", f"{URL} refused the login (HTTP 401): run `cellblock auth login notes`"),
        ("none", f"{URL} requires authentication (HTTP 401): set auth: {{type: bearer}} or {{type: oauth}}"),
    ],
)
def test_a_401_is_explained_by_the_auth_the_server_uses(auth: str, expected: str) -> None:
    watch = HttpWatch(unauthorized=True)
    assert explain("notes", remote(auth=auth), watch, RuntimeError("Session terminated")) == expected


def test_a_login_needed_is_explained_before_a_401() -> None:
    watch = HttpWatch(unauthorized=True, login=LoginNeeded("notes", URL))
    message = explain("notes", remote(auth="oauth"), watch, RuntimeError("x"))
    assert message == "server 'notes' needs a login: run `cellblock auth login notes`"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def connect_error(url: str) -> httpx2.ConnectError:
    """The ConnectError httpx2 raises for `url`, where nothing listens."""
    async with httpx2.AsyncClient() as client:
        with pytest.raises(httpx2.ConnectError) as caught:
            await client.get(url)
    return caught.value


def wrapped_in_groups(exc: BaseException) -> BaseException:
    return ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("other"), ExceptionGroup("inner", [exc])])


def caused_by(exc: BaseException) -> BaseException:
    try:
        try:
            raise exc
        except BaseException as inner:
            raise RuntimeError("Connection closed") from inner
    except RuntimeError as outer:
        return outer


def in_context_of(exc: BaseException) -> BaseException:
    try:
        try:
            raise exc
        except BaseException:
            raise RuntimeError("Connection closed")  # noqa: B904 - the implicit chain is what is tested
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize("wrap", [lambda e: e, wrapped_in_groups, caused_by, in_context_of])
async def test_an_unreachable_server_is_named_with_its_url(wrap: Callable[[BaseException], BaseException]) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    error = await connect_error(url)
    message = explain("notes", remote(url=url), HttpWatch(), wrap(error))
    assert message is not None and message.startswith(f"cannot reach {url}: ")


def test_an_unreachable_server_inside_a_group_that_caused_the_error_is_found() -> None:
    outer = caused_by(ExceptionGroup("g", [httpx2.ConnectError("All connection attempts failed")]))
    assert explain("notes", remote(), HttpWatch(), outer) == f"cannot reach {URL}: All connection attempts failed"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx2.ConnectTimeout("timed out"), f"cannot reach {URL}: timed out"),
        (httpx2.ConnectError(""), f"cannot reach {URL}: connection failed"),
        (httpx2.ReadError("peer closed\nmore"), f"lost the connection to {URL}: peer closed"),
        (httpx2.RemoteProtocolError(""), f"lost the connection to {URL}: RemoteProtocolError"),
        (
            httpx2.HTTPStatusError(
                "boom", request=httpx2.Request("POST", URL), response=httpx2.Response(502, request=None)
            ),
            f"{URL} answered HTTP 502",
        ),
    ],
)
def test_http_failures_are_explained(exc: BaseException, expected: str) -> None:
    assert explain("notes", remote(), HttpWatch(), wrapped_in_groups(exc)) == expected


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad JSON"), ExceptionGroup("g", [KeyError("x"), RuntimeError("y")]), caused_by(OSError("disk"))],
)
def test_an_unrelated_error_is_not_explained(exc: BaseException) -> None:
    assert explain("notes", remote(), HttpWatch(), exc) is None


@dataclass
class Origin:
    """A loopback HTTP server that notes (path, Authorization, X-Extra) of each request.

    `/401` answers 401; `/away?to=URL` redirects to URL; anything else answers 200.
    """

    url: str = ""
    seen: list[tuple[str, str | None, str | None]] = field(default_factory=list)


@contextlib.contextmanager
def origin() -> Iterator[Origin]:
    record = Origin()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            record.seen.append((self.path, self.headers.get("Authorization"), self.headers.get("X-Extra")))
            if self.path == "/401":
                self.send_response(401)
            elif self.path.startswith("/away?to="):
                self.send_response(307)
                self.send_header("Location", self.path.removeprefix("/away?to="))
            else:
                self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as record.url:
        yield record


@pytest.fixture
def name(keyring_env: Mapping[str, str]) -> Iterator[str]:
    """A fresh server name; its bearer entry is removed afterwards."""
    server = f"t{secrets.token_hex(4)}"
    yield server
    with contextlib.suppress(PasswordDeleteError):
        SecretService.Keyring().delete_password(SERVICE, server)


async def test_remote_client_sends_the_keyring_token_to_its_server_and_not_after_a_redirect(name: str) -> None:
    Keyring().set(name, TOKEN)
    with origin() as home, origin() as other:
        server = remote(url=f"{home.url}/mcp", auth="bearer", headers="{X-Extra: present}")
        watch = HttpWatch()
        with anyio.fail_after(DEADLINE):
            async with await remote_client(name, server, Keyring(), watch) as client:
                assert TOKEN not in repr(client.auth)
                await client.get(f"{home.url}/mcp")
                await client.get(f"{home.url}/away?to={other.url}/landing", follow_redirects=True)
                await client.get(f"{other.url}/direct")
                await client.get(f"{home.url}/401")
    assert home.seen == [
        ("/mcp", f"Bearer {TOKEN}", "present"),
        (f"/away?to={other.url}/landing", f"Bearer {TOKEN}", "present"),
        ("/401", f"Bearer {TOKEN}", "present"),
    ]
    assert other.seen == [("/landing", None, "present"), ("/direct", None, "present")]
    assert watch.unauthorized is True


async def test_remote_client_without_a_stored_token_says_how_to_set_one(name: str) -> None:
    with pytest.raises(CredentialError) as caught:
        await remote_client(name, remote(auth="bearer"), Keyring(), HttpWatch())
    assert str(caught.value) == f"server '{name}' has no token in the keyring: run `cellblock auth set {name}`"


@pytest.mark.parametrize(("auth", "secrets"), [("bearer", "{}"), ("oauth", "{}"), ("none", "{X-Key: k}")])
async def test_remote_client_with_credentials_but_no_keyring_is_refused(auth: str, secrets: str) -> None:
    with pytest.raises(CredentialError, match=r"server 'notes' has credentials in the keyring, which is not available"):
        await remote_client("notes", remote(auth=auth, secrets=secrets), None, HttpWatch())


async def test_a_secret_header_goes_to_the_servers_own_origin_only(name: str) -> None:
    entry = f"{name}-extra"
    Keyring().set(entry, TOKEN)
    try:
        with origin() as home, origin() as other:
            server = remote(url=f"{home.url}/mcp", secrets=f"{{X-Extra: {entry}}}")
            with anyio.fail_after(DEADLINE):
                async with await remote_client(name, server, Keyring(), HttpWatch()) as client:
                    await client.get(f"{home.url}/mcp")
                    await client.get(f"{home.url}/away?to={other.url}/landing", follow_redirects=True)
        assert [seen[2] for seen in home.seen] == [TOKEN, TOKEN]
        assert other.seen == [("/landing", None, None)]
    finally:
        Keyring().delete(entry)


async def test_a_secret_header_missing_from_the_keyring_says_how_to_set_it(name: str) -> None:
    with pytest.raises(CredentialError) as caught:
        await remote_client(name, remote(secrets="{X-Key: nowhere-set}"), Keyring(), HttpWatch())
    assert str(caught.value) == (
        f"server '{name}' needs the header X-Key from keyring entry 'nowhere-set', which is not set: "
        "run `cellblock auth set nowhere-set`"
    )


async def test_remote_client_without_auth_sends_no_authorization() -> None:
    with origin() as home:
        with anyio.fail_after(DEADLINE):
            async with await remote_client("notes", remote(url=f"{home.url}/mcp"), None, HttpWatch()) as client:
                await client.get(f"{home.url}/mcp")
        assert home.seen == [("/mcp", None, None)]
