"""sandbox/spawn.py's `run_bounded`: a jail run to its end however much it writes, and ended at
once when it reaches a limit, when its watch says so, or at its deadline."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cellblock.sandbox.bwrap import bwrap_plan
from cellblock.sandbox.limits import enforcement, limit_plan
from cellblock.sandbox.spawn import TAIL_BYTES, run_bounded
from cellblock.sandbox.types import JailSpec, LaunchPlan, Limits

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs the system python3"),
]

MIB = 1 << 20
FOREVER = 120  # what a jail that is ended early would otherwise take, in seconds
EARLY = 30  # far less than FOREVER: such a jail was ended, not waited for


ROOMY = Limits(64, 256 * MIB)


def jail(code: str, limits: Limits = ROOMY) -> LaunchPlan:
    spec = JailSpec("t", ("/usr/bin/python3", "-I", "-S", "-c", code), {"PATH": "/usr/bin"}, home="/root")
    return limit_plan(bwrap_plan(spec, []), "t", limits)


def test_a_jail_that_floods_its_output_is_read_to_the_end_and_only_its_end_is_kept() -> None:
    flood = "import sys\nfor _ in range(128): sys.stdout.write('x' * 65535 + '\\n')\nprint('the end'); sys.exit(3)"
    ran = run_bounded(jail(flood), 60)
    assert (ran.returncode, ran.stopped) == (3, None)
    assert ran.total == 128 * 65536 + len("the end\n") and len(ran.tail) == TAIL_BYTES
    assert ran.tail.endswith("x\nthe end\n")


def test_stdout_and_stderr_come_in_one_tail_in_the_order_written() -> None:
    ran = run_bounded(jail("import sys\nprint('out', flush=True); print('err', file=sys.stderr)"), 60)
    assert ran.tail == "out\nerr\n"


def ended_early(watch: Callable[[], str | None] | None, timeout: float = 60) -> tuple[str | None, float]:
    began = time.monotonic()
    ran = run_bounded(jail(SLEEPER), timeout, watch)
    return ran.stopped, time.monotonic() - began


SLEEPER = f"import time; print('started', flush=True); time.sleep({FOREVER})"


def test_a_jail_is_ended_at_once_when_its_watch_says_why() -> None:
    looks: list[int] = []

    def watch() -> str | None:
        looks.append(1)
        return "enough" if len(looks) > 3 else None

    stopped, took = ended_early(watch)
    assert stopped == "enough" and took < EARLY


def test_a_jail_is_ended_at_its_deadline() -> None:
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(jail(SLEEPER), 1)
    assert time.monotonic() - began < EARLY


def test_a_jail_that_reaches_its_process_limit_is_ended_naming_it() -> None:
    if not enforcement().processes.whole:
        pytest.skip(f"processes are not bounded here: {enforcement().processes.how}")
    bomb = (
        "import os, time\n"
        "for _ in range(64):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        f"            time.sleep({FOREVER}); os._exit(0)\n"
        "    except OSError:\n"
        "        break\n"
        f"time.sleep({FOREVER})"
    )
    began = time.monotonic()
    ran = run_bounded(jail(bomb, Limits(16, 256 * MIB)), 60)
    assert ran.stopped == "it reached its limit of 16 processes (jail.limits.processes)"
    assert time.monotonic() - began < EARLY
