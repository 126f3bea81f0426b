"""`cellblock serve` on stdin and stdout: the gateway's one client on a wire of JSON lines, the fast
path first and the SDK's server for the rest (`serve/http.py` serves HTTP the same way).
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import anyio

from cellblock.gateway.serve.fastpath import FastPath
from cellblock.gateway.serve.opening import Recording
from cellblock.gateway.wire.client import Wire
from cellblock.gateway.wire.early import Handover
from cellblock.gateway.wire.stdio import ReaderFactory, Writer, client_stdio

if TYPE_CHECKING:
    from cellblock.gateway.serve.gateway import Gateway

__all__ = ["serve_stdio", "serve_wire"]


async def serve_stdio(gateway: Gateway) -> None:
    """Serve the client on stdin and stdout until it closes stdin, or sends SIGTERM or SIGINT:
    either way the servers are stopped before the gateway exits, so none is left running on its own.
    """
    early = gateway.early
    handover = early.stop() if early is not None else Handover()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            limit = int(gateway.config.defaults.max_message_size)
            with client_stdio(handover.data, limit) as (make_reader, writer):
                await serve_wire(gateway, make_reader, writer, handover.served)
            tg.cancel_scope.cancel()
    finally:
        if early is not None:
            early.save()
        gateway.audit.close()  # writes the counts of events a budget left out (audit_budget)


async def serve_wire(
    gateway: Gateway, make_reader: ReaderFactory, writer: Writer, served: dict[Any, tuple[str, str]] | None = None
) -> None:
    """Serve one client on a wire of JSON lines (stdio's, or a test's socket): the fast path first,
    the SDK's server for the rest. `served`: the requests answered early (`wire/early.py`)."""
    recording = _recording(gateway)
    wire = gateway.listeners.wire = Wire(
        make_reader,
        writer,
        served=served,
        record=recording.record if recording is not None else None,
        differed=recording.differed if recording is not None else None,
        introduced=gateway.offer.expecting(),  # one client: what its servers are offered
    )
    fast = FastPath(gateway, wire, gateway.stamp, lambda: gateway.logs.level)
    async with wire.streams(fast.take) as (read, write):
        await gateway.run(read, write)


def _recording(gateway: Gateway) -> Recording | None:
    """This start's record of its opening answers, kept while they are the start's own (a list
    that searches added to is this run's only)."""
    if gateway.early is None:
        return None

    def current() -> bool:
        return gateway.keeper.as_started() and not gateway.search.added

    return Recording(gateway.early, lambda: gateway.tasks, current, gateway.keeper.announce)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    if sys.platform == "win32":  # no signal handlers on Windows' event loop; the client's kill is final
        return
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return
