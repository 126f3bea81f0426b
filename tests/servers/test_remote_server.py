"""Quick checks of the remote Streamable HTTP test server with the SDK's real client.

The tests run `remote.py` as a subprocess (see `remote_run.py`) and talk to it over HTTP:
no auth, a static bearer token, and the full OAuth dance with `OAuthClientProvider` (dynamic
registration, PKCE authorization, refresh on expiry).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPError
from pydantic import AnyUrl

from tests.servers.remote_run import RemoteStartError, run_remote, spawn_remote, stop_remote

pytestmark = pytest.mark.anyio

Mode = Literal["legacy", "auto"]
MODES: list[Mode] = ["legacy", "auto"]
TOKEN = "remote-test-token-3f9a1c"
# Every client-side wait is bounded; a local server answers in milliseconds.
CALL_TIMEOUT = 10
# Nothing listens here: the redirect handler reads `code` from the Location header instead.
REDIRECT_URI = "http://127.0.0.1:9/callback"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def open_url() -> Iterator[str]:
    """One server without auth for the module: starting one costs about 2 s (the `mcp` import)."""
    with run_remote("none") as url:
        yield url


@pytest.fixture(scope="module")
def bearer_url() -> Iterator[str]:
    """One bearer-token server for the module; tests only read from it."""
    with run_remote("bearer", env={"REMOTE_TOKEN": TOKEN}) as url:
        yield url


@pytest.fixture
def server_log(tmp_path: Path) -> Iterator[tuple[IO[bytes], Path]]:
    """A file for the server's stderr (to check what it logs), with its path."""
    path = tmp_path / "remote.log"
    with path.open("wb") as handle:
        yield handle, path


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


class MemoryStorage:
    """The SDK's `TokenStorage` protocol, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class Browser:
    """Plays the user's browser: follows the authorization URL once and hands back code and state."""

    def __init__(self) -> None:
        self.redirects = 0
        self.result: AuthorizationCodeResult | None = None

    async def redirect(self, authorization_url: str) -> None:
        self.redirects += 1
        async with httpx2.AsyncClient(follow_redirects=False) as http:
            response = await http.get(authorization_url)
        assert response.status_code == 302, response.text
        query = parse_qs(urlparse(response.headers["location"]).query)
        self.result = AuthorizationCodeResult(code=query["code"][0], state=query["state"][0])

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None, "callback before redirect"
        return self.result


def oauth_provider(url: str, storage: MemoryStorage, browser: Browser) -> OAuthClientProvider:
    metadata = OAuthClientMetadata(
        client_name="cellblock-test",
        redirect_uris=[AnyUrl(REDIRECT_URI)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
    )
    return OAuthClientProvider(url, metadata, storage, browser.redirect, browser.callback)


def connect(url: str, http: httpx2.AsyncClient, mode: Mode = "auto") -> Client:
    return Client(streamable_http_client(url, http_client=http), mode=mode, cache=None)


async def whoami(client: Client) -> str:
    with anyio.fail_after(CALL_TIMEOUT):
        return text(await client.call_tool("whoami", {}))


@pytest.mark.parametrize("mode", MODES)
async def test_without_auth_echo_returns_the_text_and_whoami_is_anonymous(mode: Mode, open_url: str) -> None:
    async with httpx2.AsyncClient() as http, connect(open_url, http, mode) as client:
        with anyio.fail_after(CALL_TIMEOUT):
            assert text(await client.call_tool("echo", {"text": "hello"})) == "hello"
        assert await whoami(client) == "anonymous"


@pytest.mark.parametrize("mode", MODES)
async def test_bearer_with_the_right_token_is_let_in(mode: Mode, bearer_url: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers) as http, connect(bearer_url, http, mode) as client:
        assert await whoami(client) == "token ok"


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer wrong"}, {}], ids=["wrong", "missing"])
@pytest.mark.parametrize("mode", MODES)
async def test_bearer_with_a_wrong_or_missing_token_is_refused(
    mode: Mode, headers: dict[str, str], bearer_url: str
) -> None:
    """The server answers 401; the SDK client only says -32603 'Server returned an error response'."""
    async with httpx2.AsyncClient(headers=headers) as http:
        response = await http.post(bearer_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer ")

        # The status is lost: the same error stands for any 4xx/5xx whose body is not JSON-RPC,
        # raised from `Client.__aenter__` inside (nested) exception groups.
        refused = pytest.RaisesExc(
            MCPError,
            check=lambda e: (e.code, e.message) == (types.INTERNAL_ERROR, "Server returned an error response"),
        )
        with anyio.fail_after(CALL_TIMEOUT), pytest.RaisesGroup(refused, flatten_subgroups=True):
            async with connect(bearer_url, http, mode):
                pass


async def test_a_response_hook_sees_the_401_the_client_would_hide(bearer_url: str) -> None:
    """How a caller can tell "unauthorized" from other failures: an httpx2 response hook raises its own error."""

    class Unauthorized(Exception):
        pass

    async def refuse_401(response: httpx2.Response) -> None:
        if response.status_code == 401:
            raise Unauthorized(response.headers.get("www-authenticate", ""))

    async with httpx2.AsyncClient(event_hooks={"response": [refuse_401]}) as http:
        with anyio.fail_after(CALL_TIMEOUT), pytest.RaisesGroup(Unauthorized, flatten_subgroups=True):
            async with connect(bearer_url, http):
                pass


def test_no_command_line_carries_the_bearer_token(bearer_url: str) -> None:
    """The token reaches the server through its environment; `ps` shows every command line."""
    leaks = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if TOKEN.encode() in cmdline.read_bytes():
                leaks.append(cmdline.parent.name)
        except OSError:  # the process ended while we looked
            continue
    assert not leaks, f"processes with the token in argv: {leaks}"


def test_bearer_without_a_token_in_the_environment_does_not_start() -> None:
    with pytest.raises(RemoteStartError, match="exited with status 1"), run_remote("bearer", env={"REMOTE_TOKEN": ""}):
        pass


def test_sigterm_stops_the_server_with_status_0() -> None:
    proc, _url = spawn_remote("none")
    assert stop_remote(proc) == 0


async def test_oauth_first_call_registers_authorizes_once_and_uses_token_1() -> None:
    storage, browser = MemoryStorage(), Browser()
    with run_remote("oauth") as url:
        async with httpx2.AsyncClient(auth=oauth_provider(url, storage, browser)) as http, connect(url, http) as client:
            assert storage.client_info is not None
            assert await whoami(client) == f"client={storage.client_info.client_id} token=1 scopes=mcp"
    assert browser.redirects == 1
    assert storage.tokens is not None
    assert storage.tokens.expires_in == 3600
    assert storage.tokens.refresh_token


@pytest.mark.parametrize("mode", MODES)
async def test_oauth_expired_token_is_refreshed_without_a_second_authorization(
    mode: Mode, server_log: tuple[IO[bytes], Path]
) -> None:
    handle, log_path = server_log
    storage, browser = MemoryStorage(), Browser()
    with run_remote("oauth", lifetime=1, log=handle) as url:
        http = httpx2.AsyncClient(auth=oauth_provider(url, storage, browser))
        async with http, connect(url, http, mode) as client:
            assert storage.client_info is not None
            client_id = storage.client_info.client_id
            assert await whoami(client) == f"client={client_id} token=1 scopes=mcp"
            first = storage.tokens
            # Expiry is wall-clock time on both sides; no event can stand in for it.
            await anyio.sleep(1.2)
            assert await whoami(client) == f"client={client_id} token=2 scopes=mcp"
    assert browser.redirects == 1
    assert first is not None and storage.tokens is not None
    assert storage.tokens.refresh_token != first.refresh_token, "the refresh token was not rotated"

    log = log_path.read_text()
    assert log.count("grant authorization_code") == 1 and log.count("grant refresh_token") == 1
    assert storage.client_info is not None
    values = [first.access_token, first.refresh_token, storage.tokens.access_token, storage.tokens.refresh_token]
    values.append(storage.client_info.client_secret)
    leaked = [i for i, value in enumerate(values) if value and value in log]
    assert not leaked, f"server log contains secrets (indexes {leaked})"


async def test_stored_token_of_unknown_expiry_is_sent_and_its_401_reauthorizes_instead_of_refreshing() -> None:
    """GAP: the SDK keeps no expiry for tokens loaded from storage, and answers a 401 with a full authorization.

    `OAuthClientProvider` computes the expiry only from a token response it received itself, so a
    token loaded from `TokenStorage` counts as valid forever and is never refreshed proactively.
    Once the server refuses it, the 401 path runs the whole authorization again (the redirect
    handler, i.e. the user) although a working refresh token is stored. The test pins that
    behaviour so a change in the SDK shows up here.
    """
    storage, browser = MemoryStorage(), Browser()
    with run_remote("oauth", lifetime=1) as url:
        async with httpx2.AsyncClient(auth=oauth_provider(url, storage, browser)) as http, connect(url, http) as client:
            await whoami(client)
        assert browser.redirects == 1
        assert storage.client_info is not None
        client_id = storage.client_info.client_id

        # Expiry is wall-clock time on the server; no event can stand in for it.
        await anyio.sleep(1.2)
        # A new provider, as after a restart: same storage, so the same client and (expired) tokens.
        async with httpx2.AsyncClient(auth=oauth_provider(url, storage, browser)) as http, connect(url, http) as client:
            assert await whoami(client) == f"client={client_id} token=2 scopes=mcp"
        assert browser.redirects == 2, "expected a second full authorization, not a refresh"
