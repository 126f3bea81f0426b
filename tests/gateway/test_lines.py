"""A pipe's JSON-RPC lines for an SDK session: the taker first, the rest in order, nothing blocks."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp.shared.message import SessionMessage

from cellblock.gateway.lines import SessionLines
from cellblock.gateway.stdio import LineReader, PipeWriter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def piped(take: Any) -> AsyncIterator[tuple[SessionLines, Any, Any, int]]:
    """SessionLines reading a pipe the test writes to (blocking fd `peer`), writing to one it drains."""
    inbound, peer = os.pipe()
    outbound, sink = os.pipe()
    os.set_blocking(inbound, False)
    os.set_blocking(sink, False)
    lines = SessionLines(lambda on_line, on_eof: LineReader(inbound, on_line, on_eof), PipeWriter(sink), take)
    try:
        async with lines.streams() as (read, write):
            yield lines, read, write, peer
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

    async with piped(take) as (_, read, _write, peer):
        os.write(peer, b'{"jsonrpc":"2.0","method":"a"}\n{"jsonrpc":"2.0","method":"fast"}\nnot json\n')
        os.write(peer, b'{"jsonrpc":"2.0","method":42}\n{"jsonrpc":"2.0","method":"b"}\n')
        with anyio.fail_after(5):
            got = [await read.receive() for _ in range(4)]
    assert [m.get("method") for m in taken] == ["fast"]
    assert isinstance(got[0], SessionMessage) and got[0].message.method == "a"
    assert isinstance(got[1], ValueError) and isinstance(got[2], ValueError)  # not JSON; not JSON-RPC
    assert isinstance(got[3], SessionMessage) and got[3].message.method == "b"


async def test_a_peer_is_never_blocked_once_the_session_is_gone() -> None:
    async with piped(lambda message: False) as (lines, read, _write, peer):
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
