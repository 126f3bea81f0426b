"""From a launch plan to what is spawned: the argv and the descriptors the child inherits.

A plan carries its seccomp filter as bytes, since a descriptor number is only known at spawn, and
its argv has `SECCOMP_FD` where bwrap's `--seccomp` expects one (and, with exec.allow, `PIN_FILTER_FD`
where `--ro-bind-data` shows the pin launcher its own filter). `spawn_args` puts each program in a
fresh memfd, writes its number into the argv and closes it again once the block ends; every place
that spawns a plan goes through it. A plan spawned without it fails closed: bwrap refuses the
placeholder ("Invalid fd") and nothing runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cellblock.sandbox.types import JailError, LaunchPlan

__all__ = ["PIN_FILTER_FD", "SECCOMP_FD", "Spawn", "run_plan", "spawn_args"]

SECCOMP_FD = "<seccomp-fd>"
PIN_FILTER_FD = "<pin-filter-fd>"


@dataclass(frozen=True, slots=True)
class Spawn:
    """What to pass to the process spawner: the command, and the descriptors to keep open in the child."""

    argv: tuple[str, ...]
    pass_fds: tuple[int, ...]


@contextlib.contextmanager
def spawn_args(plan: LaunchPlan) -> Iterator[Spawn]:
    """The argv and inherited descriptors that start `plan`; spawn inside the block.

    Raises:
        JailError: the plan's argv and its filter do not match (a placeholder without a program, or
            a program without exactly one `--seccomp` placeholder), or the memfd cannot be made.
    """
    inputs = ((SECCOMP_FD, "--seccomp", plan.seccomp), (PIN_FILTER_FD, "--ro-bind-data", plan.pin_filter))
    argv, fds = list(plan.argv), list[int]()
    try:
        for placeholder, option, data in inputs:
            slots = [i for i, arg in enumerate(argv) if arg == placeholder]
            if data is None and not slots:
                continue
            if data is None or len(slots) != 1 or argv[slots[0] - 1] != option:
                raise JailError(
                    f"the launch plan's command has {len(slots)} '{option} {placeholder}' places for "
                    f"{'no' if data is None else 'one'} seccomp program (expected as many); nothing was started"
                )
            fds.append(_memfd(data))
            argv[slots[0]] = str(fds[-1])
        yield Spawn(tuple(argv), tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)


def run_plan(plan: LaunchPlan, timeout: float, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run `plan` to its end in the caller's environment, its output captured as text.

    `prefix` goes before the command (`runuser -u USER --`, which passes its descriptors on).

    Raises:
        JailError: see `spawn_args`.
        OSError: the command cannot be started.
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds (it is killed).
    """
    with spawn_args(plan) as spawn:
        return subprocess.run(
            [*prefix, *spawn.argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            pass_fds=spawn.pass_fds,
        )


def _memfd(data: bytes) -> int:
    """A close-on-exec memfd holding `data`, at offset 0 (bwrap reads from there to the end).

    Raises:
        JailError: the memfd cannot be made or written.
    """
    fd = -1
    try:
        fd = os.memfd_create("cellblock-seccomp", os.MFD_CLOEXEC)  # pass_fds makes it inheritable
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        raise JailError(f"the jail's seccomp filter cannot be handed to bwrap: {exc}") from exc
    return fd
