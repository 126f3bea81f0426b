"""The client's connection (`wire/client.Wire`) under a hostile client: the gateway's own requests
to it (`Wire.request`, under private ids `cb-N`) against the client's requests and responses that
play with those ids.

A Wire reads a pipe the test writes to and writes to one the test reads, as under `cellblock
serve`; what it hands on is what the SDK's server would be given. (The gateway around it, and
that it keeps serving, is tested through `cellblock serve` in tests/integration/test_fastpath.py.)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from cellblock.gateway.wire.client import Wire
from cellblock.gateway.wire.stdio import LineReader, PipeWriter

pytestmark = pytest.mark.anyio

QUESTION = types.ElicitRequest(
    params=types.ElicitRequestFormParams(message="Your name?", requested_schema={"type": "object", "properties": {}})
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Peer:
    """The client's end of the pipes: lines written to the gateway, lines read from it."""

    def __init__(self, fd: int, out: int) -> None:
        self.fd, self.out = fd, out
        self._buffer = b""

    def send(self, *messages: Any) -> None:
        """All of `messages` in one write: the gateway reads them in one go."""
        os.write(self.fd, b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    async def receive(self) -> dict[str, Any]:
        with anyio.fail_after(5):
            while b"\n" not in self._buffer:
                self._buffer += await anyio.to_thread.run_sync(os.read, self.out, 65536)
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message


@asynccontextmanager
async def wired() -> AsyncIterator[tuple[Wire, Peer, Any]]:
    """A Wire on a pair of pipes; its taker (the fast path) takes nothing, so what the Wire does
    not take itself arrives on the session's read stream, yielded third."""
    inbound, peer = os.pipe()
    outbound, sink = os.pipe()
    os.set_blocking(inbound, False)
    os.set_blocking(sink, False)
    wire = Wire(
        lambda on_line, on_eof, on_oversize: LineReader(inbound, on_line, on_eof, on_oversize),
        PipeWriter(sink),
    )
    try:
        async with wire.streams(lambda message: False) as (read, _write):
            yield wire, Peer(peer, outbound), read
    finally:
        for fd in (inbound, peer, outbound, sink):
            os.close(fd)


async def session_gets(read: Any) -> Any:
    with anyio.fail_after(5):
        item = await read.receive()
    return item.message if isinstance(item, SessionMessage) else item


async def asked(wire: Wire, peer: Peer, tg: Any, got: list[Any]) -> str:
    """Start `wire.request` (the outcome, or the error it raised, into `got`); the id it asked under."""

    async def ask() -> None:
        try:
            got.append(await wire.request(QUESTION, types.ElicitResult))
        except (MCPError, ValueError) as exc:
            got.append(exc)

    tg.start_soon(ask)
    question = await peer.receive()
    assert question["method"] == "elicitation/create"
    ident: str = question["id"]
    return ident


def accept(ident: Any, name: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": {"action": "accept", "content": {"name": name}}}


async def test_a_client_request_under_the_gateways_private_id_is_a_request_and_not_the_answer() -> None:
    got: list[Any] = []
    async with wired() as (wire, peer, read), anyio.create_task_group() as tg:
        ident = await asked(wire, peer, tg, got)
        assert ident.startswith("cb-")
        peer.send({"jsonrpc": "2.0", "id": ident, "method": "ping"})
        ping = await session_gets(read)
        assert isinstance(ping, types.JSONRPCRequest) and ping.id == ident and ping.method == "ping"
        assert got == []  # still waiting for its answer
        peer.send(accept(ident, "ada"))
        with anyio.fail_after(5):
            while not got:
                await anyio.lowlevel.checkpoint()
    [answer] = got
    assert isinstance(answer, types.ElicitResult) and answer.content == {"name": "ada"}


async def test_a_second_answer_to_the_same_question_is_not_taken_for_it() -> None:
    got: list[Any] = []
    async with wired() as (wire, peer, read), anyio.create_task_group() as tg:
        ident = await asked(wire, peer, tg, got)
        peer.send(accept(ident, "first"), accept(ident, "second"))  # read in one go, before the asker runs
        late = await session_gets(read)  # the second is the SDK's: a response to nothing it asked
        assert isinstance(late, types.JSONRPCResponse) and late.result["content"] == {"name": "second"}
    [answer] = got
    assert isinstance(answer, types.ElicitResult) and answer.content == {"name": "first"}


async def test_answers_to_questions_asked_at_once_reach_each_its_own_question() -> None:
    got: list[Any] = []
    async with wired() as (wire, peer, _read), anyio.create_task_group() as tg:
        first = await asked(wire, peer, tg, got)
        second = await asked(wire, peer, tg, got)
        assert first != second
        peer.send(accept(second, "two"), accept("cb-999", "never asked"), accept(first, "one"))
        with anyio.fail_after(5):
            while len(got) < 2:
                await anyio.lowlevel.checkpoint()
    assert [a.content["name"] for a in got] == ["two", "one"]


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ({"result": {"action": "decline"}, "error": {"code": -1, "message": "both"}}, "decline"),
        ({}, ValueError),  # neither a result nor an error
        ({"error": "not an error object"}, ValueError),
        ({"result": {"action": "maybe"}}, ValueError),
        ({"error": {"code": -32600, "message": "no"}}, MCPError),
    ],
)
async def test_a_malformed_answer_fails_its_question_alone(answer: dict[str, Any], outcome: Any) -> None:
    got: list[Any] = []
    async with wired() as (wire, peer, read), anyio.create_task_group() as tg:
        ident = await asked(wire, peer, tg, got)
        peer.send({"jsonrpc": "2.0", "id": ident, **answer}, {"jsonrpc": "2.0", "method": "notifications/after"})
        after = await session_gets(read)
        assert isinstance(after, types.JSONRPCNotification) and after.method == "notifications/after"
    [result] = got
    assert result.action == outcome if isinstance(outcome, str) else isinstance(result, outcome)


@pytest.mark.parametrize("ident", [[1], {"a": 1}, None, 1.5, True])
async def test_an_answer_under_an_id_no_request_can_have_reaches_the_session_as_invalid_and_fails_nothing(
    ident: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with wired() as (_wire, peer, read):
        with caplog.at_level(logging.ERROR):
            peer.send(
                {"jsonrpc": "2.0", "id": ident, "result": {}}, {"jsonrpc": "2.0", "method": "notifications/after"}
            )
            items = [await session_gets(read) for _ in range(2)]
    assert isinstance(items[0], ValueError)  # the SDK's session counts it as not JSON-RPC, as any other
    assert isinstance(items[1], types.JSONRPCNotification) and items[1].method == "notifications/after"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
