"""The client command of the conformance suite's client scenarios: ``python -m tests.conformance_client VIA URL``.

The suite (`conformance client --command ...`) starts a scenario server, then this command with the
server's URL as its last argument, the scenario's name in MCP_CONFORMANCE_SCENARIO and, for some,
credentials in MCP_CONFORMANCE_CONTEXT (JSON). Either way the client lists the tools and calls each.

- ``direct``: the SDK's own ``mcp.Client`` over Streamable HTTP, with the SDK's OAuth provider
  where the scenario has an authorization server (the person at the browser is an HTTP GET: the
  suite's authorization endpoint approves at once and redirects to the redirect URI), or the SDK's
  providers of the authorization extensions (client credentials, enterprise-managed) for theirs.
- ``cellblock``: Cellblock as the client. It writes a cellblock.yaml with the URL as a remote
  server, stores a pre-registered client's secret with ``cellblock auth set NAME --client-secret``
  (or its private key with ``--private-key``, and an identity provider's ID token with ``--id-token``),
  logs in with ``cellblock auth login NAME`` (BROWSER is tests/servers/browser.py, which follows the
  redirect to the loopback callback), then drives ``cellblock serve`` (stdio) with the SDK client.
  It needs the environment of a gateway: DBUS_SESSION_BUS_ADDRESS of a private keyring, and
  XDG_RUNTIME_DIR.

Both answer a form elicitation by accepting the schema's defaults, and a URL elicitation (a login
the gateway asks for while serving) by opening the URL the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import anyio
import httpx2
import mcp.types as types
import yaml
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata
from pydantic import AnyUrl

from tests.integration.conftest import cli, gateway
from tests.servers.test_remote_server import Browser, MemoryStorage

ROOT = Path(__file__).resolve().parent.parent
BROWSER = ROOT / "tests" / "servers" / "browser.py"
# The Client ID Metadata Document the suite's auth/basic-cimd authorization server expects as client id.
CIMD_URL = "https://conformance-test.local/client-metadata.json"
REDIRECT = "http://127.0.0.1:33418/callback"


def _arguments(tool: types.Tool) -> dict[str, Any]:
    """A number for each numeric property (the suite's add_numbers); nothing else is asked for."""
    properties = tool.input_schema.get("properties") or {}
    return {name: 1 for name, schema in properties.items() if schema.get("type") in ("number", "integer")}


def _open(url: str) -> None:
    with urllib.request.urlopen(url, timeout=30) as page:
        page.read()


async def person(context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
    """Accept a form with its defaults; open a URL the way tests/servers/browser.py does."""
    if isinstance(params, types.ElicitRequestURLParams):
        await anyio.to_thread.run_sync(_open, params.url)
        return types.ElicitResult(action="accept")
    properties = params.requested_schema.get("properties") or {}
    defaults = {name: schema["default"] for name, schema in properties.items() if "default" in schema}
    return types.ElicitResult(action="accept", content=defaults)


async def exercise(client: Client) -> None:
    listed = await client.list_tools()
    for tool in listed.tools:
        result = await client.call_tool(tool.name, _arguments(tool))
        print(f"{tool.name}: {'error' if result.is_error else 'ok'}", file=sys.stderr)


def authorization_server(url: str) -> str:
    """The MCP server's authorization server, from its protected resource metadata: what an
    enterprise's administrator would hand out with the server's URL (SEP-990 configures it)."""
    origin = "{0.scheme}://{0.netloc}".format(urlparse(url))
    with urllib.request.urlopen(f"{origin}/.well-known/oauth-protected-resource{urlparse(url).path}") as page:
        return str(json.loads(page.read())["authorization_servers"][0])


async def _enterprise(url: str, context: dict[str, Any]) -> httpx2.Auth:
    """SEP-990: the ID token from the IdP is exchanged there for an ID-JAG (RFC 8693), which the SDK's
    provider hands the MCP server's authorization server (named by its protected resource metadata)."""
    issuer = await anyio.to_thread.run_sync(authorization_server, url)

    async def id_jag(audience: str, resource: str) -> str:
        exchange = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token": context["idp_id_token"],
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
            "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
            "audience": audience,
            "resource": resource,
            "client_id": context["idp_client_id"],
        }
        async with httpx2.AsyncClient() as http:
            answer = await http.post(context["idp_token_endpoint"], data=exchange)
        return str(answer.json()["access_token"])

    return IdentityAssertionOAuthProvider(
        url,
        MemoryStorage(),
        context["client_id"],
        context["client_secret"],
        issuer,
        id_jag,
        token_endpoint_auth_method="client_secret_basic",
    )


async def _sdk_provider(url: str, scenario: str, context: dict[str, Any]) -> httpx2.Auth:
    if scenario == "auth/cross-app-access-complete-flow":
        return await _enterprise(url, context)
    if scenario == "auth/client-credentials-basic":
        return ClientCredentialsOAuthProvider(url, MemoryStorage(), context["client_id"], context["client_secret"])
    if scenario == "auth/client-credentials-jwt":
        signed = SignedJWTParameters(
            issuer=context["client_id"],
            subject=context["client_id"],
            signing_key=context["private_key_pem"],
            signing_algorithm=context.get("signing_algorithm", "ES256"),
        )
        assertion = signed.create_assertion_provider()
        return PrivateKeyJWTOAuthProvider(url, MemoryStorage(), context["client_id"], assertion)
    browser = Browser()
    metadata = OAuthClientMetadata(redirect_uris=[AnyUrl(REDIRECT)], client_name="conformance SDK client")
    preregistered = None
    if "client_id" in context:
        preregistered = OAuthClientInformationFull(
            redirect_uris=[AnyUrl(REDIRECT)],
            client_id=context["client_id"],
            client_secret=context.get("client_secret"),
            token_endpoint_auth_method="client_secret_basic",
        )
    cimd = CIMD_URL if scenario == "auth/basic-cimd" else None
    storage = MemoryStorage()
    storage.client_info = preregistered
    return OAuthClientProvider(url, metadata, storage, browser.redirect, browser.callback, client_metadata_url=cimd)


async def direct(url: str, scenario: str, context: dict[str, Any]) -> None:
    auth = await _sdk_provider(url, scenario, context) if scenario.startswith("auth/") else None
    async with (
        httpx2.AsyncClient(auth=auth, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), elicitation_callback=person) as client,
    ):
        await exercise(client)


def server_name(scenario: str) -> str:
    """The scenario's server in cellblock.yaml: its own keyring entries, none left from another scenario."""
    return f"s-{hashlib.sha256(scenario.encode()).hexdigest()[:12]}"  # a name is at most 24 characters


def cellblock_config(directory: Path, url: str, scenario: str, context: dict[str, Any]) -> Path:
    server: dict[str, Any] = {"url": url, "prefix": False, "tools": {"default": "allow"}, "lock": {"enabled": False}}
    if scenario.startswith("auth/"):
        server["auth"] = {"type": "oauth"}
        if "client_id" in context:
            server["auth"]["client_id"] = context["client_id"]
            if scenario.startswith("auth/client-credentials-"):
                server["auth"]["grant"] = "client_credentials"
            if "private_key_pem" in context:
                server["auth"]["client_auth"] = "private_key_jwt"
            if "idp_id_token" in context:  # the identity provider's token goes in the keyring, not here
                idp = {"token_endpoint": context["idp_token_endpoint"], "client_id": context["idp_client_id"]}
                issuer = authorization_server(url)
                server["auth"] |= {"grant": "identity_assertion", "issuer": issuer, "idp": idp}
        elif scenario == "auth/basic-cimd":
            server["auth"]["client_metadata_url"] = CIMD_URL
    path = directory / "cellblock.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "servers": {server_name(scenario): server}}))
    return path


async def through_cellblock(url: str, scenario: str, context: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="cb-conf-client-") as directory:
        config = cellblock_config(Path(directory), url, scenario, context)
        name = server_name(scenario)
        env = {"CELLBLOCK_STATE_DIR": str(Path(directory) / "state")}
        steps: list[tuple[list[str], str | None]] = []
        if context.get("client_secret") and "client_id" in context:
            steps.append((["auth", "set", name, "--client-secret"], context["client_secret"]))
        if "private_key_pem" in context:  # on stdin, as a key piped from a secret store
            steps.append((["auth", "set", name, "--private-key"], context["private_key_pem"]))
        if "idp_id_token" in context:
            steps.append((["auth", "set", name, "--id-token"], context["idp_id_token"]))
        if scenario.startswith("auth/"):
            steps.append((["auth", "login", name], None))
        for args, stdin in steps:
            browser = {**env, "BROWSER": f"{sys.executable} {BROWSER} %s"}
            done = cli(browser, *args, "--config", str(config), stdin=stdin)
            print(f"cellblock {' '.join(args)}: exit {done.returncode}\n{done.stderr}", file=sys.stderr)
        passed = {key: os.environ[key] for key in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR") if key in os.environ}
        async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=passed, elicitation_callback=person) as client:
            await exercise(client)


def main() -> None:
    via, url = sys.argv[1], sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    run = {"direct": direct, "cellblock": through_cellblock}[via]
    anyio.run(run, url, scenario, context)


if __name__ == "__main__":
    main()
