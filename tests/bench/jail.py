"""Section 4: what the jail adds to starting a process, measured on `/bin/true`.

Both starts come from `launch_plan`, the one place the gateway builds a server's command: with
`jail: false` (the bare argv) and with a jail that shares `tests/servers` read-only (bwrap's argv).
Each is run with `subprocess.run` of what `spawn_args(plan)` gives (the argv, and the memfd holding
the seccomp filter), with `plan.env`; medians over the runs, after warm-ups. Building the plan is
timed too: the first plan of a gateway compiles the seccomp filter and runs bwrap once to check
that jails work here (both cached after that), every later plan only assembles the command.
Beside them, the same start in a Landlock jail (`landlock_plan`, where the kernel has Landlock ABI 4
or newer): the gateway's interpreter runs the launcher, which locks itself down and execs the server.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.sandbox.bwrap import check_bwrap
from cellblock.sandbox.landlock import NETWORK_ABI, landlock_abi, landlock_plan
from cellblock.sandbox.seccomp import jail_filter
from cellblock.sandbox.spawn import spawn_args
from cellblock.sandbox.types import JailSpec, LaunchPlan
from tests.bench.report import Table, Target, fmt, median, percentile
from tests.bench.spawn import SERVERS_DIR, Scratch

__all__ = ["JAIL_TARGET", "jail_cost"]

JAIL_TARGET = Target(15, " ms")
WARM_RUNS = 3
# /bin/true, jailed or not, ends at once; a start that takes this long is broken
RUN_SECONDS = 30


def _plan(jailed: bool) -> LaunchPlan:
    jail: Any = {"read_only": [str(SERVERS_DIR)]} if jailed else False
    return launch_plan("bench", LocalServer.model_validate({"command": "/bin/true", "jail": jail}))


def _landlock_plan(scratch: Scratch) -> LaunchPlan | None:
    """The same jail on the Landlock backend; None where this kernel cannot build it."""
    if landlock_abi() < NETWORK_ABI:
        return None
    spec = JailSpec(name="bench", argv=("/bin/true",), env={"PATH": "/usr/bin:/bin"}, read_only=(str(SERVERS_DIR),))
    return landlock_plan(spec, [], str(scratch.path("landlock")))


def _timed(action: Callable[[], object], runs: int) -> list[float]:
    """Milliseconds of each of `runs` calls of `action`, after WARM_RUNS uncounted ones."""
    for _ in range(WARM_RUNS):
        action()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return times


def _run(plan: LaunchPlan) -> None:
    """Start the plan's process and wait for it.

    Raises:
        subprocess.CalledProcessError: it did not exit 0 (a jail that cannot be built here).
    """
    with spawn_args(plan) as spawn:
        subprocess.run(
            list(spawn.argv),
            env=dict(plan.env),
            check=True,
            timeout=RUN_SECONDS,
            stdin=subprocess.DEVNULL,
            pass_fds=spawn.pass_fds,
        )


def _measure(runs: int, scratch: Scratch) -> dict[str, list[float]]:
    check_bwrap.cache_clear()
    jail_filter.cache_clear()
    began = time.perf_counter()
    _plan(jailed=True)
    first_plan = (time.perf_counter() - began) * 1000
    bare, jailed, landlocked = _plan(jailed=False), _plan(jailed=True), _landlock_plan(scratch)
    return {
        "bare": _timed(lambda: _run(bare), runs),
        "jailed": _timed(lambda: _run(jailed), runs),
        "plan": _timed(lambda: _plan(jailed=True), runs),
        "first_plan": [first_plan],
        "landlock": _timed(lambda: _run(landlocked), runs) if landlocked is not None else [],
    }


async def jail_cost(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 4: `/bin/true` started bare vs. in the jail, and the cost of building the jail's plan."""
    runs = 10 if quick else 30
    times = _measure(runs, scratch)
    bare, jailed = median(times["bare"]), median(times["jailed"])
    table = Table(
        f"4. Jail cost: start of /bin/true (median of {runs} runs after {WARM_RUNS} warm-ups)",
        ["start", "median ms", "p90 ms", "added ms", "target: added"],
    )

    def row(label: str, ms: list[float], added: float | None, targeted: bool) -> None:
        verdict = JAIL_TARGET.verdict(added) if targeted else "—"
        cells = [fmt(median(ms)), fmt(percentile(ms, 90)) if len(ms) > 1 else "—", fmt(added), verdict]
        table.add([label, *cells], label=label, ms=ms, added_ms=added, target=verdict)

    both = [j + p for j, p in zip(times["jailed"], times["plan"], strict=True)]
    row("bare (`jail: false` plan)", times["bare"], None, False)
    row("in the jail (bwrap plan)", times["jailed"], jailed - bare, True)
    row("launch_plan() of a jailed server", times["plan"], None, False)
    row("in the jail, plan included", both, median(both) - bare, True)
    row("first launch_plan() of a gateway (runs a trial jail, once)", times["first_plan"], None, False)
    if times["landlock"]:
        row("in a Landlock jail (landlock_plan)", times["landlock"], median(times["landlock"]) - bare, True)
    else:
        abi = landlock_abi()
        table.notes.append(f"no Landlock row: this kernel has Landlock ABI {abi}, the jail needs {NETWORK_ABI}")
    table.notes.append(
        "'in the jail, plan included' is what each jailed server start costs the gateway over a bare start"
    )
    return [table]
