"""Remote: a Streamable HTTP MCP test server with no auth, a static bearer token, or a built-in OAuth server.

Run as ``python tests/servers/remote.py --auth none|bearer|oauth [--port 0] [--token-lifetime SECONDS]``.
It binds 127.0.0.1 (port 0 lets the OS choose), and once it listens prints exactly one line,
``READY http://127.0.0.1:PORT/mcp``, to stdout. SIGTERM shuts it down with exit status 0.

Tools: ``echo(text)`` returns the text; ``secret_notes()`` needs the scope ``notes.read`` (oauth:
a token without it gets HTTP 403 ``insufficient_scope``, the step-up challenge); ``headers()``
returns the request's headers (as a hostile server that echoes them would; a value of digits as a
number); ``whoami()`` says who called:

- ``none``: ``anonymous``.
- ``bearer``: ``token ok``. The expected token is read from ``REMOTE_TOKEN`` (never argv: tests
  scan ``ps`` for secrets); a missing or wrong token gets HTTP 401 with ``WWW-Authenticate: Bearer``.
- ``oauth``: ``client=<client_id> token=<n> scopes=<granted, comma-separated>``, where n counts
  the access tokens this process has issued (1 for the first, 2 after a refresh, ...). The server
  is its own authorization server: dynamic client registration, an ``/authorize`` that approves at
  once (no login page), PKCE-bound single-use codes, access tokens that expire after
  ``--token-lifetime`` seconds, and refresh tokens that rotate with every refresh. Each grant is
  logged to stderr as one ``remote: grant ...`` line.

Nothing this process prints contains a token, code or client secret.
"""

import argparse
import contextlib
import hmac
import json
import math
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    TokenVerifier,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

Auth = Literal["none", "bearer", "oauth"]
HOST = "127.0.0.1"
SCOPE = "mcp"
EXTRA_SCOPE = "notes.read"  # granted when asked for (a client's `auth.scope`), never needed
TOKEN_ENV = "REMOTE_TOKEN"
CLIENT_SECRET_ENV = "REMOTE_CLIENT_SECRET"
PRE_REGISTERED_REDIRECT = "http://127.0.0.1:33418/callback"  # Cellblock's login listener (callback.LOGIN_PORT)
# Long enough for a slow test machine to finish the redirect dance, short enough to be realistic.
CODE_LIFETIME = 300
# uvicorn otherwise waits without end for open SSE streams when told to stop.
GRACEFUL_SHUTDOWN_SECONDS = 2


def log(message: str) -> None:
    print(f"remote: {message}", file=sys.stderr, flush=True)


class SequencedAccessToken(AccessToken):
    """An access token that knows its issue order, so `whoami` can tell a refreshed token apart."""

    sequence: int


@dataclass
class _Grant:
    """What an access/refresh token pair was issued for; both tokens map to the same grant."""

    client_id: str
    scopes: list[str]
    resource: str | None
    access_token: str
    refresh_token: str
    access_expires_at: float
    sequence: int


class InMemoryOAuthProvider(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, SequencedAccessToken]):
    """An authorization server that approves every request at once and keeps everything in memory."""

    def __init__(self, token_lifetime: int, clients: dict[str, OAuthClientInformationFull] | None = None) -> None:
        self.token_lifetime = token_lifetime
        self.clients: dict[str, OAuthClientInformationFull] = dict(clients or {})
        self.codes: dict[str, AuthorizationCode] = {}
        self.by_access: dict[str, _Grant] = {}
        self.by_refresh: dict[str, _Grant] = {}
        self.issued = 0

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        if client_info.client_id is None:
            raise ValueError("the registration handler always assigns a client_id")
        self.clients[client_info.client_id] = client_info
        log(f"registered client={client_info.client_id}")

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if client.client_id is None:
            raise ValueError("registered clients always have a client_id")
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + CODE_LIFETIME,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        if code is None or code.client_id != client.client_id:
            return None
        return code

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        # Single use: the token handler has already checked PKCE, redirect URI, client and expiry.
        self.codes.pop(authorization_code.code, None)
        code = authorization_code
        return self._issue("authorization_code", code.client_id, code.scopes, code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        grant = self.by_refresh.get(refresh_token)
        if grant is None or grant.client_id != client.client_id:
            return None
        return RefreshToken(
            token=refresh_token, client_id=grant.client_id, scopes=grant.scopes, resource=grant.resource
        )

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        # Rotation: the old pair stops working the moment the new one exists.
        self._drop(self.by_refresh[refresh_token.token])
        return self._issue("refresh_token", refresh_token.client_id, scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> SequencedAccessToken | None:
        grant = self.by_access.get(token)
        if grant is None or time.time() >= grant.access_expires_at:
            return None
        return SequencedAccessToken(
            token=token,
            client_id=grant.client_id,
            scopes=grant.scopes,
            expires_at=math.ceil(grant.access_expires_at),
            resource=grant.resource,
            sequence=grant.sequence,
        )

    async def revoke_token(self, token: SequencedAccessToken | RefreshToken) -> None:
        grant = self.by_access.get(token.token) or self.by_refresh.get(token.token)
        if grant is not None:
            self._drop(grant)
            log(f"revoked client={grant.client_id} token={grant.sequence}")

    def _issue(self, grant_type: str, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        self.issued += 1
        grant = _Grant(
            client_id=client_id,
            scopes=scopes,
            resource=resource,
            access_token=secrets.token_urlsafe(32),
            refresh_token=secrets.token_urlsafe(32),
            access_expires_at=time.time() + self.token_lifetime,
            sequence=self.issued,
        )
        self.by_access[grant.access_token] = grant
        self.by_refresh[grant.refresh_token] = grant
        log(f"grant {grant_type} client={client_id} token={grant.sequence} expires_in={self.token_lifetime}")
        return OAuthToken(
            access_token=grant.access_token,
            expires_in=self.token_lifetime,
            scope=" ".join(scopes),
            refresh_token=grant.refresh_token,
        )

    def _drop(self, grant: _Grant) -> None:
        self.by_access.pop(grant.access_token, None)
        self.by_refresh.pop(grant.refresh_token, None)


class StaticTokenVerifier(TokenVerifier):
    """Accepts exactly one bearer token, compared in constant time."""

    def __init__(self, expected: str) -> None:
        self.expected = expected

    async def verify_token(self, token: str) -> AccessToken | None:
        if not hmac.compare_digest(token.encode(), self.expected.encode()):
            return None
        return AccessToken(token=token, client_id="static", scopes=[])


def build_server(
    auth: Auth, base_url: str, token_lifetime: int, client_id: str | None = None
) -> tuple[MCPServer, InMemoryOAuthProvider | None]:
    """The MCP server for `auth`, whose public address is `base_url` (scheme://host:port, no path).
    With `client_id` (oauth), that client is pre-registered, with the secret in $REMOTE_CLIENT_SECRET
    (client_secret_basic at the token endpoint), and dynamic registration is off. Returns the
    server and, for oauth, its authorization server."""
    provider = None
    mcp_url = f"{base_url}/mcp"
    if auth == "none":
        server = MCPServer("remote", log_level="WARNING")
    elif auth == "bearer":
        expected = os.environ.get(TOKEN_ENV, "")
        if not expected:
            raise SystemExit(f"remote: --auth bearer needs the token in the {TOKEN_ENV} environment variable")
        # No resource_server_url: a static-token server publishes no OAuth metadata to discover.
        settings = AuthSettings.model_validate({"issuer_url": base_url, "resource_server_url": None})
        server = MCPServer("remote", log_level="WARNING", auth=settings, token_verifier=StaticTokenVerifier(expected))
    else:
        settings = AuthSettings.model_validate(
            {
                # Strings, not AnyHttpUrl: validated under AuthSettings' config, the path-less issuer
                # keeps its canonical form with no trailing slash (RFC 8414 compares issuers as strings).
                "issuer_url": base_url,
                "resource_server_url": mcp_url,
                # Tokens carry the RFC 8707 resource the client asked for; refuse ones minted for another.
                "validate_token_resource": True,
                "required_scopes": [SCOPE],
                "client_registration_options": ClientRegistrationOptions(
                    enabled=client_id is None, valid_scopes=[SCOPE, EXTRA_SCOPE], default_scopes=[SCOPE]
                ),
                "revocation_options": RevocationOptions(enabled=True),
            }
        )
        known = {}
        if client_id is not None:
            secret = os.environ.get(CLIENT_SECRET_ENV, "")
            if not secret:
                raise SystemExit(f"remote: --client-id needs the client's secret in {CLIENT_SECRET_ENV}")
            known[client_id] = OAuthClientInformationFull(
                client_id=client_id,
                client_secret=secret,
                token_endpoint_auth_method="client_secret_basic",
                redirect_uris=[AnyUrl(PRE_REGISTERED_REDIRECT)],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                scope=SCOPE,
            )
        provider = InMemoryOAuthProvider(token_lifetime, known)
        server = MCPServer("remote", log_level="WARNING", auth=settings, auth_server_provider=provider)

    @server.tool()
    def echo(text: str) -> str:
        """Return `text` unchanged."""
        return text

    @server.tool()
    def headers(ctx: Context) -> dict[str, str | int]:
        """The headers this request came with."""
        return {k: int(v) if v.isdigit() else v for k, v in (ctx.headers or {}).items()}

    @server.tool()
    def secret_notes() -> str:
        """The notes, for a token with the scope notes.read (`StepUp` asks for it with a 403)."""
        return "the secret notes"

    @server.tool()
    def whoami() -> str:
        """Say who the caller authenticated as."""
        if auth == "none":
            return "anonymous"
        if auth == "bearer":
            return "token ok"
        token = get_access_token()
        if not isinstance(token, SequencedAccessToken):
            raise RuntimeError("no OAuth access token in this request's context")
        return f"client={token.client_id} token={token.sequence} scopes={','.join(sorted(token.scopes))}"

    return server, provider


class StepUp:
    """A call to `secret_notes` with a token that lacks EXTRA_SCOPE is refused with HTTP 403
    `insufficient_scope`, naming the scopes it needs (the MCP authorization spec's step-up)."""

    def __init__(self, app: Any, provider: InMemoryOAuthProvider) -> None:
        self.app, self.provider = app, provider

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        headers = dict(scope["headers"])
        token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
        grant = self.provider.by_access.get(token)
        called = isinstance(request, dict) and request.get("method") == "tools/call"
        named = called and (request.get("params") or {}).get("name") == "secret_notes"
        if named and grant is not None and EXTRA_SCOPE not in grant.scopes:
            log("refused secret_notes: insufficient_scope")
            challenge = f'Bearer error="insufficient_scope", scope="{SCOPE} {EXTRA_SCOPE}"'
            headers_out = [(b"www-authenticate", challenge.encode())]
            await send({"type": "http.response.start", "status": 403, "headers": headers_out})
            await send({"type": "http.response.body", "body": b""})
            return

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


class _Server(uvicorn.Server):
    """uvicorn that announces READY once it listens and exits 0 on SIGTERM."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:
            port = sockets[0].getsockname()[1]
            print(f"READY http://{HOST}:{port}/mcp", flush=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's own version re-raises the signal after shutdown, so SIGTERM would end us with -15.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--auth", choices=["none", "bearer", "oauth"], required=True)
    parser.add_argument("--port", type=int, default=0, help="0 lets the OS pick a free port")
    parser.add_argument("--token-lifetime", type=int, default=3600, metavar="SECONDS")
    parser.add_argument("--client-id", help="oauth: pre-register this client (secret from $REMOTE_CLIENT_SECRET)")
    args = parser.parse_args()
    if args.token_lifetime < 1:
        parser.error("--token-lifetime must be at least 1 second")

    # Bind first: with port 0 the issuer and resource URLs can only be built once the port is known.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, args.port))
    port = sock.getsockname()[1]

    server, provider = build_server(args.auth, f"http://{HOST}:{port}", args.token_lifetime, args.client_id)
    app = server.streamable_http_app(host=HOST)
    config = uvicorn.Config(
        app if provider is None else StepUp(app, provider),
        log_level="warning",
        # Access lines would put /authorize query strings on our output; nothing there is needed.
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    _Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
