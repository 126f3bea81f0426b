"""The pieces of a server's connection that are not the supervisor's state: its streams watched
for their end, and what a failed start is told as."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp import Client
from mcp.client.extension import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, Implementation

from cellblock import __version__
from cellblock.gateway.errors import first_line
from cellblock.gateway.wire.lines import remote_message
from cellblock.sandbox.egress import Decision

__all__ = [
    "CLIENT_INFO",
    "START_SECONDS",
    "connection_closed",
    "egress_told",
    "error_answered",
    "failure_text",
    "gateway_client",
    "watched",
]

# what the gateway introduces itself as to every server it connects to (the SDK's default is its own)
CLIENT_INFO = Implementation(name="cellblock", version=__version__)
# Every server is told the gateway takes MCP Apps: it passes their ui:// resources and tool links
# through (docs/apps.md), whether or not the client it serves renders them.
APPS = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})

logger = logging.getLogger(__name__)

# A server that takes longer than this to answer its handshake and first lists is treated as
# failed to start: the client is waiting for a catalog.
START_SECONDS = 30.0


def gateway_client(transport: Any, protocol: str, **callbacks: Any) -> Client:
    """The SDK client the gateway talks to one server with (`protocol`: auto or legacy): introduced
    as Cellblock, taking apps, lists never cached, every log asked for (2026-07-28 servers log only
    to requests that opt in)."""
    mode = "legacy" if protocol == "legacy" else "auto"
    return Client(
        transport,
        mode=mode,
        client_info=CLIENT_INFO,
        log_level="debug",
        cache=None,
        extensions=[APPS],
        **callbacks,
    )


@asynccontextmanager
async def watched(transport: Any, closed: anyio.Event, remote: bool = False) -> AsyncIterator[Any]:
    """The transport's streams, setting `closed` when the server's side ends (exit, crash, EOF);
    a `remote` server's messages are bounded here (`lines.remote_message`), a local one's as read."""
    async with transport as streams:
        read, write = streams[0], streams[1]
        send, receive = anyio.create_memory_object_stream[Any](0)

        async def pump() -> None:
            try:
                async with send:
                    async for item in read:
                        await send.send(remote_message(item) if remote else item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            finally:
                closed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            try:
                yield receive, write
            finally:
                tg.cancel_scope.cancel()


def connection_closed(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(connection_closed(e) for e in exc.exceptions)
    return isinstance(exc, MCPError) and exc.error.code == CONNECTION_CLOSED


def error_answered(exc: BaseException) -> bool:
    """The server answered a request with an error, and nothing else went wrong (not a closed
    connection, not a timeout)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(error_answered(e) for e in exc.exceptions)
    return isinstance(exc, MCPError) and exc.error.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def failure_text(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, PermissionError):
        return f"command not executable: {exc.filename or exc}"
    if isinstance(exc, TimeoutError):
        return f"no answer to the handshake within {START_SECONDS:g}s"
    if isinstance(exc, MCPError):
        return f"protocol error: {exc.message}"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(failure_text(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {first_line(exc)}"


def egress_told(name: str, event: Callable[..., None]) -> Callable[[Decision], None]:
    """What logs and audits each connection the egress proxy of server `name` allowed or refused."""

    def told(decision: Decision) -> None:
        outcome = "allowed" if decision.allowed else "refused"
        logger.info("egress: '%s' -> %s:%s %s (%s)", name, decision.host, decision.port, outcome, decision.reason)
        event(
            "egress",
            host=decision.host,
            port=decision.port,
            decision="allow" if decision.allowed else "deny",
            reason=decision.reason,
            address=decision.address,
            rule=decision.rule,
            **({"asked": decision.asked} if decision.asked is not None else {}),
        )

    return told
