"""`auth:` of a remote server in `cellblock.yaml`: how it is authenticated. The credentials are
keyring entries (gateway/credentials.py), never values here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from cellblock.gateway.config.base import StrictModel

__all__ = ["AuthConfig", "IdentityProvider"]

# https, or http to this machine only (a test or a local identity provider): a token never crosses
# a network in the clear
_OAUTH_URL = r"^(https://[^/?#]+|http://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?)(/[^?#]*)?$"


class IdentityProvider(StrictModel):
    """The enterprise identity provider of `grant: identity_assertion` (SEP-990): where the ID token
    (keyring entry `<server>/idp-id-token`) is exchanged for an ID-JAG (RFC 8693), as which client."""

    token_endpoint: Annotated[str, Field(pattern=_OAUTH_URL)]
    client_id: Annotated[str, Field(min_length=1)]


class AuthConfig(StrictModel):
    """How a remote server is authenticated; the credential itself is in the keyring."""

    type: Literal["none", "bearer", "oauth"] = "none"
    # OAuth scopes to request, space-separated; None asks for what the server advertises
    scope: str | None = None
    # a client the authorization server knows already (its secret, if any, is in the keyring)...
    client_id: Annotated[str, Field(min_length=1)] | None = None
    # ...or a Client ID Metadata Document: this URL is the client id, no registration
    client_metadata_url: Annotated[str, Field(pattern=r"^https://[^/?#]+/[^?#]+$")] | None = None
    # how tokens are got: a person's login (authorization code), the client's own credentials
    # (client_credentials: client_id and its secret, no person, no browser), or an enterprise
    # identity provider's ID token traded for an ID-JAG, presented with the client's secret
    # (identity_assertion: SEP-990, with `issuer` and `idp`)
    grant: Literal["authorization_code", "client_credentials", "identity_assertion"] | None = None
    # how that client proves itself at the token endpoint: its secret, or a JWT signed with its
    # private key (RFC 7523; the key in the keyring: `cellblock auth set SERVER --private-key`)
    client_auth: Literal["client_secret", "private_key_jwt"] | None = None
    # identity_assertion: the MCP server's authorization server, named here and never taken from
    # the server, since the ID-JAG and the client's secret go to it; and the identity provider
    issuer: Annotated[str, Field(pattern=_OAUTH_URL)] | None = None
    idp: IdentityProvider | None = None

    @model_validator(mode="after")
    def _oauth_only(self) -> AuthConfig:
        for key in ("scope", "client_id", "client_metadata_url", "grant", "client_auth", "issuer", "idp"):
            if getattr(self, key) is not None and self.type != "oauth":
                raise ValueError(f"{key} is only used with type: oauth (type is {self.type!r})")
        if self.client_id is not None and self.client_metadata_url is not None:
            raise ValueError("give client_id (a pre-registered client) or client_metadata_url (a CIMD), not both")
        if self.grant in ("client_credentials", "identity_assertion") and self.client_id is None:
            raise ValueError(
                f"grant: {self.grant} needs the client's client_id (its secret goes in the keyring: "
                "`cellblock auth set SERVER --client-secret`)"
            )
        if self.client_auth == "private_key_jwt" and self.grant != "client_credentials":
            raise ValueError("client_auth: private_key_jwt goes with grant: client_credentials (and a client_id)")
        enterprise = self.grant == "identity_assertion"
        if enterprise and (self.issuer is None or self.idp is None):
            raise ValueError(
                "grant: identity_assertion needs issuer (the MCP server's authorization server) and "
                "idp: {token_endpoint: URL, client_id: ID} (the identity provider that issues the ID-JAG)"
            )
        if not enterprise and (self.issuer is not None or self.idp is not None):
            raise ValueError("issuer and idp go with grant: identity_assertion")
        return self
