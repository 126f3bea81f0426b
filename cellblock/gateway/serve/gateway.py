"""The composition root: one MCP server that routes to many, built from its parts.

`Gateway` builds the downstream servers (`downstream/configured.py`), the merged catalog (kept
current by `serve/keeper.py`), the pipeline, the call handler, and the SDK's low-level `Server`
whose handlers route each call, prompt, resource read and completion to the server it came from
(`serve/upstream.py`), and runs them (`running`). `serve/stdio.py` and `serve/http.py` serve it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp.server.subscriptions import InMemorySubscriptionBus

from cellblock.gateway.ask.elicitation import ParkedCalls
from cellblock.gateway.config.compile import policy_for
from cellblock.gateway.config.model import Config
from cellblock.gateway.downstream.configured import downstreams_of
from cellblock.gateway.downstream.egressask import host_keeper
from cellblock.gateway.downstream.keys import reader_of
from cellblock.gateway.downstream.offer import Offer
from cellblock.gateway.downstream.startable import startable_of, unavailable_of
from cellblock.gateway.serve.approvals import Approvals
from cellblock.gateway.serve.callhandler import CallHandler
from cellblock.gateway.serve.calls import Calls
from cellblock.gateway.serve.handshake_tasks import HandshakeTasks
from cellblock.gateway.serve.keeper import CatalogKeeper
from cellblock.gateway.serve.listeners import Listeners
from cellblock.gateway.serve.locking import Locks
from cellblock.gateway.serve.logs import ClientLogs
from cellblock.gateway.serve.operations import Operations
from cellblock.gateway.serve.pipeline import Pipeline
from cellblock.gateway.serve.reads import Reads
from cellblock.gateway.serve.review import Review
from cellblock.gateway.serve.search import Search
from cellblock.gateway.serve.shares import Gate, Shares
from cellblock.gateway.serve.status import instructions
from cellblock.gateway.serve.subscriptions import Subscriptions
from cellblock.gateway.serve.tasks import Tasks
from cellblock.gateway.serve.telemetry import telemetry_for
from cellblock.gateway.serve.upstream import Lists, upstream_server
from cellblock.gateway.state import clean_stale_temps
from cellblock.gateway.wire.early import Early

__all__ = ["Gateway"]

logger = logging.getLogger(__name__)


class Gateway:
    """Downstream servers behind one MCP server."""

    def __init__(
        self,
        config: Config,
        state: Path,
        runtime: Path | None,
        source: Path | None = None,
        early: Early | None = None,
        gate: Gate | None = None,  # the rules a path shared with a server passes (without: none is asked)
    ) -> None:
        self.config = config
        self.early = early  # the opening answers of the last start, and this start's record of them
        self.runtime = runtime
        self.source = source
        stale = clean_stale_temps(state, time.time())  # left by a gateway or command that was killed mid-write
        if stale:
            logger.info("removed %d temp file(s) a killed writer left in %s", stale, state)
        self.audit = config.audit_log(state, telemetry_for(config.telemetry))  # closed with the audit
        self.offer = Offer()  # what the servers are offered: all, unless one client is expected
        self.approvals = Approvals(state, self.audit, config.approvals.timeout)
        self.downstreams = downstreams_of(
            config,
            state,
            source,
            runtime,
            self.audit,
            self.offer,
            on_listing=lambda ds: self.keeper.on_listing(ds),
            on_log=lambda params: self.logs.idle(params),
            approve_sampling=self.approvals.sampling,
            approve_egress=self.approvals.egress,
        )
        self.unavailable = unavailable_of(self.downstreams, config.names.separator)
        self.approvals.keepers["egress"] = host_keeper(source, lambda name: self.downstreams[name].egress)
        self.locks = Locks(config, state, self.audit)
        self.policies = {name: policy_for(config, name) for name in config.servers}
        # the same rules machinery for prompts (by name) and resources (by the server's URI)
        self.item_policies = {
            kind: {name: policy_for(config, name, kind) for name in config.servers} for kind in ("prompt", "resource")
        }
        self.bus = InMemorySubscriptionBus()
        # the clients' connections, for notifications sent outside any request
        self.listeners = Listeners()
        self.keeper = CatalogKeeper(
            config,
            catalog_dir=state / "catalogs",
            downstreams=self.downstreams,
            locks=self.locks,
            policies=self.policies,
            item_policies=self.item_policies,
            offer=lambda catalog: self.search.offer(catalog),
            bus=self.bus,
            listeners=self.listeners,
            tasks=lambda: self.tasks,
        )
        names = config.names
        self.search = Search(config.catalog, names.separator, names.max_length, self.audit, self.keeper.announce_to)
        self.state = state
        self.review = Review(config, state, self.audit, self.approvals, self.locks, self.downstreams, self.keeper)
        self.shares = Shares(self.downstreams, self.approvals, gate) if gate is not None else None
        self.pipeline = Pipeline(
            lambda: self.keeper.catalog,
            self.unavailable,
            self.policies,
            self.audit,
            approver=self.approvals.approve,
            reviewer=self.review.review_lock,
            unasked=lambda server: self.locks.unasked.get(server, frozenset()),
            learn=reader_of(ds.keys for ds in self.downstreams.values()) if config.credential_entries() else None,
            startable=startable_of(self.downstreams),
            share=self.shares.stage if self.shares is not None else None,
        )
        self.parked = ParkedCalls()
        self.calls = Calls(
            self.pipeline,
            self.parked,
            self.secrets,
            lambda: self.tasks,
            lambda: self.keeper.catalog.uris,
            lambda server, uri, resource: self.reads.page_passes(server, uri, resource),
        )
        self.logs = ClientLogs(self.secrets, self._notify_handshake_client)
        self._tg: anyio.abc.TaskGroup | None = None
        self.reads = Reads(
            self.keeper,
            self.downstreams,
            self.item_policies,
            self.pipeline,
            self.approvals,
            self.locks,
            tasks=lambda: self.tasks,
            secrets=self.secrets,
            send_log=self.logs.send,
        )
        self.client_tasks = Tasks(self.audit)
        self.handshake_tasks = HandshakeTasks(self.client_tasks, lambda: self.tasks)
        self.subscriptions = Subscriptions(
            self.downstreams, self.reads, self.listeners, self.bus, self.client_tasks, lambda: self.tasks
        )
        self.call_handler = CallHandler(
            keeper=self.keeper,
            search=self.search,
            own=self.review,
            task_calls=self.handshake_tasks,
            calls=self.calls,
            downstreams=self.downstreams,
            met=self.listeners.met,
            send_log=self.logs.send,
            redeem=self.parked.redeem,
            carried=self.approvals.sealed.carried,
            pipeline=self.pipeline,
            tasks=lambda: self.tasks,
        )
        self.calls.then = self.call_handler.then  # what an admitted call does once it is a ToolCall
        lists = Lists(self.keeper, self.search, self.listeners)
        self.server = upstream_server(
            lists, self.reads, self.subscriptions, self.call_handler, self.logs, self.client_tasks, self.handshake_tasks
        )

    @property
    def stamp(self) -> dict[str, Any]:
        """The gateway's serverInfo as every result carries it (fixed for its life)."""
        return self.server.server_info_stamp

    # -- running ---------------------------------------------------------------------------

    @property
    def tasks(self) -> anyio.abc.TaskGroup:
        """The task group of the running gateway, where downstream supervisors and calls live."""
        if self._tg is None:
            raise RuntimeError("the gateway is not running; call run() first")
        return self._tg

    async def run(self, read: Any, write: Any) -> None:
        """Start the downstream servers and serve one client connection until it closes."""
        async with self.running():
            await self.server.run(read, write, self.server.create_initialization_options())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[anyio.abc.TaskGroup]:
        """The downstream servers started, and the first of them settled (bounded): serve clients
        inside; on leaving, every server is stopped."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.pipeline.learn_secrets)  # what no call may carry to another server
            self.keeper.start(tg)
            if self.runtime is not None:
                # answers to pending approvals, and `cellblock ps`, arrive on this socket
                parts = (self.locks, self.approvals, self.downstreams, self.shares, self.source, self.review)
                control = Operations(self.config, self.state, *parts).control(self.runtime, self.audit)
                await tg.start(control.serve)
            # The handshake carries the servers' instructions, so it waits (bounded) for them.
            await self.keeper.settled()
            self.server.instructions = instructions(self.config, self.locks.held, self.keeper.shown)
            yield tg
            tg.cancel_scope.cancel()

    def _notify_handshake_client(self, method: str, params: dict[str, Any] | None) -> None:
        """A notification outside any request; only a handshake-era client has a channel for it."""
        self.listeners.notify(self.tasks, method, params)

    def secrets(self) -> re.Pattern[str] | None:
        """What finds the secret values the gateway holds, in what a server sends toward the client."""
        return self.audit.secret_pattern()
