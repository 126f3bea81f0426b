"""The gateway in memory (tests/harness.py), on its wire: lists, calls the policy allows, denies or asks about,
a server that dies during a call, and one that keeps crashing beside one that works. The servers
are the jailed test servers."""

from __future__ import annotations

import gc
import json
import sys
import weakref
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.downstream.backoff import Backoff
from tests.harness import build, connected
from tests.integration.conftest import asker_servers, probe_server, write_config

pytestmark = pytest.mark.anyio

RAW = Path(__file__).resolve().parents[2] / "servers" / "raw.py"
POLICY = {"default": "deny", "rules": {"echo": "allow", "slow": "ask"}}
# a crashing server is given up on in a moment, not after 15 s of waits
QUICK = Backoff(first=0.01, most=0.01)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def events(state: Path, event: str) -> list[dict[str, Any]]:
    lines = (state / "audit.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["event"] == event]


class Human:
    """Answers each approval question with `decision`, and counts them."""

    def __init__(self, decision: str) -> None:
        self.decision = decision
        self.asked: list[str] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": self.decision})


def raw_server() -> dict[str, Any]:
    """The raw test server: no SDK, so it starts at once (for tests where the server is not the point)."""
    return {
        "command": sys.executable,
        "args": [str(RAW), "--era", "legacy"],
        "protocol": "legacy",
        "jail": {"read_only": [str(RAW.parent)]},
    }


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_client_lists_every_servers_tools_under_the_servers_name(tmp_path: Path, mode: str) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p"), "r": raw_server()})
    async with connected(build(config, tmp_path / "state"), mode=mode) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
    assert names == sorted(names)
    assert {"p__echo", "p__slow", "r__ok", "r__say"} <= set(names)
    assert all(name.startswith(("p__", "r__")) for name in names)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_allowed_call_is_forwarded_and_audited_before_it_runs(tmp_path: Path, mode: str) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p", tools=POLICY)})
    state = tmp_path / "state"
    async with connected(build(config, state), mode=mode) as client:
        result = await client.call_tool("p__echo", {"message": "through"})
    assert not result.is_error and result.structured_content == {"message": "through"}
    [call] = events(state, "call")
    assert (call["server"], call["tool"], call["decision"]) == ("p", "echo", "allow")
    [end] = events(state, "call_end")
    assert end["tool"] == "echo" and end["is_error"] is False


def test_a_call_walks_one_list_of_named_steps_and_the_fast_path_walks_the_same_list(tmp_path: Path) -> None:
    gateway = build(write_config(tmp_path, {"r": raw_server()}), tmp_path / "state")
    handler = gateway.call_handler
    assert [step.name for step in handler.path] == [
        *("served", "search", "own", "reply", "retry", "review", "local"),
        *("route", "start", "secrets", "lock", "policy", "share", "approval", "record"),
        *("run", "ready", "recheck", "send"),
    ]
    assert handler.fast == tuple(step.now for step in handler.path if step.now is not None)
    # every stage decides on both paths; the fast path can neither answer the gateway's own
    # tools nor wait for a server to start, and the SDK validated the request itself
    assert [step.name for step in handler.path if step.now is None] == ["review", "run", "ready", "recheck", "send"]
    assert [step.name for step in handler.path if step.run is None] == ["served", "local", "ready", "recheck", "send"]
    # once a ToolCall, an admitted call walks the rest of the same list (`ToolCall.start`)
    assert [step.name for step in handler.path if step.then is not None] == ["ready", "recheck", "send"]
    assert gateway.calls.then == handler.then == tuple(step.then for step in handler.path if step.then is not None)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("fast", [True, False])
async def test_the_harness_serves_on_the_gateways_wire_where_the_fast_path_answers(
    tmp_path: Path, mode: str, fast: bool
) -> None:
    """The harness's client meets the fast path, as a client of `cellblock serve` does; the
    control: served on the SDK's streams alone, the same call never reaches it."""
    gateway = build(write_config(tmp_path, {"p": probe_server("--name", "p", tools=POLICY)}), tmp_path / "state")
    async with connected(gateway, mode=mode, fast=fast) as client:
        await client.list_tools()
        result = await client.call_tool("p__echo", {"message": "through"})
    assert result.structured_content == {"message": "through"}
    assert gateway.downstreams["p"].fast_calls == (1 if fast else 0)


async def test_a_servers_catalog_read_again_leaves_no_earlier_listing_or_catalog_alive(tmp_path: Path) -> None:
    """What a server offered before its re-read, and the catalog built from it, are freed: the
    connection's coroutine (which lives as long as the connection) holds neither."""
    gateway = build(write_config(tmp_path, {"r": raw_server()}), tmp_path / "state")
    async with connected(gateway, mode="legacy") as client:
        await client.list_tools()
        ds = gateway.downstreams["r"]
        first, start = weakref.ref(ds.listing), weakref.ref(gateway.keeper.catalog)
        assert gateway.keeper.as_started()
        await ds.refresh()  # what a list_changed from the server does
        gc.collect()
        assert ds.listing is not None and first() is None and start() is None
        assert not gateway.keeper.as_started()  # a rebuild since the start


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_denied_call_is_refused_naming_the_rule_and_never_reaches_the_server(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "probe.log"
    server = probe_server("--name", "p", tools=POLICY, env={"PROBE_LOG": str(log)}, writable=tmp_path)
    state = tmp_path / "state"
    async with connected(build(write_config(tmp_path, {"p": server}), state), mode=mode) as client:
        refused = await client.call_tool("p__hang", {})
    assert refused.is_error and text(refused).startswith("denied by policy: default")
    assert "hang started" not in log.read_text()
    [call] = events(state, "call")
    assert (call["tool"], call["decision"]) == ("hang", "deny")


async def test_a_call_to_a_tool_no_server_has_is_refused_as_unknown(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"r": raw_server()})
    async with connected(build(config, tmp_path / "state")) as client:
        refused = await client.call_tool("r__nosuchtool", {})
    assert refused.is_error and "unknown tool 'r__nosuchtool'" in text(refused)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize(("decision", "forwarded"), [("allow_once", True), ("deny", False)])
async def test_an_asked_call_runs_only_when_the_human_allows_it(
    tmp_path: Path, mode: str, decision: str, forwarded: bool
) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p", tools=POLICY)}, approvals={"timeout": 30})
    human = Human(decision)
    async with connected(build(config, tmp_path / "state"), mode=mode, elicitation_callback=human) as client:
        result = await client.call_tool("p__slow", {"steps": 1, "delay": 0})
    assert len(human.asked) == 1 and "server 'p'" in human.asked[0] and 'tool "slow"' in human.asked[0]
    if forwarded:
        assert text(result) == "done 1 steps"
    else:
        assert result.is_error and "the user denied it" in text(result)


async def test_a_server_that_keeps_crashing_is_given_up_on_and_the_others_keep_working(tmp_path: Path) -> None:
    servers = {"dying": probe_server("--exit-at-start"), "fine": probe_server("--name", "fine")}
    state = tmp_path / "state"
    async with connected(build(write_config(tmp_path, servers), state, backoff=QUICK)) as client:
        assert text(await client.call_tool("fine__echo", {"message": "up"})) == "up"
        # the default backoff's waits add up to 15.5 s: this one's, to a moment
        with anyio.fail_after(10):
            # no event reaches the client: it sees the failure when it asks
            while "gave up" not in (message := text(await client.call_tool("dying__echo", {}))):
                assert "'dying'" in message
                await anyio.sleep(0.05)
        assert "gave up after 5 restarts" in message
        assert text(await client.call_tool("fine__echo", {"message": "still up"})) == "still up"
    assert len(events(state, "server_start_failed")) == 6  # the first start and five restarts


async def test_a_call_whose_server_dies_under_it_fails_naming_the_server_which_then_comes_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with connected(build(write_config(tmp_path, {"p": probe_server("--name", "p")}), state, backoff=QUICK)) as c:
        died = await c.call_tool("p__crash", {})
        assert died.is_error and "server 'p'" in text(died), text(died)
        assert text(await c.call_tool("p__echo", {"message": "back"})) == "back"  # waits for the restart
    assert len(events(state, "server_exit")) == 1 and len(events(state, "server_ready")) == 2


@pytest.mark.parametrize("tool", ["twice", "both"])
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_server_that_asks_twice_in_a_call_has_each_answer_from_the_user(
    tmp_path: Path, mode: str, tool: str
) -> None:
    """The asker asks `first?` and `second?`, one after the other (`twice`) or at once (`both`):
    as elicitation requests (`a`, a handshake server) or input rounds (`m`, 2026-07-28). Each
    question reaches the user, and each answer the server, whatever era the client speaks; a
    handshake client is asked `a`'s two at once (the gateway answers `m`'s in turn)."""
    servers = asker_servers()
    names = {"first?": "ada", "second?": "bob"}
    asked: list[str] = []
    second = anyio.Event()

    async def user(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        question = params.message.rsplit("\n", 1)[-1]
        asked.append(question)
        if question == "second?":
            second.set()
        elif (tool, mode, server) == ("both", "legacy", "a") and asked == ["first?"]:
            with anyio.fail_after(10):  # a handshake client holds both at once: the first waits for the second
                await second.wait()
        return types.ElicitResult(action="accept", content={"name": names[question]})

    config = write_config(tmp_path, servers)
    async with connected(build(config, tmp_path / "state"), mode=mode, elicitation_callback=user) as client:
        for server in ("a", "m"):
            asked.clear()
            second = anyio.Event()
            result = await client.call_tool(f"{server}__{tool}", {})
            assert text(result) == "answers: ada, bob", server
            assert sorted(asked) == ["first?", "second?"], server
