"""The fast path through a real gateway: taken when it should be, indistinguishable when taken, and
no way around the protocol's or the policy's checks.

A bare JSON-RPC client (no SDK in between to smooth anything over) compares the gateway's raw
answers for the same call on the fast path (server `fast`, policy allow) and on the SDK's path
(server `asked`, policy ask, approved by the "human" each time). The probe servers run jailed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from tests.integration.conftest import PROBE, asker_servers, cli, eventually, gateway, probe_server, write_config
from tests.integration.raw import APPROVE, MODERN_META, Raw, open_session, raw_gateway

pytestmark = pytest.mark.anyio

COLLIDER = PROBE.parent / "collider.py"

ALLOW = {"default": "allow"}
ASK = {"default": "ask"}


async def call(raw: Raw, meta: dict[str, Any], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tools/call to its final answer; a 2026-07-28 approval round is answered and retried."""
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    answer = await raw.request("tools/call", params)
    result = answer.get("result", {})
    if result.get("resultType") == "input_required":
        responses = {key: APPROVE for key in result["inputRequests"]}
        retry = {**params, "inputResponses": responses, "requestState": result["requestState"]}
        answer = await raw.request("tools/call", retry)
    return answer


def config(tmp_path: Path) -> Path:
    servers = {
        "fast": probe_server("--name", "fast", tools=ALLOW),
        "asked": probe_server("--name", "asked", tools=ASK),
    }
    return write_config(tmp_path, servers, approvals={"timeout": 30})


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_fast_answer_is_the_answer_the_sdk_path_gives(tmp_path: Path, era: str) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        meta = await open_session(raw, era)
        for tool, arguments in (
            ("echo", {"message": "same"}),
            ("link", {"uri": "note://1"}),  # resource URIs rewritten to route back
            ("malformed", {}),  # the server writes junk on the side
            ("echo", {"wrong": 1}),  # the server's own error
        ):
            fast = await call(raw, meta, f"fast__{tool}", arguments)
            asked = await call(raw, meta, f"asked__{tool}", arguments)
            assert json.loads(json.dumps(fast).replace("fast", "asked")) == {**asked, "id": fast["id"]}, tool
        linked = (await call(raw, meta, "fast__link", {"uri": "note://1"}))["result"]["content"]
        assert [c.get("uri") or c["resource"]["uri"] for c in linked] == ["cellblock://fast/note://1"] * 2


async def test_allowed_calls_take_the_fast_path_and_asked_ones_the_sdk_path(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}

    async def human(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})

    async with gateway(config(tmp_path), tmp_path / "state", env=env, elicitation_callback=human) as client:
        for server in ("fast", "asked"):
            for n in range(3):
                assert not (await client.call_tool(f"{server}__echo", {"message": str(n)})).is_error
        ps = json.loads((await anyio.to_thread.run_sync(lambda: cli(env, "ps", "--json"))).stdout)
    counts = {s["name"]: (s["calls"], s["fast_calls"]) for s in ps[0]["servers"]}
    assert counts == {"fast": (3, 3), "asked": (3, 0)}


async def test_a_server_cannot_answer_another_servers_calls(tmp_path: Path) -> None:
    servers = {"a": probe_server("--name", "a", tools=ALLOW), "b": probe_server("--name", "b", tools=ALLOW)}
    config = write_config(tmp_path, servers)
    async with gateway(config, tmp_path / "state") as client:
        results: dict[str, types.CallToolResult] = {}
        stepped = anyio.Event()

        async def step(progress: float, total: float | None, message: str | None) -> None:
            stepped.set()

        async def slow_on_b() -> None:
            results["b"] = await client.call_tool("b__slow", {"steps": 2, "delay": 1}, progress_callback=step)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_on_b)
            with anyio.fail_after(30):  # both servers start first
                await stepped.wait()  # b has reported a step: its call is in flight under a private id
            # a answers every private id it can think of, b's included (and its own: a server may
            # answer its own call as it likes, so what a's call gets is a's business)
            params = types.CallToolRequestParams(name="a__forge", arguments={"first": 1, "last": 300})
            await client.session.send_request(types.CallToolRequest(params=params), types.CallToolResult)
            assert "b" not in results, "b's call ended before a forged its answers: nothing was tested"
    assert not results["b"].is_error
    assert [c.text for c in results["b"].content if isinstance(c, types.TextContent)] == ["done 2 steps"]


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_cancelled_fast_call_is_never_answered_and_the_server_is_told(tmp_path: Path, era: str) -> None:
    log = tmp_path / "probe.log"
    servers = {"fast": probe_server("--name", "fast", tools=ALLOW, env={"PROBE_LOG": str(log)}, writable=tmp_path)}
    async with raw_gateway(write_config(tmp_path, servers), tmp_path / "state") as raw:
        meta = await open_session(raw, era)
        params: dict[str, Any] = {"name": "fast__hang", "arguments": {}, **({"_meta": meta} if meta else {})}
        await raw.send({"jsonrpc": "2.0", "id": "hanging", "method": "tools/call", "params": params})
        await eventually(lambda: log.exists() and "hang started" in log.read_text())
        await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "hanging"}})
        await eventually(lambda: "cancelled hang" in log.read_text())
        after = await call(raw, meta, "fast__echo", {"message": "after"})
        assert after["result"]["structuredContent"] == {"message": "after"}
        # an answer to the cancelled call (the gateway's, or the server's passed on) would have been
        # written before this one: the server answers in order, and so does the gateway
        assert "hanging" not in raw.answers


async def test_a_call_before_the_handshake_gets_the_sdks_refusal(tmp_path: Path) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        early = await raw.request("tools/call", {"name": "fast__echo", "arguments": {"message": "too soon"}})
        assert "error" in early and "result" not in early


async def test_an_envelope_the_sdk_did_not_accept_gets_the_sdks_refusal(tmp_path: Path) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        meta = await open_session(raw, "auto")
        future = {**meta, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
        refused = await call(raw, future, "fast__echo", {"message": "from the future"})
        assert "error" in refused and "2026-07-28" in json.dumps(refused["error"])
        # and an envelope on a handshake connection is refused as well
    async with raw_gateway(config(tmp_path), tmp_path / "state2") as raw:
        await open_session(raw, "legacy")
        mixed = await call(raw, MODERN_META, "fast__echo", {"message": "wrong era"})
        assert "error" in mixed and "result" not in mixed


async def test_a_client_that_plays_with_the_gateways_private_ids_gets_its_answers_and_the_gateway_goes_on(
    tmp_path: Path,
) -> None:
    """A fast call whose server asks the user (the collider, asking under the call's own private
    id): the gateway asks the client under its first private id, `cb-1`. Before it answers, the
    client sends a request of its own under `cb-1`, an answer to an id never asked, and one under
    an id no request can have; after it, its answer again; then a call under `cb-2`, the id of
    the next question. Its ping is answered as a ping, each call gets the client's answer, and the
    gateway goes on answering."""
    collider = {"command": sys.executable, "args": [str(COLLIDER)], "jail": {"read_only": [str(PROBE.parent)]}}
    config = write_config(tmp_path, {"c": {**collider, "protocol": "legacy"}})

    async def hostile(method: str, params: dict[str, Any]) -> dict[str, Any]:
        await raw.send({"jsonrpc": "2.0", "id": "cb-1", "method": "ping"})
        await raw.send({"jsonrpc": "2.0", "id": "cb-77", "result": {"action": "accept", "content": {}}})
        await raw.send({"jsonrpc": "2.0", "id": ["cb-1"], "result": {"action": "accept", "content": {}}})
        return {"action": "accept", "content": {}}

    async with raw_gateway(config, tmp_path / "state", hostile) as raw:
        await open_session(raw, "legacy")
        assert "result" in await raw.request("tools/list", {})  # the server is up: the call is a fast one
        asked = await call(raw, {}, "c__ask", {})
        assert asked["result"]["content"][0]["text"] == "answer: accept"
        assert [m["id"] for m in raw.asked] == ["cb-1"]
        assert await raw.answer_to("cb-1") == {"jsonrpc": "2.0", "id": "cb-1", "result": {}}  # the ping's
        await raw.send({"jsonrpc": "2.0", "id": "cb-1", "result": {"action": "decline"}})  # answered already
        # the next call under the id the gateway asks its next question under
        again = await raw.request("tools/call", {"name": "c__ask", "arguments": {}}, ident="cb-2")
        assert again["result"]["content"][0]["text"] == "answer: accept"
        assert [m["id"] for m in raw.asked] == ["cb-1", "cb-2"]


@pytest.mark.parametrize("tool", ["twice", "both"])
@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_fast_call_whose_server_asks_twice_has_each_answer_from_the_user(
    tmp_path: Path, era: str, tool: str
) -> None:
    """The asker's two questions in one call (tests/gateway/serve/test_gateway.py has the SDK's path):
    asked on the wire within the call (handshake era), or as the answers to the call and its
    retries (2026-07-28; the retries are the SDK's path, the first round the fast path's)."""
    servers = asker_servers()
    names = {"first?": "ada", "second?": "bob"}
    asked: list[str] = []

    def user(params: dict[str, Any]) -> dict[str, Any]:
        question = params["message"].rsplit("\n", 1)[-1]
        asked.append(question)
        return {"action": "accept", "content": {"name": names[question]}}

    async def on_the_wire(method: str, params: dict[str, Any]) -> dict[str, Any]:
        return user(params)

    async with raw_gateway(write_config(tmp_path, servers), tmp_path / "state", on_the_wire) as raw:
        meta = await open_session(raw, era)
        assert "result" in await raw.request("tools/list", {"_meta": meta} if meta else {})  # servers up
        for server in ("a", "m"):
            asked.clear()
            params: dict[str, Any] = {"name": f"{server}__{tool}", "arguments": {}, **({"_meta": meta} if meta else {})}
            answer = await raw.request("tools/call", params)
            while answer["result"].get("resultType") == "input_required":
                result = answer["result"]
                responses = {key: user(request["params"]) for key, request in result["inputRequests"].items()}
                retry = {**params, "inputResponses": responses, "requestState": result["requestState"]}
                answer = await raw.request("tools/call", retry)
            assert answer["result"]["content"][0]["text"] == "answers: ada, bob", server
            assert sorted(asked) == ["first?", "second?"], server


async def test_a_retry_after_the_server_gave_up_on_the_call_gets_how_the_call_ended(tmp_path: Path) -> None:
    """A 2026-07-28 client holds the server's question longer than the server's timeout: the call
    ends meanwhile, and the retry that brings the answer is answered with that end."""
    asker = {**asker_servers()["a"], "timeout": 1}
    state = tmp_path / "state"
    async with raw_gateway(write_config(tmp_path, {"a": asker}), state) as raw:
        meta = await open_session(raw, "auto")
        assert "result" in await raw.request("tools/list", {"_meta": meta})
        params = {"name": "a__twice", "arguments": {}, "_meta": meta}
        asked = (await raw.request("tools/call", params))["result"]
        assert asked["resultType"] == "input_required"
        await eventually(lambda: '"call_end"' in (state / "audit.jsonl").read_text())  # the server's timeout
        answer = {key: {"action": "accept", "content": {"name": "ada"}} for key in asked["inputRequests"]}
        retry = await raw.request(
            "tools/call", {**params, "inputResponses": answer, "requestState": asked["requestState"]}
        )
        assert retry["result"]["isError"] and "took longer than 1s" in retry["result"]["content"][0]["text"]
