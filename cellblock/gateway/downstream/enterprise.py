"""Enterprise-managed authorization (SEP-990), `grant: identity_assertion`: no person logs in to
the MCP server. The enterprise identity provider's ID token (keyring entry `<server>/idp-id-token`,
from `cellblock auth set NAME --id-token`) is exchanged at the identity provider for an ID-JAG
(RFC 8693 token exchange), which the client presents, with its own secret, to the MCP server's
authorization server (RFC 7523 jwt-bearer grant) for an access token.

The second leg is the SDK's `IdentityAssertionOAuthProvider`: the authorization server is the
config's `auth.issuer`, never one the MCP server names, so the ID-JAG and the secret go only there.
This module does the first leg, which the SDK leaves to the deployment. The ID token, the ID-JAG
and the secret are told to `on_secret` (the audit log redacts them) and never put in a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider

from cellblock.gateway.config.model import RemoteServer
from cellblock.gateway.credentials import CredentialError, client_secret_entry, id_token_entry
from cellblock.gateway.downstream.oauth import KeyringTokenStorage

__all__ = ["ID_JAG", "enterprise_provider"]

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"
_TIMEOUT = httpx2.Timeout(30.0)


async def enterprise_provider(
    name: str,
    server: RemoteServer,
    storage: KeyringTokenStorage,
    on_secret: Callable[[str], None] | None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> httpx2.Auth:
    """The auth of a server with `grant: identity_assertion`, its tokens kept in `storage`;
    `transport` carries the exchange at the identity provider (by default, a plain connection).

    Raises:
        CredentialError: the client's secret is not in the keyring.
    """
    auth, store = server.auth, storage.store
    if auth.client_id is None or auth.issuer is None or auth.idp is None:  # the config's check refuses it
        raise RuntimeError(f"'{name}' uses grant: identity_assertion without client_id, issuer and idp")
    secret = await store.aget(client_secret_entry(name))
    if not secret:
        raise CredentialError(
            f"'{name}' uses grant: identity_assertion and the client's secret is not in the keyring; "
            f"set it with `cellblock auth set {name} --client-secret`"
        )
    tell = on_secret or (lambda value: None)
    tell(secret)
    idp = auth.idp

    async def id_jag(audience: str, resource: str) -> str:
        """Leg one: the ID token traded at the identity provider for an ID-JAG for `audience`
        (the authorization server) and `resource` (the MCP server)."""
        id_token = await store.aget(id_token_entry(name))
        if not id_token:
            raise CredentialError(
                f"'{name}' uses grant: identity_assertion and the identity provider's ID token is not in the "
                f"keyring; store it with `cellblock auth set {name} --id-token`"
            )
        tell(id_token)
        exchange = {
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": id_token,
            "subject_token_type": ID_TOKEN,
            "requested_token_type": ID_JAG,
            "audience": audience,
            "resource": resource,
            "client_id": idp.client_id,
        }
        try:
            async with httpx2.AsyncClient(timeout=_TIMEOUT, follow_redirects=False, transport=transport) as http:
                answer = await http.post(idp.token_endpoint, data=exchange)
        except httpx2.HTTPError as exc:
            raise CredentialError(f"'{name}': cannot reach the identity provider: {type(exc).__name__}") from None
        body = _json(answer)
        jag = body.get("access_token")
        if answer.status_code != 200 or not isinstance(jag, str) or body.get("issued_token_type", ID_JAG) != ID_JAG:
            why = str(body.get("error") or f"HTTP {answer.status_code}")[:80]
            raise CredentialError(
                f"the identity provider refused to trade the ID token of '{name}' for an ID-JAG ({why}); "
                f"if it expired, store a fresh one with `cellblock auth set {name} --id-token`"
            )
        tell(jag)
        return jag

    return IdentityAssertionOAuthProvider(
        server.url,
        storage,
        auth.client_id,
        secret,
        auth.issuer,
        id_jag,
        scope=auth.scope,
        token_endpoint_auth_method="client_secret_basic",  # RFC 6749's default, which every server takes
    )


def _json(answer: httpx2.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
