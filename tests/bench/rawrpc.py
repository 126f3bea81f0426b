"""A bare JSON-RPC client over stdio: what a server's answer costs without any client SDK's parsing.

The SDK client validates every result into pydantic models; for a 2,000-tool list that takes
longer than the server does, and would hide the server's own cost. This client writes one request
line and times until the whole answer line is read, plus one `json.loads`. Handshake era only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp.client.stdio import StdioServerParameters

from tests.bench.spawn import CONNECT_SECONDS

__all__ = ["RawClient", "raw_client"]

# One answer line may be this long (2,000 tools are about 0.5 MB).
MAX_LINE = 64 * 1024 * 1024
# A stopped server gets this long to exit after its stdin closes.
STOP_SECONDS = 5.0


class RawClient:
    """Requests to one server process, one at a time, each answered on one line."""

    def __init__(self, process: Process) -> None:
        if process.stdin is None or process.stdout is None:
            raise ValueError("the process needs piped stdin and stdout")
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._next_id = 0

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._stdin.send(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """Milliseconds from sending the request to its parsed answer, and the answer's result.

        Raises:
            RuntimeError: the answer is an error, or none came within CONNECT_SECONDS.
        """
        self._next_id += 1
        ident = self._next_id
        line = json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params}).encode() + b"\n"
        began = time.perf_counter()
        await self._stdin.send(line)
        with anyio.move_on_after(CONNECT_SECONDS):
            while True:
                message = json.loads(await self._stdout.receive_until(b"\n", MAX_LINE))
                if message.get("id") == ident:  # notifications in between are skipped
                    took = (time.perf_counter() - began) * 1000
                    if "error" in message:
                        raise RuntimeError(f"{method} failed: {message['error']}")
                    result: dict[str, Any] = message["result"]
                    return took, result
        raise RuntimeError(f"no answer to {method} within {CONNECT_SECONDS} s")

    async def initialize(self) -> None:
        await self.request(
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench-raw", "version": "0"}},
        )
        await self.notify("notifications/initialized", {})


@asynccontextmanager
async def raw_client(params: StdioServerParameters, log: Path) -> AsyncIterator[RawClient]:
    """Spawn the server (stderr to `log`) and complete the handshake."""
    env = {**os.environ, **(params.env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as errlog:
        process = await anyio.open_process(
            [params.command, *params.args], env=env, cwd=params.cwd, stderr=errlog, start_new_session=True
        )
        try:
            client = RawClient(process)
            await client.initialize()
            yield client
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)


async def _stop(process: Process) -> None:
    if process.stdin is not None:
        await process.stdin.aclose()  # a stdio server ends when its input does
    with anyio.move_on_after(STOP_SECONDS):
        await process.wait()
        return
    process.kill()
    await process.wait()
