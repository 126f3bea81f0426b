"""The gateway in memory: a real `Gateway` served to the SDK's real `Client`, in this process.

The client speaks to the gateway over a pair of connected sockets, through the gateway's own wire
(`serve/stdio.py: serve_wire`: the line reader and writer `cellblock serve` uses on its pipes, the fast
path first, the SDK's server for the rest), so a test meets what a client of `cellblock serve`
meets. `fast=False` serves the SDK's streams alone (`Gateway.run`), as an HTTP session is. The
downstream servers are what the config names (the test servers under tests/servers, jailed as
configured), started and supervised as under `cellblock serve`. Only the process around the
gateway is left out: stdin and stdout themselves, signals and the early answers, tested by running
`cellblock serve` (tests/integration/).

    gateway = build(write_config(tmp_path, servers), tmp_path / "state")
    async with connected(gateway) as client:
        await client.call_tool("p__echo", {"message": "hi"})
"""

from __future__ import annotations

import math
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage

from cellblock.gateway.config.loading import load_config
from cellblock.gateway.downstream.backoff import Backoff
from cellblock.gateway.serve.gateway import Gateway
from cellblock.gateway.serve.stdio import serve_wire
from cellblock.gateway.wire.stdio import DEFAULT_LINE_LIMIT, LineReader, OnLine, OnOversize, PipeWriter, Reader

__all__ = ["build", "connected", "unfollowed"]

# Once the client has gone, the gateway stops its servers (each gets a moment to exit by itself).
STOP_SECONDS = 15.0


def build(config: Path, state: Path, *, backoff: Backoff | None = None, runtime: Path | None = None) -> Gateway:
    """The gateway `cellblock serve --config CONFIG` would run, with its state in `state`.

    `backoff`: how its servers are restarted when they crash (the default's five waits add up to 15.5 s).
    `runtime`: the `XDG_RUNTIME_DIR` of the CLI that reaches it (`cellblock approve`, `pending`,
    `ps`; `tests/integration/conftest.cli_env` makes one): its control socket is served in
    `runtime/cellblock`, as `cellblock serve` serves it. One gateway per directory: the socket is
    named by the pid, and every gateway in memory shares this process's. Without it: no control socket.
    """
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    loaded, source = load_config(config)
    control = None
    if runtime is not None:
        control = runtime / "cellblock"
        for private in (runtime, control):  # the CLI uses a runtime dir only while it is private
            private.mkdir(mode=0o700, exist_ok=True)
    gateway = Gateway(loaded, state, control, source)
    if backoff is not None:
        for downstream in gateway.downstreams.values():
            downstream.supervisor.backoff = backoff
    return gateway


def unfollowed(gateway: Gateway) -> Gateway:
    """`gateway` with every server spoken to in its config's era whatever its client speaks, as a
    server that starts before its client has spoken is, and every server of `--http`
    (downstream/offer.py): for the tests of a client and a server of different eras."""
    gateway.offer.spoken = lambda server: server.protocol  # type: ignore[method-assign]
    return gateway


@asynccontextmanager
async def connected(
    gateway: Gateway, *, mode: str = "auto", fast: bool = True, **client_args: Any
) -> AsyncIterator[Client]:
    """`gateway` running, and the SDK's client connected to it in `mode` (`legacy`: the handshake;
    `auto`: 2026-07-28), over the gateway's wire (`fast=False`: its SDK server alone). `client_args`
    go to `Client` (an elicitation callback, say).

    Raises:
        TimeoutError: the gateway did not stop within STOP_SECONDS of the client leaving.
    """
    stopped = anyio.Event()
    async with anyio.create_task_group() as tg, _streams(gateway, fast, stopped, tg) as (transport, close):
        try:
            async with Client(transport(), mode=mode, cache=None, **client_args) as client:
                yield client
        finally:
            # the end of the client's stream ends the gateway's session, and the gateway with it
            await close()
            with anyio.fail_after(STOP_SECONDS):
                await stopped.wait()


@asynccontextmanager
async def _streams(gateway: Gateway, fast: bool, stopped: anyio.Event, tg: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The client's transport and how it closes, with the gateway started in `tg`."""

    async def run(serve: Any) -> None:
        try:
            await serve
        finally:
            gateway.audit.close()  # as serve_stdio does: the counts of what a budget left out
            stopped.set()

    if not fast:
        async with create_client_server_memory_streams() as (client_streams, server_streams):
            tg.start_soon(run, gateway.run(*server_streams))

            @asynccontextmanager
            async def memory() -> AsyncIterator[Any]:
                yield client_streams

            yield memory, client_streams[1].aclose
        return
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):
        end.setblocking(False)
    try:
        tg.start_soon(run, serve_wire(gateway, _reader(theirs.fileno()), PipeWriter(theirs.fileno())))
        client = _LineClient(ours)
        yield client.transport, client.close
    finally:
        ours.close()
        theirs.close()


def _reader(fd: int) -> Any:
    def make(on_line: OnLine, on_eof: Any, on_oversize: OnOversize) -> Reader:
        return LineReader(fd, on_line, on_eof, on_oversize, b"", DEFAULT_LINE_LIMIT)

    return make


class _LineClient:
    """The client's end of the socket: JSON lines to and from the SDK's session streams."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, fd = sock, sock.fileno()
        self.writer = PipeWriter(fd)
        send, self.received = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
        self.to_client: MemoryObjectSendStream[SessionMessage | Exception] = send
        self.outgoing, self.to_gateway = _pair()
        self.reader = LineReader(fd, self._line, self.to_client.close, lambda _: None, b"", DEFAULT_LINE_LIMIT)

    def _line(self, line: bytes) -> None:
        try:
            message: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            )
        except ValueError as exc:
            message = exc
        self.to_client.send_nowait(message)

    @asynccontextmanager
    async def transport(self) -> AsyncIterator[Any]:
        self.reader.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write)
            try:
                yield self.received, self.outgoing
            finally:
                tg.cancel_scope.cancel()

    async def _write(self) -> None:
        async for message in self.to_gateway:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            await self.writer.write(data.encode() + b"\n")

    async def close(self) -> None:
        """The client leaves: its side of the socket is shut, which the gateway reads as EOF."""
        self.reader.close()
        self.writer.close()
        self.sock.shutdown(socket.SHUT_WR)


def _pair() -> tuple[MemoryObjectSendStream[SessionMessage], MemoryObjectReceiveStream[SessionMessage]]:
    return anyio.create_memory_object_stream[SessionMessage](math.inf)
