"""Opening answers from the last start, through a real gateway: the same answers the gateway gave,
a record that is out of date corrected, and no way for the record to decide a call.

One module-wide start learns a probe server's catalog (its lock, `first: trust`) and records the
gateway's opening answers in both eras; each test starts the gateway again on a copy of that state.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cellblock.gateway.wire.early import RECORD, request_key
from tests.integration.conftest import eventually, probe_server, write_config
from tests.integration.raw import MODERN_META, Raw, raw_gateway

pytestmark = pytest.mark.anyio

TOOLS = {"default": "ask", "rules": {"echo": "allow", "crash": "deny"}}
HELLO = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"elicitation": {}},
    "clientInfo": {"name": "raw", "version": "1"},
}
MARK = "ANSWERED FROM THE RECORD"


async def opening(raw: Raw, era: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Open the connection in `era` and list the tools: the two raw answers, and the `_meta` to send."""
    if era == "legacy":
        hello = await raw.request("initialize", HELLO)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return hello, await raw.request("tools/list", {}), {}
    hello = await raw.request("server/discover", {"_meta": MODERN_META})
    return hello, await raw.request("tools/list", {"_meta": MODERN_META}), dict(MODERN_META)


def listed(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {tool["name"]: tool for tool in answer["result"]["tools"]}


@pytest.fixture(scope="module")
async def learned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The config, a state dir with the probe's lock and the recorded answers, and the gateway's
    own answers (from a start that had no record yet), per era."""
    root = tmp_path_factory.mktemp("early")
    servers = {"probe": probe_server("--name", "probe", tools=TOOLS, lock={"first": "trust"}, start="lazy")}
    config = write_config(root, servers)
    state = root / "state"
    async with raw_gateway(config, state) as raw:  # first contact: learns and locks the catalog
        await opening(raw, "legacy")
    answers = {}
    for era in ("legacy", "auto"):  # the lock is there now: these answers are recorded
        async with raw_gateway(config, state) as raw:
            answers[era] = await opening(raw, era)
    record = json.loads((state / RECORD).read_text())
    assert len(record["answers"]) == 4, record["answers"].keys()
    return {"config": config, "state": state, "answers": answers}


def fresh_state(learned: dict[str, Any], tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(learned["state"], state)
    return state


def tamper(state: Path, era: str, change: Any) -> None:
    """Rewrite the recorded tools/list answer of `era` with `change(result)`, fingerprint kept."""
    path = state / RECORD
    record = json.loads(path.read_text())
    key = request_key("tools/list", {"_meta": MODERN_META}) if era == "auto" else request_key("tools/list", {}, "raw")
    result = json.loads(record["answers"][key])
    change(result)
    record["answers"][key] = json.dumps(result)
    path.write_text(json.dumps(record))


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def edit(path: Path, change: Any) -> str:
    """Rewrite the file at `path` with `change(text)`; its text before."""
    text = path.read_text()
    path.write_text(change(text))
    return text


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_the_opening_is_answered_as_the_gateway_answered_it(
    learned: dict[str, Any], tmp_path: Path, era: str
) -> None:
    state = fresh_state(learned, tmp_path)
    async with raw_gateway(learned["config"], state) as raw:
        hello, tools, meta = await opening(raw, era)
        expected_hello, expected_tools, _ = learned["answers"][era]
        assert hello == expected_hello and tools == expected_tools
        assert "probe__echo" in listed(tools) and "probe__crash" not in listed(tools)  # denied: not listed
        # the gateway took over the connection the early answers opened
        params: dict[str, Any] = {"name": "probe__echo", "arguments": {"message": "hi"}}
        answer = await raw.request("tools/call", {**params, "_meta": meta} if meta else params)
        assert answer["result"]["content"][0]["text"] == "hi"
        assert raw.answers == {}  # each request was answered once: the gateway's own answers stayed in
        assert raw.notifications == []  # nothing was out of date
    assert "out of date" not in (tmp_path / "gateway.log").read_text()
    # the server started for the call is spoken to in its client's era, which the early answers told
    audit = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    started = [e["protocol"] for e in audit if e["event"] == "server_ready"]
    assert started[-1] == ("2025-11-25" if era == "legacy" else "2026-07-28")


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_record_out_of_date_is_corrected_and_decides_no_call(
    learned: dict[str, Any], tmp_path: Path, era: str
) -> None:
    """A record that says more than the gateway would (by a bug, or written by hand) is only ever
    a list: the client is told to list again, and the calls it invites are refused."""
    state = fresh_state(learned, tmp_path)

    def lie(result: dict[str, Any]) -> None:
        for tool in result["tools"]:
            tool["description"] = MARK
        result["tools"] += [
            {"name": "probe__ghost", "description": MARK, "inputSchema": {"type": "object"}},
            {"name": "probe__crash", "description": MARK, "inputSchema": {"type": "object"}},
        ]

    tamper(state, era, lie)
    async with raw_gateway(learned["config"], state) as raw:
        _, tools, meta = await opening(raw, era)
        assert {t["description"] for t in listed(tools).values()} == {MARK}  # it was answered early
        # the gateway, once up, finds the early answer out of date (and says so, where it can)
        await eventually(lambda: "the early answer to tools/list was out of date" in read(tmp_path / "gateway.log"))
        if era == "legacy":
            await eventually(
                lambda: {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"} in raw.notifications
            )
        again = await raw.request("tools/list", {"_meta": meta} if meta else {})
        assert again["result"] == learned["answers"][era][1]["result"]
        for name, why in (("probe__ghost", "unknown tool"), ("probe__crash", "denied by policy: crash")):
            params: dict[str, Any] = {"name": name, "arguments": {}}
            answer = await raw.request("tools/call", {**params, "_meta": meta} if meta else params)
            assert answer["result"]["isError"] is True, answer
            assert why in answer["result"]["content"][0]["text"]
    audit = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    refused = [e for e in audit if e.get("event") == "call" and e.get("decision") == "deny"]
    assert {e["tool"] for e in refused} == {"probe__ghost", "crash"}
    # the record holds the gateway's answer again
    record = json.loads((state / RECORD).read_text())
    assert MARK not in json.dumps(record)


async def test_a_changed_config_is_not_answered_from_the_old_record(learned: dict[str, Any], tmp_path: Path) -> None:
    state = fresh_state(learned, tmp_path)
    tamper(state, "legacy", lambda result: result["tools"][0].update(description=MARK))
    config = Path(learned["config"])
    original = edit(config, lambda text: text + "# edited\n")
    try:
        async with raw_gateway(config, state) as raw:
            _, tools, _ = await opening(raw, "legacy")
    finally:
        edit(config, lambda text: original)
    assert MARK not in json.dumps(tools)
    assert tools == learned["answers"]["legacy"][1]


async def test_a_client_that_leaves_after_the_early_answers_leaves_the_record_as_it_was(
    learned: dict[str, Any], tmp_path: Path
) -> None:
    """A client that only wanted the list may be gone before the gateway is up: the gateway's
    answers to the early requests are then errors (the connection closed), which say nothing
    about the record."""
    state = fresh_state(learned, tmp_path)
    before = json.loads(read(state / RECORD))
    async with raw_gateway(learned["config"], state) as raw:
        await opening(raw, "legacy")
    assert json.loads(read(state / RECORD)) == before
    assert "out of date" not in read(tmp_path / "gateway.log")


async def test_a_handshake_out_of_date_is_corrected_for_the_next_start(learned: dict[str, Any], tmp_path: Path) -> None:
    """Nothing in the protocol revises a handshake once answered: the gateway says so, and the
    next start answers with what the gateway says now."""
    state = fresh_state(learned, tmp_path)
    path = state / RECORD
    record = json.loads(read(path))
    key = request_key("initialize", HELLO)
    hello = json.loads(record["answers"][key])
    hello["instructions"] = MARK
    record["answers"][key] = json.dumps(hello)
    path.write_text(json.dumps(record))
    async with raw_gateway(learned["config"], state) as raw:
        first, _, _ = await opening(raw, "legacy")
        assert first["result"]["instructions"] == MARK  # answered early, from the record
        await eventually(lambda: "client keeps it until it reconnects" in read(tmp_path / "gateway.log"))
    async with raw_gateway(learned["config"], state) as raw:
        again, _, _ = await opening(raw, "legacy")
    assert again["result"] == learned["answers"]["legacy"][0]["result"]
