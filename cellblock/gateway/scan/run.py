"""One scan run: the server started in its jail under the tracer, in the scan's scratch world,
listed, and each tool called with each probe; the trace cut into the start and each call.

The jail is the one `launch_plan` builds for the gateway, with the scratch copies in place of the
user's grants and the scratch home as the jail's home: if it cannot be built, nothing runs.
strace only wraps bwrap, so the server never runs outside its jail.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError

from cellblock.gateway.config.model import Config, LocalServer
from cellblock.gateway.downstream.connection import gateway_client
from cellblock.gateway.downstream.jailreport import tell_jail
from cellblock.gateway.downstream.launch import launch_plan, own_paths
from cellblock.gateway.downstream.local import LocalChannel, local_transport
from cellblock.gateway.scan.scratch import ScanError, Scratch, jail_of
from cellblock.policy.files import make_dirs
from cellblock.policy.hosts import parse_rule
from cellblock.policy.probes import Probe, destructive, probes
from cellblock.sandbox.egress import Decision, EgressProxy
from cellblock.sandbox.trace import Event, Kind, Trace, find_strace, parse_trace, traced

__all__ = ["Call", "Decoy", "Run", "ToolInfo", "scan_run"]

START_SECONDS = 60.0
CALL_SECONDS = 20.0
# After the last call: how long the server gets before it is stopped, so that what it does at
# the end is in the trace too.
SETTLE_SECONDS = 0.3


@dataclass
class ToolInfo:
    """What a tool says of itself."""

    name: str
    description: str
    annotations: dict[str, Any]
    schema: dict[str, Any]
    destructive: bool


@dataclass
class Call:
    """One probe sent to one tool, its answer and what the server did meanwhile."""

    tool: str
    probe: Probe
    start: float
    end: float
    error: str | None = None  # the tool's error text, or why the call failed
    events: list[Event] = field(default_factory=list)


@dataclass
class Run:
    """A whole scan run: what the server offered, the start's events, each call's."""

    tools: list[ToolInfo]
    calls: list[Call]
    start_events: list[Event]
    skipped: list[str]  # destructive tools not called (no --destructive)
    protocol: str = ""
    stderr: str = ""
    # what the jail shows for the server to run (its installation, the system): reads there are
    # what running it takes, not what it does
    code: tuple[str, ...] = ()
    cwd: str = ""  # the server's working directory in its jail (its home, unless `cwd` says)


class Decoy:
    """The host that is not allowed: a loopback listener on the host that counts who reached it."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self.port: int = self._socket.getsockname()[1]
        self.reached = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cellblock-scan"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except (TimeoutError, OSError):
                continue
            self.reached += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))[:300]


async def scan_run(
    config: Config,
    config_path: Path,
    state: Path,
    runtime: Path,
    name: str,
    server: LocalServer,
    scratch: Scratch,
    decoy: Decoy,
    allow_destructive: bool,
) -> Run:
    """Start `server` (already moved into `scratch`) jailed and traced, call every tool with every
    probe, stop it, and cut the trace into the start and each call.

    Raises:
        JailError: the jail or the tracer cannot be built (nothing was started).
        ScanError: the server did not start or answer its handshake.
    """
    strace = find_strace()
    own = own_paths(config, state, config_path, runtime)
    jail = jail_of(server)  # Scratch.server refused jail: false already
    egress = str(runtime / f"scan-{os.getpid()}-{name}.sock") if jail.proxied else None
    private = scratch.root / "private"
    plan = launch_plan(name, server, egress, private, None, config.limits_of(name), own, jail_home=str(scratch.home))
    tell_jail(name, plan)
    output = scratch.root / "trace"
    plan = replace(plan, argv=traced(plan.argv, str(output), strace))
    decisions: list[Event] = []

    def told(decision: Decision) -> None:
        target = f"{decision.host}:{decision.port}"
        decisions.append(Event(time.time(), 0, Kind.CONNECT, target, "egress", None if decision.allowed else "EACCES"))

    code = tuple(m.path for m in plan.mounts if m.why not in ("read_only", "read_write"))
    run = Run([], [], [], [], code=code, cwd=server.cwd or str(scratch.home))
    errlog = scratch.root / "stderr"
    async with anyio.create_task_group() as tg:
        if egress is not None:
            await anyio.to_thread.run_sync(make_dirs, runtime)
            # nobody answers a scan's questions: under `network: ask` the hosts not listed are refused
            proxy = EgressProxy(name, [parse_rule(h) for h in jail.allow_hosts], egress, told)
            await tg.start(proxy.serve)
        try:
            with errlog.open("w") as err:
                await _session(plan, name, err, scratch, decoy, allow_destructive, run)
        finally:
            tg.cancel_scope.cancel()
    run.stderr = errlog.read_text(errors="replace")[-2000:]
    trace = parse_trace(output.read_text(errors="replace")) if output.exists() else Trace(None, ())
    _cut(run, trace, decisions)
    return run


async def _session(
    plan: Any, name: str, err: Any, scratch: Scratch, decoy: Decoy, allow_destructive: bool, run: Run
) -> None:
    channel = LocalChannel(name)
    client = gateway_client(local_transport(plan, channel, err), "auto")
    started = False
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + START_SECONDS) as scope:
            async with client:
                started, scope.deadline = True, math.inf
                channel.answered = True
                await _exercise(client, scratch, decoy, allow_destructive, run)
    except Exception as exc:
        if not _ended(exc):
            raise
        if started:
            raise ScanError(f"server '{name}' stopped during the scan: {exc or type(exc).__name__}") from exc
        raise ScanError(f"server '{name}' did not start in its jail: {exc or type(exc).__name__}") from exc
    if scope.cancelled_caught:
        raise ScanError(f"server '{name}' did not answer its handshake within {START_SECONDS:.0f} seconds")


def _ended(exc: BaseException) -> bool:
    """Whether `exc` (or every exception of a group) says the server went away."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_ended(e) for e in exc.exceptions)
    return isinstance(exc, (MCPError, anyio.ClosedResourceError, anyio.EndOfStream, anyio.BrokenResourceError, OSError))


async def _exercise(client: Any, scratch: Scratch, decoy: Decoy, allow_destructive: bool, run: Run) -> None:
    """List the tools, then call each with each of its probes (destructive ones only if allowed)."""
    places = scratch.places(decoy.url)
    run.protocol = client.protocol_version or ""
    listed = await client.list_tools()
    for tool in listed.tools:
        annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
        info = ToolInfo(tool.name, tool.description or "", annotations, dict(tool.input_schema or {}), False)
        info.destructive = destructive(tool.name, annotations)
        run.tools.append(info)
    for info in run.tools:
        if info.destructive and not allow_destructive:
            run.skipped.append(info.name)
            continue
        for probe in probes(info.schema, places, info.name):
            call = Call(info.name, probe, time.time(), 0.0)
            try:
                with anyio.fail_after(CALL_SECONDS):
                    result = await client.call_tool(info.name, probe.arguments)
                call.error = _text(result) if result.is_error else None
            except (MCPError, TimeoutError) as exc:
                call.error = str(exc) or type(exc).__name__
            call.end = time.time()
            run.calls.append(call)
    await anyio.sleep(SETTLE_SECONDS)


def _cut(run: Run, trace: Trace, decisions: list[Event]) -> None:
    """Each event to the start (before the first call began) or to the call in whose window it
    fell (from the end of the call before it to its own end)."""
    events = sorted([*trace.events, *decisions], key=lambda e: e.ts)
    first = run.calls[0].start if run.calls else float("inf")
    run.start_events = [e for e in events if e.ts <= first]
    previous = first
    for call in run.calls:
        call.events = [e for e in events if previous < e.ts <= call.end]
        previous = call.end
    if trace.started is None and not events:
        print("cellblock: the trace shows no start of the server", file=sys.stderr)
