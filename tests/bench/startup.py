"""Sections 3 and 5: cold start (spawn to the first complete `tools/list`) and the gateway's memory.

Each start is timed from just before the process is spawned to the end of the first `tools/list`
(the handshake-era client's initialize included, as a client would do it). The same runs then call
every server once, so that all of them are connected, and read the gateway's VmRSS: the gateway
process alone, its servers excluded. Every configuration runs twice first, not counted: that warms
the page cache and, for the gateways, learns and locks the catalogs (the first run) and records the
opening answers under the config's fingerprint (the second), so the counted runs are the every-day
start of a client. The "no record" rows remove that record before each run: the start as it is
without early answers. The first-contact row starts from an empty state directory each run; the
lazy runs serve their catalogs from the locks the 16-eager runs wrote.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.gateway.wire.early import RECORD
from tests.bench.report import Table, Target, fmt, median, say
from tests.bench.spawn import PROBE, Scratch, child_pid, connect, direct, gateway, probe_argv, rss_mb

__all__ = ["COLD_TARGET", "LAZY_TARGET", "RSS_TARGET", "cold_start", "list_all", "memory"]

COLD_TARGET = Target(1.3, "x")
LAZY_TARGET = Target(0.3, " s")
RSS_TARGET = Target(60, " MB")
GATEWAY_MARKER = "cellblock.gateway.cli.main"
# the first start of a gateway learns and locks the catalogs, the second records its opening answers
WARM_UPS = 2


@dataclass
class Starts:
    """The timed starts of one configuration."""

    label: str
    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    tools: int = 0


@dataclass
class Measured:
    """Every configuration's starts, in table order; the first is the single probe, the baseline."""

    starts: list[Starts]
    runs: int


async def list_all(client: Client) -> list[str]:
    """Every tool name the server lists, following cursors."""
    names: list[str] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            return names


async def _start(
    params: StdioServerParameters, marker: str, scratch: Scratch, label: str, servers: list[str]
) -> tuple[float, float, int]:
    """One cold start: seconds to the first complete tools/list, the process's RSS once every one of
    `servers` has answered a call (all of them connected), and the tool count."""
    began = time.perf_counter()
    async with connect(params, "legacy", scratch.log(label)) as client:
        tools = await list_all(client)
        took = time.perf_counter() - began
        async with anyio.create_task_group() as tg:  # a server listed from its lock may not be up yet
            for name in servers:
                tg.start_soon(_echo, client, f"{name}__echo")
        # the list may have been answered early, before the gateway had loaded: a ping is only
        # ever answered by the gateway itself, so the memory read after it is the gateway's, loaded
        await client.send_ping()
        rss = rss_mb(child_pid(marker))
    return took, rss, len(tools)


async def _echo(client: Client, tool: str) -> None:
    """Raises:
    RuntimeError: the call failed (a server that did not come up).
    """
    if (await client.call_tool(tool, {"message": "up?"})).is_error:
        raise RuntimeError(f"{tool} failed: the server did not come up")


async def _starts(
    params: StdioServerParameters | Callable[[int], StdioServerParameters],
    marker: str,
    scratch: Scratch,
    label: str,
    runs: int,
    servers: list[str] = [],  # noqa: B006 - never mutated
) -> Starts:
    """`runs` counted starts after WARM_UPS that are not; `params` may be made anew for each (by number)."""
    result = Starts(label)
    made = params if callable(params) else (lambda _: params)
    for run in range(-WARM_UPS + 1, 1):  # not counted
        await _start(made(run), marker, scratch, label, servers)
    for run in range(1, runs + 1):
        took, rss, result.tools = await _start(made(run), marker, scratch, label, servers)
        result.seconds.append(took)
        result.rss_mb.append(rss)
    say(f"{label}: {', '.join(f'{s:.2f}' for s in result.seconds)} s")
    return result


def _probes(count: int) -> dict[str, list[str]]:
    return {f"p{i:02d}": probe_argv(f"p{i:02d}") for i in range(count)}


async def _measure(scratch: Scratch, quick: bool) -> Measured:
    runs = 1 if quick else 3
    starts = [await _starts(direct("p"), str(PROBE), scratch, "probe server alone", runs)]
    for count in (0, 1, 8, 16):
        label = f"gateway, {count} eager server{'s' if count != 1 else ''}" if count else "gateway, no servers"
        # the uncounted runs lock the catalogs and record the opening: each counted run is a client
        # launch after that, the every-day case
        params = gateway(scratch, f"start-eager-{count}", _probes(count))
        starts.append(await _starts(params, GATEWAY_MARKER, scratch, label, runs, list(_probes(count))))
    eager = gateway(scratch, "start-eager-16", _probes(16))
    label = "gateway, 16 eager servers, no record (catalogs from the locks, the SDK loaded first)"
    starts.append(
        await _starts(
            _unrecorded(scratch, "start-eager-16", eager), GATEWAY_MARKER, scratch, label, runs, list(_probes(16))
        )
    )
    first = lambda run: gateway(scratch, f"start-first-16-{run}", _probes(16))  # noqa: E731 - a fresh state dir per run
    label = "gateway, 16 eager servers, first contact (nothing locked yet)"
    starts.append(await _starts(first, GATEWAY_MARKER, scratch, label, runs, list(_probes(16))))
    lazy = gateway(scratch, "start-lazy-16", _probes(16), start="lazy", state="start-eager-16")
    label = "gateway, 16 lazy servers (catalogs from the lock)"
    starts.append(await _starts(lazy, GATEWAY_MARKER, scratch, label, runs))
    label = "gateway, 16 lazy servers, no record"
    starts.append(await _starts(_unrecorded(scratch, "start-eager-16", lazy), GATEWAY_MARKER, scratch, label, runs))
    return Measured(starts, runs)


def _unrecorded(scratch: Scratch, state: str, params: StdioServerParameters) -> Callable[[int], StdioServerParameters]:
    """`params` for a start without the record of opening answers (it is removed first)."""

    def made(run: int) -> StdioServerParameters:
        (scratch.path(f"state-{state}") / RECORD).unlink(missing_ok=True)
        return params

    return made


_cache: dict[bool, Measured] = {}


async def _measured(scratch: Scratch, quick: bool) -> Measured:
    """The start measurements, taken once per run and shared by the cold-start and memory sections."""
    if quick not in _cache:
        _cache[quick] = await _measure(scratch, quick)
    return _cache[quick]


async def cold_start(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 3: gateway start with 0, 1, 8, 16 eager and 16 lazy servers, against one probe server."""
    measured = await _measured(scratch, quick)
    base = median(measured.starts[0].seconds)
    table = Table(
        f"3. Cold start: spawn to first complete tools/list (median of {measured.runs} runs after {WARM_UPS} more)",
        ["start", "tools listed", "median s", "min s", "max s", "x one probe", "target"],
    )
    for starts in measured.starts:
        took = median(starts.seconds)
        if starts.label == "gateway, 16 eager servers":
            verdict = COLD_TARGET.verdict(took / base)
        elif starts.label == "gateway, 16 lazy servers (catalogs from the lock)":
            verdict = LAZY_TARGET.verdict(took)
        else:
            verdict = "—"
        cells = [
            str(starts.tools),
            fmt(took),
            fmt(min(starts.seconds)),
            fmt(max(starts.seconds)),
            f"{fmt(took / base, 2)}x",
        ]
        table.add(
            [starts.label, *cells, verdict],
            label=starts.label,
            seconds=starts.seconds,
            tools=starts.tools,
            ratio=took / base,
            target=verdict,
        )
    table.notes += [
        "every server is the same probe, so the slowest single server started directly is the probe itself: "
        "its median is the baseline of the x column",
        "eager rows: each counted run follows two that locked the catalogs and recorded the opening answers, so "
        "the gateway answers the opening from that record before the SDK is loaded, lists the servers from the "
        "locks and starts them once the client has its list; 'no record' rows remove the record before each run; "
        "'first contact' runs start from an empty state directory each, and the list waits for every server",
        f"the machine has {os.cpu_count()} cores: servers that start at once share them",
    ]
    return [table]


async def memory(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 5: VmRSS of the gateway process alone after its first tools/list."""
    measured = await _measured(scratch, quick)
    table = Table(
        f"5. Memory: VmRSS with the servers connected (median of {measured.runs} runs), servers excluded",
        ["process", "median MB", "max MB", "target"],
    )
    for starts in measured.starts:
        rss = median(starts.rss_mb)
        verdict = RSS_TARGET.verdict(rss) if starts.label == "gateway, 16 eager servers" else "—"
        table.add(
            [starts.label, fmt(rss), fmt(max(starts.rss_mb)), verdict],
            label=starts.label,
            rss_mb=starts.rss_mb,
            target=verdict,
        )
    table.notes += [
        "'probe server alone' is one probe server's own RSS: what any Python MCP server on this SDK costs",
        "eager rows are read once every server has answered a call (all connected); the lazy rows after the "
        "list (none started); every row once the gateway has answered a ping itself (it is loaded)",
    ]
    return [table]
