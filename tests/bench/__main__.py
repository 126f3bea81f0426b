"""`python -m tests.bench`: measure every section in one run, print markdown tables, optionally save JSON.

    .venv/bin/python -m tests.bench [--quick] [--only SECTION] [--json FILE]

Tables go to stdout; progress and warnings go to stderr, prefixed `bench:`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from tests.bench import calls, catalog, hotpath, jail, launch, scan, startup, toolsearch
from tests.bench.machine import busy, describe
from tests.bench.peers import PEERS
from tests.bench.report import Table, say
from tests.bench.spawn import Scratch

Section = Callable[[Scratch, bool], Awaitable[list[Table]]]

SECTIONS: dict[str, Section] = {
    "calls": calls.per_call,
    "concurrency": calls.concurrency,
    "startup": startup.cold_start,
    "jail": jail.jail_cost,
    "memory": startup.memory,
    "catalog": catalog.catalog_scale,
    "hotpath": hotpath.hot_path,
    "scan": scan.scan_cost,
    "launch": launch.launch_cost,
    "search": toolsearch.search_cost,
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run, not numbers to quote")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only this section (repeatable)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON to FILE")
    return parser.parse_args(argv)


def _peers() -> dict[str, Any]:
    """Install the peer proxies if needed; their versions, or why one is unavailable."""
    found: dict[str, Any] = {}
    for peer in PEERS:
        try:
            peer.ensure()
            found[peer.name] = peer.versions()
        except RuntimeError as exc:
            say(f"{exc}; its rows will say n/a")
            found[peer.name] = {"error": str(exc)}
    return found


def _header(machine: dict[str, Any], peers: dict[str, Any], quick: bool) -> str:
    lines = [
        f"## Cellblock benchmark{' (--quick: smoke run, not numbers to quote)' if quick else ''}",
        "",
        f"- machine: {machine['nproc']} cores, {machine['cpu']}, Linux {machine['kernel']}, Python {machine['python']}",
        f"- ours: mcp {machine['mcp']}, pydantic {machine['pydantic']}; commit {machine['commit']}"
        f"{' + uncommitted changes under cellblock/' if machine['uncommitted'] else ''}",
        f"- load average at start: {machine['loadavg']}",
    ]
    for name, versions in peers.items():
        shown = versions.get("error") or ", ".join(f"{k} {v}" for k, v in versions.items())
        lines.append(f"- {name} (.bench/{name}): {shown}")
    return "\n".join(lines)


async def _run(selected: list[str], quick: bool) -> dict[str, list[Table]]:
    results: dict[str, list[Table]] = {}
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-") as tmp:
        scratch = Scratch(Path(tmp))
        for key in selected:
            began = time.perf_counter()
            say(f"{key} ...")
            results[key] = await SECTIONS[key](scratch, quick)
            say(f"{key} took {time.perf_counter() - began:.0f} s")
            for table in results[key]:
                print(table.markdown() + "\n", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    competing = busy()
    if competing:
        say("warning: a test run is using the CPU; numbers will be skewed:")
        for line in competing:
            say(f"  {line}")
    machine = describe()
    peers = _peers() if not args.only or {"calls", "concurrency"} & set(args.only) else {}
    print(_header(machine, peers, args.quick) + "\n", flush=True)
    began = time.perf_counter()
    selected = [key for key in SECTIONS if not args.only or key in args.only]
    results = anyio.run(_run, selected, args.quick)
    took = time.perf_counter() - began
    say(f"done in {took:.0f} s; load average now {describe()['loadavg']}")
    if args.json:
        payload = {
            "machine": machine,
            "peers": peers,
            "quick": args.quick,
            "seconds": round(took, 1),
            "sections": {key: [t.as_json() for t in tables] for key, tables in results.items()},
        }
        args.json.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
