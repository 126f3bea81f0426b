"""`servers.NAME.learn: true`: the jailed server traced while it serves.

The jail's bwrap command is wrapped in the same strace command a scan uses (`sandbox/trace.py`),
outside the jail; strace's output goes through Cellblock's writer (`sandbox/tracecap.py`) into
`<state>/learn/NAME/<time>.trace`: 0600 in a 0700 directory, without a program's arguments or the
bytes sent or received on a socket, each run's trace cut at TRACE_BYTES and at most KEEP traces
kept per server (the oldest removed at each start). `cellblock scan NAME --from-learned` reads
them.

Without strace (or off Linux) the server still starts, jailed as always, and the log says loudly
at each start that it is not learning.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from cellblock.gateway.config.model import LocalServer
from cellblock.policy.files import make_dirs
from cellblock.sandbox.trace import traced
from cellblock.sandbox.types import LaunchPlan

__all__ = ["KEEP", "TRACE_BYTES", "learn_dir", "learned_traces", "learning"]

logger = logging.getLogger(__name__)

TRACE_BYTES = 32 * 1024 * 1024  # one run's trace: past this it is cut (a line says so)
KEEP = 8  # traces kept per server: at most KEEP * TRACE_BYTES on disk
WRITER = Path(__file__).resolve().parents[2] / "sandbox" / "tracecap.py"


def learn_dir(state: Path, name: str) -> Path:
    """Where the learn traces of server `name` are kept."""
    return state / "learn" / name


def learned_traces(state: Path, name: str) -> list[Path]:
    """The learn traces of `name`, oldest first."""
    folder = learn_dir(state, name)
    return sorted(folder.glob("*.trace")) if folder.is_dir() else []


def learning(plan: LaunchPlan, name: str, server: LocalServer, state: Path | None) -> LaunchPlan:
    """`plan` traced into a new learn trace when `server` says `learn: true` (and it can be:
    Linux, strace installed, a state directory); else `plan` as it is."""
    if not server.learn or server.jail is False or state is None:
        return plan
    strace = shutil.which("strace")
    if strace is None or not sys.platform.startswith("linux"):
        why = "strace is not installed" if sys.platform.startswith("linux") else f"there is no tracer on {sys.platform}"
        logger.warning(
            "server '%s' has learn: true, but %s: it runs jailed as always, and NOTHING IS LEARNED "
            "(install strace: apt-get install strace, dnf install strace)",
            name,
            why,
        )
        return plan
    folder = learn_dir(state, name)
    make_dirs(folder)
    os.chmod(folder, 0o700)  # ours, inside the state dir: narrowed even when it was there
    old = learned_traces(state, name)
    for stale in old[: max(0, len(old) - (KEEP - 1))]:
        stale.unlink(missing_ok=True)
    now = time.time_ns()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now // 1_000_000_000))
    output = folder / f"{stamp}.{now % 1_000_000_000:09d}.trace"
    python = os.path.realpath(sys.executable)
    writer = shlex.join([python, "-I", "-S", str(WRITER), str(output), str(TRACE_BYTES)])
    logger.info("server '%s': learning, into %s", name, output)
    return replace(plan, argv=traced(plan.argv, f"|exec {writer} >/dev/null", strace))
