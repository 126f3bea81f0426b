"""What the numbers were measured on, and whether something else was using the CPU meanwhile."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["busy", "describe"]

# Command lines that mean a test run is competing for the CPU.
_COMPETITORS = ("pytest", ".ci/run")


def describe() -> dict[str, Any]:
    """Cores, CPU model, kernel, Python and the SDK versions of this run."""
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mcp": metadata.version("mcp"),
        "pydantic": metadata.version("pydantic"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "commit": _git("rev-parse", "--short", "HEAD"),
        # what is measured is the working tree: say when it differs from the commit
        "uncommitted": bool(_git("status", "--porcelain", "--", "cellblock")),
    }


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False, timeout=30)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def busy() -> list[str]:
    """Other processes (not this one's children) that look like a test run, as 'pid command'."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(word in cmdline for word in _COMPETITORS) and str(sys.argv[0]) not in cmdline:
            found.append(f"{entry.name} {cmdline[:100]}")
    return found
