"""Section 9: a client launch with 14 real servers, each started directly vs. through Cellblock with lazy start.

A launch is what a client does when it opens: start every entry of its config, initialize each and
list its tools. Directly, that is 14 processes started at once (as a client with 14 entries starts
them, with the SDK's default environment); through Cellblock, one `cellblock serve` whose servers
are `start: lazy` and whose catalogs are in its locks, so it lists them all and starts none. The
servers are the pinned npm and PyPI peers of `tests/peers.py` (`./dev peers`), repeated under
different names. Measured once every list has been answered (the gateway's after a ping it answers
itself, so it is loaded): the memory of the whole process tree under the benchmark (the sum of
each process's RSS, and of its PSS, which shares the pages of a library loaded by many among them)
and the CPU time the tree has used (user + system, reaped children included). The two take turns,
run after run.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from mcp.client.stdio import StdioServerParameters

from tests import peers
from tests.bench.report import Table, fmt, median, say
from tests.bench.spawn import Scratch, connect, gateway
from tests.bench.startup import list_all

__all__ = ["SERVERS", "launch_cost"]

SERVERS = 14
# the first gateway launch meets the servers and locks their catalogs, the second records its opening
WARM_UPS = 2
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Launches:
    """The counted launches of one way of starting the servers."""

    label: str
    rss_mb: list[float] = field(default_factory=list)
    pss_mb: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    tools: int = 0


@dataclass(frozen=True)
class Tree:
    """The process tree under the benchmark at one moment."""

    processes: int
    rss_mb: float
    pss_mb: float
    cpu_s: float


def _servers(scratch: Scratch) -> dict[str, list[str]]:
    """14 real servers: the pinned peers, each kind under several names, as a client config lists them."""
    shared = scratch.path("launch-files")
    shared.mkdir(exist_ok=True)
    repo = scratch.path("launch-repo")
    if not repo.exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    kinds = {
        "everything": peers.everything(),
        "filesystem": peers.filesystem(shared),
        "time": peers.time_server("--local-timezone", "UTC"),
        "fetch": peers.fetch_server(),
        "git": peers.git_server(repo),
    }
    names = list(kinds)
    return {f"{names[i % len(names)]}-{i:02d}": kinds[names[i % len(names)]] for i in range(SERVERS)}


def _tree() -> Tree:
    """Every process under this one: how many, their summed RSS and PSS, and the CPU they used."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue  # gone meanwhile
    under: set[int] = set()
    grown = {os.getpid()}
    while grown:
        grown = {pid for pid, parent in parents.items() if parent in grown} - under
        under |= grown
    rss = pss = 0
    ticks = 0
    for pid in under:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
        for line in rollup:
            key, _, value = line.partition(":")
            if key == "Rss":
                rss += int(value.split()[0])
            elif key == "Pss":
                pss += int(value.split()[0])
    return Tree(len(under), rss / 1024, pss / 1024, ticks / _TICK)


async def _direct(servers: dict[str, list[str]], scratch: Scratch) -> tuple[float, Tree, int]:
    """One launch of every server at once, as a client starts its entries: (seconds, tree, tools)."""
    listed: dict[str, int] = {}
    done = anyio.Event()
    all_listed = anyio.Event()
    began = time.perf_counter()

    async def one(name: str, argv: list[str]) -> None:
        params = StdioServerParameters(command=argv[0], args=argv[1:])
        async with connect(params, "legacy", scratch.log(f"launch-direct-{name}")) as client:
            listed[name] = len(await list_all(client))
            if len(listed) == len(servers):
                all_listed.set()
            await done.wait()

    async with anyio.create_task_group() as tg:
        for name, argv in servers.items():
            tg.start_soon(one, name, argv)
        await all_listed.wait()
        took = time.perf_counter() - began
        tree = _tree()
        done.set()
    return took, tree, sum(listed.values())


async def _through(params: StdioServerParameters, scratch: Scratch) -> tuple[float, Tree, int]:
    """One launch of the gateway: (seconds to its complete list, tree once it is loaded, tools)."""
    began = time.perf_counter()
    async with connect(params, "legacy", scratch.log("launch-cellblock")) as client:
        tools = len(await list_all(client))
        took = time.perf_counter() - began
        await client.send_ping()  # only the loaded gateway answers a ping: the tree is measured loaded
        tree = _tree()
    return took, tree, tools


def _count(launches: Launches, took: float, tree: Tree, tools: int) -> None:
    launches.seconds.append(took)
    launches.rss_mb.append(tree.rss_mb)
    launches.pss_mb.append(tree.pss_mb)
    launches.cpu_s.append(tree.cpu_s)
    launches.processes.append(tree.processes)
    launches.tools = tools


async def launch_cost(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 9: memory and CPU of a client launch with 14 real servers, direct vs. Cellblock lazy."""
    runs = 1 if quick else 3
    servers = _servers(scratch)
    lazy = gateway(scratch, "launch-lazy", servers, start="lazy")
    direct, through = Launches("14 servers started directly"), Launches("Cellblock, 14 lazy servers")
    for run in range(-WARM_UPS + 1, runs + 1):  # not counted up to 0: page cache, locks, the record
        took, tree, tools = await _direct(servers, scratch)
        if run > 0:
            _count(direct, took, tree, tools)
        took, tree, tools = await _through(lazy, scratch)
        if run > 0:
            _count(through, took, tree, tools)
        say(f"launch run {run}{' (not counted)' if run <= 0 else ''}: {tree.processes} processes under Cellblock")
    table = Table(
        f"9. Client launch with {SERVERS} real servers: initialize and list every server's tools "
        f"(median of {runs} runs after {WARM_UPS} more)",
        ["launch", "tools", "processes", "RSS sum MB", "PSS sum MB", "CPU s", "seconds to full list"],
    )
    for launches in (direct, through):
        table.add(
            [
                launches.label,
                str(launches.tools),
                str(int(median(launches.processes))),
                fmt(median(launches.rss_mb)),
                fmt(median(launches.pss_mb)),
                fmt(median(launches.cpu_s)),
                fmt(median(launches.seconds)),
            ],
            label=launches.label,
            rss_mb=launches.rss_mb,
            pss_mb=launches.pss_mb,
            cpu_s=launches.cpu_s,
            seconds=launches.seconds,
            processes=launches.processes,
            tools=launches.tools,
        )
    table.notes += [
        "servers: the pinned peers (npm server-everything and server-filesystem, PyPI mcp-server-time, "
        "mcp-server-fetch and mcp-server-git), each kind under 2-3 names; started by their installed "
        "entry points (node SCRIPT, the script in their virtualenv), not through npx/uvx, whose resolution "
        "would add to the direct row",
        "Cellblock: `start: lazy` (what `cellblock wrap` writes), `jail: false`, catalogs from the locks the "
        "uncounted launches wrote: the counted launches start no server, so the jail's cost does not enter; "
        "the first call to a server starts it then",
        "memory and CPU are of every process under the benchmark (the servers, or the gateway and whatever it "
        "started), read once every list is answered; the benchmark's own process is not counted",
    ]
    return [table]
