"""Starting what the benchmark measures: the probe server directly, `cellblock serve`, and clients to them.

Every process is a child of the benchmark, spawned by the SDK's `stdio_client` (its stderr goes to a
log file in the scratch directory, shown when something fails). Gateway configs are written here
with policy, lock (`first: trust`) and audit on, as a user would run them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

__all__ = [
    "CONNECT_SECONDS",
    "PROBE",
    "ROOT",
    "SERVERS_DIR",
    "TOOLS",
    "Scratch",
    "child_pid",
    "connect",
    "direct",
    "gateway",
    "probe_argv",
    "rss_mb",
    "tail",
]

ROOT = Path(__file__).resolve().parents[2]
SERVERS_DIR = ROOT / "tests" / "servers"
PROBE = SERVERS_DIR / "probe.py"
# A connection (spawn, handshake) may take this long: 16 servers starting at once on 2 cores take ~15 s.
CONNECT_SECONDS = 120.0
# The policy every gateway runs: `echo` is allowed by an exact rule, a glob asks, everything else asks.
TOOLS: dict[str, Any] = {"default": "ask", "rules": {"echo": "allow", "t*": "ask"}}


@dataclass(frozen=True)
class Scratch:
    """The run's temporary directory: configs, state directories and logs."""

    root: Path

    def path(self, name: str) -> Path:
        return self.root / name

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"


def probe_argv(name: str = "probe", extra_tools: int = 0) -> list[str]:
    """The probe server's command line (this interpreter, this repository's probe)."""
    argv = [sys.executable, str(PROBE), "--name", name]
    return [*argv, "--extra-tools", str(extra_tools)] if extra_tools else argv


def direct(name: str = "probe", extra_tools: int = 0) -> StdioServerParameters:
    argv = probe_argv(name, extra_tools)
    return StdioServerParameters(command=argv[0], args=argv[1:])


def gateway(
    scratch: Scratch,
    label: str,
    servers: Mapping[str, list[str]],
    *,
    jailed: bool = False,
    start: str = "eager",
    state: str | None = None,
) -> StdioServerParameters:
    """`cellblock serve` for `servers` (name -> argv), its config and state dir under `scratch`.

    `state` names a state directory to share with an earlier gateway (its locks: lazy start).
    """
    jail: dict[str, Any] | bool = {"read_only": [str(SERVERS_DIR)]} if jailed else False
    entries = {
        name: {"command": argv[0], "args": argv[1:], "jail": jail, "lock": {"first": "trust"}}
        for name, argv in servers.items()
    }
    config = {"version": 1, "defaults": {"tools": TOOLS, "start": start}, "servers": entries}
    path = scratch.path(f"{label}.yaml")
    path.write_text(yaml.safe_dump(config))
    env = {"CELLBLOCK_STATE_DIR": str(scratch.path(f"state-{state or label}"))}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "cellblock.gateway.cli.main", "serve", "--config", str(path)],
        env=env,
        cwd=ROOT,
    )


@asynccontextmanager
async def connect(target: StdioServerParameters | str, mode: str, log: Path) -> AsyncIterator[Client]:
    """A connected client: stdio to a spawned process (stderr to `log`), or Streamable HTTP to a URL."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as errlog:
        transport = stdio_client(target, errlog=errlog) if isinstance(target, StdioServerParameters) else target
        # every request (the handshake too) waits at most CONNECT_SECONDS: a cancel scope cannot
        # bound the entry of a context that outlives it
        async with Client(transport, mode=mode, cache=None, read_timeout_seconds=CONNECT_SECONDS) as client:
            yield client


def child_pid(marker: str) -> int:
    """The pid of this process's child whose command line contains `marker`.

    Raises:
        LookupError: no child, or more than one, matches.
    """
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        parent = stat.rsplit(")", 1)[1].split()[1]
        if parent == me and marker in cmdline:
            found.append(int(entry.name))
    if len(found) != 1:
        raise LookupError(f"expected one child running {marker!r}, found {len(found)}")
    return found[0]


def rss_mb(pid: int) -> float:
    """Resident memory of one process (VmRSS, its children not included), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def tail(log: Path, lines: int = 5) -> str:
    """The last lines of a log, for an error message."""
    try:
        return " / ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
