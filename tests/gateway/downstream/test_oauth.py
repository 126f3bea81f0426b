"""OAuth pieces: the loopback listener that catches the redirect, the keyring token storage, and
what the provider restores from it after a restart.

The listener is driven over real TCP; the storage uses the private Secret Service (`keyring_env`).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import anyio
import httpx2
import pytest
from keyring.backends import SecretService
from keyring.errors import PasswordDeleteError
from mcp.client.auth.utils import create_client_registration_request
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthMetadata, OAuthToken
from pydantic import AnyUrl

from cellblock.gateway.credentials import (
    SERVICE,
    CredentialError,
    Keyring,
    client_key_entry,
    client_secret_entry,
    id_token_entry,
    oauth_entries,
)
from cellblock.gateway.downstream import callback
from cellblock.gateway.downstream.callback import LoopbackCatcher
from cellblock.gateway.downstream.oauth import KeyringTokenStorage, client_metadata, oauth_provider, redirect_uri_of

pytestmark = pytest.mark.anyio

# Everything here is local: a second is plenty; five leaves slack for a loaded machine.
DEADLINE = 5

METADATA = OAuthMetadata.model_validate(
    {
        "issuer": "https://auth.example/",
        "authorization_endpoint": "https://auth.example/authorize",
        "token_endpoint": "https://auth.example/token",
        "registration_endpoint": "https://auth.example/register",
    }
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def http_get(port: int, target: str, method: str = "GET") -> tuple[str, str]:
    """The status line and body the listener answers to one request (it closes after answering)."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        data = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                data += await stream.receive()
    head, _, body = data.decode().partition("\r\n\r\n")
    return head.split("\r\n", 1)[0], body


@contextlib.asynccontextmanager
async def waiting(catcher: LoopbackCatcher) -> AsyncIterator[dict[str, Any]]:
    """Run `catcher.wait()` in the background; the dict gets its `result` once it returns."""
    outcome: dict[str, Any] = {}

    async def wait() -> None:
        outcome["result"] = await catcher.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        yield outcome


async def test_the_callback_gives_code_state_and_issuer_and_the_browser_a_page() -> None:
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, waiting(catcher) as outcome:
            status, body = await http_get(catcher.port, "/callback?code=c&state=s&iss=i")
        assert status == "HTTP/1.1 200 OK"
        assert "Cellblock is logged in to notes" in body
        assert outcome["result"] == AuthorizationCodeResult(code="c", state="s", iss="i")


async def test_each_authorization_of_one_login_gets_its_own_callback() -> None:
    # a scope step-up authorizes twice in one login: the second must not be handed the first's
    # (already used) code and state, or the SDK refuses it as a state mismatch
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, anyio.create_task_group() as group:
            group.start_soon(catcher.run)
            await http_get(catcher.port, "/callback?code=first&state=s1")
            assert (await catcher.next()).code == "first"
            second = anyio.Event()

            async def take() -> None:
                got.append(await catcher.next())
                second.set()

            got: list[AuthorizationCodeResult] = []
            group.start_soon(take)
            await http_get(catcher.port, "/callback?code=second&state=s2")
            await second.wait()
            assert got == [AuthorizationCodeResult(code="second", state="s2")]
            group.cancel_scope.cancel()


async def test_an_error_redirect_reaches_the_authorization_that_waits() -> None:
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, anyio.create_task_group() as group:
            group.start_soon(catcher.run)
            await http_get(catcher.port, "/callback?error=access_denied")
            with pytest.raises(CredentialError, match="refused the login: access_denied"):
                await catcher.next()
            group.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [
        ("GET", "/favicon.ico", "HTTP/1.1 404 Not Found"),
        ("GET", "/", "HTTP/1.1 404 Not Found"),
        ("GET", "/callback/extra?code=x", "HTTP/1.1 404 Not Found"),
        ("GET", "/other?next=/callback&code=x", "HTTP/1.1 404 Not Found"),
        ("POST", "/callback?code=x", "HTTP/1.1 404 Not Found"),
        ("GET", "/callback?state=s", "HTTP/1.1 400 Bad Request"),  # no code
        ("GET", "/callback?code=&state=s", "HTTP/1.1 400 Bad Request"),
    ],
)
async def test_other_requests_are_answered_and_the_catcher_keeps_waiting(method: str, target: str, status: str) -> None:
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, waiting(catcher) as outcome:
            assert (await http_get(catcher.port, target, method))[0] == status
            assert "result" not in outcome
            assert (await http_get(catcher.port, "/callback?code=good&state=s"))[0] == "HTTP/1.1 200 OK"
        assert outcome["result"] == AuthorizationCodeResult(code="good", state="s")


async def test_an_error_redirect_is_refused_naming_the_server_and_the_reason() -> None:
    answer: dict[str, tuple[str, str]] = {}

    async def browser(port: int) -> None:
        answer["page"] = await http_get(port, "/callback?error=access_denied&error_description=user+said+<no>&state=s")

    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, anyio.create_task_group() as group:
            group.start_soon(browser, catcher.port)
            with pytest.raises(CredentialError) as caught:
                await catcher.wait()
    assert str(caught.value) == "the authorization server for 'notes' refused the login: user said <no>"
    status, body = answer["page"]
    assert status == "HTTP/1.1 400 Bad Request"
    assert "Login to notes failed: user said &lt;no&gt;" in body  # escaped: the reason is the server's text


async def test_an_error_without_description_names_the_error_code() -> None:
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, anyio.create_task_group() as group:
            group.start_soon(http_get, catcher.port, "/callback?error=access_denied")
            with pytest.raises(CredentialError, match=r"for 'notes' refused the login: access_denied$"):
                await catcher.wait()


async def test_the_wanted_port_is_used_when_free() -> None:
    port = free_port()
    async with LoopbackCatcher("notes", port) as catcher:
        assert catcher.port == port
        assert catcher.redirect_uri == f"http://127.0.0.1:{port}/callback"


async def test_a_taken_port_falls_back_to_a_free_one_and_the_redirect_uri_follows() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with anyio.fail_after(DEADLINE):
            async with LoopbackCatcher("notes", port) as catcher, waiting(catcher) as outcome:
                assert catcher.port not in (port, 0)
                assert catcher.redirect_uri == f"http://127.0.0.1:{catcher.port}/callback"
                await http_get(catcher.port, "/callback?code=c")
        assert outcome["result"].code == "c"


async def test_a_connection_closed_without_a_request_is_skipped() -> None:
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, waiting(catcher) as outcome:
            await (await anyio.connect_tcp("127.0.0.1", catcher.port)).aclose()
            await http_get(catcher.port, "/callback?code=c")
        assert outcome["result"].code == "c"


async def test_a_connection_that_sends_nothing_is_dropped_so_a_later_request_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The listener drops an idle connection after IDLE_SECONDS; shortened so the test is fast.
    # Without the drop the good request below would wait forever.
    monkeypatch.setattr(callback, "IDLE_SECONDS", 0.2)
    with anyio.fail_after(DEADLINE):
        async with LoopbackCatcher("notes", 0) as catcher, waiting(catcher) as outcome:
            idle = await anyio.connect_tcp("127.0.0.1", catcher.port)  # sends nothing, stays open
            async with idle:
                status, _ = await http_get(catcher.port, "/callback?code=c")
        assert status == "HTTP/1.1 200 OK"
        assert outcome["result"].code == "c"


@pytest.fixture
def server(keyring_env: Mapping[str, str]) -> Iterator[str]:
    """A fresh server name whose OAuth entries are removed afterwards."""
    name = f"t-{secrets.token_hex(6)}"
    yield name
    for entry in (*oauth_entries(name), client_secret_entry(name), client_key_entry(name), id_token_entry(name)):
        with contextlib.suppress(PasswordDeleteError):
            SecretService.Keyring().delete_password(SERVICE, entry)


async def no_browser(url: str) -> None:
    raise AssertionError(f"the test opened a browser at {url}")


async def no_callback() -> AuthorizationCodeResult:
    raise AssertionError("the test waited for a callback")


def provider(storage: KeyringTokenStorage, server: str) -> Any:
    redirect = "http://127.0.0.1:33418/callback"
    return oauth_provider(server, "https://mcp.example/mcp", storage, redirect, None, no_browser, no_callback)


async def test_tokens_round_trip_with_their_absolute_expiry_and_the_metadata(server: str) -> None:
    storage = KeyringTokenStorage(Keyring(), server)
    provider(storage, server).context.oauth_metadata = METADATA  # as discovery leaves it
    token = OAuthToken(access_token="at", refresh_token="rt", expires_in=3600, scope="read")
    before = time.time()
    await storage.set_tokens(token)
    after = time.time()

    restarted = KeyringTokenStorage(Keyring(), server)
    assert await restarted.get_tokens() == token
    assert restarted.expires_at is not None and before + 3600 <= restarted.expires_at <= after + 3600
    assert restarted.metadata == METADATA
    assert await restarted.token_state() == (restarted.expires_at, True)


async def test_every_token_stored_or_read_is_told_for_redaction(server: str) -> None:
    told: list[str] = []
    await KeyringTokenStorage(Keyring(), server, told.append).set_tokens(
        OAuthToken(access_token="at", refresh_token="rt")
    )
    assert told == ["at", "rt"]
    told.clear()
    await KeyringTokenStorage(Keyring(), server, told.append).get_tokens()
    assert told == ["at", "rt"]


async def test_a_token_without_expiry_or_metadata_stores_none_for_them(server: str) -> None:
    storage = KeyringTokenStorage(Keyring(), server)
    await storage.set_tokens(OAuthToken(access_token="at"))
    restarted = KeyringTokenStorage(Keyring(), server)
    assert await restarted.get_tokens() == OAuthToken(access_token="at")
    assert (restarted.expires_at, restarted.metadata) == (None, None)
    assert await restarted.token_state() == (None, False)


async def test_nothing_stored_reads_as_none(server: str) -> None:
    storage = KeyringTokenStorage(Keyring(), server)
    assert await storage.get_tokens() is None
    assert await storage.get_client_info() is None
    assert await storage.token_state() is None


async def test_a_damaged_token_entry_says_to_log_out(server: str) -> None:
    Keyring().set(oauth_entries(server)[0], "{not json")
    with pytest.raises(CredentialError) as caught:
        await KeyringTokenStorage(Keyring(), server).get_tokens()
    assert str(caught.value) == (
        f"keyring entry '{server}/oauth-tokens' is damaged; run `cellblock auth logout {server}` and log in again"
    )


@pytest.mark.parametrize("record", ['"text"', "{}", '{"token": {"token_type": "Bearer"}}', '{"client_id": 3}'])
async def test_a_token_entry_of_the_wrong_shape_says_to_log_out(server: str, record: str) -> None:
    tokens, client = oauth_entries(server)
    Keyring().set(tokens, record)
    Keyring().set(client, record)
    storage = KeyringTokenStorage(Keyring(), server)
    for read, entry in ((storage.get_tokens, tokens), (storage.get_client_info, client)):
        with pytest.raises(CredentialError) as caught:
            await read()
        assert str(caught.value) == (
            f"keyring entry '{entry}' is damaged; run `cellblock auth logout {server}` and log in again"
        )


async def test_client_info_round_trips_and_names_its_redirect_uri(server: str) -> None:
    client = OAuthClientInformationFull(
        client_id="cid-1",
        client_id_issued_at=1700000000,
        **client_metadata("http://127.0.0.1:40001/callback", "read").model_dump(),
    )
    await KeyringTokenStorage(Keyring(), server).set_client_info(client)
    stored = await KeyringTokenStorage(Keyring(), server).get_client_info()
    assert stored == client
    assert redirect_uri_of(stored) == "http://127.0.0.1:40001/callback"
    assert redirect_uri_of(None) is None


async def test_forgetting_removes_tokens_and_client(server: str) -> None:
    storage = KeyringTokenStorage(Keyring(), server)
    await storage.set_tokens(OAuthToken(access_token="at"))
    await storage.set_client_info(OAuthClientInformationFull(client_id="c", redirect_uris=[AnyUrl("http://x/cb")]))
    await storage.forget_tokens()
    await storage.forget_client()
    assert await storage.get_tokens() is None and await storage.get_client_info() is None
    await storage.forget_tokens()  # forgetting twice is not an error


def test_client_metadata_is_a_public_client_with_code_and_refresh_grants() -> None:
    meta = client_metadata("http://127.0.0.1:33418/callback", None)
    assert [str(u) for u in meta.redirect_uris or []] == ["http://127.0.0.1:33418/callback"]
    assert meta.token_endpoint_auth_method == "none"
    assert meta.grant_types == ["authorization_code", "refresh_token"]
    assert meta.scope is None


async def store_record(server: str, token: OAuthToken, expires_at: float | None, metadata: bool) -> None:
    record = {
        "token": token.model_dump(mode="json", exclude_none=True),
        "expires_at": expires_at,
        "metadata": METADATA.model_dump(mode="json", exclude_none=True) if metadata else None,
    }
    await Keyring().aset(oauth_entries(server)[0], json.dumps(record))


async def test_after_a_restart_the_provider_has_the_stored_expiry_and_metadata(server: str) -> None:
    expires_at = time.time() + 600
    await store_record(server, OAuthToken(access_token="at", refresh_token="rt"), expires_at, metadata=True)
    restarted = provider(KeyringTokenStorage(Keyring(), server), server)
    await restarted._initialize()
    assert restarted.context.token_expiry_time == expires_at
    assert restarted.context.oauth_metadata == METADATA
    assert restarted.context.current_tokens.access_token == "at"
    assert restarted.context.is_token_valid()


async def test_an_expired_stored_token_is_not_valid_after_a_restart(server: str) -> None:
    await store_record(server, OAuthToken(access_token="at", refresh_token="rt"), time.time() - 1, metadata=True)
    restarted = provider(KeyringTokenStorage(Keyring(), server), server)
    await restarted._initialize()
    assert restarted.context.current_tokens is not None
    assert not restarted.context.is_token_valid()


async def test_without_stored_metadata_the_expiry_is_not_restored(server: str) -> None:
    """Without the issuer's metadata a refresh would go to the MCP server's own /token, so the
    token is kept as if it had no expiry and a 401 leads to discovery and a new login instead."""
    await store_record(server, OAuthToken(access_token="at", refresh_token="rt"), time.time() - 1, metadata=False)
    restarted = provider(KeyringTokenStorage(Keyring(), server), server)
    await restarted._initialize()
    assert restarted.context.current_tokens is not None
    assert restarted.context.oauth_metadata is None
    assert restarted.context.token_expiry_time is None


async def test_metadata_discovered_in_this_process_is_not_replaced_by_the_stored_one(server: str) -> None:
    await store_record(server, OAuthToken(access_token="at"), time.time() + 600, metadata=True)
    fresh = METADATA.model_copy(update={"token_endpoint": AnyUrl("https://auth.example/v2/token")})
    restarted = provider(KeyringTokenStorage(Keyring(), server), server)
    restarted.context.oauth_metadata = fresh
    await restarted._initialize()
    assert restarted.context.oauth_metadata == fresh


async def test_a_pre_registered_client_comes_from_the_config_and_its_secret_from_the_keyring(server: str) -> None:
    storage = KeyringTokenStorage(Keyring(), server, client_id="known-client")
    public = await storage.get_client_info()
    assert public is not None and public.client_id == "known-client" and public.client_secret is None
    assert public.token_endpoint_auth_method == "none"
    Keyring().set(client_secret_entry(server), "s3cret")
    told: list[str] = []
    storage = KeyringTokenStorage(Keyring(), server, told.append, client_id="known-client")
    confidential = await storage.get_client_info()
    assert confidential is not None and confidential.client_secret == "s3cret" and told == ["s3cret"]
    # the SDK never stores over it: it is not the SDK's to keep
    await storage.set_client_info(OAuthClientInformationFull(client_id="other", redirect_uris=[AnyUrl("http://x/cb")]))
    assert Keyring().get(oauth_entries(server)[1]) is None


@pytest.mark.parametrize(
    ("supported", "method"),
    [
        (None, "client_secret_basic"),  # RFC 8414: basic unless the server says otherwise
        (["client_secret_post"], "client_secret_post"),
        (["client_secret_post", "client_secret_basic"], "client_secret_basic"),
        (["none"], "client_secret_basic"),  # a server that names no secret method gets the RFC's default
    ],
)
async def test_a_pre_registered_secret_goes_where_the_authorization_server_takes_it(
    server: str, supported: list[str] | None, method: str
) -> None:
    Keyring().set(client_secret_entry(server), "s3cret")
    storage = KeyringTokenStorage(Keyring(), server, client_id="known-client")
    provider = oauth_provider(
        server, "https://mcp.example/mcp", storage, "http://127.0.0.1:1/callback", None, no_browser, no_callback
    )
    provider.context.client_info = await storage.get_client_info()
    provider.context.oauth_metadata = METADATA.model_copy(update={"token_endpoint_auth_methods_supported": supported})
    data, headers = provider.context.prepare_token_auth({"grant_type": "authorization_code"}, {})
    assert (
        provider.context.client_info is not None and provider.context.client_info.token_endpoint_auth_method == method
    )
    sent_in_body = data.get("client_secret") == "s3cret"
    assert sent_in_body == (method == "client_secret_post")
    assert headers.get("Authorization", "").startswith("Basic ") == (method == "client_secret_basic")


async def machine(
    server: str, scope: str | None, client_credentials: bool = True, client_auth: str | None = None, **told: Any
) -> Any:
    """A provider for the pre-registered client `machine`, its metadata known (`told`: `on_secret`)."""
    storage = KeyringTokenStorage(Keyring(), server, told.get("on_secret"), "machine", client_auth)
    provider = oauth_provider(
        server,
        "https://mcp.example/mcp",
        storage,
        "http://x/cb",
        scope,
        no_browser,
        no_callback,
        None,
        None,
        client_credentials,
    )
    provider.context.client_info = await storage.get_client_info()
    provider.context.oauth_metadata = METADATA
    return provider


async def test_with_client_credentials_the_token_is_asked_for_with_the_clients_own_secret(server: str) -> None:
    Keyring().set(client_secret_entry(server), "s3cret")
    provider = await machine(server, "notes.read")
    provider.context.oauth_metadata = METADATA.model_copy(
        update={"token_endpoint_auth_methods_supported": ["client_secret_post"]}
    )
    request = await provider._perform_authorization()  # no browser, no redirect: the token request itself
    assert (request.method, str(request.url)) == ("POST", "https://auth.example/token")
    form = dict(item.split("=", 1) for item in request.content.decode().split("&"))
    assert form["grant_type"] == "client_credentials" and form["client_id"] == "machine"
    assert form["client_secret"] == "s3cret" and form["scope"] == "notes.read"  # as the metadata takes it
    # the control: without the grant the flow is a person's login, which goes to the browser
    login = await machine(server, None, client_credentials=False)

    async def admitted(url: Any, servers: Any) -> None:
        return None  # auth.example does not resolve here; the guard has its own tests

    login._guard.admit = admitted  # type: ignore[attr-defined]  # reason: the flow's own guard, bypassed here
    with pytest.raises(AssertionError, match=re.escape("opened a browser at https://auth.example/authorize")):
        await login._perform_authorization()


async def test_client_credentials_without_a_secret_say_how_to_set_it(server: str) -> None:
    provider = await machine(server, None)
    with pytest.raises(CredentialError, match=f"cellblock auth set {server} --client-secret"):
        await provider._perform_authorization()


@pytest.mark.parametrize(
    ("supported", "method"),
    [
        (None, "none"),  # nothing said: a public client, as before
        (["none", "client_secret_basic"], "none"),  # a public client wherever one is taken: no secret to keep
        (["client_secret_post", "client_secret_basic"], "client_secret_basic"),
        (["client_secret_post"], "client_secret_post"),
        (["private_key_jwt"], "none"),  # nothing Cellblock can do: it asks as before, and the server says no
    ],
)
async def test_registration_asks_for_the_token_auth_method_the_authorization_server_takes(
    server: str, supported: list[str] | None, method: str
) -> None:
    storage = KeyringTokenStorage(Keyring(), server)
    provider = oauth_provider(
        server, "https://mcp.example/mcp", storage, "http://127.0.0.1:1/callback", None, no_browser, no_callback
    )
    metadata = METADATA.model_copy(update={"token_endpoint_auth_methods_supported": supported})
    provider.context.oauth_metadata = metadata
    built = create_client_registration_request(metadata, provider.context.client_metadata, "https://auth.example")
    sent = provider._registered_as_metadata_says(built)
    body = json.loads(sent.content)
    assert body["token_endpoint_auth_method"] == method and body["redirect_uris"] == ["http://127.0.0.1:1/callback"]
    other = httpx2.Request("POST", "https://auth.example/token", json={"token_endpoint_auth_method": "none"})
    assert provider._registered_as_metadata_says(other) is other  # only the registration is rewritten


def test_a_client_metadata_document_is_handed_to_the_flow_as_the_client_id(server: str) -> None:
    storage = KeyringTokenStorage(Keyring(), server)
    url = "https://app.example/cellblock/client.json"
    provider = oauth_provider(
        "cimd",
        "https://mcp.example/mcp",
        storage,
        "http://127.0.0.1:1/cb",
        None,
        no_browser,
        no_callback,
        client_metadata_url=url,
    )
    assert provider.context.client_metadata_url == url
