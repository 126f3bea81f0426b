"""From a launch plan to what is spawned: the argv and the descriptors the child inherits.

A plan carries its seccomp filter as bytes, since a descriptor number is only known at spawn, and
its argv has `SECCOMP_FD` where bwrap's `--seccomp` expects one. `spawn_args` puts the program in
a fresh memfd, writes its number into the argv and closes it again once the block ends; every
place that spawns a plan goes through it. A plan spawned without it fails closed: bwrap refuses
the placeholder ("Invalid fd") and nothing runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cellblock.sandbox.types import JailError, LaunchPlan

__all__ = ["SECCOMP_FD", "Spawn", "run_plan", "spawn_args"]

SECCOMP_FD = "<seccomp-fd>"


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
    slots = [i for i, arg in enumerate(plan.argv) if arg == SECCOMP_FD]
    if plan.seccomp is None:
        if slots:
            raise JailError("the launch plan asks bwrap for a seccomp filter but carries none; nothing was started")
        yield Spawn(plan.argv, ())
        return
    if len(slots) != 1 or plan.argv[slots[0] - 1] != "--seccomp":
        raise JailError(
            f"the launch plan carries a seccomp filter but its command has {len(slots)} '--seccomp {SECCOMP_FD}' "
            "places (expected 1); nothing was started"
        )
    fd = _memfd(plan.seccomp)
    at = slots[0]
    try:
        yield Spawn((*plan.argv[:at], str(fd), *plan.argv[at + 1 :]), (fd,))
    finally:
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
