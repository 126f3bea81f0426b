"""A bare JSON-RPC client for `cellblock serve`: raw answers, with no SDK in between to smooth
anything over, and the gateway's own requests (approval questions) answered."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["APPROVE", "MODERN_META", "Answer", "Raw", "approve", "open_session", "raw_gateway"]

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}
APPROVE = {"action": "accept", "content": {"decision": "allow_once"}}

# Answers a request the gateway sends the client (an approval question): method, params -> result
Answer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def approve(method: str, params: dict[str, Any]) -> dict[str, Any]:
    assert method == "elicitation/create", method
    return APPROVE


class Raw:
    """One connection to `cellblock serve`: requests out, every line in, the gateway's requests answered."""

    def __init__(self, process: Process, answer: Answer) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin, self._stdout = process.stdin, BufferedByteReceiveStream(process.stdout)
        self.pid = process.pid
        self._answer = answer
        self._ids = 0
        self._waiting: dict[Any, anyio.Event] = {}
        self.answers: dict[Any, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.asked: list[dict[str, Any]] = []  # the gateway's requests, as they came

    async def send(self, message: dict[str, Any]) -> None:
        await self._stdin.send((json.dumps(message) + "\n").encode())

    async def request(self, method: str, params: dict[str, Any], ident: Any = None) -> dict[str, Any]:
        """The whole response message (a result or an error)."""
        if ident is None:
            self._ids += 1
            ident = self._ids
        return await self.exchange({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})

    async def exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send `message`, whatever it holds, and return the answer to its id."""
        ident = message["id"]
        self._waiting[ident] = anyio.Event()
        await self.send(message)
        with anyio.fail_after(30):
            await self._waiting[ident].wait()
        return self.answers.pop(ident)

    async def answer_to(self, ident: Any) -> dict[str, Any]:
        """The answer to `ident`, a request sent with `send`, once it has come."""
        if ident not in self.answers:
            self._waiting[ident] = anyio.Event()
            with anyio.fail_after(30):
                await self._waiting[ident].wait()
        return self.answers.pop(ident)

    async def refused(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send `message` (a request the gateway must refuse) and return the error it gets, which
        carries a null id because the request's own id was no good."""
        return await self.refused_line(json.dumps(message).encode())

    async def refused_line(self, line: bytes) -> dict[str, Any]:
        """Send one raw `line` (not a request the gateway can read) and return the error it gets,
        which carries a null id."""
        self._waiting[None] = anyio.Event()
        await self._stdin.send(line + b"\n")
        with anyio.fail_after(30):
            await self._waiting[None].wait()
        return self.answers.pop(None)

    async def read(self) -> None:
        while True:
            message = json.loads(await self._stdout.receive_until(b"\n", 1 << 26))
            if "method" in message and "id" in message:
                self.asked.append(message)
                result = await self._answer(message["method"], message.get("params") or {})
                await self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})
            elif "method" in message:
                self.notifications.append(message)
            else:
                self.answers[message["id"]] = message
                if message["id"] in self._waiting:
                    self._waiting.pop(message["id"]).set()


@asynccontextmanager
async def raw_gateway(
    config: Path, state: Path, answer: Answer = approve, python: tuple[str, ...] = ("-m", "cellblock.gateway.cli.main")
) -> AsyncIterator[Raw]:
    """`cellblock serve` on `config`; `python`: what the interpreter runs, given the CLI's arguments."""
    command = [sys.executable, *python, "serve", "--config", str(config)]
    with (state.parent / "gateway.log").open("a") as errlog:
        async with await anyio.open_process(
            command, stderr=errlog, env={**os.environ, "CELLBLOCK_STATE_DIR": str(state)}
        ) as process:
            raw = Raw(process, answer)
            async with anyio.create_task_group() as tg:
                tg.start_soon(raw.read)
                yield raw
                tg.cancel_scope.cancel()


async def open_session(raw: Raw, era: str) -> dict[str, Any]:
    """The client's side of opening the connection in `era`; the `_meta` its requests carry."""
    if era == "legacy":
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "raw", "version": "1"},
        }
        assert "result" in await raw.request("initialize", hello)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return {}
    assert "result" in await raw.request("server/discover", {"_meta": MODERN_META})
    return dict(MODERN_META)
