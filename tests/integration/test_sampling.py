"""A downstream server asking the client's model (sampling): refused, asked about, or passed on.

Against server-everything's trigger-sampling-request, in both client eras, through the gateway in
memory (tests/harness.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from tests import peers
from tests.harness import build, connected
from tests.integration.conftest import ROOT, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]


class Client:
    """The upstream client's side: a model that answers, and a human who allows once."""

    def __init__(self) -> None:
        self.sampled: list[types.CreateMessageRequestParams] = []
        self.asked: list[str] = []

    async def sample(self, ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.sampled.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="the model says hi"), model="test-model"
        )

    async def elicit(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=["legacy", "auto"])
async def session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("sampling")
    argv = peers.everything()
    base = {"command": argv[0], "args": argv[1:], "jail": {"read_only": [str(peers.NODE_MODULES)]}}
    servers = {"closed": base, "asked": base | {"sampling": "ask"}, "open": base | {"sampling": "allow"}}
    client_side = Client()
    async with connected(
        build(write_config(tmp, servers), tmp / "state"),
        mode=request.param,
        sampling_callback=client_side.sample,
        elicitation_callback=client_side.elicit,
    ) as client:
        yield client, client_side, tmp / "state"


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


SAMPLER = ROOT / "tests" / "servers" / "sampler.py"
ARGS = {"prompt": "say hi", "maxTokens": 20}


async def test_a_server_denied_sampling_is_not_offered_it(session: Any) -> None:
    client, *_ = session
    names = {t.name for t in (await client.list_tools()).tools}
    # server-everything lists its sampling tool only to a client that can sample: the gateway does
    # not tell a denied server it can (the control: the same server allowed or asked lists it)
    assert "closed__trigger-sampling-request" not in names
    assert {"open__trigger-sampling-request", "asked__trigger-sampling-request"} <= names
    assert "closed__echo" in names


async def test_sampling_ask_asks_the_human_first(session: Any) -> None:
    client, side, _ = session
    asked, sampled = len(side.asked), len(side.sampled)
    result = await client.call_tool("asked__trigger-sampling-request", ARGS)
    assert "the model says hi" in text(result)
    assert len(side.asked) == asked + 1 and "use your model" in side.asked[-1]
    assert len(side.sampled) == sampled + 1


async def test_sampling_allow_passes_the_request_on(session: Any) -> None:
    client, side, state = session
    sampled = len(side.sampled)
    result = await client.call_tool("open__trigger-sampling-request", ARGS)
    assert "the model says hi" in text(result)
    assert len(side.sampled) == sampled + 1 and "say hi" in json.dumps(side.sampled[-1].model_dump(mode="json"))
    decisions = {(e["server"], e["decision"]) for e in events(state) if e["event"] == "sampling"}
    assert ("open", "allow") in decisions and not any(server == "closed" for server, _ in decisions)
    allowed = [e for e in events(state) if e["event"] == "sampling" and e["decision"] == "allow"]
    assert allowed[-1]["max_output"] == ARGS["maxTokens"]  # the gateway's own field, not redacted


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_without_a_model_is_never_sent_a_sampling_request(tmp_path: Path, mode: str) -> None:
    """Over stdio a server is not even offered sampling then (server-everything lists no tool that
    samples); one that asks anyway is refused: in the handshake era by the gateway's client of it,
    which never offered it; a 2026-07-28 server's request, part of its call's answer, by the gateway,
    and audited. The control is the test above: the same requests, to a client that can sample."""
    argv = peers.everything()
    everything = {"command": argv[0], "args": argv[1:], "jail": {"read_only": [str(peers.NODE_MODULES)]}}
    sampler = {"command": sys.executable, "args": [str(SAMPLER)], "jail": {"read_only": [str(SAMPLER.parent)]}}
    servers = {
        "open": everything,
        "sa": sampler | {"protocol": "legacy"},
        "sm": sampler | {"args": [str(SAMPLER), "--era", "modern"]},
    }
    config = write_config(tmp_path, {name: server | {"sampling": "allow"} for name, server in servers.items()})
    async with connected(build(config, tmp_path / "state"), mode=mode) as client:  # no sampling declared
        assert "open__trigger-sampling-request" not in {t.name for t in (await client.list_tools()).tools}
        assert text(await client.call_tool("sa__twice", {"message": "hi"})) == "sampled: none, none"
        refused = text(await client.call_tool("sm__twice", {"message": "hi"}))
    assert "the model of a client that has none to offer" in refused, refused
    offered = {e["server"]: e["offered"] for e in events(tmp_path / "state") if e["event"] == "server_ready"}
    assert offered == {"open": ["roots"], "sa": ["roots"], "sm": ["roots"]}
    [decision] = [e for e in events(tmp_path / "state") if e["event"] == "sampling"]
    assert (decision["server"], decision["decision"], decision["reason"]) == ("sm", "deny", "the client cannot sample")
