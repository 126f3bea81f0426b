"""A resource URI is judged under every spelling the server may read it as, through the gateway
(in memory, tests/harness.py).

The spelled server (tests/servers/spelled.py) is honest: it decodes escapes and resolves dot
segments, as the SDK's template matcher and Node's `new URL()` do. Asked directly, it hands over
the secret items under their respellings (the control); through the gateway, rules that deny the
secret items deny them under every spelling, and the lock holds them under every spelling.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.harness import build, connected
from tests.integration.conftest import write_config

pytestmark = pytest.mark.anyio

SPELLED = Path(__file__).resolve().parents[1] / "servers" / "spelled.py"
RULES = {"note://*": "allow", "note://secret": "deny", "file:///srv/public/*": "allow"}
# each with what the server reads it as
RESPELLED = {
    "note://%73ecret": "TOP SECRET NOTE",
    "note://%2573ecret": "TOP SECRET NOTE",  # an escape of an escape
    "NOTE://secret": "TOP SECRET NOTE",
    "file:///srv/public/../secret/key": "SECRET KEY MATERIAL",
    "file:///srv/public/%2e%2e/secret/key": "SECRET KEY MATERIAL",
    "file:///srv/public/%2E%2E/secret/./key": "SECRET KEY MATERIAL",
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def spelled(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SPELLED)], "jail": {"read_only": [str(SPELLED.parent)]}, **extra}


async def text_of(client: Client, uri: str) -> str:
    try:
        result = await client.read_resource(uri)
    except MCPError as exc:
        return f"error: {exc}"
    return " ".join(getattr(c, "text", "") for c in result.contents)


async def test_control_the_server_itself_reads_each_respelling_as_the_secret_item() -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(SPELLED)])
    async with Client(params, cache=None) as direct:
        for uri, secret in RESPELLED.items():
            assert await text_of(direct, uri) == secret, uri


async def test_a_denied_resource_is_denied_under_every_spelling(tmp_path: Path) -> None:
    server = spelled(resources={"default": "deny", "rules": RULES})
    state = tmp_path / "state"
    async with connected(build(write_config(tmp_path, {"s": server}), state)) as client:
        assert await text_of(client, "cellblock://s/note://public") == "a public note"
        assert await text_of(client, "cellblock://s/file:///srv/public/readme") == "public readme"
        # a legitimate escape is read: both of its spellings are allowed
        assert await text_of(client, "cellblock://s/file:///srv/public/a%20b") == "a file with a space"
        for uri, secret in RESPELLED.items():
            seen = await text_of(client, f"cellblock://s/{uri}")
            # denied by the rule, or (a spelling no template covers as written) as not in the catalog
            assert seen.startswith(("error: denied by policy", "error: refused: route")), (uri, seen)
            assert secret not in seen
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    denied = [e for e in records if e["event"] == "call" and e["decision"] == "deny"]
    assert len(denied) == len(RESPELLED)


async def test_a_held_resource_is_held_under_a_spelling_an_approved_template_covers(tmp_path: Path) -> None:
    """`note://secret` is listed since the approval (held); `note://%73ecret` is covered by the
    approved template `note://{title}` as written, and is the same item to the server."""
    state = tmp_path / "state"
    server = spelled(resources={"default": "allow"}, lock={"enabled": True, "first": "trust"})
    async with connected(build(write_config(tmp_path, {"s": server}), state)) as client:
        assert await text_of(client, "cellblock://s/note://public") == "a public note"
    server["env"] = {"SPELLED_CHANGED": "1"}
    async with connected(build(write_config(tmp_path, {"s": server}), state)) as client:
        assert await text_of(client, "cellblock://s/note://public") == "a public note"  # approved template
        for uri in ("note://secret", "note://%73ecret", "NOTE://secret"):
            seen = await text_of(client, f"cellblock://s/{uri}")
            assert seen.startswith("error: refused: lock") and "TOP SECRET" not in seen, (uri, seen)


@pytest.mark.parametrize("first", ["get", "read"])
async def test_a_server_started_by_a_get_or_read_is_judged_by_what_it_offers_once_started(
    tmp_path: Path, first: str
) -> None:
    """A lazy server is judged from its approved catalog until it starts; a get or read that
    starts it waits for the lock to see what it offers now, and a changed item is held."""
    state = tmp_path / "state"
    server = spelled(tools={"default": "allow"}, lock={"enabled": True, "first": "trust"}, start="lazy")
    async with connected(build(write_config(tmp_path, {"s": server}), state)) as client:
        assert (await client.get_prompt("s__greet")).messages  # starts it: the catalog is trusted
    server["env"] = {"SPELLED_CHANGED": "1"}
    async with connected(build(write_config(tmp_path, {"s": server}), state)) as client:
        if first == "get":
            with pytest.raises(MCPError, match="refused: lock: prompt 'greet'"):
                await client.get_prompt("s__greet")
        else:
            assert (await text_of(client, "cellblock://s/note://secret")).startswith("error: refused: lock")


async def test_a_get_or_read_that_routes_nowhere_is_refused_and_audited(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with connected(build(write_config(tmp_path, {"s": spelled(tools={"default": "allow"})}), state)) as client:
        with pytest.raises(MCPError, match="unknown prompt 's__nope'"):
            await client.get_prompt("s__nope")
        for uri in ("note://index", "cellblock://nosuch/note://index"):
            assert (await text_of(client, uri)).startswith("error: ")
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    refused = [(e["tool"], e["rule"]) for e in records if e["event"] == "call" and e["decision"] == "deny"]
    assert refused == [
        ("prompt:s__nope", "route"),
        ("resource:note://index", "route"),
        ("resource:cellblock://nosuch/note://index", "route"),
    ]
