"""Section 6: catalog scale (`tools/list` of 50 servers x 40 tools) and policy decisions with 500 rules.

The 50 servers' catalogs are learned once, in batches of 10 eager servers sharing one state
directory (50 probe servers starting at once on 2 cores would race the gateway's start deadline);
then a gateway with all 50 `start: lazy` serves them from their locks without running any.
The baseline is one probe server listing 2,000 tools itself. The policy is timed alone: a
`Policy` built from 500 rule entries with `parse_rule_entry`, as the config does, and
`policy.decide(tool, args)` under `timeit`.
"""

from __future__ import annotations

import itertools
import os
import time
import timeit
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mcp.client.stdio import StdioServerParameters

from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision
from tests.bench.rawrpc import raw_client
from tests.bench.report import Table, Target, fmt, median, percentile, say
from tests.bench.spawn import Scratch, connect, direct, gateway, probe_argv
from tests.bench.startup import list_all

__all__ = ["DECISION_TARGET", "LIST_TARGET", "catalog_scale"]

LIST_TARGET = Target(20, " ms")
DECISION_TARGET = Target(20, " µs")
SERVERS, BATCH = 50, 10
# the probe has 14 tools of its own; 26 more make 40
EXTRA_TOOLS = 26
ERAS = {"legacy": "handshake", "auto": "2026-07-28"}
WARM_LISTS = 3


@dataclass(frozen=True)
class Lists:
    """Timed tools/list calls on one connection: the tool count, the first list, then the counted ones (ms)."""

    tools: int
    first_ms: float
    ms: list[float]


def _servers() -> dict[str, list[str]]:
    return {f"s{i:02d}": probe_argv(f"s{i:02d}", EXTRA_TOOLS) for i in range(SERVERS)}


async def _learn(scratch: Scratch, servers: dict[str, list[str]]) -> None:
    """Run the servers eagerly, BATCH at a time, so that the shared state dir holds every lock."""
    names = sorted(servers)
    began = time.perf_counter()
    for first in range(0, len(names), BATCH):
        batch = {name: servers[name] for name in names[first : first + BATCH]}
        label = f"catalog-learn-{first}"
        async with connect(gateway(scratch, label, batch, state="catalog"), "legacy", scratch.log(label)) as client:
            await list_all(client)
    say(f"learned {len(names)} catalogs in {time.perf_counter() - began:.0f} s")


async def _sdk_lists(params: StdioServerParameters, mode: str, scratch: Scratch, label: str, runs: int) -> Lists:
    """tools/list through the SDK's client: its validation of every tool is part of each time."""
    async with connect(params, mode, scratch.log(label)) as client:

        async def one() -> tuple[float, int]:
            began = time.perf_counter()
            count = len(await list_all(client))
            return (time.perf_counter() - began) * 1000, count

        lists = await _repeat(one, runs)
    say(f"{label}: median {median(lists.ms):.0f} ms")
    return lists


async def _raw_lists(params: StdioServerParameters, scratch: Scratch, label: str, runs: int) -> Lists:
    """tools/list by a bare JSON-RPC client: the server's cost, and one json.loads."""
    async with raw_client(params, scratch.log(label)) as client:

        async def one() -> tuple[float, int]:
            took, result = await client.request("tools/list", {})
            if result.get("nextCursor"):
                raise RuntimeError(f"{label}: tools/list is paged; the raw client reads one page")
            return took, len(result["tools"])

        return await _repeat(one, runs)


async def _repeat(one: Callable[[], Awaitable[tuple[float, int]]], runs: int) -> Lists:
    """The first list after connecting, then `runs` more after WARM_LISTS uncounted ones."""
    first, tools = await one()
    for _ in range(WARM_LISTS):
        await one()
    times = [(await one())[0] for _ in range(runs)]
    return Lists(tools, first, times)


async def _list_table(scratch: Scratch, quick: bool) -> Table:
    runs = 3 if quick else 5
    servers = _servers()
    await _learn(scratch, servers)
    lazy = gateway(scratch, "catalog-lazy", servers, start="lazy", state="catalog")
    big = direct("big", SERVERS * 40 - 14)
    table = Table(
        f"6a. Catalog scale: tools/list, {SERVERS} servers x 40 tools "
        f"(median of {runs} (raw: {4 * runs}) lists after {WARM_LISTS} warm-ups)",
        ["path", "client", "tools", "first list ms", "median ms", "p90 ms", "x one server", "target"],
    )
    measured: list[tuple[str, Lists, Lists]] = []
    for mode, era in ERAS.items():
        base = await _sdk_lists(big, mode, scratch, f"catalog-direct-{mode}", runs)
        through = await _sdk_lists(lazy, mode, scratch, f"catalog-gateway-{mode}", runs)
        measured.append((f"SDK Client, {era}", base, through))
    base = await _raw_lists(big, scratch, "catalog-direct-raw", 4 * runs)
    through = await _raw_lists(lazy, scratch, "catalog-gateway-raw", 4 * runs)
    measured.append(("raw JSON-RPC, handshake", base, through))
    for client, base, through in measured:
        for label, got in (("one probe server, 2,000 tools", base), ("gateway, 50 lazy servers", through)):
            ratio = median(got.ms) / median(base.ms)
            verdict = LIST_TARGET.verdict(median(got.ms)) if got is through else "—"
            cells = [str(got.tools), fmt(got.first_ms), fmt(median(got.ms)), fmt(percentile(got.ms, 90))]
            raw = {"label": label, "client": client, "tools": got.tools, "first_ms": got.first_ms, "ms": got.ms}
            table.add([label, client, *cells, f"{fmt(ratio, 2)}x", verdict], **raw, target=verdict)
    table.notes += [
        "the gateway's 50 servers are lazy and never run: their catalogs come from the locks an eager run wrote",
        "SDK Client rows include the client's own validation of 2,000 tools; the raw rows time only the "
        "request line out and the answer line in, plus one json.loads",
    ]
    return table


# -- policy ------------------------------------------------------------------------------------


def _rules() -> list[Any]:
    """500 rule entries as a config would hold them: exact names, globs, path and host constraints."""
    entries: dict[str, Any] = {}
    entries |= {f"tool_{i}": "allow" for i in range(200)}
    entries |= {f"srv{i}_*": "ask" for i in range(200)}
    entries |= {f"read_{i}_*": {"decision": "allow", "args": {"path": {"under": ["/usr/share"]}}} for i in range(50)}
    entries |= {f"fetch_{i}": {"decision": "allow", "args": {"url": {"hosts": ["*.example.com"]}}} for i in range(50)}
    return [parse_rule_entry(pattern, body) for pattern, body in entries.items()]


def _cases(policy: Policy) -> list[tuple[str, Callable[[], object], Decision]]:
    """What to time: (label, one decision, the decision it must give)."""
    fresh: Iterator[str] = itertools.cycle([f"zz_{i}" for i in range(5000)])  # more than the lookup cache keeps

    def decide(tool: str, args: dict[str, Any] | None) -> Callable[[], object]:
        return lambda: policy.decide(tool, args)

    return [
        ("exact rule, no constraint", decide("tool_123", {"message": "hi"}), Decision.ALLOW),
        ("glob rule (250 globs)", decide("srv150_list", {}), Decision.ASK),
        ("glob rule + path constraint (`under`)", decide("read_25_file", {"path": "/usr/share/doc"}), Decision.ALLOW),
        ("exact rule + host constraint", decide("fetch_25", {"url": "https://api.example.com/v1"}), Decision.ALLOW),
        ("no rule: the default", decide("unknown_tool", {}), Decision.ASK),
        ("a new tool name every call (lookup cache missed)", lambda: policy.decide(next(fresh), None), Decision.ASK),
    ]


def _policy_table(quick: bool) -> Table:
    number = 2_000 if quick else 20_000
    began = time.perf_counter()
    policy = Policy(default=Decision.ASK, rules=tuple(_rules()), cwd=None, home=os.path.expanduser("~"))
    built = (time.perf_counter() - began) * 1000
    table = Table(
        f"6b. Policy decision time, 500 rules (timeit: median of 5 repeats x {number:,} decisions)",
        ["decision", "µs/decision", "target"],
    )
    for label, action, expected in _cases(policy):
        got = action()
        if getattr(got, "decision", None) is not expected:
            raise RuntimeError(f"policy case {label!r} decided {got}, expected {expected.value}")
        micros = median(timeit.repeat(action, repeat=5, number=number)) / number * 1e6
        verdict = DECISION_TARGET.verdict(micros)
        table.add([label, fmt(micros), verdict], label=label, us=micros, target=verdict)
    table.notes.append(f"building the Policy from 500 entries took {built:.1f} ms (once per config load)")
    return table


async def catalog_scale(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 6: tools/list of 2,000 tools through the gateway, and policy decisions with 500 rules."""
    return [await _list_table(scratch, quick), _policy_table(quick)]
