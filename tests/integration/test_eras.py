"""A local server is spoken to in the era its client opened with (downstream/offer.py).

Over stdio the gateway serves one client, whose first request says its era: a local server with
`protocol: auto` is spoken to in it, the handshake for a client that opened with `initialize`, as
the client would speak to the server itself. Where clients of both eras may share a server (the
SDK's streams alone, as an HTTP session is served), it is probed in 2026-07-28 as before; a server
with `protocol: legacy` is spoken to in the handshake whatever the client. The lock approves one
catalog in both eras, though the server lists a tool's `execution` in the handshake era only (the
control: it does). A server that refuses the handshake (one of 2026-07-28 only) is met as its
config says. The gateway runs in memory (tests/harness.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.harness import build, connected
from tests.integration.conftest import ROOT, write_config

pytestmark = pytest.mark.anyio

NOTES = ROOT / "tests" / "servers" / "notes.py"
RAW = ROOT / "tests" / "servers" / "raw.py"
HANDSHAKE, MODERN = "2025-11-25", "2026-07-28"
NOTES_SERVER = {"command": sys.executable, "args": [str(NOTES)], "jail": {"read_only": [str(NOTES.parent)]}}


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


def spoken(state: Path) -> list[tuple[str, str]]:
    """(server, protocol) of each server's start, in order, as the audit log tells it."""
    return [(e["server"], e["protocol"]) for e in events(state) if e["event"] == "server_ready"]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


# the client's era, whether it is served on the wire (as on stdio) or on the SDK's streams alone
# (as an HTTP session), and the era each server is then spoken to in
CASES = {
    "a handshake client on the wire": ("legacy", True, {"n": HANDSHAKE, "old": HANDSHAKE}),
    "a 2026-07-28 client on the wire": ("auto", True, {"n": MODERN, "old": HANDSHAKE}),
    "a handshake client on the SDK's streams, as over HTTP": ("legacy", False, {"n": MODERN, "old": HANDSHAKE}),
}


@pytest.mark.parametrize(("mode", "fast", "eras"), CASES.values(), ids=CASES.keys())
async def test_a_local_server_is_spoken_to_in_the_era_its_client_opened_with(
    tmp_path: Path, mode: str, fast: bool, eras: dict[str, str]
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, {"n": NOTES_SERVER, "old": {**NOTES_SERVER, "protocol": "legacy"}})
    async with connected(build(config, state), mode=mode, fast=fast) as client:
        for name in eras:
            assert text(await client.call_tool(f"{name}__touch", {"uri": "note://1"})) == "touched note://1"
    assert sorted(spoken(state)) == sorted(eras.items())


async def test_the_server_lists_a_tools_execution_in_the_handshake_era_only() -> None:
    """The control for the lock's test below: the two eras' listings of the same server differ."""
    listed = {}
    for mode in ("legacy", "auto"):
        async with Client(StdioServerParameters(command=sys.executable, args=[str(NOTES)]), mode=mode) as direct:
            listed[mode] = {t.name: t.execution for t in (await direct.list_tools()).tools}
    assert listed["legacy"]["watched"] == types.ToolExecution(task_support="optional")
    assert listed["auto"]["watched"] is None


@pytest.mark.parametrize(("first", "then"), [("auto", "legacy"), ("legacy", "auto")])
async def test_a_catalog_approved_in_one_era_is_approved_in_the_other(tmp_path: Path, first: str, then: str) -> None:
    state = tmp_path / "state"
    lock = {"lock": {"enabled": True, "first": "trust"}, "tools": {"default": "allow"}}
    config = write_config(tmp_path, {"n": NOTES_SERVER}, defaults=lock)
    for mode in (first, then):
        async with connected(build(config, state), mode=mode) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            assert {"n__touch", "n__watched", "n__retitle"} <= listed
            assert text(await client.call_tool("n__watched", {})) == ""
    era = {"legacy": HANDSHAKE, "auto": MODERN}
    assert spoken(state) == [("n", era[first]), ("n", era[then])]
    assert not [e for e in events(state) if e["event"] in ("lock_changed", "lock_held")]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_server_of_2026_07_28_only_is_met_as_its_config_says_for_a_handshake_client(
    tmp_path: Path, protocol: str
) -> None:
    state = tmp_path / "state"
    only = {
        "command": sys.executable,
        "args": [str(RAW), "--era", "modern", "--no-handshake"],
        "jail": {"read_only": [str(RAW.parent)]},
        "protocol": protocol,
    }
    config = write_config(tmp_path, {"s": only})
    async with connected(build(config, state), mode="legacy") as client:
        result = await client.call_tool("s__ok", {})
    if protocol == "legacy":  # the control: the handshake is refused, and the server never starts
        assert result.is_error and "no method initialize" in text(result), text(result)
        assert spoken(state) == []
    else:
        assert not result.is_error and text(result) == "ok"
        assert spoken(state) == [("s", MODERN)]
        assert not [e for e in events(state) if e["event"] == "server_failed"]
