"""OAuth 2.1 for remote servers, through the SDK's `OAuthClientProvider`, with the keyring as store.

The SDK does discovery, dynamic client registration, PKCE, the code exchange and refresh. This
module gives it what it needs from Cellblock: a `TokenStorage` in the keyring (the registered
client too, or every run would register a new one), what the SDK keeps only in memory (the
token's expiry and the authorization server's metadata, see `_Provider`), and the two ends of an
interactive login: the browser (or a printed URL) and a loopback listener that catches the redirect
(gateway/downstream/callback.py).

While serving there is nobody at a browser: `LoginNeeded` is raised instead, and the user is told
to run `cellblock auth login NAME`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import union_scopes
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
)
from pydantic import AnyUrl, PrivateAttr, ValidationError

from cellblock.gateway.credentials import (
    CredentialError,
    Keyring,
    client_key_entry,
    client_secret_entry,
    oauth_entries,
)
from cellblock.gateway.downstream.clientkey import ASSERTION_TYPE, client_assertion
from cellblock.gateway.downstream.discovery import PIN, DiscoveryGuard

__all__ = [
    "KeyringTokenStorage",
    "LoginNeeded",
    "client_metadata",
    "oauth_provider",
    "redirect_uri_of",
]


class LoginNeeded(CredentialError):
    """The server needs an interactive OAuth login, which only `cellblock auth login` can do."""

    def __init__(self, server: str, url: str) -> None:
        # the scope the authorization asks for: on a step-up, the granted and the challenged ones
        self.scope = parse_qs(urlsplit(url).query).get("scope", [None])[0]
        more = f" with the scope '{self.scope}'" if self.scope else ""
        super().__init__(f"server '{server}' needs a login{more}: run `cellblock auth login {server}`")
        self.server, self.url = server, url


class KeyringTokenStorage:
    """The SDK's `TokenStorage`, kept in the keyring entries `<server>/oauth-tokens` and `-client`."""

    def __init__(
        self,
        store: Keyring,
        server: str,
        on_secret: Callable[[str], None] | None = None,
        client_id: str | None = None,
        client_auth: str | None = None,
    ) -> None:
        """`client_id`: a pre-registered client (`auth.client_id`), used instead of registering;
        its secret, if it has one, is the keyring entry `client_secret_entry(server)`. With
        `client_auth` `private_key_jwt` it has none: it signs assertions with the private key in
        `client_key_entry(server)`."""
        self.store, self.server = store, server
        self.client_id, self.signs = client_id, client_auth == "private_key_jwt"
        # told every token read or received, so the audit log can redact it wherever it turns up
        self.on_secret = on_secret
        self.tokens_entry, self.client_entry = oauth_entries(server)
        # kept beside the tokens, because the SDK keeps them only in memory: when the access token
        # expires, and where to refresh it (the authorization server's metadata)
        self.expires_at: float | None = None
        self.metadata: OAuthMetadata | None = None
        self.context: OAuthContext | None = None  # the provider's, to read its discovered metadata

    async def get_tokens(self) -> OAuthToken | None:
        data = await self._read(self.tokens_entry)
        if data is None:
            return None
        try:
            expires_at = data.get("expires_at")
            metadata = OAuthMetadata.model_validate(data["metadata"]) if data.get("metadata") else None
            tokens = OAuthToken.model_validate(data["token"])
        except (AttributeError, KeyError, TypeError, ValidationError):
            raise self._damaged(self.tokens_entry) from None
        self.expires_at, self.metadata = expires_at if isinstance(expires_at, int | float) else None, metadata
        self._tell(tokens)
        return tokens

    def _tell(self, tokens: OAuthToken) -> None:
        if self.on_secret is not None:
            for value in (tokens.access_token, tokens.refresh_token):
                if value:
                    self.on_secret(value)

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._tell(tokens)
        self.expires_at = time.time() + tokens.expires_in if tokens.expires_in is not None else None
        if self.context is not None and self.context.oauth_metadata is not None:
            self.metadata = self.context.oauth_metadata
        record = {
            "token": tokens.model_dump(mode="json", exclude_none=True),
            "expires_at": self.expires_at,
            "metadata": self.metadata.model_dump(mode="json", exclude_none=True) if self.metadata else None,
        }
        await self.store.aset(self.tokens_entry, json.dumps(record))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self.client_id is not None and self.signs:
            return OAuthClientInformationFull(client_id=self.client_id, token_endpoint_auth_method="private_key_jwt")
        if self.client_id is not None:
            secret = await self.store.aget(client_secret_entry(self.server))
            if secret and self.on_secret is not None:
                self.on_secret(secret)
            # the method is chosen from the authorization server's metadata when it is known (_Provider)
            method = "client_secret_basic" if secret else "none"
            return OAuthClientInformationFull(
                client_id=self.client_id, client_secret=secret or None, token_endpoint_auth_method=method
            )
        data = await self._read(self.client_entry)
        try:
            client = None if data is None else OAuthClientInformationFull.model_validate(data)
        except ValidationError:
            raise self._damaged(self.client_entry) from None
        self._tell_secret(client)
        return client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.client_id is not None:
            return  # pre-registered: nothing of it is the SDK's to keep
        self._tell_secret(client_info)
        await self.store.aset(self.client_entry, client_info.model_dump_json(exclude_none=True))

    def _tell_secret(self, client: OAuthClientInformationFull | None) -> None:
        """A secret the authorization server gave at registration is redacted like a token."""
        if client is not None and client.client_secret and self.on_secret is not None:
            self.on_secret(client.client_secret)

    async def token_state(self) -> tuple[float | None, bool] | None:
        """(absolute expiry or None, has a refresh token) of the stored tokens; None when there are none."""
        tokens = await self.get_tokens()
        return None if tokens is None else (self.expires_at, bool(tokens.refresh_token))

    async def forget_tokens(self) -> None:
        await self.store.adelete(self.tokens_entry)

    async def forget_client(self) -> None:
        await self.store.adelete(self.client_entry)

    async def _read(self, entry: str) -> Any:
        raw = await self.store.aget(entry)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise self._damaged(entry) from None

    def _damaged(self, entry: str) -> CredentialError:
        # never the record itself in the message: it holds tokens
        return CredentialError(
            f"keyring entry '{entry}' is damaged; run `cellblock auth logout {self.server}` and log in again"
        )


class _Provider(OAuthClientProvider):
    """The SDK's provider, told what it forgets across restarts: the stored token's expiry and
    the authorization server it came from. Without the expiry an old token looks valid forever
    (a 401 then forces a new login); without the metadata a refresh would go to the MCP server's
    own `/token`, handing the refresh token to a host that may not be its issuer. So a stored
    token is refreshed only when both are known.

    Every request the flow makes, and the authorization URL it shows, passes `guard` first
    (gateway/downstream/discovery.py): the server's 401 and metadata cannot send it anywhere else."""

    def __init__(
        self,
        storage: KeyringTokenStorage,
        guard: DiscoveryGuard,
        redirect_handler: Callable[[str], Awaitable[None]],
        client_credentials: bool = False,
        **kwargs: Any,
    ) -> None:
        async def vetted_redirect(url: str) -> None:
            await guard.admit(url, self._authorization_servers())
            await redirect_handler(url)

        super().__init__(storage=storage, redirect_handler=vetted_redirect, **kwargs)
        self._client_credentials = client_credentials
        self._keyring_storage = storage
        self._guard = guard
        storage.context = self.context
        prepare = self.context.prepare_token_auth

        def authenticated(data: dict[str, str], headers: dict[str, str] | None = None) -> Any:
            self._choose_auth_method()
            return prepare(data, headers)

        self.context.prepare_token_auth = authenticated  # type: ignore[method-assign]  # reason: the one hook before a token request

    def _choose_auth_method(self) -> None:
        """A pre-registered client with a secret authenticates at the token endpoint the way its
        authorization server says it takes (RFC 8414: client_secret_basic unless it says otherwise)."""
        client, metadata = self.context.client_info, self.context.oauth_metadata
        if self._keyring_storage.client_id is None or client is None or not client.client_secret:
            return
        supported = (metadata.token_endpoint_auth_methods_supported if metadata is not None else None) or [
            "client_secret_basic"
        ]
        if "client_secret_basic" not in supported and "client_secret_post" in supported:
            client.token_endpoint_auth_method = "client_secret_post"
        else:
            client.token_endpoint_auth_method = "client_secret_basic"

    def _registered_as_metadata_says(self, outgoing: httpx2.Request) -> httpx2.Request:
        """The SDK's registration request asks for the token endpoint auth method Cellblock was
        built with (`none`); it asks for what the authorization server's metadata says it takes:
        a public client (PKCE alone, no secret to keep) where it takes one or names none, else
        `client_secret_basic` or `client_secret_post`, the secret then kept in the keyring."""
        metadata = self.context.oauth_metadata
        endpoint = metadata.registration_endpoint if metadata is not None else None
        if metadata is None or outgoing.method != "POST" or str(outgoing.url) != str(endpoint):
            return outgoing
        supported = metadata.token_endpoint_auth_methods_supported or ["none"]
        secret_methods = [m for m in ("client_secret_basic", "client_secret_post") if m in supported]
        method = "none" if "none" in supported or not secret_methods else secret_methods[0]
        body = json.loads(outgoing.content)
        if not isinstance(body, dict) or body.get("token_endpoint_auth_method") == method:
            return outgoing
        body["token_endpoint_auth_method"] = method
        return httpx2.Request("POST", outgoing.url, json=body, headers={"Content-Type": "application/json"})

    async def _perform_authorization(self) -> httpx2.Request:
        """With `grant: client_credentials` a token is asked for with the client's own credentials
        (RFC 6749 section 4.4): no person, no browser, no redirect. Else the SDK's login."""
        if not self._client_credentials:
            return await super()._perform_authorization()
        client, stored = self.context.client_info, self._keyring_storage
        if client is None or not (client.client_secret or stored.signs):
            raise CredentialError(
                f"'{stored.server}' uses grant: client_credentials and the client's secret is not in the keyring; "
                f"set it with `cellblock auth set {stored.server} --client-secret`"
            )
        data: dict[str, str] = {"grant_type": "client_credentials"}
        if self.context.should_include_resource_param(self.context.protocol_version):
            data["resource"] = self.context.get_resource_url()
        if self.context.client_metadata.scope:
            data["scope"] = self.context.client_metadata.scope
        data, headers = self.context.prepare_token_auth(data, {"Content-Type": "application/x-www-form-urlencoded"})
        if stored.signs and client.client_id is not None:
            assertion = await self._assertion(client.client_id)
            data |= {"client_assertion_type": ASSERTION_TYPE, "client_assertion": assertion}
        return httpx2.Request("POST", self._get_token_endpoint(), data=data, headers=headers)

    async def _assertion(self, client_id: str) -> str:
        """A JWT that proves the client (`private_key_jwt`, RFC 7523), for the authorization server
        whose metadata is in use, signed with the key in the keyring and an algorithm it takes."""
        stored, metadata = self._keyring_storage, self.context.oauth_metadata
        key = await stored.store.aget(client_key_entry(stored.server))
        if not key:
            raise CredentialError(
                f"'{stored.server}' uses client_auth: private_key_jwt and the client's private key is not in the "
                f"keyring; store it with `cellblock auth set {stored.server} --private-key KEY.pem`"
            )
        if metadata is None:
            raise CredentialError(f"'{stored.server}': no authorization server metadata to address the assertion to")
        if stored.on_secret is not None:
            stored.on_secret(key)
        supported = metadata.token_endpoint_auth_signing_alg_values_supported
        assertion = await client_assertion(client_id, key, str(metadata.issuer), supported)
        if stored.on_secret is not None:
            stored.on_secret(assertion)  # a credential for its short life: redacted like a token
        return assertion

    def _authorization_servers(self) -> list[str]:
        """The authorization servers the flow may use: those the (origin-checked) resource metadata
        names, and the issuer of the metadata in use, which the SDK checked against them (or which
        was stored after such a check)."""
        named = []
        if self.context.protected_resource_metadata is not None:
            named += [str(server) for server in self.context.protected_resource_metadata.authorization_servers]
        if self.context.oauth_metadata is not None:
            named.append(str(self.context.oauth_metadata.issuer))
        return named

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """The SDK's flow, with each of its own requests (discovery, registration, token, the
        redirects it follows) admitted by the guard and pinned to the checked address."""
        flow = super().async_auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                if outgoing is not request:
                    outgoing = self._registered_as_metadata_says(outgoing)
                    address = await self._guard.admit(outgoing.url, self._authorization_servers())
                    if address is None:
                        outgoing.extensions.pop(PIN, None)
                    else:
                        outgoing.extensions[PIN] = address
                response = yield outgoing
                if outgoing is request:
                    self._guard.connected(response)
                    self._guard.check_challenge(response)
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()

    async def _initialize(self) -> None:
        await super()._initialize()
        stored = self._keyring_storage
        if self.context.oauth_metadata is None and stored.metadata is not None:
            self.context.oauth_metadata = stored.metadata
        if self.context.oauth_metadata is not None:
            self.context.token_expiry_time = stored.expires_at


class _ScopedMetadata(OAuthClientMetadata):
    """Client metadata whose scope always holds the config's `auth.scope`: the SDK sets the scope
    to what the server challenges for on every 401, before it registers and authorizes."""

    _floor: str | None = PrivateAttr(default=None)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "scope":
            value = union_scopes(self._floor, value)
        super().__setattr__(name, value)


def client_metadata(redirect_uri: str, scope: str | None) -> OAuthClientMetadata:
    """What Cellblock registers as: a public client (no secret; `_Provider` asks for a secret
    instead where the authorization server takes no public client), code + refresh grants, asking
    for `scope` (the config's `auth.scope`) beside whatever the server asks for."""
    metadata = _ScopedMetadata(
        client_name="Cellblock",
        redirect_uris=[AnyUrl(redirect_uri)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
        scope=scope,
    )
    metadata._floor = scope
    return metadata


def oauth_provider(
    server: str,
    url: str,
    storage: KeyringTokenStorage,
    redirect_uri: str,
    scope: str | None,
    redirect_handler: Callable[[str], Awaitable[None]],
    callback_handler: Callable[[], Awaitable[AuthorizationCodeResult]],
    guard: DiscoveryGuard | None = None,
    client_metadata_url: str | None = None,
    client_credentials: bool = False,
) -> OAuthClientProvider:
    """An httpx2 auth that adds, refreshes and (through the handlers) obtains tokens for `url`;
    its requests go only where `guard` (by default one for `server` at `url`) admits. Send them
    through a `PinnedTransport`, which connects to the addresses the guard checked.
    `client_metadata_url`: a Client ID Metadata Document, the client id where the authorization
    server takes one (else it registers dynamically). `client_credentials`: tokens are got with the
    pre-registered client's own secret, never through a login."""
    return _Provider(
        storage,
        guard if guard is not None else DiscoveryGuard(server, url),
        server_url=url,
        client_metadata=client_metadata(redirect_uri, scope),
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata_url=client_metadata_url,
        client_credentials=client_credentials,
    )


def redirect_uri_of(client: OAuthClientInformationFull | None) -> str | None:
    if client is None or not client.redirect_uris:
        return None
    return str(client.redirect_uris[0])
