"""A local server's stdio connection: one process, one pair of pipes, two users of them.

The SDK's client session talks to the server through the message streams `local_transport`
yields, as it would through the SDK's own `stdio_client`. Beside it, the fast path
(`gateway/serve/fastpath.py`) writes its `tools/call` requests straight onto the server's stdin under
private ids (`LocalChannel.request`) and is called back with their responses, parsed once, from
the loop callback that read them: no validation, stream hop or task switch in between. Every
line from the server is parsed here once: a response to a private id, or progress for one, goes
to the fast path; the rest is validated and handed to the SDK session. Writes of both go out
whole and in order through one `PipeWriter`.

What a server may send is bounded here, before any validation: a line longer than `limit` is
dropped and the request it answered (when its id shows) gets an error naming the server, and
after `MAX_OVERSIZED` of them the server is restarted (`on_misbehaving`); log and progress
notifications beyond the server's budget are dropped; `list_changed` notifications go straight
to `on_list_changed`, which coalesces them.

Spawning and stopping follow the SDK's `stdio_client`: a new session and process group, no
await between the spawn and the task group, and a shielded shutdown that closes stdin, waits,
then ends the whole process group. A jail with resource limits is released right after the spawn,
once they are in place (`sandbox/spawn.py`), and looked at every `LIMIT_CHECK_SECONDS`: one that
reached a limit is restarted (`on_misbehaving`), and the reason stays with the channel.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import anyio.abc
import anyio.to_thread
import mcp.types as types
from mcp.client.stdio import PROCESS_TERMINATION_TIMEOUT, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree

from cellblock.gateway.downstream.ratelimit import Budget
from cellblock.gateway.downstream.stderr import Secrets, StderrRelay
from cellblock.gateway.wire.lines import SessionLines, Streams, error_response, request_id
from cellblock.gateway.wire.stdio import DEFAULT_LINE_LIMIT, LineReader, OnOversize, Oversized, PipeWriter
from cellblock.sandbox.limits import Confinement
from cellblock.sandbox.marks import Mark
from cellblock.sandbox.spawn import SETTLE_SECONDS, discard, spawn_args
from cellblock.sandbox.types import LaunchPlan

__all__ = ["ENVELOPE_PREFIX", "LocalChannel", "Pending", "local_transport"]

logger = logging.getLogger(__name__)

# The 2026-07-28 per-request envelope lives in `_meta` under this reserved prefix.
ENVELOPE_PREFIX = "io.modelcontextprotocol/"
# Private request ids start with this; the SDK session numbers its own requests, so they never meet.
_ID_PREFIX = "cb-"
# After stdin is closed a server gets this long to exit before its process group is ended.
_EXIT_SECONDS = PROCESS_TERMINATION_TIMEOUT
# A write already accepted from the SDK session gets this long to reach the pipe at shutdown.
_FLUSH_SECONDS = 0.5
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# Lines over the limit a server may send in one run before it is restarted: one is a large
# answer; a few in a row are a server that will not stop.
MAX_OVERSIZED = 3
# How often a jail is looked at for a limit it reached: a fork refused or an OOM kill in its cgroup
# stays counted, so this only bounds how long a server at its limit keeps running.
LIMIT_CHECK_SECONDS = 1.0
# What a server's notifications may cost before they are dropped (see `Budget`).
_NOTICES = ("notifications/message", "notifications/progress")
_LIST_CHANGED = (
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
)

Progress = Callable[[float, float | None, str | None], None]


@dataclass(eq=False)
class Pending:
    """A request written under a private id, until its answer: the response, or None when the
    server went away or the request timed out (`timed_out`)."""

    id: str
    on_done: Callable[[Pending], None]
    progress: Progress | None
    deadline: float
    response: dict[str, Any] | None = None
    timed_out: bool = False
    done: bool = False

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self.on_done(self)


@dataclass(eq=False)
class LocalChannel:
    """The fast path's side of a local server's pipes: requests under private ids, and their answers."""

    name: str
    limit: int = DEFAULT_LINE_LIMIT  # the longest line taken from the server
    # log and progress notifications beyond this are dropped before they cost anything more
    notices: Budget = field(default_factory=Budget)
    # told that the catalog changed (coalesced by the owner), and that the server must be restarted
    on_list_changed: Callable[[], None] | None = None
    on_misbehaving: Callable[[str], None] | None = None
    # a log: delivered from here, so that it reaches its call before the call's answer does
    on_log: Callable[[types.LoggingMessageNotificationParams], None] | None = None
    # what the SDK session stamps on every request to a 2026-07-28 server (protocol version,
    # client info and capabilities, log opt-in), copied from its own requests as they pass
    envelope: dict[str, Any] | None = None
    open: bool = False
    # the server has answered its handshake: at shutdown it gets time to exit by itself, while one
    # still starting (busy loading, not reading its stdin) is stopped at once
    answered: bool = False
    # the jail's resource limits while it runs, and whether it reached one (sandbox/limits.py)
    confinement: Confinement | None = None
    mark: Mark | None = None  # an unjailed server's marked cgroup, removed once it has ended (sandbox/marks.py)
    pid: int | None = None  # the process started for the server (bwrap, for a jailed one)
    stderr: StderrRelay | None = None  # what it writes there, passed on; its last lines kept
    _writer: PipeWriter | None = None
    _lines: SessionLines | None = None
    _oversized: int = 0
    _pending: dict[str, Pending] = field(default_factory=dict)
    _order: deque[Pending] = field(default_factory=deque)  # by deadline: every request has one timeout
    _expiring: anyio.Event = field(default_factory=anyio.Event)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _probe: Any = None  # the id of the SDK session's discovery probe, until it is answered

    def request(
        self,
        method: str,
        params: dict[str, Any],
        timeout: float,
        on_done: Callable[[Pending], None],
        progress: Progress | None = None,
    ) -> Pending:
        """Write one request under a new private id; `on_done` is called once with its answer,
        its timeout (after telling the server to stop) or the end of the connection.

        Raises:
            OSError: the connection is closed or the server's stdin is gone.
        """
        if not self.open or self._writer is None:
            raise BrokenPipeError(f"the connection to server '{self.name}' is closed")
        pending = Pending(f"{_ID_PREFIX}{next(self._ids)}", on_done, progress, time.monotonic() + timeout)
        if progress is not None:
            params = {**params, "_meta": {**params.get("_meta", {}), "progressToken": pending.id}}
        self._write({"jsonrpc": "2.0", "id": pending.id, "method": method, "params": params})
        self._pending[pending.id] = pending
        self._order.append(pending)
        self._expiring.set()
        return pending

    def cancel(self, pending: Pending, reason: str) -> None:
        """Tell the server to stop working on `pending`, which ends unanswered (without `on_done`)."""
        if self._pending.pop(pending.id, None) is None:
            return
        pending.done = True
        self._notify_cancelled(pending, reason)

    def _notify_cancelled(self, pending: Pending, reason: str) -> None:
        params = {"requestId": pending.id, "reason": reason}
        with contextlib.suppress(OSError):  # the server is gone: nothing left to stop
            self._write({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})

    def breach(self) -> str | None:
        """Why the server's jail must stop, if it reached one of its resource limits."""
        return self.confinement.breach() if self.confinement is not None else None

    async def _watch_limits(self) -> None:
        """Restart the server once its jail reaches a limit (a fork bomb that made its processes
        and sleeps, a memory hog the kernel killed a child of)."""
        while (reason := self.breach()) is None:  # noqa: ASYNC110 - the kernel's counters fire no event here
            await anyio.sleep(LIMIT_CHECK_SECONDS)
        if self.on_misbehaving is not None:
            self.on_misbehaving(reason)

    def _write(self, message: dict[str, Any]) -> None:
        if self._writer is None:
            raise BrokenPipeError(f"the connection to server '{self.name}' is closed")
        self._writer.write_nowait((_ENCODER.encode(message) + "\n").encode())

    def _take(self, message: dict[str, Any]) -> bool:
        """Deliver a message from the server if it is the fast path's, or drop it (True); False
        if it is the SDK's."""
        ident = message.get("id")
        if self._probe is not None and ident == self._probe and "method" not in message:
            self._probe = None  # what the server wrote about it is in its stderr pipe by now
            if self.stderr is not None:
                self.stderr.probe_answered(refused="error" in message)
        if isinstance(ident, str) and ident.startswith(_ID_PREFIX) and "method" not in message:
            self._answer(ident, message)  # else the late answer to a request given up on: dropped
            return True
        method = message.get("method")
        if "id" not in message and method in _LIST_CHANGED and self.on_list_changed is not None:
            self.on_list_changed()
            return True
        if method in _NOTICES and not self.notices.take():
            if self.notices.dropped == 1:
                logger.warning(
                    "server '%s' sends notifications faster than %g a second; the rest are dropped",
                    self.name,
                    self.notices.rate,
                )
            return True
        if self.notices.dropped and method in _NOTICES:
            logger.warning("server '%s': %d notifications were dropped", self.name, self.notices.settle())
        params = message.get("params")
        if method == "notifications/message" and self.on_log is not None and "id" not in message:
            try:
                log = types.LoggingMessageNotificationParams.model_validate(params, by_name=False)
            except ValueError:
                return False  # not valid MCP: the session counts it
            self.on_log(log)
            return True
        if method != "notifications/progress" or not isinstance(params, dict):
            return False
        token = params.get("progressToken")
        if not (isinstance(token, str) and token.startswith(_ID_PREFIX)):
            return False
        pending = self._pending.get(token)
        if pending is not None and pending.progress is not None:
            total, text = params.get("total"), params.get("message")
            with contextlib.suppress(TypeError, ValueError, KeyError):  # a malformed report is dropped
                pending.progress(
                    float(params["progress"]),
                    None if total is None else float(total),
                    text if isinstance(text, str) else None,
                )
        return True

    def _answer(self, ident: str, response: dict[str, Any]) -> None:
        pending = self._pending.pop(ident, None)
        if pending is not None:
            pending.response = response
            pending._finish()

    def _oversize(self, line: Oversized) -> None:
        """A line over the limit: dropped, its request answered with an error, the server
        restarted once it has done so `MAX_OVERSIZED` times."""
        self._oversized += 1
        ident = request_id(line)
        logger.warning(
            "server '%s' sent a message of %s bytes or more, over its limit of %s (max_message_size); dropped",
            self.name,
            f"{line.size:,}",
            f"{self.limit:,}",
        )
        why = (
            f"its answer is larger than Cellblock accepts "
            f"({line.size:,} bytes or more; max_message_size: {self.limit:,})"
        )
        self._fail_request(ident, why)
        if self._oversized >= MAX_OVERSIZED and self.on_misbehaving is not None:
            self.on_misbehaving(f"it sent {self._oversized} messages over the limit of {self.limit:,} bytes")

    def _unparsable(self, line: Oversized, exc: ValueError) -> bool:
        """A line that is not JSON: the request it answered, when its first bytes show which, gets
        an error now rather than at its timeout; the session still sees the line (False)."""
        self._fail_request(request_id(line), f"its answer is not JSON ({exc})")
        return False

    def _fail_request(self, ident: str | int | None, why: str) -> None:
        """Answer the request `ident` (the fast path's, or the SDK session's) with an error."""
        if isinstance(ident, str) and ident.startswith(_ID_PREFIX):
            self._answer(ident, error_response(ident, types.INTERNAL_ERROR, why))
        elif ident is not None and self._lines is not None:
            self._lines.hand(error_response(ident, types.INTERNAL_ERROR, why))  # the SDK session's request

    async def _expire(self) -> None:
        """Time out requests past their deadline (oldest first: all share the server's timeout)."""
        while True:
            while self._order and (self._order[0].done or self._order[0].id not in self._pending):
                self._order.popleft()
            if not self._order:
                self._expiring = anyio.Event()
                await self._expiring.wait()
                continue
            head = self._order[0]
            wait = head.deadline - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)
                continue
            self._order.popleft()
            if self._pending.pop(head.id, None) is not None:
                self._notify_cancelled(head, "timed out")
                head.timed_out = True
                head._finish()

    def _close(self) -> None:
        self.open = False
        pending, self._pending = self._pending, {}
        self._order.clear()
        for waiting in pending.values():
            waiting._finish()  # response stays None: the server is gone

    def _observe(self, message: types.JSONRPCMessage) -> bool:
        """Remember the envelope the SDK session puts on its requests, to put it on ours; hold the
        server's stderr while its discovery probe waits (`StderrRelay.hold`)."""
        if isinstance(message, types.JSONRPCRequest) and message.method == "server/discover" and self._probe is None:
            self._probe = message.id
            if self.stderr is not None:
                self.stderr.hold()
        if isinstance(message, types.JSONRPCRequest) and isinstance(message.params, dict):
            meta = message.params.get("_meta")
            if isinstance(meta, dict):
                stamped = {k: v for k, v in meta.items() if k.startswith(ENVELOPE_PREFIX)}
                if stamped:
                    self.envelope = stamped
        return True


@asynccontextmanager
async def local_transport(
    plan: LaunchPlan, channel: LocalChannel, errlog: TextIO, secrets: Secrets | None = None
) -> AsyncIterator[Streams]:
    """Start the planned process and yield the SDK session's streams; `channel` shares the pipes.
    What it writes to stderr reaches `errlog` as its own lines, with `secrets` (every secret the
    gateway holds) redacted (`StderrRelay`).

    Raises:
        OSError: the process cannot be started.
        JailError: the plan's seccomp filter cannot be handed to bwrap, or its jail could not be
            put under its resource limits (it was ended).
    """
    child_in, to_child = os.pipe()
    from_child, child_out = os.pipe()
    stderr_in, child_err = os.pipe()
    channel.stderr = StderrRelay(stderr_in, errlog.fileno(), channel.name, secrets)
    try:
        with spawn_args(plan) as spawn:
            process = await anyio.open_process(
                list(spawn.argv),
                stdin=child_in,
                stdout=child_out,
                stderr=child_err,
                env=get_default_environment() | dict(plan.env),
                cwd=plan.cwd,
                start_new_session=True,
                pass_fds=spawn.pass_fds,
            )
            channel.pid, channel.mark, gate = process.pid, spawn.mark, spawn.gate
            try:
                # the jail waits until this returns: its limits are in place before the server runs.
                # In a worker thread: it waits for bubblewrap and runs the tmpfs sizing (tens of ms,
                # seconds on a busy machine), while the gateway's other calls go on. The wait for it
                # is shielded, so what it made is kept (and ended below) even if this start is cancelled.
                channel.confinement = await anyio.to_thread.run_sync(spawn.release)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await _stop(process, 0)
                raise
    except BaseException:
        for fd in (to_child, from_child):
            os.close(fd)
        discard(plan)
        raise
    finally:
        os.close(child_in)
        os.close(child_out)
        os.close(child_err)  # the relay sees EOF once the server (and all it started) is gone
    # no await from here until the task group is entered: a cancellation would leak the process
    os.set_blocking(to_child, False)
    os.set_blocking(from_child, False)
    writer = PipeWriter(to_child)

    def reader(on_line: Callable[[bytes], None], on_eof: Callable[[], None], on_oversize: OnOversize) -> LineReader:
        return LineReader(from_child, on_line, on_eof, on_oversize, limit=channel.limit)

    lines = SessionLines(
        reader,
        writer,
        lambda message: isinstance(message, dict) and channel._take(message),
        channel._oversize,
        outgoing=channel._observe,
        ended=channel._close,
        unparsable=channel._unparsable,
        bounded=True,
    )
    channel._lines = lines
    try:
        async with anyio.create_task_group() as tg, lines.streams() as streams:
            channel._writer, channel.open = writer, True
            tg.start_soon(channel._expire)
            if channel.confinement is not None:
                tg.start_soon(channel._watch_limits)
            try:
                yield streams
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            channel._close()
            with anyio.move_on_after(_FLUSH_SECONDS):
                await writer.drained()  # what the session wrote last reaches the server
            writer.close()
            lines.drop()  # the server's last output is read and dropped: it must not block exiting
            os.close(to_child)  # EOF on the server's stdin: the polite way to stop it
            await _stop(process, _EXIT_SECONDS if channel.answered else 0)
            # the server's last words (why it exited) are kept before anyone asks for them
            await anyio.to_thread.run_sync(channel.stderr.join, _EXIT_SECONDS)
            lines.close()
            os.close(from_child)
            for made in (channel.confinement, channel.mark):
                if made is not None:
                    await _settle(made)
            if gate is not None:
                await anyio.to_thread.run_sync(gate.close)  # its threads wake at once; joined off the loop
            await anyio.to_thread.run_sync(discard, plan)  # a Landlock jail's throw-away home and tmp


async def _settle(confinement: Confinement | Mark) -> None:
    """Remove what was made for the ended jail or server, once its last tasks have exited (a moment after)."""
    with anyio.move_on_after(SETTLE_SECONDS):
        while not confinement.close():  # noqa: ASYNC110 - no event fires when a cgroup empties
            await anyio.sleep(0.01)


async def _stop(process: anyio.abc.Process, grace: float) -> None:
    """Give the server `grace` seconds to exit after its stdin closed, then end its process group."""
    with anyio.move_on_after(grace):
        # polled, not process.wait(): that also waits for the EOF of every pipe a child may hold
        while process.returncode is None:  # noqa: ASYNC110 - no event fires when a process exits
            await anyio.sleep(0.01)
    # whatever the server started is ended with it, even after the server itself exited
    await terminate_posix_process_tree(process)
