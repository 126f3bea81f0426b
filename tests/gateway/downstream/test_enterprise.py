"""Enterprise-managed authorization (`grant: identity_assertion`, SEP-990), against a mock identity
provider, authorization server and MCP server in one `MockTransport`: the ID token from the
keyring is traded at the identity provider for an ID-JAG, and that, with the client's secret, at
the configured authorization server (never one the MCP server names) for the access token.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import parse_qs

import httpx2
import pytest
import yaml

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import ConfigError, RemoteServer
from cellblock.gateway.credentials import CredentialError, Keyring, client_secret_entry, id_token_entry
from cellblock.gateway.downstream.enterprise import enterprise_provider
from cellblock.gateway.downstream.oauth import KeyringTokenStorage
from tests.gateway.downstream.test_oauth import anyio_backend, server

__all__ = ["anyio_backend", "server"]  # fixtures, used by name

pytestmark = pytest.mark.anyio

ISSUER = "https://as.example"
IDP = "https://idp.example/oauth2/token"
MCP = "https://mcp.example/mcp"
ID_TOKEN = "eyJ.id-token-of-alice.sig"
JAG = "eyJ.id-jag-for-mcp.sig"


def remote(server: str, **auth: Any) -> RemoteServer:
    wanted = {
        "type": "oauth",
        "grant": "identity_assertion",
        "client_id": "mcp-client",
        "issuer": ISSUER,
        "idp": {"token_endpoint": IDP, "client_id": "idp-client"},
        **auth,
    }
    config = parse_config(yaml.safe_dump({"version": 1, "servers": {server: {"url": MCP, "auth": wanted}}}))
    found = config.servers[server]
    assert isinstance(found, RemoteServer)
    return found


class World:
    """The three parties, recording what each was sent."""

    def __init__(self, idp_answer: tuple[int, dict[str, Any]] = (200, {"access_token": JAG})) -> None:
        self.idp_answer = idp_answer
        self.seen: dict[str, list[httpx2.Request]] = {"idp": [], "token": [], "mcp": [], "other": []}

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        if url == IDP:
            self.seen["idp"].append(request)
            status, body = self.idp_answer
            return httpx2.Response(status, json=body)
        if url == f"{ISSUER}/.well-known/oauth-authorization-server":
            metadata = {"issuer": ISSUER, "token_endpoint": f"{ISSUER}/token", "authorization_endpoint": f"{ISSUER}/a"}
            return httpx2.Response(200, json=metadata)
        if url == f"{ISSUER}/token":
            self.seen["token"].append(request)
            return httpx2.Response(200, json={"access_token": "mcp-access", "token_type": "Bearer", "expires_in": 600})
        if url == MCP:
            self.seen["mcp"].append(request)
            if request.headers.get("Authorization") == "Bearer mcp-access":
                return httpx2.Response(200, json={"ok": True})
            # a hostile server names another authorization server: it is never asked
            challenge = 'Bearer resource_metadata="https://evil.example/.well-known/oauth-protected-resource"'
            return httpx2.Response(401, headers={"WWW-Authenticate": challenge})
        self.seen["other"].append(request)
        return httpx2.Response(404)


def form(request: httpx2.Request) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(request.content.decode()).items()}


async def test_the_id_token_is_traded_for_an_id_jag_and_that_for_the_servers_token(server: str) -> None:
    Keyring().set(client_secret_entry(server), "client-s3cret")
    Keyring().set(id_token_entry(server), ID_TOKEN)
    told: list[str] = []
    world = World()
    mock = httpx2.MockTransport(world.handle)
    storage = KeyringTokenStorage(Keyring(), server, told.append, "mcp-client")
    auth = await enterprise_provider(server, remote(server), storage, told.append, transport=mock)
    async with httpx2.AsyncClient(auth=auth, transport=mock) as http:
        assert (await http.post(MCP, json={})).status_code == 200
    exchange = form(world.seen["idp"][0])
    assert exchange == {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token": ID_TOKEN,
        "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
        "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
        "audience": ISSUER,
        "resource": MCP,
        "client_id": "idp-client",
    }
    grant, sent = form(world.seen["token"][0]), world.seen["token"][0]
    assert grant["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer" and grant["assertion"] == JAG
    basic = base64.b64decode(sent.headers["Authorization"].removeprefix("Basic ")).decode()
    assert basic == "mcp-client:client-s3cret" and "client_secret" not in grant
    assert world.seen["other"] == []  # the evil authorization server the 401 named was never asked
    assert {"client-s3cret", ID_TOKEN, JAG, "mcp-access"} <= set(told)  # each is redacted in the audit log
    stored = json.loads(Keyring().get(f"{server}/oauth-tokens") or "{}")
    assert stored["token"]["access_token"] == "mcp-access"  # kept for the next start


async def test_without_the_id_token_or_the_secret_the_error_names_the_command(server: str) -> None:
    with pytest.raises(CredentialError, match=f"cellblock auth set {server} --client-secret"):
        await enterprise_provider(server, remote(server), KeyringTokenStorage(Keyring(), server), None)
    Keyring().set(client_secret_entry(server), "client-s3cret")
    world = World()
    mock = httpx2.MockTransport(world.handle)
    auth = await enterprise_provider(server, remote(server), KeyringTokenStorage(Keyring(), server), None, mock)
    async with httpx2.AsyncClient(auth=auth, transport=mock) as http:
        with pytest.raises(CredentialError, match=f"store it with `cellblock auth set {server} --id-token`"):
            await http.post(MCP, json={})
    assert world.seen["idp"] == [] and world.seen["token"] == []  # nothing was sent without it


async def test_a_refused_exchange_says_to_store_a_fresh_id_token_and_never_quotes_it(server: str) -> None:
    Keyring().set(client_secret_entry(server), "client-s3cret")
    Keyring().set(id_token_entry(server), ID_TOKEN)
    world = World((400, {"error": "invalid_grant", "error_description": f"expired: {ID_TOKEN}"}))
    mock = httpx2.MockTransport(world.handle)
    auth = await enterprise_provider(server, remote(server), KeyringTokenStorage(Keyring(), server), None, mock)
    async with httpx2.AsyncClient(auth=auth, transport=mock) as http:
        with pytest.raises(CredentialError, match=r"\(invalid_grant\); if it expired, store a fresh one") as refused:
            await http.post(MCP, json={})
    assert ID_TOKEN not in str(refused.value) and world.seen["token"] == []


@pytest.mark.parametrize(
    ("auth", "said"),
    [
        ({"issuer": None}, "grant: identity_assertion needs issuer"),
        ({"idp": None}, "grant: identity_assertion needs issuer"),
        ({"client_id": None}, "grant: identity_assertion needs the client's client_id"),
        ({"grant": "client_credentials"}, "issuer and idp go with grant: identity_assertion"),
        ({"issuer": "http://as.example"}, "issuer"),  # a token in the clear over a network
        ({"idp": {"token_endpoint": IDP}}, "client_id"),
    ],
)
def test_an_enterprise_config_names_both_ends_and_only_with_its_grant(
    server: str, auth: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError, match=said):
        remote(server, **auth)
    assert remote(server, issuer="http://127.0.0.1:8080").auth.issuer == "http://127.0.0.1:8080"  # a local test AS
    entries = parse_config(
        yaml.safe_dump({"version": 1, "servers": {"e": {"url": MCP, "auth": remote(server).auth.model_dump()}}})
    ).credential_entries()
    assert ("e/idp-id-token", "e", "identity provider ID token") in entries
    assert ("e/oauth-client-secret", "e", "OAuth client secret") in entries
