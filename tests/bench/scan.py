"""Section 8: `cellblock scan` of @modelcontextprotocol/server-filesystem (14 tools) and the tracer's cost.

The whole scan is `cellblock scan files --destructive --fail-on never` as a user runs it (a new
process: the interpreter's start, the scratch copy, the jail, every probe, the report), timed from
spawn to exit. The tracer's cost is the same server in the same jail (`launch_plan`, as the scan
builds it) started and called with the scan's benign probes, once as it is and once under
`traced()` (strace -f over bwrap): the start (spawn to the first complete tools/list) and the calls.
Medians over the runs, after one warm-up of each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import anyio

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.connection import gateway_client
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.gateway.downstream.local import LocalChannel, local_transport
from cellblock.policy.probes import Places, destructive, probes
from cellblock.sandbox.trace import traced
from cellblock.sandbox.types import LaunchPlan
from tests import peers
from tests.bench.report import Table, fmt, median, say
from tests.bench.spawn import ROOT, Scratch

__all__ = ["scan_cost"]

SCAN_SECONDS = 300


def _world(scratch: Scratch) -> tuple[Path, list[str]]:
    """A directory of a few files, and server-filesystem's argv told of it."""
    shared = scratch.path("scan-shared")
    (shared / "sub").mkdir(parents=True, exist_ok=True)
    for index in range(5):
        (shared / f"note-{index}.txt").write_text(f"note {index}\n" * 20)
    (shared / "sub" / "deeper.md").write_text("# deeper\n")
    return shared, peers.filesystem(shared)


def _config(scratch: Scratch, shared: Path, argv: list[str]) -> Path:
    config = scratch.path("scan.yaml")
    config.write_text(
        "version: 1\nservers:\n  files:\n"
        f"    command: {argv[0]}\n    args: {argv[1:]!r}\n"
        f"    jail:\n      read_only: [{str(peers.NODE_MODULES)!r}]\n      read_write: [{str(shared)!r}]\n"
    )
    return config


def _whole_scan(config: Path, state: Path) -> tuple[float, int, int]:
    """Seconds of one whole scan, and the tools and calls it reported."""
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "cellblock.gateway.cli.main", "scan", "files", "--config", str(config)]
    began = time.perf_counter()
    done = subprocess.run(
        [*argv, "--destructive", "--fail-on", "never", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=SCAN_SECONDS,
        check=False,
    )
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"cellblock scan failed: {done.stderr[-1000:]}")
    report = json.loads(done.stdout)
    return took, len(report["tools"]), sum(len(t["calls"]) for t in report["tools"])


async def _session(plan: LaunchPlan, shared: Path, errlog: Path) -> tuple[float, float, int]:
    """Start, list and call every non-destructive tool with its benign probes: seconds to the
    list, seconds of the calls, and how many calls."""
    places = Places(str(shared), str(shared / "note-0.txt"), None, "/nowhere", "~/.ssh/id_rsa", None, "http://x/")
    channel = LocalChannel("files")
    errlog.parent.mkdir(parents=True, exist_ok=True)
    with errlog.open("a") as err:
        began = time.perf_counter()
        async with gateway_client(local_transport(plan, channel, err), "auto") as client:
            channel.answered = True
            tools = (await client.list_tools()).tools
            listed = time.perf_counter()
            calls = 0
            for tool in tools:
                annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
                if destructive(tool.name, annotations):
                    continue
                for probe in probes(dict(tool.input_schema or {}), places, tool.name):
                    if not probe.hostile:
                        await client.call_tool(tool.name, probe.arguments)
                        calls += 1
            called = time.perf_counter()
    return listed - began, called - listed, calls


async def scan_cost(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 8: a whole scan's wall time, and strace's cost to the same jailed server."""
    if shutil.which("strace") is None or shutil.which("bwrap") is None:
        say("scan: needs strace and bwrap; skipped")
        return []
    try:
        shared, argv = _world(scratch)
    except Exception as exc:  # the peer is not installed: its rows say why
        say(f"scan: {exc}; skipped")
        return []
    runs = 2 if quick else 5
    config = _config(scratch, shared, argv)
    state = scratch.path("scan-state")
    scans = [await anyio.to_thread.run_sync(_whole_scan, config, state) for _ in range(runs + 1)][1:]
    server = LocalServer.model_validate(
        {
            "command": argv[0],
            "args": argv[1:],
            "jail": {"read_only": [str(peers.NODE_MODULES)], "read_write": [str(shared)]},
        }
    )
    plan = launch_plan("files", server)
    strace = shutil.which("strace") or "strace"
    results: dict[str, list[tuple[float, float, int]]] = {"untraced": [], "traced": []}
    for index in range(runs + 1):
        for label in results:
            output = scratch.path(f"scan-trace-{index}")
            run = plan if label == "untraced" else replace(plan, argv=traced(plan.argv, str(output), strace))
            measured = await _session(run, shared, scratch.log(f"scan-{label}"))
            if index:
                results[label].append(measured)
            output.unlink(missing_ok=True)
    tools, probed = scans[0][1:]
    table = Table(
        f"8. Scan: server-filesystem ({tools} tools, {probed} calls), median of {runs} runs after 1 warm-up",
        ["what", "median ms", "traced / untraced"],
    )
    whole = [s[0] * 1000 for s in scans]
    table.add(["whole `cellblock scan --destructive` (process spawn to exit)", fmt(median(whole)), "—"], ms=whole)
    calls = results["untraced"][0][2]
    for index, what in ((0, "start to first tools/list"), (1, f"{calls} benign calls")):
        plain = [r[index] * 1000 for r in results["untraced"]]
        under = [r[index] * 1000 for r in results["traced"]]
        ratio = median(under) / median(plain)
        table.add([f"{what}, jailed", fmt(median(plain)), "—"], ms=plain)
        table.add([f"{what}, jailed under strace", fmt(median(under)), f"{ratio:.2f}x"], ms=under, ratio=ratio)
    table.notes.append("strace -f -e trace=%file,%network,%process over bwrap, as the scan runs it (docs/scan.md)")
    return [table]
