"""A real third-party server over Streamable HTTP behind the gateway: server-everything served on
loopback (its `streamableHttp` mode), its task-only tool `simulate-research-query` called through
the gateway as a 2025-11-25 task, as a local server's is (tests/integration/test_real_peers.py).

The gateway reaches the server through a TCP relay that keeps what passes each way, so a test
sees what the server was sent and answered.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests import peers
from tests.integration.conftest import eventually, free_port, gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]

RESEARCH = "simulate-research-query"  # four stages of a second each, the third asking when ambiguous
CANCEL, CANCELLED = b'"method":"tasks/cancel"', b'"status":"cancelled"'


@pytest.fixture(scope="module")
def everything_port() -> Iterator[int]:
    """server-everything serving Streamable HTTP on a free loopback port."""
    argv = [*peers.everything()[:-1], "streamableHttp"]
    port = free_port()
    env = {**peers.peer_env(), "PORT": str(port)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # its first line says it listens, or why not
        assert f"listening on port {port}" in line, line
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


class Relay:
    """Passes TCP through to `port`, keeping the bytes each way."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = bytearray()  # what the gateway sent the server
        self.answered = bytearray()  # what the server sent back

    async def handle(self, near: anyio.abc.SocketStream) -> None:
        async with near, await anyio.connect_tcp("127.0.0.1", self.port) as far, anyio.create_task_group() as tg:
            tg.start_soon(self._pump, near, far, self.sent)
            tg.start_soon(self._pump, far, near, self.answered)

    @staticmethod
    async def _pump(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, kept: bytearray) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            async for chunk in source:
                kept.extend(chunk)
                await sink.send(chunk)
            await sink.send_eof()


@pytest.fixture(scope="module")
async def relayed(everything_port: int) -> AsyncIterator[tuple[str, Relay]]:
    relay = Relay(everything_port)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, relay.handle)
        yield f"http://127.0.0.1:{port}/mcp", relay
        tg.cancel_scope.cancel()


class Asked:
    def __init__(self) -> None:
        self.messages: list[str] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.messages.append(params.message)
        return types.ElicitResult(action="accept", content={"interpretation": "programming"})


@pytest.fixture(scope="module")
async def client(
    relayed: tuple[str, Relay], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Client, Asked, Relay]]:
    url, relay = relayed
    tmp, asked = tmp_path_factory.mktemp("remote-peers"), Asked()
    # the same server twice: `slow` gives a call two seconds, less than the research takes
    config = write_config(tmp, {"web": {"url": url, "timeout": 30}, "slow": {"url": url, "timeout": 2}})
    async with gateway(config, tmp / "state", elicitation_callback=asked) as c:
        yield c, asked, relay


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_without_a_task_the_real_server_refuses_its_task_only_tool(everything_port: int) -> None:
    # the control: called plainly, as the gateway called a remote server's tools before
    async with Client(streamable_http_client(f"http://127.0.0.1:{everything_port}/mcp")) as direct:
        [tool] = [t for t in (await direct.list_tools()).tools if t.name == RESEARCH]
        assert tool.execution is not None and tool.execution.task_support == "required"
        plain = await direct.call_tool(RESEARCH, {"topic": "python"})
    assert plain.is_error and "requires task augmentation" in text(plain), text(plain)


async def test_a_remote_servers_task_only_tool_is_called_as_a_task_and_asks_on_the_way(
    client: tuple[Client, Asked, Relay],
) -> None:
    c, asked, relay = client
    tools = {t.name: t for t in (await c.list_tools()).tools}
    assert tools[f"web__{RESEARCH}"].execution is None  # whether it runs as a task is the gateway's to say
    before = len(asked.messages)
    result = await c.call_tool(f"web__{RESEARCH}", {"topic": "python", "ambiguous": True})
    assert not result.is_error, text(result)
    assert "Research Report: python (programming)" in text(result)
    [question] = asked.messages[before:]
    assert question.startswith("Question from server 'web' (not a Cellblock approval):\n")
    assert "interpretations" in question
    assert "io.modelcontextprotocol/related-task" not in (result.meta or {})
    assert b'"task":{}' in relay.sent and b'"method":"tasks/result"' in relay.sent


async def test_a_cancelled_call_cancels_the_remote_servers_task(client: tuple[Client, Asked, Relay]) -> None:
    c, _, relay = client
    cancels, cancelled = relay.sent.count(CANCEL), relay.answered.count(CANCELLED)
    with anyio.move_on_after(1.5):  # the research takes four seconds
        await c.call_tool(f"web__{RESEARCH}", {"topic": "snakes"})
    await eventually(lambda: relay.sent.count(CANCEL) > cancels)
    await eventually(lambda: relay.answered.count(CANCELLED) > cancelled)  # the server's answer to it
    # the server is still usable afterwards
    assert "Echo: still here" in text(await c.call_tool("web__echo", {"message": "still here"}))


async def test_a_remote_servers_error_to_its_task_names_the_server(client: tuple[Client, Asked, Relay]) -> None:
    c, _, _ = client
    wrong = await c.call_tool(f"web__{RESEARCH}", {"topic": 3})  # the server makes no task of this
    assert wrong.is_error
    assert text(wrong).startswith(f"server 'web' answered '{RESEARCH}' with an error: "), text(wrong)


async def test_a_remote_servers_progress_reaches_the_client(client: tuple[Client, Asked, Relay]) -> None:
    c, _, _ = client
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    done = await c.call_tool(
        "web__trigger-long-running-operation", {"duration": 1, "steps": 2}, progress_callback=progress
    )
    assert not done.is_error and seen == [1, 2]


async def test_a_call_that_times_out_cancels_the_remote_servers_task(client: tuple[Client, Asked, Relay]) -> None:
    c, _, relay = client
    cancels, cancelled = relay.sent.count(CANCEL), relay.answered.count(CANCELLED)
    late = await c.call_tool(f"slow__{RESEARCH}", {"topic": "snakes"})
    assert (
        late.is_error and text(late) == f"call to '{RESEARCH}' on server 'slow' took longer than 2s and was cancelled"
    )
    await eventually(lambda: relay.sent.count(CANCEL) > cancels)
    await eventually(lambda: relay.answered.count(CANCELLED) > cancelled)
