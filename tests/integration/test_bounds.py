"""What a peer may send the gateway: lines of bounded size, notifications within a budget, and
request ids as MCP allows them. Each bound is tried past its edge, through `cellblock serve`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.downstream.ratelimit import NOTICE_BURST
from tests.integration.conftest import eventually, gateway, probe_server, write_config
from tests.integration.raw import Raw, open_session, raw_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

RAW = Path(__file__).resolve().parents[1] / "servers" / "raw.py"
LIMIT = 1 << 20  # max_message_size in these configs


def raw_server(*args: str, **extra: Any) -> dict[str, Any]:
    jail = {"read_only": [str(RAW.parent)]}
    return {"command": sys.executable, "args": [str(RAW), *args], "jail": jail, **extra}


def config(tmp: Path, **raw: Any) -> Path:
    return write_config(
        tmp,
        {"raw": raw_server(protocol="legacy", **raw), "probe": probe_server()},
        defaults={"tools": {"default": "allow"}, "lock": {"enabled": False}, "max_message_size": LIMIT},
    )


def peak_memory(pid: int) -> int:
    """The most memory (resident, in bytes) the process has held since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


async def call(raw: Raw, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return await raw.request("tools/call", {"name": name, "arguments": arguments or {}})


def text(response: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in response["result"]["content"])


async def test_a_300_mb_answer_is_refused_naming_the_server_and_the_gateway_stays_small(tmp_path: Path) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        await open_session(raw, "legacy")
        assert text(await call(raw, "raw__ok")) == "ok"
        before = peak_memory(raw.pid)
        answer = await call(raw, "raw__huge", {"size": 300_000_000})
        assert answer["result"]["isError"] is True
        assert "server 'raw'" in text(answer) and "larger than Cellblock accepts" in text(answer)
        grew = peak_memory(raw.pid) - before
        assert grew < 64 << 20, f"the gateway grew by {grew:,} bytes reading one line"
        assert text(await call(raw, "probe__echo", {"message": "still here"})) == "still here"
        assert text(await call(raw, "raw__ok")) == "ok"


async def test_a_line_that_never_ends_costs_the_call_its_timeout_not_the_gateway_its_memory(tmp_path: Path) -> None:
    done = tmp_path / "written"
    servers = config(tmp_path, timeout=3, jail={"read_only": [str(RAW.parent)], "read_write": [str(tmp_path)]})
    async with raw_gateway(servers, tmp_path / "state") as raw:
        await open_session(raw, "legacy")
        before = peak_memory(raw.pid)
        arguments = {"size": 300_000_000, "newline": False, "done_file": str(done)}
        answer = await call(raw, "raw__huge", arguments)
        assert "server 'raw'" in text(answer) and "took longer than 3s" in text(answer)
        await eventually(done.exists, timeout=60)  # the gateway has read all 300 MB of it
        grew = peak_memory(raw.pid) - before
        assert grew < 64 << 20, f"the gateway grew by {grew:,} bytes reading one line"
        assert text(await call(raw, "probe__echo", {"message": "still here"})) == "still here"


async def test_a_server_that_keeps_sending_oversized_answers_is_restarted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with raw_gateway(config(tmp_path), state) as raw:
        await open_session(raw, "legacy")
        for _ in range(3):
            answer = await call(raw, "raw__huge", {"size": 2 * LIMIT})
            assert "larger than Cellblock accepts" in text(answer)
        # restarted: the next call waits for the new process and is answered by it
        assert text(await call(raw, "raw__ok")) == "ok"
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    exits = [e for e in events if e["event"] == "server_exit" and e["server"] == "raw"]
    assert [e["reason"] for e in exits][:1] == [f"it sent 3 messages over the limit of {LIMIT:,} bytes"]


async def test_an_oversized_request_from_the_client_is_refused_and_the_next_one_answered(tmp_path: Path) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        await open_session(raw, "legacy")
        answer = await call(raw, "probe__echo", {"message": "x" * (2 * LIMIT)})
        assert answer["error"]["code"] == types.INVALID_REQUEST
        assert "larger than Cellblock accepts" in answer["error"]["message"]
        assert text(await call(raw, "probe__echo", {"message": "small"})) == "small"


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_ids_mcp_does_not_allow_are_refused_alike_on_both_paths(tmp_path: Path, era: str) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        meta = await open_session(raw, era)
        params = {"_meta": meta} if meta else {}
        call_ = {"name": "probe__echo", "arguments": {"message": "hi"}, **params}
        for ident in [True, None, 1.5, [1], {"a": 1}]:
            for method, body in (("tools/call", call_), ("prompts/list", params)):  # fast path, SDK path
                refused = await raw.refused({"jsonrpc": "2.0", "id": ident, "method": method, "params": body})
                assert refused["error"]["code"] == types.INVALID_REQUEST, (ident, method, refused)
        answer = await raw.request("tools/call", call_)
        assert text(answer) == "hi"
    assert "TypeError" not in (tmp_path / "gateway.log").read_text()


class Logs:
    def __init__(self) -> None:
        self.received = 0

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.received += 1


async def test_a_flood_of_notifications_is_cut_to_a_budget_and_the_other_servers_keep_answering(
    tmp_path: Path,
) -> None:
    logs = Logs()
    log = tmp_path / "gateway.log"
    async with gateway(
        config(tmp_path), tmp_path / "state", mode="legacy", logging_callback=logs.log, stderr=log
    ) as client:
        echoed: list[str] = []

        async def other_server() -> None:
            result = await client.call_tool("probe__echo", {"message": "not starved"})
            echoed.extend(c.text for c in result.content if isinstance(c, types.TextContent))

        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "raw__flood", {"count": 200_000})
            tg.start_soon(other_server)
        assert echoed == ["not starved"]
        result = await client.call_tool("raw__ok", {})
        assert not result.is_error
    assert NOTICE_BURST <= logs.received < 200_000 / 20, logs.received
    assert "notifications faster than" in log.read_text()


def _number(result: types.CallToolResult) -> int:
    return int("".join(c.text for c in result.content if isinstance(c, types.TextContent)))


async def test_a_flood_of_list_changed_is_one_re_read_at_a_time_not_one_each(tmp_path: Path) -> None:
    async with gateway(config(tmp_path), tmp_path / "state", mode="legacy") as client:
        before = _number(await client.call_tool("raw__listed", {}))
        await client.call_tool("raw__flood", {"count": 20_000, "kind": "list_changed"})
        assert (await client.call_tool("probe__echo", {"message": "up"})).content
        after = _number(await client.call_tool("raw__listed", {}))
    assert 1 <= after - before <= 5, f"{after - before} re-reads for 20,000 notifications"


async def test_what_the_client_sends_that_is_not_a_request_gets_the_json_rpc_error_for_it(tmp_path: Path) -> None:
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        await open_session(raw, "legacy")
        for line, code in [
            (b"this is not json", types.PARSE_ERROR),
            (b'{"jsonrpc":"2.0","id":7,"method":"tools/list","params":NaN}', types.PARSE_ERROR),
            (b"[" * 5000 + b"]" * 5000, types.PARSE_ERROR),
            (b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}', types.PARSE_ERROR),
            (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', types.INVALID_REQUEST),
            (b"42", types.INVALID_REQUEST),
        ]:
            answer = await raw.refused_line(line)
            assert answer["error"]["code"] == code, line[:40]
        stringly = {"jsonrpc": "2.0", "id": 53, "method": "tools/list", "params": "not an object"}
        assert (await raw.exchange(stringly))["error"]["code"] == types.INVALID_PARAMS
        # a request with a good id but a method that is no string was left unanswered (the SDK
        # cannot read it; its sender waited for ever), and one without JSON-RPC 2.0's envelope was
        # answered as if it had it: both are invalid requests
        for odd in [
            {"jsonrpc": "1.0", "id": 60, "method": "tools/list"},
            {"id": 61, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 62, "method": 5},
            {"jsonrpc": "2.0", "id": 63, "method": None},
        ]:
            assert (await raw.exchange(odd))["error"]["code"] == types.INVALID_REQUEST, odd
        assert "tools" in (await raw.request("tools/list", {}))["result"]


async def test_an_answer_that_is_not_json_fails_its_call_at_once_not_at_its_timeout(tmp_path: Path) -> None:
    async with raw_gateway(config(tmp_path, timeout=600), tmp_path / "state") as raw:
        await open_session(raw, "legacy")
        with anyio.fail_after(30):  # far less than the server's timeout
            answer = await call(raw, "raw__nan")
        assert answer["result"]["isError"] and "server 'raw'" in text(answer) and "not JSON" in text(answer)
        assert text(await call(raw, "raw__ok")) == "ok"


async def test_a_server_writing_garbage_floods_neither_the_log_nor_the_gateway_and_is_restarted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with raw_gateway(config(tmp_path), state) as raw:
        await open_session(raw, "legacy")
        await call(raw, "raw__garbage", {"count": 20_000})
        assert text(await call(raw, "probe__echo", {"message": "up"})) == "up"
        assert text(await call(raw, "raw__ok")) == "ok"  # after the restart
    log = (tmp_path / "gateway.log").read_text()
    assert log.count("not valid MCP") < 100, log.count("not valid MCP")
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    assert any(e["event"] == "server_exit" and "not valid MCP" in e["reason"] for e in events)


async def test_an_invalid_result_is_told_in_one_short_line_and_one_too_dense_to_check_is_refused(
    tmp_path: Path,
) -> None:
    """20,000 content items of no MCP type fail pydantic's validation 260,000 times, and its text
    of them all was 50 MB, built for the call's error and the log; 52,000 (under 1 MB) hold more
    values than the gateway validates at all: each bad one costs pydantic kilobytes."""
    async with raw_gateway(config(tmp_path), tmp_path / "state") as raw:
        await open_session(raw, "legacy")
        assert text(await call(raw, "raw__ok")) == "ok"
        answer = await call(raw, "raw__invalid", {"count": 20_000})
        told = text(answer)
        assert answer["result"]["isError"] and "server 'raw' sent an invalid result for 'invalid'" in told, told
        assert "260000 validation errors" in told and len(told) < 300, told
        before = peak_memory(raw.pid)
        answer = await call(raw, "raw__invalid", {"count": 52_000})
        grew = peak_memory(raw.pid) - before
        told = text(answer)
        assert answer["result"]["isError"] and "server 'raw'" in told and "more than 100,000 values" in told, told
        assert grew < 64 << 20, f"the gateway grew by {grew:,} bytes refusing one dense result"
        assert text(await call(raw, "probe__echo", {"message": "still here"})) == "still here"
        assert text(await call(raw, "raw__ok")) == "ok"
    assert len((tmp_path / "gateway.log").read_text()) < 100_000
