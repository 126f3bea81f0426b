"""The HTTP side of a remote server: its client, the credential its config names, and plain errors.

A bearer token is read from the keyring at each connect (so `cellblock auth set` takes effect at
the next reconnect) and sent only to the server's own origin: a redirect elsewhere does not carry
it. OAuth goes through gateway/downstream/oauth.py (its login redirect caught by callback.py), its
discovery only where gateway/downstream/discovery.py admits.
The SDK reports HTTP failures without the status, so a response hook notes a 401 and `explain`
turns what happened into an error that says what to do.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp.types as types
from mcp import Client
from mcp.client.auth.utils import union_scopes
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult

from cellblock.gateway.ask.elicitation import Asker
from cellblock.gateway.config.model import RemoteServer
from cellblock.gateway.credentials import CredentialError, Keyring
from cellblock.gateway.downstream.callback import CALLBACK_PATH, LOGIN_PORT, LOGIN_SECONDS, LoopbackCatcher
from cellblock.gateway.downstream.connection import CLIENT_INFO
from cellblock.gateway.downstream.discovery import DiscoveryGuard, DiscoveryRefused, PinnedTransport, origin
from cellblock.gateway.downstream.enterprise import enterprise_provider
from cellblock.gateway.downstream.httpwatch import HttpWatch
from cellblock.gateway.downstream.keys import ServerKeys
from cellblock.gateway.downstream.oauth import KeyringTokenStorage, LoginNeeded, oauth_provider, redirect_uri_of
from cellblock.gateway.errors import first_line
from cellblock.gateway.wire.stdio import DEFAULT_LINE_LIMIT

__all__ = [
    "BearerAuth",
    "BoundedTransport",
    "MessageTooLarge",
    "explain",
    "login",
    "login_through_client",
    "remote_client",
]

# No read timeout: a call's own deadline (the server's `timeout:`) bounds it, and the stream of
# a long call may be quiet for minutes.
_TIMEOUT = httpx2.Timeout(30.0, read=None)


class BearerAuth(httpx2.Auth):
    """`Authorization: Bearer …` on requests to the server's own origin, and nowhere else."""

    def __init__(self, token: str, url: str) -> None:
        self._token, self._origin = token, origin(url)

    def __repr__(self) -> str:  # the default repr would show the token in any debug dump
        return f"BearerAuth(origin={self._origin!r})"

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        if origin(request.url) == self._origin:
            request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


class MessageTooLarge(httpx2.StreamError):
    """A remote server's JSON answer passed `max_message_size`: reading it stopped there."""


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._inner:
            size += len(chunk)
            if size > self._limit:
                raise MessageTooLarge(
                    f"its answer is larger than Cellblock accepts (more than {self._limit:,} bytes; max_message_size)"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """HTTP for one remote server, whose JSON answers are read up to `limit` bytes and no further.

    An answer over the limit fails the request it answered (the SDK turns the stream error into an
    error response for it), as a local server's long line does; the SDK bounds each SSE event itself.
    """

    def __init__(self, limit: int, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._limit = limit
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        json = response.headers.get("content-type", "").startswith("application/json")
        if json and isinstance(response.stream, httpx2.AsyncByteStream):  # what an async transport gives
            response.stream = _Bounded(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def remote_client(
    name: str,
    server: RemoteServer,
    keyring: Keyring | None,
    watch: HttpWatch,
    on_secret: Callable[[str], None] | None = None,
    limit: int = DEFAULT_LINE_LIMIT,
    on_refused: Callable[[DiscoveryRefused], None] | None = None,
) -> httpx2.AsyncClient:
    """The HTTP client for `server`, authenticated as its `auth:` says; `on_secret` is told each token,
    `on_refused` each OAuth URL refused; JSON answers longer than `limit` bytes fail (`BoundedTransport`).

    Raises:
        CredentialError: the credential is not in the keyring, or no keyring is usable.
    """
    auth: httpx2.Auth | None = None
    if (server.auth.type != "none" or server.secrets) and keyring is None:
        raise CredentialError(f"server '{name}' has credentials in the keyring, which is not available")
    secret_headers = {}
    if keyring is not None:  # None only when there is nothing to read from it (above)
        for header, entry in server.secrets.items():
            value = await keyring.aget(entry)
            if value is None:
                raise CredentialError(
                    f"server '{name}' needs the header {header} from keyring entry '{entry}', "
                    f"which is not set: run `cellblock auth set {entry}`"
                )
            if on_secret is not None:
                on_secret(value)
            secret_headers[header] = value
        if server.auth.type == "bearer":
            token = await keyring.aget(name)
            if not token:
                raise CredentialError(f"server '{name}' has no token in the keyring: run `cellblock auth set {name}`")
            if on_secret is not None:
                on_secret(token)
            auth = BearerAuth(token, server.url)
        elif server.auth.type != "none":
            auth = await _serving_oauth(name, server, keyring, watch, on_secret, on_refused)
    hooks: dict[str, list[Any]] = {"response": [watch.on_response]}
    if secret_headers:
        hooks["request"] = [_origin_headers(secret_headers, server.url)]
    transport = BoundedTransport(limit, PinnedTransport())
    return httpx2.AsyncClient(
        headers=server.headers, auth=auth, timeout=_TIMEOUT, event_hooks=hooks, transport=transport
    )


async def remote_transport(
    name: str, server: RemoteServer, keys: ServerKeys, watch: HttpWatch, max_message: int
) -> AbstractAsyncContextManager[Any]:
    """The Streamable HTTP connection of one run of server `name`, its credential read anew.

    Raises:
        CredentialError: a secret or token is not in the keyring, or the keyring is refused.
    """
    keyring = keys.keyring() if server.auth.type != "none" or server.secrets else None
    http = await remote_client(name, server, keyring, watch, keys.add, max_message, keys.refused)
    return streamable_http_client(server.url, http_client=http, max_sse_event_size=max_message)


def _origin_headers(headers: Mapping[str, str], url: str) -> Callable[[httpx2.Request], Awaitable[None]]:
    """A request hook adding `headers` to requests for the server's own origin only (not to an
    authorization server, not after a redirect elsewhere). A redirect copies the previous
    request's headers, so for any other origin they are removed, not just left out."""
    own = origin(url)

    async def add(request: httpx2.Request) -> None:
        if origin(request.url) == own:
            request.headers.update(headers)
        else:
            for header in headers:
                request.headers.pop(header, None)

    return add


async def _serving_oauth(
    name: str,
    server: RemoteServer,
    keyring: Keyring,
    watch: HttpWatch,
    on_secret: Callable[[str], None] | None,
    on_refused: Callable[[DiscoveryRefused], None] | None,
) -> httpx2.Auth:
    """OAuth while serving: tokens are used and refreshed; a needed login is reported, not started."""
    storage = KeyringTokenStorage(keyring, name, on_secret, server.auth.client_id, server.auth.client_auth)
    if server.auth.grant == "identity_assertion":  # no login, no discovery: the config names both ends
        return await enterprise_provider(name, server, storage, on_secret)

    def refused(exc: DiscoveryRefused) -> None:
        watch.refused = exc
        if on_refused is not None:
            on_refused(exc)

    redirect = redirect_uri_of(await storage.get_client_info()) or f"http://127.0.0.1:{LOGIN_PORT}{CALLBACK_PATH}"

    async def no_browser(url: str) -> None:
        watch.login = LoginNeeded(name, url)
        raise watch.login

    async def no_callback() -> AuthorizationCodeResult:
        raise LoginNeeded(name, server.url)

    guard = DiscoveryGuard(name, server.url, refused)
    return oauth_provider(
        name,
        server.url,
        storage,
        redirect,
        server.auth.scope,
        no_browser,
        no_callback,
        guard,
        server.auth.client_metadata_url,
        server.auth.grant == "client_credentials",
    )


def explain(name: str, server: RemoteServer, watch: HttpWatch, exc: BaseException) -> str | None:
    """A plain reason for a failed connection to `server`, or None when it is not an HTTP matter."""
    if watch.refused is not None:
        return str(watch.refused)
    if watch.login is not None:
        return str(watch.login)
    if watch.unauthorized:
        if server.auth.type == "bearer":
            return f"{server.url} refused the token (HTTP 401): run `cellblock auth set {name}` with a valid one"
        if server.auth.type == "oauth":
            return f"{server.url} refused the login (HTTP 401): run `cellblock auth login {name}`"
        return f"{server.url} requires authentication (HTTP 401): set auth: {{type: bearer}} or {{type: oauth}}"
    for error in _leaves(exc):
        if isinstance(error, httpx2.ConnectError | httpx2.ConnectTimeout):
            return f"cannot reach {server.url}: {first_line(error) if str(error) else 'connection failed'}"
        if isinstance(error, httpx2.HTTPStatusError):
            return f"{server.url} answered HTTP {error.response.status_code}"
        if isinstance(error, httpx2.TransportError):
            return f"lost the connection to {server.url}: {first_line(error)}"
    return None


def _leaves(exc: BaseException, depth: int = 0) -> list[BaseException]:
    """Every exception inside `exc`: group members and causes, at any depth (bounded)."""
    if depth > 16:
        return []
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub, depth + 1)]
    behind = exc.__cause__ or exc.__context__
    return [exc, *(_leaves(behind, depth + 1) if behind is not None else [])]


async def login(
    name: str,
    server: RemoteServer,
    store: Keyring,
    show: Callable[[str], Awaitable[None]],
    on_secret: Callable[[str], None] | None = None,
    on_refused: Callable[[DiscoveryRefused], None] | None = None,
    scope: str | None = None,
) -> int:
    """An interactive OAuth login: `show` puts the authorization URL before the user (a browser,
    a printed line, the client's URL elicitation); the redirect is caught on loopback. The tokens
    land in the keyring. Returns how many tools the server lists with them. `on_refused` is told
    each OAuth URL the server pointed at that discovery refused; `scope` is asked for beside
    `auth.scope` (a step-up's: the granted and the challenged scopes).

    Raises:
        CredentialError: the login was refused, declined, timed out or failed.
    """
    storage = KeyringTokenStorage(store, name, on_secret, server.auth.client_id, server.auth.client_auth)
    stored = await storage.get_client_info()
    registered = redirect_uri_of(stored)
    port = (urlsplit(registered).port if registered else None) or LOGIN_PORT
    async with LoopbackCatcher(name, port) as catcher:
        if catcher.port != port and (server.auth.client_id or server.auth.client_metadata_url):
            # a client that cannot register anew keeps its redirect URI: a login on another port is refused
            raise CredentialError(
                f"cannot log in to '{name}': its client's redirect URI names port {port} on this machine, which "
                "another program holds (another login?); free it and log in again"
            )
        scope = union_scopes(server.auth.scope, scope)
        wanted = set((scope or "").split())
        if registered != catcher.redirect_uri or not wanted <= set(((stored and stored.scope) or "").split()):
            # registered for another port, or for fewer scopes than auth.scope names: register anew
            await storage.forget_client()
        # a login asks again, even when tokens are stored (another account, new scopes)
        await storage.forget_tokens()

        refusals: list[DiscoveryRefused] = []

        def refused(exc: DiscoveryRefused) -> None:
            refusals.append(exc)
            if on_refused is not None:
                on_refused(exc)

        guard = DiscoveryGuard(name, server.url, refused)
        auth: httpx2.Auth = oauth_provider(
            name,
            server.url,
            storage,
            catcher.redirect_uri,
            scope,
            show,
            catcher.next,
            guard,
            server.auth.client_metadata_url,
            server.auth.grant == "client_credentials",
        )
        if server.auth.grant == "identity_assertion":  # no browser: the identity provider's token instead
            auth = await enterprise_provider(name, server, storage, on_secret)
        http = httpx2.AsyncClient(headers=server.headers, auth=auth, timeout=_TIMEOUT, transport=PinnedTransport())
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(catcher.run)  # listening from now on
                async with (
                    http,
                    Client(streamable_http_client(server.url, http_client=http), client_info=CLIENT_INFO) as client,
                ):
                    tools = len((await client.list_tools()).tools)
                tg.cancel_scope.cancel()
        except Exception as exc:  # noqa: BLE001 - any failure (the SDK's flow, HTTP, ours) becomes one plain message
            if refusals:  # the SDK may have wrapped it, or answered in its place
                raise refusals[0] from None
            leaves = _leaves(exc)
            ours = next((e for e in leaves if isinstance(e, CredentialError)), None)
            if ours is not None:
                raise ours from None
            if any(isinstance(e, TimeoutError) for e in leaves):
                raise CredentialError(f"no login for '{name}' arrived within {LOGIN_SECONDS / 60:g} minutes") from None
            # every login starts with a 401, so only connection failures are explained from HTTP
            first = next((e for e in leaves if not isinstance(e, BaseExceptionGroup)), exc)
            reason = explain(name, server, HttpWatch(), exc) or f"{type(first).__name__}: {first_line(first)}"
            raise CredentialError(f"login to '{name}' failed: {reason}") from None
        if await storage.get_tokens() is None:  # the tokens were forgotten above: none came
            raise CredentialError(
                f"'{name}' ({server.url}) answered without asking for a login, so there is nothing to store; "
                "if it needs none, give it auth: {type: none}"
            )
        return tools


async def login_through_client(
    name: str, server: RemoteServer, keys: ServerKeys, asker: Asker, scope: str | None = None
) -> int:
    """The OAuth login of `cellblock auth login`, with the client's URL elicitation as the browser:
    the user opens the authorization URL from the client, and the redirect comes back to the
    gateway's loopback listener. `scope`: what a step-up asks for. Returns how many tools the
    server lists with the new tokens.

    Raises:
        CredentialError: the user declined, or the login failed or timed out.
    """

    async def show(url: str) -> None:
        params = types.ElicitRequestURLParams(
            message=f"Log in to '{name}' ({server.url}) so Cellblock can call its tools",
            url=url,
            elicitation_id=secrets.token_urlsafe(12),
        )
        answer = await asker.elicit(name, params)
        if answer.action != "accept":
            raise CredentialError(
                f"the login to '{name}' was not completed ({answer.action}); log in with `cellblock auth login {name}`"
            )

    return await login(name, server, keys.keyring(), show, keys.add, keys.refused, scope)
