"""Sections 1 and 2: latency and throughput of a trivial `echo` call, direct vs. through each proxy.

Every route to the probe server is opened at once (one connection each, or four for four servers),
warmed up, and then measured in rounds that take turns, so a slow moment of the machine falls on
every route alike. Each round gives p50/p90/p99 and calls/s; the tables show medians over rounds,
and the ratio to the direct route of the same era in the same run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tests.bench.peers import fastmcp_proxy, mcp_proxy
from tests.bench.report import Summary, Table, Target, fmt, median, say, summarize
from tests.bench.spawn import Scratch, connect, direct, gateway, probe_argv

RELAY = Path(__file__).resolve().parent / "relay.py"

__all__ = ["ERAS", "concurrency", "per_call"]

# Client mode -> the era it asks for ("auto" gets 2026-07-28 from a server that speaks it).
ERAS = {"legacy": "handshake", "auto": "2026-07-28"}
# A batch of calls (or a whole concurrent round) must finish within this; a stuck proxy fails its row.
BATCH_SECONDS = 300.0
P50_TARGET = Target(1.3, "x")
THROUGHPUT_TARGET = Target(0.8, "x", at_least=True)

Lane = tuple[Client, str]  # a connection, and the name the echo tool has on it
Opener = Callable[[Scratch, str, list[str], AsyncExitStack], Awaitable[list[Lane]]]


@dataclass(frozen=True)
class Plan:
    """How much to measure: rounds per route, and calls per round."""

    rounds: int
    calls: int
    warm: int


@dataclass(frozen=True)
class Route:
    """One way to reach the probe's echo tool."""

    label: str
    open: Opener
    eras: tuple[str, ...] = ("legacy", "auto")
    why_not: str = ""  # why an era is missing
    targeted: bool = False  # the targets apply to this route


@dataclass
class Outcome:
    """What one route gave in one era: per-round summaries, or why there are none."""

    rounds: list[Summary] = field(default_factory=list)
    negotiated: str = ""
    error: str = ""

    @property
    def summary(self) -> Summary | None:
        return Summary.median_of(self.rounds) if self.rounds else None


# -- opening each route ------------------------------------------------------------------------


async def _open_direct(scratch: Scratch, mode: str, names: list[str], stack: AsyncExitStack) -> list[Lane]:
    lanes = []
    for name in names:
        client = await stack.enter_async_context(connect(direct(name), mode, scratch.log(f"direct-{mode}-{name}")))
        lanes.append((client, "echo"))
    return lanes


async def _open_relay(scratch: Scratch, mode: str, names: list[str], stack: AsyncExitStack) -> list[Lane]:
    lanes = []
    for name in names:  # one relay per server, as direct has one connection per server
        argv = [str(RELAY), *probe_argv(name)]
        params = StdioServerParameters(command=sys.executable, args=argv)
        client = await stack.enter_async_context(connect(params, mode, scratch.log(f"relay-{mode}-{name}")))
        lanes.append((client, "echo"))
    return lanes


def _open_gateway(jailed: bool) -> Opener:
    async def open_(scratch: Scratch, mode: str, names: list[str], stack: AsyncExitStack) -> list[Lane]:
        label = f"calls-{'jailed' if jailed else 'unjailed'}-{mode}-{len(names)}"
        params = gateway(scratch, label, {n: probe_argv(n) for n in names}, jailed=jailed)
        client = await stack.enter_async_context(connect(params, mode, scratch.log(label)))
        return [(client, f"{name}__echo") for name in names]

    return open_


async def _open_fastmcp(scratch: Scratch, mode: str, names: list[str], stack: AsyncExitStack) -> list[Lane]:
    params = fastmcp_proxy({n: probe_argv(n) for n in names})
    client = await stack.enter_async_context(connect(params, mode, scratch.log(f"fastmcp-{mode}-{len(names)}")))
    if len(names) == 1:
        return [(client, "echo")]
    tools = [t.name for t in (await client.list_tools()).tools]
    # FastMCP mounts each server under its name; find each server's echo as FastMCP named it
    return [(client, _one([t for t in tools if t.startswith(name) and t.endswith("echo")], name)) for name in names]


async def _open_mcp_proxy(scratch: Scratch, mode: str, names: list[str], stack: AsyncExitStack) -> list[Lane]:
    log = scratch.log(f"mcp-proxy-{mode}-{len(names)}")
    urls = await stack.enter_async_context(mcp_proxy({n: probe_argv(n) for n in names}, log))
    return [(await stack.enter_async_context(connect(urls[name], mode, log)), "echo") for name in names]


def _one(found: list[str], name: str) -> str:
    if len(found) != 1:
        raise LookupError(f"expected one echo tool for {name!r} through FastMCP, found {found}")
    return found[0]


ROUTES = (
    Route("direct", _open_direct),
    Route("floor: a bare relay (each line parsed once, nothing checked)", _open_relay),
    Route("cellblock serve, unjailed", _open_gateway(jailed=False), targeted=True),
    Route("cellblock serve, jailed", _open_gateway(jailed=True)),
    Route("FastMCP proxy", _open_fastmcp),
    Route(
        "mcp-proxy (HTTP→stdio)",
        _open_mcp_proxy,
        eras=("legacy",),
        why_not="mcp-proxy is on SDK 1.x, which speaks only the handshake era (an auto client falls back to it)",
    ),
)


# -- measuring ---------------------------------------------------------------------------------


async def _call(lane: Lane, message: str) -> None:
    """One echo call; a refused or failed call is an error, never a fast sample.

    Raises:
        RuntimeError: the call came back as an error.
    """
    client, tool = lane
    result = await client.call_tool(tool, {"message": message})
    if result.is_error:
        raise RuntimeError(f"{tool} returned an error: {result.content}")


async def _sequential(lanes: Sequence[Lane], calls: int) -> Summary:
    (lane,) = lanes
    times = []
    began = time.perf_counter()
    for i in range(calls):
        start = time.perf_counter()
        await _call(lane, f"m{i}")
        times.append((time.perf_counter() - start) * 1000)
    return summarize(times, time.perf_counter() - began)


async def _concurrent(lanes: Sequence[Lane], workers: int, per_worker: int) -> Summary:
    times: list[float] = []

    async def worker(index: int) -> None:
        lane = lanes[index % len(lanes)]
        for i in range(per_worker):
            start = time.perf_counter()
            await _call(lane, f"w{index}-{i}")
            times.append((time.perf_counter() - start) * 1000)

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for index in range(workers):
            tg.start_soon(worker, index)
    return summarize(times, time.perf_counter() - began)


Warm = Callable[[Sequence[Lane]], Awaitable[object]]
Batch = Callable[[Sequence[Lane]], Awaitable[Summary]]


async def _measure_era(
    scratch: Scratch, mode: str, names: list[str], rounds: int, warm: Warm, batch: Batch
) -> dict[str, Outcome]:
    """Open every route in one era, warm each up, then measure them in turns for `rounds` rounds."""
    outcomes = {route.label: Outcome() for route in ROUTES}
    stacks: dict[str, AsyncExitStack] = {}
    opened: dict[str, Sequence[Lane]] = {}
    try:
        for route in ROUTES:
            outcome = outcomes[route.label]
            if mode not in route.eras:
                outcome.error = route.why_not
                continue
            stack = stacks[route.label] = AsyncExitStack()
            try:
                lanes = await route.open(scratch, mode, names, stack)  # bounded by the clients' read timeout
                with anyio.fail_after(BATCH_SECONDS):
                    await warm(lanes)
            except Exception as exc:  # one route failing (a peer that will not start) leaves the others measured
                outcome.error = f"failed: {_reason(exc)}"
                say(f"{route.label}, {ERAS[mode]}: {outcome.error}")
                continue
            opened[route.label] = lanes
            say(f"{ERAS[mode]}: {route.label} open and warm")
            outcome.negotiated = str(lanes[0][0].protocol_version)
        for _ in range(rounds):
            for label, route_lanes in list(opened.items()):
                try:
                    with anyio.fail_after(BATCH_SECONDS):
                        outcomes[label].rounds.append(await batch(route_lanes))
                except Exception as exc:  # as above: the row says what broke, the run goes on
                    outcomes[label].error = f"failed mid-run: {_reason(exc)}"
                    say(f"{label}, {ERAS[mode]}: {outcomes[label].error}")
                    del opened[label]
    finally:
        for label, stack in reversed(stacks.items()):  # last opened, first closed: their scopes nest
            try:
                await stack.aclose()
            except Exception as exc:  # a route that does not close cleanly is reported; the numbers stand
                say(f"{label}, {ERAS[mode]}: closing it failed: {_reason(exc)}")
    return outcomes


def _reason(exc: BaseException) -> str:
    """The first real error inside task-group wrappers, for a table note."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _era_cell(mode: str, outcome: Outcome) -> str:
    if outcome.negotiated and mode == "auto" and outcome.negotiated not in MODERN_PROTOCOL_VERSIONS:
        return f"auto → {outcome.negotiated}"
    return f"{ERAS[mode]} ({outcome.negotiated})" if mode == "legacy" and outcome.negotiated else ERAS[mode]


def _paired(outcome: Outcome, base: Outcome | None, figure: str) -> float | None:
    """The median over rounds of this route's `figure` divided by the direct route's in the same
    round: the two were measured seconds apart, so a slow spell of the machine cancels out."""
    if base is None:
        return None
    ratios = [
        getattr(mine, figure) / getattr(theirs, figure)
        for mine, theirs in zip(outcome.rounds, base.rounds, strict=False)
        if getattr(theirs, figure)
    ]
    return median(ratios) if ratios else None


# -- the sections ------------------------------------------------------------------------------


def _missing_row(table: Table, route: Route, mode: str, outcome: Outcome) -> None:
    """A row of n/a for a route that has no numbers in this era, and a note saying why."""
    blanks = len(table.columns) - 3
    table.add(
        [route.label, ERAS[mode], *["n/a"] * blanks, "n/a" if route.targeted else "—"],
        route=route.label,
        mode=mode,
        error=outcome.error,
    )
    table.notes.append(f"{route.label}, {ERAS[mode]}: n/a, {outcome.error}")


async def per_call(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 1: sequential echo calls over stdio, one server, each route and era."""
    plan = Plan(rounds=3, calls=50, warm=10) if quick else Plan(rounds=15, calls=100, warm=50)
    table = Table(
        f"1. Per-call latency, sequential ({plan.rounds} rounds x {plan.calls} calls, medians over rounds; "
        "ratios paired by round)",
        ["path", "era", "p50 ms", "p90 ms", "p99 ms", "calls/s", "p50 x direct", f"target: p50 {P50_TARGET.text}"],
    )

    async def warm(lanes: Sequence[Lane]) -> None:
        for i in range(plan.warm):
            await _call(lanes[0], f"warm{i}")

    async def batch(lanes: Sequence[Lane]) -> Summary:
        return await _sequential(lanes, plan.calls)

    for mode in ERAS:
        outcomes = await _measure_era(scratch, mode, ["p"], plan.rounds, warm, batch)
        direct = outcomes[ROUTES[0].label]
        for route in ROUTES:
            outcome = outcomes[route.label]
            s = outcome.summary
            if s is None:
                _missing_row(table, route, mode, outcome)
                continue
            ratio = _paired(outcome, direct, "p50")
            verdict = P50_TARGET.verdict(ratio) if route.targeted else "—"
            cells = [fmt(s.p50), fmt(s.p90), fmt(s.p99), fmt(s.per_second), f"{fmt(ratio, 2)}x", verdict]
            table.add([route.label, _era_cell(mode, outcome), *cells], **_raw(route, mode, outcome, p50_ratio=ratio))
    table.notes.append(
        "mcp-proxy has no stdio-to-stdio mode (it bridges stdio and SSE/Streamable HTTP): the client reaches it "
        "over Streamable HTTP on loopback and it runs the probe over stdio, so its row includes an HTTP hop"
    )
    return [table]


async def concurrency(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 2: 32 concurrent echo calls spread over 4 servers, each route and era."""
    workers, names = 32, [f"p{i}" for i in range(4)]
    plan = Plan(rounds=3, calls=4, warm=2) if quick else Plan(rounds=9, calls=10, warm=2)
    table = Table(
        f"2. Concurrency: {workers} calls in flight over {len(names)} servers "
        f"({plan.rounds} rounds x {workers * plan.calls} calls, medians over rounds; ratios paired by round)",
        [
            "path",
            "era",
            "calls/s",
            "p50 ms",
            "calls/s x direct",
            "p50 x direct",
            f"target: calls/s {THROUGHPUT_TARGET.text}",
        ],
    )

    async def warm(lanes: Sequence[Lane]) -> None:
        await _concurrent(lanes, workers, plan.warm)

    async def batch(lanes: Sequence[Lane]) -> Summary:
        return await _concurrent(lanes, workers, plan.calls)

    for mode in ERAS:
        outcomes = await _measure_era(scratch, mode, names, plan.rounds, warm, batch)
        direct = outcomes[ROUTES[0].label]
        for route in ROUTES:
            outcome = outcomes[route.label]
            s = outcome.summary
            if s is None:
                _missing_row(table, route, mode, outcome)
                continue
            throughput = _paired(outcome, direct, "per_second")
            latency = _paired(outcome, direct, "p50")
            verdict = THROUGHPUT_TARGET.verdict(throughput) if route.targeted else "—"
            cells = [fmt(s.per_second), fmt(s.p50), f"{fmt(throughput, 2)}x", f"{fmt(latency, 2)}x", verdict]
            raw = _raw(route, mode, outcome, throughput_ratio=throughput, p50_ratio=latency)
            table.add([route.label, _era_cell(mode, outcome), *cells], **raw)
    table.notes.append(
        "direct: 4 connections, one per server; cellblock and FastMCP: one connection to one proxy with 4 "
        "servers; mcp-proxy: one proxy with 4 named servers, one HTTP session each"
    )
    return [table]


def _raw(route: Route, mode: str, outcome: Outcome, **ratios: float | None) -> dict[str, object]:
    """A row's numbers for the JSON file: the medians, the ratios, and every round."""
    s = outcome.summary
    medians = {} if s is None else {"p50_ms": s.p50, "p90_ms": s.p90, "p99_ms": s.p99, "calls_per_s": s.per_second}
    rounds = [vars(r) for r in outcome.rounds]
    return {"route": route.label, "mode": mode, "negotiated": outcome.negotiated, **medians, **ratios, "rounds": rounds}
