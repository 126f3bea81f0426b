"""A pipe's JSON-RPC lines for an SDK session: the taker first, the rest in order, nothing blocks."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.shared.message import SessionMessage

from cellblock.gateway.wire.lines import MAX_VALUES, SessionLines, remote_message, request_id
from cellblock.gateway.wire.stdio import LineReader, Oversized, PipeWriter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def piped(
    take: Any, oversized: list[Oversized] | None = None, limit: int = 1 << 20
) -> AsyncIterator[tuple[SessionLines, Any, Any, int, int]]:
    """SessionLines reading a pipe the test writes to (blocking fd `peer`), writing to one whose
    read end (`outbound`, blocking) the test reads."""
    inbound, peer = os.pipe()
    outbound, sink = os.pipe()
    os.set_blocking(inbound, False)
    os.set_blocking(sink, False)
    dropped = oversized if oversized is not None else []
    lines = SessionLines(
        lambda on_line, on_eof, on_oversize: LineReader(inbound, on_line, on_eof, on_oversize, limit=limit),
        PipeWriter(sink),
        take,
        dropped.append,
    )
    try:
        async with lines.streams() as (read, write):
            yield lines, read, write, peer, outbound
    finally:
        lines.close()
        for fd in (inbound, peer, outbound, sink):
            os.close(fd)


async def test_the_taker_sees_every_line_first_and_the_session_gets_the_rest_in_order() -> None:
    taken: list[Any] = []

    def take(message: Any) -> bool:
        if isinstance(message, dict) and message.get("method") == "fast":
            taken.append(message)
            return True
        return False

    async with piped(take) as (_, read, _write, peer, _out):
        os.write(peer, b'{"jsonrpc":"2.0","method":"a"}\n{"jsonrpc":"2.0","method":"fast"}\nnot json\n')
        os.write(peer, b'{"jsonrpc":"2.0","method":42}\n{"jsonrpc":"2.0","method":"b"}\n')
        with anyio.fail_after(5):
            got = [await read.receive() for _ in range(4)]
    assert [m.get("method") for m in taken] == ["fast"]
    assert isinstance(got[0], SessionMessage) and got[0].message.method == "a"
    assert isinstance(got[1], ValueError) and isinstance(got[2], ValueError)  # not JSON; not JSON-RPC
    assert isinstance(got[3], SessionMessage) and got[3].message.method == "b"


async def test_a_peer_is_never_blocked_once_the_session_is_gone() -> None:
    async with piped(lambda message: False) as (lines, read, _write, peer, _out):
        await read.aclose()  # the session left without closing the pipe
        # far more than a pipe holds: the write ends only if the lines are still being read
        flood = b'{"jsonrpc":"2.0","method":"notifications/x"}\n' * 40_000

        def write_all() -> None:
            view = memoryview(flood)
            while view:
                view = view[os.write(peer, view) :]

        with anyio.fail_after(20):
            await anyio.to_thread.run_sync(write_all)
        assert not lines._backlog  # dropped, not kept


async def test_text_that_cannot_be_encoded_reaches_the_session_replaced_and_nan_is_not_json() -> None:
    taken: list[Any] = []
    async with piped(lambda message: taken.append(message) or False) as (_, read, _write, peer, _out):
        os.write(peer, b'{"jsonrpc":"2.0","method":"a","params":{"t":"hi \\ud800","\\udfff":1}}\n')
        os.write(peer, b'{"jsonrpc":"2.0","method":"b","params":{"n":NaN}}\n')
        with anyio.fail_after(5):
            got = [await read.receive() for _ in range(2)]
    assert taken == [{"jsonrpc": "2.0", "method": "a", "params": {"t": "hi \ufffd", "\ufffd": 1}}]
    assert isinstance(got[0], SessionMessage) and got[0].message.params == {"t": "hi \ufffd", "\ufffd": 1}
    assert isinstance(got[1], ValueError)  # NaN is not JSON; the taker never saw it


async def test_a_line_over_the_limit_is_dropped_and_told_with_its_ends_and_the_next_one_arrives() -> None:
    oversized: list[Oversized] = []
    async with piped(lambda message: False, oversized, limit=64 << 10) as (_, read, _write, peer, _out):
        huge = b'{"jsonrpc":"2.0","id":7,"result":{"text":"' + b"x" * (3 << 20) + b'"}}\n'

        def write_all() -> None:
            view = memoryview(huge + b'{"jsonrpc":"2.0","method":"after"}\n')
            while view:
                view = view[os.write(peer, view) :]

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, write_all)
            with anyio.fail_after(10):
                after = await read.receive()
    assert isinstance(after, SessionMessage) and after.message.method == "after"
    [line] = oversized
    assert line.size == len(huge) - 1
    assert request_id(line) == 7


def test_a_dropped_lines_id_is_found_at_either_end_and_never_in_its_content() -> None:
    def ends(text: bytes) -> Oversized:
        return Oversized(len(text), text[:256], text[-256:])

    middle = b'"content":[{"type":"text","text":"' + b"y" * 1000 + b'"}],"structuredContent":{"id":5}'
    assert request_id(ends(b'{"jsonrpc":"2.0","id":"cb-3","result":{' + middle + b"}}")) == "cb-3"
    assert request_id(ends(b'{"result":{' + middle + b'},"jsonrpc":"2.0","id":12}')) == 12
    assert request_id(ends(b'{"jsonrpc":"2.0","result":{' + middle + b"}}")) is None
    assert request_id(ends(b'{"id":true,"result":{' + middle + b"}}")) is None


async def test_a_response_the_session_cannot_encode_becomes_an_error_for_its_request() -> None:
    async with piped(lambda message: False) as (_, _read, write, _peer, out):
        bad = types.JSONRPCResponse(jsonrpc="2.0", id=4, result={"text": "hi \ud800"})
        good = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/ok")
        with anyio.fail_after(5):
            await write.send(SessionMessage(bad))
            await write.send(SessionMessage(good))
            received = b""
            while received.count(b"\n") < 2:
                received += await anyio.to_thread.run_sync(os.read, out, 65536)
    first, second = [json.loads(line) for line in received.splitlines()]
    assert first["id"] == 4 and first["error"]["code"] == types.INTERNAL_ERROR and "result" not in first
    assert second["method"] == "notifications/ok"


def test_a_remote_message_too_dense_to_validate_becomes_an_error_for_its_request_or_for_the_session() -> None:
    dense = [{"type": "bogus"}] * (MAX_VALUES // 2 + 1)
    answer = types.JSONRPCResponse(jsonrpc="2.0", id=7, result={"content": dense})
    replaced = remote_message(SessionMessage(answer))
    assert isinstance(replaced, SessionMessage) and isinstance(replaced.message, types.JSONRPCError)
    assert replaced.message.id == 7 and "more than 100,000 values" in replaced.message.error.message
    asked = types.JSONRPCRequest(jsonrpc="2.0", id=8, method="sampling/createMessage", params={"messages": dense})
    assert isinstance(remote_message(SessionMessage(asked)), ValueError)
    # free-form fields are one value each; what is within the bound passes untouched
    free = SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=9, result={"structuredContent": {"rows": dense}}))
    assert remote_message(free) is free
    fits = SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=10, result={"content": dense[:1000]}))
    assert remote_message(fits) is fits
