"""One downstream server: its connection, its catalog, and what passes over it.

A `Downstream` is what the gateway knows of one server. Each run (`run`, started and restarted
by its `Supervisor`) connects (stdio through `launch_plan`, or Streamable HTTP), reads the
server's catalog, and waits for the connection to end. It forwards the calls (`send_call`: it is
the `Target` a `ToolCall` goes to) and the other requests, and takes what the server sends
unasked: logs, change notices, questions. Calls in flight when a server dies end with an error
that names it. A local server whose jail reached a resource limit is stopped like one that
crashed, with that reason.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import anyio.abc
import mcp.types as types
from mcp import Client
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.ask.elicitation import Asker
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import LocalServer, RemoteServer
from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.downstream.changes import Refresher, listen
from cellblock.gateway.downstream.connection import (
    START_SECONDS,
    connection_closed,
    error_answered,
    failure_text,
    gateway_client,
    watched,
)
from cellblock.gateway.downstream.egressask import EgressApproval, ServerEgress
from cellblock.gateway.downstream.httpwatch import HttpWatch
from cellblock.gateway.downstream.jailreport import jail_fields, jail_line, tell_jail
from cellblock.gateway.downstream.keys import ServerKeys
from cellblock.gateway.downstream.launch import plan_off_loop, server_plan, stdio_parameters
from cellblock.gateway.downstream.learning import learning
from cellblock.gateway.downstream.listing import Listing, fetch_listing
from cellblock.gateway.downstream.local import LocalChannel, local_transport
from cellblock.gateway.downstream.offer import Offer
from cellblock.gateway.downstream.packages import InstallError
from cellblock.gateway.downstream.questions import Questions, SamplingApproval
from cellblock.gateway.downstream.ratelimit import Budget
from cellblock.gateway.downstream.rounds import (
    Answered,
    Caller,
    LocalRound,
    Progress,
    RemoteRequests,
    Round,
    TaskRound,
    failed_result,
    forward_request,
    forwardable,
    owner_of,
)
from cellblock.gateway.downstream.supervisor import Supervisor
from cellblock.gateway.downstream.watch import Watched
from cellblock.gateway.errors import first_line
from cellblock.gateway.scrub import scrub as scrub_secrets
from cellblock.gateway.wire.stdio import DEFAULT_LINE_LIMIT
from cellblock.sandbox.types import JailError, LaunchPlan, Limits

__all__ = ["Downstream"]

logger = logging.getLogger(__name__)

# Messages that are not valid MCP a server may send in one run before it is restarted: a stray
# print or two is a bug to log, thousands are a server that will not speak the protocol.
MAX_GARBAGE = 1000
MAX_LOGINS = 2  # logins through the client for one scope in one run: a server asking for more takes none

R = TypeVar("R", bound=types.Result)
_LIST_CHANGED = (
    types.ToolListChangedNotification,
    types.PromptListChangedNotification,
    types.ResourceListChangedNotification,
)


@dataclass
class Downstream:
    name: str
    config: LocalServer | RemoteServer
    timeout: float
    on_listing: Callable[[Downstream], Awaitable[None]] | None = None
    # where a log outside any call goes (one during a call goes to the call)
    on_log: Callable[[Downstream, types.LoggingMessageNotificationParams], None] | None = None
    audit: Audit | None = None
    runtime: Path = field(default_factory=lambda: Path("/nonexistent"))
    sampling: str = "deny"
    # `credentials.allow_insecure`: accept a keyring backend that keeps secrets in plain files
    allow_insecure: bool = False
    # asks the human whether this server may use the client's model (for `sampling: ask`): None
    # when they allowed it, else why not
    approve_sampling: SamplingApproval | None = None
    approve_egress: EgressApproval | None = None  # asks about a host outside a `network: ask` jail's list
    # the longest message taken from a local server (`max_message_size`)
    max_message: int = DEFAULT_LINE_LIMIT
    # what a local server's jail may take (`jail.limits`); None: remote, or unjailed
    limits: Limits | None = None
    # the gateway's config file, audit log, state and runtime dirs: hidden in a jail whose grants hold them
    own: tuple[Path, ...] = ()
    learn_in: Path | None = None  # the state directory, where `learn: true` keeps its traces
    offer: Offer = field(default_factory=Offer)  # what the client answers, so what the server is offered
    # what the server may send unasked (logs, progress) before the excess is dropped
    notices: Budget = field(default_factory=Budget)
    listing: Listing | None = None
    client: Client | None = None
    # the pipes of a running local server, for the fast path's calls beside the SDK session
    channel: LocalChannel | None = None
    calls: int = 0  # tool calls forwarded to this server, and how many of them on the fast path
    fast_calls: int = 0
    _in_flight: list[Caller] = field(default_factory=list)
    _login_lock: anyio.Lock = field(default_factory=anyio.Lock)
    _logins: Counter[str | None] = field(default_factory=Counter)  # logins through the client, by scope
    _watch: HttpWatch = field(default_factory=HttpWatch)
    _words: str = ""  # the last lines the server wrote to stderr, as put into `error`
    _jail_told = False  # the log said once what the jail keeps from the server and how its limits are enforced
    plan: LaunchPlan | None = None  # the local server's last launch plan: its jail, for `ps` and the audit
    _garbage = 0  # messages that were not valid MCP, in this run
    _refused_handshake = False  # it refused the handshake of its client's era: met as configured since
    _garbage_log: Budget = field(default_factory=lambda: Budget(rate=1.0, burst=20.0))
    supervisor: Supervisor = field(init=False)  # its start, restarts, and where it is
    questions: Questions = field(init=False)
    keys: ServerKeys = field(init=False)
    changes: Refresher = field(init=False)  # re-reads of its catalog after a change notice
    watched: Watched = field(init=False)  # the resources clients subscribed to, across restarts
    egress: ServerEgress = field(init=False)  # its egress proxy of each run, and what the human answered

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.name, self, self._event)
        self.watched = Watched(self.name)
        self.keys = ServerKeys(self.name, self.config, self.audit, self.allow_insecure)
        self.questions = Questions(
            self.name, self.config, self.sampling, self.approve_sampling, self._event, self.keys, self.owner
        )
        self.changes = Refresher(self.refresh, lambda: self.listing is not None and self.listing.retryable)
        self.egress = ServerEgress(self.name, self.config, self.runtime, self._event, self.owner, self.approve_egress)

    # -- lifecycle: the supervisor's ----------------------------------------------------------

    async def ready_client(self) -> Client:
        """The connected client, waiting for a (re)start in progress.

        Raises:
            DownstreamError: the server is failed or does not come up in time.
        """
        await self.supervisor.ready()
        if self.client is None:
            raise self.supervisor.not_running()
        return self.client

    # -- what the supervisor needs (`Supervised`) -----------------------------------------------

    def drop(self) -> None:
        self.client = None

    def refused(self) -> bool:
        return self._watch.login is not None or self._watch.unauthorized or self._watch.refused is not None

    def ended(self, exc: BaseException | None) -> str:
        if isinstance(exc, (InstallError, JailError)):  # said as they are
            return self._with_last_words(str(exc))
        # a jail that reached a limit ended for that reason, whatever broke next
        breach = self.channel.breach() if self.channel is not None else None
        if exc is None:
            return breach or self._with_last_words("the server exited")
        return breach or self._with_last_words(self._explain(exc), exc)

    def _event(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.note(event, self.name, **fields)

    @property
    def is_remote(self) -> bool:
        return isinstance(self.config, RemoteServer)

    @property
    def error_without_output(self) -> str | None:
        """Why it is not running, with what the server wrote left out: for whoever has not approved
        that server's text (the status tool shows every server, held ones too)."""
        error = self.supervisor.error
        if error is None or not self._words:
            return error
        return error.replace(self._words, "(what it wrote to stderr is in `cellblock ps`)")

    def _with_last_words(self, reason: str, exc: BaseException | None = None) -> str:
        """`reason`, with the last lines the server wrote to stderr: most often they say why it stopped."""
        relay = self.channel.stderr if self.channel is not None else None
        words = relay.last_words() if relay else ""  # the gateway's secrets (any server's) redacted
        if not words:
            return reason
        self._words = words
        if exc is not None and connection_closed(exc) and self.channel is not None and not self.channel.answered:
            return f"exited at start: {words}"
        return f"{reason}; its stderr ended: {words}"

    def _explain(self, exc: BaseException) -> str:
        if isinstance(self.config, RemoteServer):
            from cellblock.gateway.downstream.remote import explain  # the HTTP stack: remote servers only

            text = explain(self.name, self.config, self._watch, exc) or failure_text(exc)
        else:
            text = failure_text(exc)
        # what the server answered (a refused handshake) may hold a secret the gateway gave it
        return cast(str, scrub_secrets(text, self.keys.pattern())[0])

    async def run(self) -> None:
        self._garbage = 0
        proxy = self.egress.for_run()  # the server reaches the network only through it, while it runs
        if proxy is None:
            await self._connect(None)
            return
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve)
            try:
                await self._connect(proxy.socket_path)
            finally:
                tg.cancel_scope.cancel()

    async def _connect(self, egress_socket: str | None) -> None:
        """One run's connection, in the era of the server's client as it is known when the run
        starts (`Offer.spoken`); a server that answers that era's handshake with an error (one
        that speaks 2026-07-28 only) is connected again at once as its config says, and met so
        for as long as the gateway runs."""
        offered = Offer.names(await self.offer.client(), self.sampling)
        protocol = self.config.protocol if self._refused_handshake else self.offer.spoken(self.config)
        try:
            await self._session(egress_socket, offered, protocol)
        except Exception as exc:
            # only an error answer before the server was ready, in a run the gateway did not end itself
            answered = self.channel is None or self.channel.answered
            if protocol == self.config.protocol or answered or self.supervisor.restart_reason is not None:
                raise
            if not error_answered(exc):
                raise
            self._refused_handshake, self._garbage = True, 0
            logger.info(
                "server '%s' answered the handshake of its client's era with an error (%s); it is met as "
                "its config says",
                self.name,
                self._explain(exc),  # the server's words, with the gateway's secrets redacted
            )
            await self._session(egress_socket, offered, self.config.protocol)

    async def _session(self, egress_socket: str | None, offered: list[str], protocol: str) -> None:
        closed = self.supervisor.opened()
        client = gateway_client(
            watched(await self._transport(egress_socket), closed, remote=self.is_remote),
            protocol,
            logging_callback=self._on_log,
            message_handler=self._on_message,
            **self.questions.callbacks(offered),
        )
        # One deadline covers spawn, handshake and first lists; lifted once the server is ready.
        with anyio.CancelScope(deadline=anyio.current_time() + START_SECONDS) as scope:
            async with client:
                # not a local of this frame, which lives as long as the connection: a re-read
                # replaces the listing, and the first would be kept alive beside it
                self._ready(client, await fetch_listing(client, self.keys.pattern(), self.name), offered)
                scope.deadline = math.inf
                try:
                    try:
                        if self.on_listing is not None:
                            await self.on_listing(self)
                    finally:
                        # settled once the lock has reviewed what it offers: what the handshake tells
                        # (the instructions, which name held servers) is then known
                        self.supervisor.settled()
                    async with anyio.create_task_group() as tg:
                        self.changes.open(tg)  # the re-reads of this connection's catalog
                        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                            tg.start_soon(listen, self.name, client, self.changes.soon, self.watched)
                        await self.watched.connected(client)
                        await closed.wait()
                        tg.cancel_scope.cancel()
                finally:
                    self.changes.close()
                    await self.watched.connected(None)
                    # told and audited by the supervisor, once the server's last words are in
                    self.supervisor.ran()
        if scope.cancelled_caught:
            raise TimeoutError

    def _ready(self, client: Client, listing: Listing, offered: list[str]) -> None:
        """The server answered its handshake and first lists: up, told and audited."""
        if self.channel is not None:
            self.channel.answered = True
        self.client, self.listing = client, listing
        self.supervisor.up()
        jail = jail_fields(self.config, self.plan, self.channel.confinement if self.channel else None)
        tools = len(listing.tools)
        self._event("server_ready", protocol=client.protocol_version, tools=tools, offered=offered, **jail)
        version = client.protocol_version
        logger.info("server '%s' is ready (%s, %d tools, %s)", self.name, version, tools, jail_line(jail))

    async def _transport(self, egress_socket: str | None) -> Any:
        """The connection for one run.

        Raises:
            CredentialError: a secret or token is not in the keyring, or the keyring is refused.
            JailError: the jail cannot be built.
        """
        if isinstance(self.config, LocalServer):
            values = await self.keys.environment()
            private = self.runtime / "servers" / self.name
            # off the event loop: building a jail looks at the disk (an installed tree is checked file by file)
            build = functools.partial(
                server_plan, self.name, self.config, egress_socket, private, values, self.limits, self.own
            )
            plan = learning(await plan_off_loop(build), self.name, self.config, self.learn_in)
            self._tell_jail(plan)
            if sys.platform == "win32":  # no process groups: the SDK's transport, and no fast path
                return stdio_client(stdio_parameters(plan), errlog=sys.stderr)
            self.channel = LocalChannel(
                self.name,
                limit=self.max_message,
                notices=self.notices,
                on_list_changed=self.changes.soon,
                on_misbehaving=self.supervisor.restart,
                on_log=self._log,
            )
            # what it writes to stderr is its own, with no secret of the gateway's (any server's)
            return local_transport(plan, self.channel, sys.stderr, self.audit.secrets if self.audit else None)
        from cellblock.gateway.downstream.remote import remote_transport  # the HTTP stack: remote servers only

        self._watch = HttpWatch()
        return await remote_transport(self.name, self.config, self.keys, self._watch, self.max_message)

    def _tell_jail(self, plan: LaunchPlan) -> None:
        self.plan = plan
        if not self._jail_told:
            self._jail_told = True
            tell_jail(self.name, plan)

    # -- what the server sends us ----------------------------------------------------------

    def owner(self) -> Caller | None:
        """The call a question or log from the server belongs to (`rounds.owner_of`)."""
        return owner_of(self._in_flight)

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        """A remote server's log (a local server's come through its channel, in order with its answers)."""
        if not self.is_remote or self.notices.take():  # a local server's were counted as they came
            self._log(params)

    def _log(self, params: types.LoggingMessageNotificationParams) -> None:
        logger_name = f"{self.name}.{params.logger}" if params.logger else self.name
        params = params.model_copy(update={"logger": logger_name})
        owner = self.owner()
        if owner is not None:
            owner.log(params)
        elif self.on_log is not None:
            self.on_log(self, params)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            # logged within a budget of its own: a server writing garbage must not flood the log
            self._garbage += 1
            if self._garbage_log.take():
                logger.warning("server '%s' sent a message that is not valid MCP: %s", self.name, first_line(message))
            if self._garbage == MAX_GARBAGE:
                self.supervisor.restart(f"it sent {MAX_GARBAGE} messages that are not valid MCP")
        elif isinstance(message, _LIST_CHANGED):
            self.changes.soon()
        elif isinstance(message, types.ResourceUpdatedNotification):
            self.watched.updated(str(message.params.uri))

    async def refresh(self) -> None:
        """Re-read the catalog after the server said it changed, and report it."""
        client = self.client
        if client is None:
            return
        try:
            with anyio.fail_after(START_SECONDS):
                self.listing = await fetch_listing(client, self.keys.pattern(), self.name, self.listing)
        except (MCPError, TimeoutError, anyio.ClosedResourceError) as exc:
            logger.warning("server '%s': could not re-read its catalog: %s", self.name, failure_text(exc))
            return
        if self.on_listing is not None:
            await self.on_listing(self)

    # -- forwarding ------------------------------------------------------------------------

    @property
    def needs_login(self) -> bool:
        """Its OAuth flow wanted an authorization: tokens missing, no longer accepted, or a step-up."""
        return self._watch.login is not None

    async def login_through_client(self, asker: Asker) -> None:
        """Log in through the client (`remote.login_through_client`), once for any number of calls
        that need it, and start the server with the new tokens.

        Raises:
            CredentialError: the user declined, or the login failed or timed out.
        """
        if not isinstance(self.config, RemoteServer):  # only a remote server's OAuth flow sets `needs_login`
            raise RuntimeError(f"server '{self.name}' is local: it has no login to go through the client")
        async with self._login_lock:
            if self._watch.login is None:
                return  # another call logged in meanwhile
            scope = self._watch.login.scope
            self._logins[scope] += 1
            if self._logins[scope] > MAX_LOGINS:  # a server that asks again after each login
                raise CredentialError(f"{self._watch.login} (asked again after {MAX_LOGINS} logins through the client)")
            from cellblock.gateway.downstream.remote import login_through_client

            tools = await login_through_client(self.name, self.config, self.keys, asker, scope)
            self._event("login", tools=tools)
            logger.info("server '%s': logged in through the client", self.name)
            self._watch.login = None  # answered: the next connection starts from the new tokens
            self.supervisor.reconnect()

    def _lost_session(self) -> bool:
        """True (and a reconnect begun) when a remote server answered 404 to our session: it
        restarted and forgot it. The spec has the client start a new session; the refused request
        was never processed, so it is safe to send again."""
        if not self._watch.session_lost:
            return False
        self._watch.session_lost = False
        self.supervisor.lost("the remote server no longer knows our session (it restarted)")
        return True

    def track(self, caller: Caller) -> None:
        """`caller` is in flight on this server (see `owner`)."""
        self._in_flight.append(caller)

    def untrack(self, caller: Caller) -> None:
        with contextlib.suppress(ValueError):  # a call ends once, but may be cancelled after
            self._in_flight.remove(caller)

    def send_call(
        self, params: dict[str, Any], answered: Answered, progress: Progress | None, logs: bool = True
    ) -> Round:
        """Send one round of a tool call (`params` as JSON: the server's tool name, arguments, the
        caller's own `_meta`); `answered` is told once how it ended, unless it is cancelled.
        `logs`: the caller can carry the server's logs (else a 2026-07-28 opt-in is not passed on).

        Raises:
            OSError: a local server's stdin is gone.
            ValueError, RecursionError: the params cannot be encoded.
        """
        self.calls += 1
        meta = forwardable(params.get("_meta")) or {}
        channel, client = self.channel, self.client
        modern = client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS
        local = channel if channel is not None and channel.open and (not modern or channel.envelope) else None
        if local is not None and modern:
            meta.update(local.envelope or {})
            if not logs:
                meta.pop(LOG_LEVEL_META_KEY, None)  # nothing would carry the server's logs on
        sent = {k: v for k, v in params.items() if k != "_meta"}
        if meta:
            sent["_meta"] = meta
        as_task = not modern and self.listing is not None and sent.get("name") in self.listing.task_only
        if local is not None:
            return (TaskRound.local if as_task else LocalRound.send)(local, sent, self.timeout, answered, progress)
        tg = self.supervisor.tg
        if tg is None:
            raise BrokenPipeError(f"server '{self.name}' is not running")
        told = progress

        async def report(progress: float, total: float | None, message: str | None) -> None:
            if told is not None and (not self.is_remote or self.notices.take()):  # a local one's was budgeted
                told(progress, total, message)

        remote = RemoteRequests(tg, self.ready_client, self.timeout, told and report, self._lost_session)
        return TaskRound.start(remote.send, sent, answered) if as_task else remote.send("tools/call", sent, answered)

    def failed_call(self, tool: str, exc: BaseException) -> types.CallToolResult:
        """The error result the model reads when a call to `tool` did not complete."""
        stopped = self.supervisor.restart_reason or (self.channel.breach() if self.channel is not None else None)
        stopped = stopped or (str(self._watch.login) if self._watch.login is not None else None)
        return failed_result(self.name, tool, self.timeout, exc, stopped)

    async def request(self, request: Any, result_type: type[R]) -> R:
        """Forward a non-call request (prompt get, resource read, completion); see `forward_request`."""
        return await forward_request(
            self.name, self.timeout, self.ready_client, self._lost_session, request, result_type
        )
