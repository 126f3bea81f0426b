"""Per-call latency: a trivial echo tool direct over stdio vs. through `cellblock serve`.

Run by hand: `.venv/bin/python tests/bench/bench_calls.py [CALLS]`. One run measures, on the same
machine, the probe server called directly and through the gateway (policy, lock and audit on;
unjailed and jailed), in both protocol eras, and prints medians and the gateway/direct ratio.
Numbers, not assertions: the suite never times anything.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "servers" / "probe.py"


def direct() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(PROBE)])


def through_gateway(tmp: Path, jailed: bool) -> StdioServerParameters:
    server: dict[str, object] = {"command": sys.executable, "args": [str(PROBE)], "lock": {"first": "trust"}}
    server["jail"] = {"read_only": [str(PROBE.parent)]} if jailed else False
    config = tmp / f"bench-{jailed}.yaml"
    config.write_text(
        yaml.safe_dump({"version": 1, "defaults": {"tools": {"default": "allow"}}, "servers": {"p": server}})
    )
    env = {"CELLBLOCK_STATE_DIR": str(tmp / f"state-{jailed}")}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "cellblock.gateway.cli", "serve", "--config", str(config)], env=env
    )


async def measure(params: StdioServerParameters, tool: str, mode: str, calls: int) -> list[float]:
    async with Client(params, mode=mode, cache=None) as client:
        await client.list_tools()
        for _ in range(20):  # warm up
            await client.call_tool(tool, {"message": "warm"})
        times = []
        for i in range(calls):
            began = time.perf_counter()
            await client.call_tool(tool, {"message": f"m{i}"})
            times.append((time.perf_counter() - began) * 1000)
        return times


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        print(f"{'path':<34} {'era':<8} {'p50 ms':>8} {'p90 ms':>8} {'x direct':>9}")
        for mode in ("legacy", "auto"):
            plain = await measure(direct(), "echo", mode, calls)
            base = statistics.median(plain)
            rows = [("direct", plain)]
            for label, jailed in (("gateway (unjailed)", False), ("gateway (jailed)", True)):
                rows.append((label, await measure(through_gateway(tmp, jailed), "p__echo", mode, calls)))
            for label, times in rows:
                p50 = statistics.median(times)
                p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else p50
                print(f"{label:<34} {mode:<8} {p50:>8.2f} {p90:>8.2f} {p50 / base:>9.2f}")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 300)
