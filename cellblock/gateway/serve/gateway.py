"""The gateway's face toward the client: one MCP server that routes to many.

`Gateway` owns the downstream servers, the merged catalog (kept current by `serve/keeper.py`),
and the SDK's low-level `Server` whose handlers route each call, prompt, resource read and
completion to the server it came from. It serves both protocol eras; where they differ
(notifications, questions to the user) the handler picks the era's way.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp.server.apps import EXTENSION_ID as APPS_EXTENSION
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus

from cellblock import __version__
from cellblock.gateway.ask.elicitation import ParkedCalls
from cellblock.gateway.config.compile import policy_for
from cellblock.gateway.config.model import Config
from cellblock.gateway.downstream.egressask import host_keeper
from cellblock.gateway.downstream.keys import reader_of
from cellblock.gateway.downstream.launch import own_paths
from cellblock.gateway.downstream.offer import Offer
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.startable import startable_of, unavailable_of
from cellblock.gateway.serve.approvals import Approvals
from cellblock.gateway.serve.callhandler import CallHandler
from cellblock.gateway.serve.calls import Calls
from cellblock.gateway.serve.control import ControlServer, socket_path
from cellblock.gateway.serve.fastpath import FastPath
from cellblock.gateway.serve.handshake_tasks import HandshakeTasks
from cellblock.gateway.serve.keeper import CatalogKeeper
from cellblock.gateway.serve.listeners import ChangingServer, Listeners
from cellblock.gateway.serve.locking import Locks
from cellblock.gateway.serve.logs import ClientLogs
from cellblock.gateway.serve.opening import Recording
from cellblock.gateway.serve.operations import Operations
from cellblock.gateway.serve.pipeline import Call, Pipeline
from cellblock.gateway.serve.reads import Reads
from cellblock.gateway.serve.review import Review
from cellblock.gateway.serve.search import Search, client_of
from cellblock.gateway.serve.shares import Gate, Shares
from cellblock.gateway.serve.status import instructions
from cellblock.gateway.serve.subscriptions import Subscriptions
from cellblock.gateway.serve.tasks import Tasks
from cellblock.gateway.serve.telemetry import telemetry_for
from cellblock.gateway.state import clean_stale_temps
from cellblock.gateway.wire.client import Wire
from cellblock.gateway.wire.early import Early, Handover
from cellblock.gateway.wire.stdio import ReaderFactory, Writer, client_stdio
from cellblock.policy.types import Decision, Verdict

__all__ = ["Gateway"]

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]


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
        self.downstreams = {
            name: Downstream(
                name,
                server,
                timeout=config.timeout_of(name),
                protocol=server.protocol,
                on_listing=lambda ds: self.keeper.on_listing(ds),
                on_log=lambda _, params: self.logs.idle(params),
                audit=self.audit,
                runtime=runtime or Path("/nonexistent"),
                sampling=config.sampling_of(name),
                max_message=config.max_message_of(name),
                own=own_paths(config, state, source, runtime),
                learn_in=state,
                limits=config.limits_of(name),
                approve_sampling=self.approvals.sampling,
                approve_egress=self.approvals.egress,
                allow_insecure=config.credentials.allow_insecure,
                offer=self.offer,
            )
            for name, server in sorted(config.servers.items())
        }
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
            approver=self._approve,
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
            unknown=self.unknown,
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
        self.server = self._build_server()

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

    async def serve_stdio(self) -> None:
        """Serve the client on stdin and stdout: the fast path first, the SDK's server for the rest.

        Until the client closes stdin, or sends SIGTERM or SIGINT: either way the servers are
        stopped before the gateway exits, so none is left running on its own.
        """
        handover = self.early.stop() if self.early is not None else Handover()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signal, tg.cancel_scope)
                limit = int(self.config.defaults.max_message_size)
                with client_stdio(handover.data, limit) as (make_reader, writer):
                    await self.serve_wire(make_reader, writer, handover.served)
                tg.cancel_scope.cancel()
        finally:
            if self.early is not None:
                self.early.save()
            self.audit.close()  # writes the counts of events a budget left out (audit_budget)

    async def serve_wire(
        self, make_reader: ReaderFactory, writer: Writer, served: dict[Any, tuple[str, str]] | None = None
    ) -> None:
        """Serve one client on a wire of JSON lines (stdio's, or a test's socket): the fast path
        first, the SDK's server for the rest. `served`: the requests answered early (`wire/early.py`)."""
        recording = self._recording()
        wire = self.listeners.wire = Wire(
            make_reader,
            writer,
            served=served,
            record=recording.record if recording is not None else None,
            differed=recording.differed if recording is not None else None,
            introduced=self.offer.expecting(),  # one client: what its servers are offered
        )
        fast = FastPath(self, wire, self.stamp, lambda: self.logs.level)
        async with wire.streams(fast.take) as (read, write):
            await self.run(read, write)

    def _recording(self) -> Recording | None:
        """This start's record of its opening answers, kept while they are the start's own (a list
        that searches added to is this run's only)."""
        if self.early is None:
            return None

        def current() -> bool:
            return self.keeper.as_started() and not self.search.added

        return Recording(self.early, lambda: self.tasks, current, self.keeper.announce)

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
                operations = Operations(
                    self.config,
                    self.state,
                    self.locks,
                    self.approvals,
                    self.downstreams,
                    self.shares,
                    self.source,
                    self.review,
                )
                control = ControlServer(
                    socket_path(self.runtime), operations.answer, self._server_pids, self._control_refused
                )
                await tg.start(control.serve)
            # The handshake carries the servers' instructions, so it waits (bounded) for them.
            await self.keeper.settled()
            self.server.instructions = instructions(self.config, self.locks.held, self.keeper.shown)
            yield tg
            tg.cancel_scope.cancel()

    def _control_refused(self, op: str, pid: int | None, uid: int | None, why: str) -> None:
        """A request on the control socket was refused (a foreign uid, a server, no or a wrong token)."""
        self.audit.note("control_refused", "", op=op, peer_pid=pid, peer_uid=uid, reason=why)

    # -- the upstream server ---------------------------------------------------------------

    def _build_server(self) -> Server[Any]:
        server: Server[Any] = ChangingServer(
            "cellblock",
            version=__version__,
            on_list_tools=self._list_tools,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self.reads.get_prompt,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self.reads.read_resource,
            on_completion=self.reads.complete,
            on_subscribe_resource=self.subscriptions.subscribe,
            on_unsubscribe_resource=self.subscriptions.unsubscribe,
            on_subscriptions_listen=self.subscriptions.listen,
        )
        # registered directly: a task is a result the SDK has no model of (typed as a dict)
        server.add_request_handler("tools/call", types.CallToolRequestParams, self.call_handler.handle)
        # registered directly: the constructor argument warns that logging is deprecated in 2026
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self.logs.set_level)
        self.client_tasks.serve(server)  # a call may be answered with a task
        server.middleware = []  # no tracing span per message on the hot path
        self.handshake_tasks.serve(server)  # ...and in 2025-11-25 too (its middleware answers those calls)
        server.extensions[APPS_EXTENSION] = {}  # the servers' apps are passed through (docs/apps.md)
        return server

    def _notify_handshake_client(self, method: str, params: dict[str, Any] | None) -> None:
        """A notification outside any request; only a handshake-era client has a channel for it."""
        self.listeners.notify(self.tasks, method, params)

    async def _list_tools(self, ctx: Ctx, params: Any) -> types.ListToolsResult:
        self.listeners.met(ctx)
        catalog = self.search.view(await self.keeper.client_catalog(), client_of(ctx))
        return types.ListToolsResult(tools=catalog.listed_tools(ctx.protocol_version))

    async def _list_prompts(self, ctx: Ctx, params: Any) -> types.ListPromptsResult:
        self.listeners.met(ctx)
        return types.ListPromptsResult(prompts=list((await self.keeper.client_catalog()).prompts))

    async def _list_resources(self, ctx: Ctx, params: Any) -> types.ListResourcesResult:
        self.listeners.met(ctx)
        return types.ListResourcesResult(resources=list((await self.keeper.client_catalog()).resources))

    async def _list_templates(self, ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
        self.listeners.met(ctx)
        return types.ListResourceTemplatesResult(
            resource_templates=list((await self.keeper.client_catalog()).templates)
        )

    def secrets(self) -> re.Pattern[str] | None:
        """What finds the secret values the gateway holds, in what a server sends toward the client."""
        return self.audit.secret_pattern()

    def _server_pids(self) -> set[int]:
        """The processes started for the local servers: the control socket refuses them and theirs."""
        return {ds.channel.pid for ds in self.downstreams.values() if ds.channel is not None and ds.channel.pid}

    async def _approve(self, call: Call) -> Verdict:
        verdict = call.verdict or Verdict(Decision.ASK, "default", "")
        return await self.approvals.decide(call.server, call.tool, call.name, verdict, call)

    def unknown(self, name: str, kind: str) -> str:
        return (
            self.unavailable(name)
            or f"unknown {kind} '{name}': it is not in Cellblock's catalog; list the {kind}s again"
        )


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    if sys.platform == "win32":  # no signal handlers on Windows' event loop; the client's kill is final
        return
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return
