"""`serve --http`'s connections, in this process over real loopback sockets with a bare ASGI app:
how many at once, which one makes room at the cap, and how long a request may take to arrive."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest
import uvicorn
from uvicorn.server import ServerState

from cellblock.gateway.serve import connections
from cellblock.gateway.serve.connections import MAX_CONNECTIONS, Connection, Connections, connection_cap
from tests.integration.conftest import eventually

pytestmark = pytest.mark.anyio

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
HALF = b"POST / HTTP/1.1\r\nHost: x\r\nContent-"
# An answer more than the kernel holds for a client that reads nothing (about 30 KB with the
# smallest receive buffer and segments), and less than that and asyncio's own 64 KiB together.
BIG = 80_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class App:
    """Answers `/` with "ok"; `/stream` with a first chunk, and the rest once `release` is set;
    `/big` with `BIG` bytes before its "ok"."""

    def __init__(self) -> None:
        self.release = anyio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        if scope["path"] == "/big":
            await send({"type": "http.response.body", "body": b"x" * BIG, "more_body": True})
        if scope["path"] == "/stream":
            await send({"type": "http.response.body", "body": b"first ", "more_body": True})
            await self.release.wait()
        await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def served(cap: int, app: App) -> AsyncIterator[tuple[int, Connections]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    config = uvicorn.Config(app, http="h11", ws="none", lifespan="off", log_level="warning")
    config.load()
    state, pool = ServerState(), Connections(cap)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.serve, listener, lambda: Connection(pool, config, state, {}))
            yield listener.getsockname()[1], pool
            pool.stop()
            for connection in list(state.connections):
                connection.transport.close()
    finally:
        listener.close()


async def opened(port: int, data: bytes) -> anyio.abc.SocketStream:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(data)
    return stream


async def closed(stream: anyio.abc.SocketStream) -> bool:
    """Whether the gateway closed `stream` (read to its end within a few seconds)."""
    with anyio.move_on_after(5):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return True
    return False


async def answered(stream: anyio.abc.SocketStream, want: bytes = b"ok", status: bool = True) -> bool:
    """Whether `want` arrives on `stream` within a few seconds (after a 200's head, unless not `status`)."""
    got = b""
    with anyio.move_on_after(5):
        while want not in got:
            got += await stream.receive()
        return got.startswith(b"HTTP/1.1 200") or not status
    return False


def test_connections_take_half_of_the_open_files_beyond_the_reserve_within_bounds() -> None:
    assert connection_cap(128) == 32
    assert connection_cap(1024) == 480
    assert connection_cap(1 << 20) == MAX_CONNECTIONS
    assert connection_cap(20) == connections.FEWEST_CONNECTIONS


def test_the_soft_limit_of_open_files_is_raised_to_the_hard_one() -> None:
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (100, 300)); "
        "from cellblock.gateway.serve.connections import open_files; "
        "print(open_files(), resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split(maxsplit=1) == ["300", "(300, 300)\n"]


async def test_a_request_that_has_not_arrived_in_time_is_closed_however_it_trickles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connections, "ARRIVAL_SECONDS", 0.5)
    async with served(8, App()) as (port, _):
        silent = await opened(port, b"")
        half = await opened(port, HALF)
        trickle = await opened(port, b"P")
        prompt = await opened(port, REQUEST)
        assert await answered(prompt)  # control: a request sent at once is answered
        began = anyio.current_time()
        for byte in b"OST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n":
            await anyio.sleep(0.05)  # a byte every 50 ms: each arrives well within the deadline
            try:
                await trickle.send(bytes([byte]))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                break
        assert await closed(trickle) and anyio.current_time() - began < 2.5  # not a deadline per byte
        assert await closed(silent) and await closed(half)


async def test_at_the_cap_the_connection_waiting_longest_makes_room_and_a_stream_is_never_it() -> None:
    app = App()
    async with served(4, app) as (port, pool):
        stream = await opened(port, REQUEST.replace(b"GET / ", b"GET /stream "))
        assert await answered(stream, b"first ")
        waiting = [await opened(port, HALF) for _ in range(3)]
        await eventually(lambda: len(pool._open) == 4)
        # at the cap: the next request is taken, and the oldest half-sent one closed for it
        prompt = await opened(port, REQUEST)
        assert await answered(prompt)
        assert await closed(waiting[0])
        # each newer connection is kept open: one the garbage collector closed would leave room
        newer: list[anyio.abc.SocketStream] = []
        for left in waiting[1:]:
            newer.append(await opened(port, REQUEST))
            assert await answered(newer[-1])
            assert await closed(left)
        # answered, `prompt` waits for its client's next request (keep-alive), the longest by now
        newer.append(await opened(port, REQUEST))
        assert await answered(newer[-1])
        assert await closed(prompt)
        app.release.set()
        assert await answered(stream, status=False)  # the stream being answered was never the one closed


async def test_a_connection_that_does_not_take_its_answers_waits_for_its_client_and_is_closed_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connections, "ARRIVAL_SECONDS", 0.5)
    async with served(4, App()) as (port, pool):
        # an answer it does not read, asked with Connection: close: uvicorn closes the connection
        # once it has written the answer, and a close waits for the client to take it first
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)  # small segments: the kernel holds less
        sock.connect(("127.0.0.1", port))
        try:
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            prompt = await opened(port, REQUEST)
            assert await answered(prompt)  # control: a client that reads is answered meanwhile
            await prompt.aclose()
            # its answer not taken, the connection is closed when the deadline comes
            await eventually(lambda: not pool._open, 5)
        finally:
            sock.close()
