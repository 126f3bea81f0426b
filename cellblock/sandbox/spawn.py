"""From a launch plan to what is spawned: the argv and the descriptors the child inherits.

A plan carries its seccomp filter as bytes, since a descriptor number is only known at spawn, and
its argv has `SECCOMP_FD` where bwrap's `--seccomp` expects one (and, with exec.allow, `PIN_FILTER_FD`
where `--ro-bind-data` shows the pin launcher its own filter). `spawn_args` puts each program in a
fresh memfd, writes its number into the argv and closes it again once the block ends; every place
that spawns a plan goes through it. A plan spawned without it fails closed: bwrap refuses the
placeholder ("Invalid fd") and nothing runs.

A plan with resource limits has two more placeholders, for bwrap's `--info-fd` (where it reports
the jail's first process) and `--block-fd` (where that process waits before it starts the
server; a Landlock plan's launcher, `sandbox/landlocked.py`, takes the same two and reports
itself). The spawner calls `Spawn.release` right after starting the process: it puts the jail
under its limits (`sandbox/limits.py`) and only then lets it go on. A jail that is not released
(the spawner failed, or forgot) is ended, never let go without its limits.

A Landlock plan some of whose calls the gateway makes (its network through the egress proxy, a
root installer's mode changes, the files beside a lone granted file) carries a gate
(`sandbox/connects.py`): `spawn_args` opens it, writes the descriptor the launcher hands its
filter's listener over and, for the network, the port of the gate's listener into the argv
(`GATE_FD`, `GATE_PORT`), and the spawner closes it (`Spawn.gate`) once the server has ended.

An unjailed server's plan may carry a mark (`sandbox/marks.py`): `spawn_args` makes its cgroup and
writes the path its first process joins into the argv; the spawner removes it (`Spawn.mark`) once
the server has ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cellblock.sandbox.limits import BLOCK_FD, INFO_FD, Confinement, confine
from cellblock.sandbox.marks import JOIN, MARK_PROCS, Mark, made
from cellblock.sandbox.types import JailError, LaunchPlan, LimitPlan, MarkPlan

if TYPE_CHECKING:  # opened only for a Landlock jail's network, in the gateway's process (it needs anyio)
    from cellblock.sandbox.connects import ConnectGate

__all__ = [
    "GATE_FD",
    "GATE_PORT",
    "PIN_FILTER_FD",
    "SECCOMP_FD",
    "TAIL_BYTES",
    "Bounded",
    "Hold",
    "Spawn",
    "discard",
    "run_bounded",
    "run_plan",
    "spawn_args",
]

SECCOMP_FD = "<seccomp-fd>"
PIN_FILTER_FD = "<pin-filter-fd>"
GATE_FD, GATE_PORT = "<gate-fd>", "<gate-port>"
# bwrap reports the jail's first process within milliseconds; with systemd it first waits for the
# service manager to make the scope. A jail not reported by then is ended.
HOLD_SECONDS = 10.0
# A jail's cgroups can be removed once its last task has exited, a moment after the jail ends.
SETTLE_SECONDS = 1.0
# What `run_bounded` keeps of a jail's output: the end of it, where a failing command says why.
TAIL_BYTES = 64 * 1024
CHUNK_BYTES = 64 * 1024
# How often `run_bounded` looks whether a running jail has reached a limit (or its watch says stop).
LOOK_SECONDS = 0.05


class Hold:
    """A jail held at bwrap's `--block-fd` before its command runs, until its limits are in place."""

    def __init__(self, plan: LimitPlan) -> None:
        self.plan = plan
        self._info, self._info_child = os.pipe()
        self._block_child, self._block = os.pipe()
        self._open = True
        self._read = False
        self._pid: int | None = None
        self._why = ""

    @property
    def child_fds(self) -> tuple[int, int]:
        """bwrap's ends: where it reports the jail's first process, and where that process waits."""
        return self._info_child, self._block_child

    def release(self) -> Confinement:
        """Put the jail under its limits, then let it start the server.

        Raises:
            JailError: bwrap ended or did not report the jail in time, or the limits could not be
                put in place; the jail has been ended.
        """
        if not self._open:
            raise JailError(f"server '{self.plan.server}': its jail was released or ended already")
        try:
            pid = self._report()
            if pid is None:
                raise JailError(f"server '{self.plan.server}': bubblewrap {self._why}; nothing was started")
            confinement = confine(pid, self.plan)
        except BaseException:
            self.close()
            raise
        try:
            os.write(self._block, b"\x01")
        except OSError as exc:
            confinement.close()
            self.close()
            raise JailError(f"server '{self.plan.server}': its jail ended before it could start: {exc}") from exc
        self._close_fds()
        return confinement

    def _report(self) -> int | None:
        """The jail's first process as bwrap reports it (once, then remembered); None when bwrap
        ended without a report, or made none in time (`_why` says which)."""
        if self._read:
            return self._pid
        self._read = True
        os.close(self._info_child)  # the child has its own: an end of file means bwrap is gone
        os.close(self._block_child)
        self._info_child = self._block_child = -1
        report, deadline = b"", time.monotonic() + HOLD_SECONDS
        poller = select.poll()
        poller.register(self._info, select.POLLIN)
        # read up to a whole report, not to the end: a prefix (runuser) may keep the pipe open
        while self._pid is None and (left := deadline - time.monotonic()) > 0 and poller.poll(left * 1000):
            chunk = os.read(self._info, 4096)
            if not chunk:
                break
            report += chunk
            with contextlib.suppress(ValueError, KeyError, TypeError):
                pid = json.loads(report)["child-pid"]
                self._pid = pid if isinstance(pid, int) and pid > 0 else None
        if self._pid is None:
            # what ended may be what runs bwrap (systemd-run, which could not make the scope): its error is in the log
            self._why = "ended before it started the jail (see the log)" if not report else "made no report in time"
        return self._pid

    def close(self) -> None:
        """End a jail that was not released: kill its first process once bwrap has reported it,
        and close the report before the hold, so a bwrap that is still to report dies of the
        broken pipe instead of going on."""
        if not self._open:
            return
        pid = self._report()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._close_fds()

    def _close_fds(self) -> None:
        self._open = False
        for fd in (self._info, self._info_child, self._block_child, self._block):
            if fd >= 0:
                os.close(fd)
        self._info = self._info_child = self._block_child = self._block = -1


@dataclass(frozen=True, slots=True)
class Spawn:
    """What to pass to the process spawner: the command, and the descriptors to keep open in the child."""

    argv: tuple[str, ...]
    pass_fds: tuple[int, ...]
    hold: Hold | None = None  # with limits: call `release` once the process is started
    mark: Mark | None = None  # the cgroup an unjailed server joins: close it once the server has ended
    gate: ConnectGate | None = None  # a Landlock jail's connects: close it once the server has ended

    def release(self) -> Confinement | None:
        """Let a jail with limits start its server once they are in place (None: a plan without limits).

        Raises:
            JailError: see `Hold.release`.
        """
        return self.hold.release() if self.hold is not None else None


def _placeholder(argv: tuple[str, ...], value: str, option: str) -> int:
    """Where `value` stands in `argv` as the argument of `option`.

    Raises:
        JailError: it does not, exactly once.
    """
    slots = [i for i, arg in enumerate(argv) if arg == value]
    if len(slots) != 1 or argv[slots[0] - 1] != option:
        raise JailError(
            f"the launch plan's command has {len(slots)} '{option} {value}' places (expected 1); nothing was started"
        )
    return slots[0]


@contextlib.contextmanager
def spawn_args(plan: LaunchPlan) -> Iterator[Spawn]:
    """The argv and inherited descriptors that start `plan`; spawn inside the block, then call
    `Spawn.release` at once.

    Raises:
        JailError: the plan's argv and what it carries do not match (a placeholder without a
            program or limits, or those without exactly one placeholder), or the memfd cannot be made.
    """
    argv = list(plan.argv)
    fds: list[int] = []
    programs = ((SECCOMP_FD, "--seccomp", plan.seccomp), (PIN_FILTER_FD, "--ro-bind-data", plan.pin_filter))
    for placeholder, _, program in programs:
        if program is None and placeholder in argv:
            raise JailError("the launch plan asks for a seccomp filter but carries none; nothing was started")
    if plan.limits is None and (INFO_FD in argv or BLOCK_FD in argv):
        raise JailError("the launch plan holds its jail for limits it does not carry; nothing was started")
    if plan.mark is None and MARK_PROCS in argv:
        raise JailError("the launch plan joins a cgroup it does not carry; nothing was started")
    if plan.gate is None and (GATE_FD in argv or GATE_PORT in argv):
        raise JailError("the launch plan hands its connects to a gate it does not carry; nothing was started")
    slots = {p: _placeholder(plan.argv, p, option) for p, option, program in programs if program is not None}
    if plan.limits is not None:
        slots[INFO_FD] = _placeholder(plan.argv, INFO_FD, "--info-fd")
        slots[BLOCK_FD] = _placeholder(plan.argv, BLOCK_FD, "--block-fd")
    if plan.mark is not None:
        slots[MARK_PROCS] = _placeholder(plan.argv, MARK_PROCS, JOIN)
    if plan.gate is not None:
        slots[GATE_FD] = _placeholder(plan.argv, GATE_FD, "--gate")
        if plan.gate.egress_socket is not None:
            slots[GATE_PORT] = _placeholder(plan.argv, GATE_PORT, "--proxy-port")
    hold: Hold | None = None
    mark: Mark | None = None
    gate: ConnectGate | None = None
    try:
        for placeholder, _, program in programs:
            if program is not None:
                fds.append(_memfd(program))
                argv[slots[placeholder]] = str(fds[-1])
        if plan.limits is not None:
            hold = Hold(plan.limits)
            argv[slots[INFO_FD]], argv[slots[BLOCK_FD]] = (str(fd) for fd in hold.child_fds)
        if plan.mark is not None:
            mark = _mark(plan.mark)
            argv[slots[MARK_PROCS]] = str(mark.path / "cgroup.procs")
        if plan.gate is not None:
            from cellblock.sandbox.connects import ConnectGate  # see the TYPE_CHECKING import above

            try:
                gate = ConnectGate(plan.gate)
            except OSError as exc:
                raise JailError(
                    f"server '{plan.gate.server}': the gate of its connections cannot be opened ({exc}); "
                    "nothing was started"
                ) from exc
            argv[slots[GATE_FD]] = str(gate.child)
            if GATE_PORT in slots:
                argv[slots[GATE_PORT]] = str(gate.port)
        inherited = (*fds, *(hold.child_fds if hold else ()), *((gate.child,) if gate else ()))
        yield Spawn(tuple(argv), inherited, hold, mark, gate)
    except BaseException:
        if mark is not None:
            mark.close()  # nothing started in it (or what did is ended): an empty cgroup goes
        if gate is not None:
            gate.close()
        raise
    finally:
        if gate is not None:
            gate.spawned()
        if hold is not None:
            hold.close()  # a jail never released is ended, not let go
        for fd in fds:
            os.close(fd)


def _mark(plan: MarkPlan) -> Mark:
    """The cgroup that marks the processes of `plan`'s server, made now.

    Raises:
        JailError: it cannot be made (the server is not started unmarked).
    """
    try:
        return made(plan)
    except OSError as exc:
        raise JailError(
            f"server '{plan.server}': the cgroup that marks its processes could not be made in "
            f"{plan.base} ({exc.strerror or exc}); nothing was started"
        ) from exc


def run_plan(plan: LaunchPlan, timeout: float, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run `plan` to its end in the caller's environment, its output captured as text.

    `prefix` goes before the command (`runuser -u USER --`, which passes its descriptors on).

    Raises:
        JailError: see `spawn_args` and `Spawn.release`.
        OSError: the command cannot be started.
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds (it is killed).
    """
    try:
        with spawn_args(plan) as spawn:
            process = subprocess.Popen(
                [*prefix, *spawn.argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                pass_fds=spawn.pass_fds,
            )
            confinement: Confinement | None = None
            with process:
                try:
                    confinement = spawn.release()
                    stdout, stderr = process.communicate(timeout=timeout)
                except BaseException:
                    process.kill()
                    process.communicate()
                    raise
                finally:
                    for made_here in (confinement, spawn.mark):
                        if made_here is not None:
                            settle(made_here)
                    if spawn.gate is not None:
                        spawn.gate.close()
            return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    finally:
        discard(plan)  # what was made for it alone goes with it


@dataclass(frozen=True, slots=True)
class Bounded:
    """How a jail run by `run_bounded` ended."""

    returncode: int
    tail: str  # the end of its output (stdout and stderr as they came): at most TAIL_BYTES of it
    total: int  # bytes of output in all: what came before the tail was read and let go
    stopped: str | None  # why it was ended before it exited: a limit it reached, or what its watch said


def run_bounded(plan: LaunchPlan, timeout: float, watch: Callable[[], str | None] | None = None) -> Bounded:
    """Run the jail `plan` (under limits) to its end, keeping only the end of its output, however
    much it writes; end it at once when it reaches a limit, or when `watch` (called a few times a
    second while it runs) says why it must stop.

    Raises:
        JailError: see `spawn_args` and `Spawn.release`.
        OSError: the command cannot be started.
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds (it is ended).
    """
    try:
        with spawn_args(plan) as spawn:
            out, into = os.pipe()  # one pipe for both streams: the tail is what came last, from either
            try:
                process = subprocess.Popen(
                    spawn.argv, stdin=subprocess.DEVNULL, stdout=into, stderr=into, pass_fds=spawn.pass_fds
                )
            except BaseException:
                os.close(out)
                raise
            finally:
                os.close(into)
            confinement: Confinement | None = None
            with process, open(out, "rb", buffering=0) as output:
                try:
                    confinement = spawn.release()
                    looks = [confinement.breach] if confinement is not None else []
                    tail, total, stopped = _follow(
                        process, output.fileno(), [*looks, *([watch] if watch else [])], timeout
                    )
                finally:
                    if process.poll() is None:
                        process.kill()  # the jail's first process dies with bwrap (--die-with-parent)
                    process.wait()
                    for made_here in (confinement, spawn.mark):
                        if made_here is not None:
                            settle(made_here)
                    if spawn.gate is not None:
                        spawn.gate.close()
            return Bounded(process.returncode, tail.decode(errors="replace"), total, stopped)
    finally:
        discard(plan)  # what was made for it alone goes with it


def _follow(
    process: subprocess.Popen[bytes], out: int, looks: Sequence[Callable[[], str | None]], timeout: float
) -> tuple[bytearray, int, str | None]:
    """Read `process`'s output from `out` to its end, keeping the last TAIL_BYTES, until it exits;
    looking every LOOK_SECONDS, and once it has ended, whether one of `looks` says why it must stop.
    Returns the tail, the bytes read in all, and that reason (None: it ended within its bounds).

    Raises:
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds.
    """
    poller = select.poll()
    poller.register(out, select.POLLIN)
    tail, total, open_ = bytearray(), 0, True
    deadline = time.monotonic() + timeout
    look = time.monotonic()
    while open_ or process.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            raise subprocess.TimeoutExpired(process.args, timeout)
        if now >= look:
            look = now + LOOK_SECONDS
            for reason in (each() for each in looks):
                if reason is not None:
                    return tail, total, reason
        wait = max(0.0, min(deadline, look) - now)
        if not open_:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait)
            continue
        if poller.poll(wait * 1000):
            chunk = os.read(out, CHUNK_BYTES)
            open_ = bool(chunk)
            total += len(chunk)
            tail += chunk
            del tail[:-TAIL_BYTES]
    # a last look: what it did since the one before counts as much (a refused fork, the disk)
    return tail, total, next((r for r in (each() for each in looks) if r is not None), None)


def discard(plan: LaunchPlan) -> None:
    """Remove what was made for `plan`'s run alone (its `made`: a Landlock jail's throw-away home
    and tmp), once it has ended or was never run. Links in them are removed, never followed."""
    for path in plan.made:
        shutil.rmtree(path, ignore_errors=True)


def settle(confinement: Confinement | Mark) -> None:
    """Remove what was made for an ended jail or server, waiting (briefly) for its last tasks to exit."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while not confinement.close() and time.monotonic() < deadline:
        time.sleep(0.01)


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
