"""The gateway in memory: a real `Gateway` served to the SDK's real `Client` over anyio memory streams.

The downstream servers are what the config names (the test servers under tests/servers, jailed as
configured), started and supervised as under `cellblock serve`; only the process around the gateway
is left out: stdin and stdout, the fast path that reads them (`Gateway.serve_stdio`), signals and
the early answers. Those are tested by running `cellblock serve` (tests/integration/).

    gateway = build(write_config(tmp_path, servers), tmp_path / "state")
    async with connected(gateway) as client:
        await client.call_tool("p__echo", {"message": "hi"})
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.shared.memory import create_client_server_memory_streams

from cellblock.gateway.config.loading import load_config
from cellblock.gateway.downstream.backoff import Backoff
from cellblock.gateway.serve.gateway import Gateway

__all__ = ["build", "connected"]

# Once the client has gone, the gateway stops its servers (each gets a moment to exit by itself).
STOP_SECONDS = 15.0


def build(config: Path, state: Path, *, backoff: Backoff | None = None) -> Gateway:
    """The gateway `cellblock serve --config CONFIG` would run, with its state in `state` and no
    control socket (nothing for `cellblock approve` or `cellblock ps` to reach).

    `backoff`: how its servers are restarted when they crash (the default's five waits add up to 15.5 s).
    """
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    loaded, source = load_config(config)
    gateway = Gateway(loaded, state, None, source)
    if backoff is not None:
        for downstream in gateway.downstreams.values():
            downstream.supervisor.backoff = backoff
    return gateway


@asynccontextmanager
async def connected(gateway: Gateway, *, mode: str = "auto", **client_args: Any) -> AsyncIterator[Client]:
    """`gateway` running, and the SDK's client connected to it in `mode` (`legacy`: the handshake;
    `auto`: 2026-07-28). `client_args` go to `Client` (an elicitation callback, say).

    Raises:
        TimeoutError: the gateway did not stop within STOP_SECONDS of the client leaving.
    """
    async with create_client_server_memory_streams() as (client_streams, server_streams):
        stopped = anyio.Event()

        async def run() -> None:
            try:
                await gateway.run(*server_streams)
            finally:
                gateway.audit.close()  # as serve_stdio does: the counts of what a budget left out
                stopped.set()

        @asynccontextmanager
        async def transport() -> AsyncIterator[Any]:
            yield client_streams

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                async with Client(transport(), mode=mode, cache=None, **client_args) as client:
                    yield client
            finally:
                # the end of the client's stream ends the gateway's session, and the gateway with it
                await client_streams[1].aclose()
                with anyio.fail_after(STOP_SECONDS):
                    await stopped.wait()
