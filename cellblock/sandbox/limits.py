"""Resource limits per jail: how many tasks and how much memory one server may take.

Every jail is held before its command runs (bwrap's `--block-fd`: after its namespaces exist,
before it forks the server) until the gateway has put the jail's first process under its limits;
everything that process starts inherits them, so no fork can slip out before they hold. One
mechanism per limit, the strongest this machine offers (`enforcement`):

- **systemd**: on a cgroup v2 machine with a service manager the gateway may use (the user's
  `systemd --user`, or as root PID 1), the jail runs in a transient scope of its own, made by
  `systemd-run --scope -p TasksMax=… -p MemoryMax=…`, which moves itself into the scope before it
  starts bwrap.
- **cgroup**: where the gateway can make cgroups itself (as root, or in a delegated cgroup v2
  subtree), a cgroup of the jail's own under the gateway's (`sandbox/cgroups.py`).
- **rlimit**: otherwise `RLIMIT_NPROC`, set on the jail's first process, which lives in the
  jail's user namespace, where Linux 5.14 and newer count a user's tasks (it does not apply to
  root); and `RLIMIT_DATA`, which bounds each process, not the jail as a whole.

A file in a tmpfs is memory that no process's RLIMIT_DATA counts and that outlives its writer, so
the tmpfs mounts a jail may write (its /tmp, home and /dev/shm: `LaunchPlan.tmpfs`) are sized
within its memory limit, whatever enforces the rest (`tmpfs_sizes`): their bytes, and their files,
each of which the kernel keeps an inode and a name for (set from outside the held jail by
`sandbox/tmpfs.py`).

Where nothing can enforce a limit as a whole, `Method.how` says so, and `show`, `doctor` and the
log repeat it; the server still starts. A running jail's `Confinement` tells whether it reached a
limit: a refused fork or an OOM kill in its cgroup (the kernel counts both), or, with rlimits, as
many tasks in its process tree as its limit when it is looked at.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cellblock.sandbox.cgroups import (
    CGROUP_ROOT,
    CONTROLLERS,
    Cgroup,
    bases,
    make,
    name_for,
    own_cgroups,
    remove,
    scope_cgroups,
)
from cellblock.sandbox.seccomp import DISK_WATCHED, jail_filter
from cellblock.sandbox.types import (
    Enforcement,
    JailError,
    LaunchPlan,
    LimitPlan,
    Limits,
    Mechanism,
    Method,
    Mount,
)

__all__ = [
    "BLOCK_FD",
    "FILE_BYTES",
    "INFO_FD",
    "TMPFS_WEIGHTS",
    "Confinement",
    "bwrap_has_size",
    "confine",
    "describe",
    "enforcement",
    "limit_plan",
    "size",
    "tmpfs_sizes",
]

INFO_FD = "<info-fd>"
BLOCK_FD = "<block-fd>"
# From 5.14 on, RLIMIT_NPROC counts a user's tasks per user namespace, so a jail's own limit does
# not depend on how many processes the user runs elsewhere.
NPROC_PER_NAMESPACE = (5, 14)
# A Landlock jail (sandbox/landlock.py) has no user namespace of its own: there RLIMIT_NPROC would
# count every process of the user, and refuse the server's forks for the user's own browser tabs.
NPROC_SHARED = (
    "NOT ENFORCED: a Landlock jail has no user namespace of its own, in which RLIMIT_NPROC would count its "
    "processes alone; a systemd user manager or a writable pids cgroup enforces it"
)
# systemd-run expands $VARIABLES in a scope's command line from this version on, unless told not to.
SYSTEMD_EXPANDS = 254
_PAGE = mmap.PAGESIZE
# What a jail's writable tmpfs mounts get of its memory limit, by weight (any other: 1): /tmp, where
# programs put their temporary files, twice what the home and /dev/shm get. A file in a tmpfs is
# memory that no process's RLIMIT_DATA counts and that outlives its writer, so together they never
# exceed the limit.
TMPFS_WEIGHTS = {"/tmp": 2}
# What the kernel keeps for each file, directory or link of a tmpfs, whatever its size: its inode
# and its name (1 KiB for a short name, 1.7 KiB for a symlink with a 250-character one, measured
# on Linux 6.18). A sixteenth of each mount's share is for them, the rest for what the files hold.
FILE_BYTES = 2048
FILES_SHARE = 16
# `fspick` and `fsconfig`, with which the gateway sets a held jail's tmpfs sizes (`sandbox/tmpfs.py`).
RESIZE_KERNEL = (5, 2)
TMPFS = str(Path(__file__).resolve().with_name("tmpfs.py"))
# It joins two namespaces and resizes three mounts: milliseconds. A jail not sized by then is ended.
TMPFS_SECONDS = 10.0


def size(value: int) -> str:
    """Bytes for people: `4 GiB`, `256 MiB`, `1536 KiB`."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift} {unit}"
    return f"{value:,} bytes"


def describe(plan: LimitPlan) -> str:
    """One line: each limit, and what enforces it."""
    limits, how = plan.limits, plan.enforcement
    return f"processes {limits.processes}: {how.processes.how}; memory {size(limits.memory)}: {how.memory.how}"


# -- what this machine offers --------------------------------------------------------------


@functools.cache
def enforcement() -> Enforcement:
    """How this machine enforces a jail's limits, found once per process (where the gateway may
    make cgroups, a trial one is made and removed)."""
    scope = _systemd()
    if scope is not None:
        args, env, manager = scope
        return Enforcement(
            Method(Mechanism.SYSTEMD, f"TasksMax of a systemd scope of its own ({manager})", whole=True),
            Method(Mechanism.SYSTEMD, f"MemoryMax of that scope, no swap ({manager})", whole=True),
            scope=args,
            scope_env=env,
        )
    found = bases()
    return Enforcement(_processes(found.get("pids")), _memory(found.get("memory")))


def _processes(base: tuple[int, Path] | None) -> Method:
    if base is not None:
        version, path = base
        how = f"pids.max of a cgroup of its own in {path} (cgroup v{version})"
        return Method(Mechanism.CGROUP, how, True, str(path), version)
    if os.geteuid() == 0:
        return Method(
            Mechanism.NONE,
            "NOT ENFORCED: the gateway runs as root, to whom RLIMIT_NPROC does not apply, and has no writable pids "
            "cgroup and no systemd manager; run it as a normal user, or where one of those exists",
            whole=False,
        )
    if _kernel() < NPROC_PER_NAMESPACE:
        return Method(
            Mechanism.NONE,
            f"NOT ENFORCED: Linux {os.uname().release} counts RLIMIT_NPROC over all of a user's processes (5.14 and "
            "newer count them per user namespace), and there is no systemd user manager or writable pids cgroup",
            whole=False,
        )
    return Method(Mechanism.RLIMIT, "RLIMIT_NPROC in the jail's own user namespace", whole=True)


def _memory(base: tuple[int, Path] | None) -> Method:
    if base is not None:
        version, path = base
        files = "memory.max and memory.swap.max" if version == 2 else "memory.limit_in_bytes and memory.memsw"
        return Method(
            Mechanism.CGROUP, f"{files} of a cgroup of its own in {path} (cgroup v{version})", True, str(path), version
        )
    return Method(
        Mechanism.RLIMIT,
        "RLIMIT_DATA, PER PROCESS ONLY: the jail as a whole is not bounded; it counts reserved writable memory "
        "too (a Node server needs about 1 GiB of it)",
        whole=False,
    )


def _kernel() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _systemd() -> tuple[tuple[str, ...], dict[str, str], str] | None:
    """The `systemd-run` command that makes a scope with both controllers, the environment it
    needs, and whose manager that is; None where there is none to use."""
    command = shutil.which("systemd-run")
    if command is None or not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None  # cgroup v1 or hybrid: a manager cannot delegate the controllers there
    env: dict[str, str] = {}
    uid = os.geteuid()
    if uid == 0:
        if not Path("/run/systemd/system").is_dir():
            return None  # PID 1 is not systemd
        controllers, args, manager = CGROUP_ROOT / "cgroup.controllers", [command, "--scope"], "the system's manager"
    else:
        # a client may start the gateway without these variables; the user manager's place is fixed
        runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
        bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        if not (Path(runtime) / "systemd" / "private").exists() or (bus is None and not Path(runtime, "bus").exists()):
            return None  # no user manager running, or no bus to reach it
        # the user's manager can move only processes of its own subtree into a scope
        try:
            own = own_cgroups().get("", "") + "/"
        except OSError:
            return None
        unit = f"/user@{uid}.service/"
        if unit not in own:
            return None
        controllers = CGROUP_ROOT / own[1 : own.index(unit) + len(unit)] / "cgroup.controllers"
        args, manager = [command, "--user", "--scope"], "your user's service manager"
        env = {"XDG_RUNTIME_DIR": runtime} | ({"DBUS_SESSION_BUS_ADDRESS": bus} if bus else {})
    try:
        delegated = set(controllers.read_text().split())
        version = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not set(CONTROLLERS) <= delegated:
        return None  # systemd would accept the limits and apply neither
    # the server's stdout is its MCP channel: systemd-run must print nothing there
    args += ["--quiet", "--collect"]
    number = re.match(r"systemd (\d+)", version)
    if number is not None and int(number.group(1)) >= SYSTEMD_EXPANDS:
        args.append("--expand-environment=no")  # bwrap's command line is the server's, taken literally
    return tuple(args), env, manager


# -- a plan held until its limits are in place ---------------------------------------------


def limit_plan(plan: LaunchPlan, server: str, limits: Limits) -> LaunchPlan:
    """`plan` (a bwrap command) under `limits`: held at start until `spawn.Spawn.release` has put
    them in place, run in a systemd scope where that is how this machine enforces them, and its
    writable tmpfs mounts sized within its memory limit. With a bounded disk (an installer's), its
    seccomp filter also refuses `fallocate` (`seccomp.DISK_WATCHED`), whichever backend built it.

    Raises:
        JailError: the plan's tmpfs mounts are not where it says (it was changed after it was made),
            or a plan with a bounded disk has a filter other than the one its rules make.
    """
    how = enforcement()
    if plan.backend == "landlock" and how.processes.mechanism is Mechanism.RLIMIT:
        how = replace(how, processes=Method(Mechanism.NONE, NPROC_SHARED, whole=False))
    argv, mounts, tmpfs = _sized(plan, limits.memory)
    seccomp = plan.seccomp
    rules = plan.rules
    if limits.disk is not None and seccomp is not None:
        if not rules or seccomp != jail_filter(rules):
            raise JailError(
                "a jail whose disk is bounded needs the filter its plan was made with (to add to it); "
                "nothing was started"
            )
        rules = (*rules, DISK_WATCHED)
        seccomp = jail_filter(rules)
    # after bwrap itself, or a Landlock plan's launcher script: both take the same options
    bwrap, rest = argv[: plan.held_at], argv[plan.held_at :]
    held = ("--info-fd", INFO_FD, "--block-fd", BLOCK_FD)
    prefix: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()
    env = dict(plan.env)
    if how.scope:
        prefix = (
            *how.scope,
            f"--unit={name_for(server)}",
            f"--description=Cellblock jail of server {server}",
            *("-p", f"TasksMax={limits.processes}", "-p", f"MemoryMax={limits.memory}", "-p", "MemorySwapMax=0"),
            "--",
        )
        env |= how.scope_env
        # what systemd-run needs or adds stays outside the jail (without secrets bwrap clears all anyway)
        unset = tuple(a for key in (*how.scope_env, "INVOCATION_ID") for a in ("--unsetenv", key))
    limited = LimitPlan(server, limits, how, tmpfs)
    argv = (*prefix, *bwrap, *held, *unset, *rest)
    return replace(plan, argv=argv, env=env, mounts=mounts, limits=limited, seccomp=seccomp, rules=rules)


def tmpfs_sizes(points: Sequence[str], memory: int) -> dict[str, tuple[int, int]]:
    """What each of a jail's writable tmpfs mounts may hold: bytes (in whole pages) and files, the
    files at `FILE_BYTES` each a sixteenth of its share; together at most `memory` (/tmp's share
    twice what each other gets)."""
    weights = {point: TMPFS_WEIGHTS.get(point, 1) for point in points}
    total = sum(weights.values())
    sizes = {}
    for point, weight in weights.items():
        share = memory * weight // total
        files = max(1, share // FILES_SHARE // FILE_BYTES)
        sizes[point] = (max(_PAGE, (share - files * FILE_BYTES) // _PAGE * _PAGE), files)
    return sizes


@functools.cache
def bwrap_has_size(bwrap: str) -> bool:
    """Whether `bwrap` can size a tmpfs (`--size`: bubblewrap 0.7.0 and newer)."""
    try:
        shown = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in shown.stdout + shown.stderr


def _sized(
    plan: LaunchPlan, memory: int
) -> tuple[tuple[str, ...], tuple[Mount, ...], tuple[tuple[str, int, int], ...]]:
    """`plan`'s argv with each writable tmpfs sized within `memory` (bwrap's `--size`, where it
    has it), its mounts saying so, and what `confine` sets each to (bytes and files: where the
    kernel lets it).

    Raises:
        JailError: a tmpfs is not where the plan says.
    """
    argv = list(plan.argv)
    if any(argv[at : at + 2] != ["--tmpfs", point] for at, point in plan.tmpfs):
        raise JailError("the launch plan's tmpfs mounts are not where it says; nothing was started")
    points = [point for _, point in plan.tmpfs]
    if not points:
        return plan.argv, plan.mounts, ()
    sizes = tmpfs_sizes(points, memory)
    if bwrap_has_size(argv[0]):
        for at, point in sorted(plan.tmpfs, reverse=True):
            argv[at:at] = ["--size", str(sizes[point][0])]
    if _kernel() >= RESIZE_KERNEL:
        said = {point: f"at most {size(sizes[point][0])} in {sizes[point][1]:,} files" for point in points}
        tmpfs = tuple((point, *sizes[point]) for point in points)
    elif bwrap_has_size(argv[0]):
        said = {
            point: f"at most {size(sizes[point][0])}, in ANY NUMBER OF FILES (Linux 5.2 and newer can cap them)"
            for point in points
        }
        tmpfs = ()
    else:
        # where a cgroup or scope bounds memory, what is written there still counts against it
        said = dict.fromkeys(
            points, "NOT SIZED: this bubblewrap has no --size (0.7.0 and newer have it), nor Linux fspick (5.2)"
        )
        tmpfs = ()
    mounts = tuple(
        replace(m, why=f"{m.why}, {said[m.path]}") if m.path in said and m.why.endswith("(tmpfs)") else m
        for m in plan.mounts
    )
    return tuple(argv), mounts, tmpfs


# -- a running jail under its limits -------------------------------------------------------


@dataclass(eq=False)
class Confinement:
    """A started jail's limits: whether it reached one, and the cgroups to remove once it has ended."""

    plan: LimitPlan
    pid: int  # the jail's first process (bwrap's, pid 1 inside), as the gateway sees it
    cgroups: list[Cgroup] = field(default_factory=list)
    made: list[Path] = field(default_factory=list)  # the cgroups the gateway made, removed at the end
    _breach: str | None = None
    _closed: bool = False

    def breach(self) -> str | None:
        """Why the jail must stop, once it has reached a limit ("it reached its limit of 32
        processes (jail.limits.processes)"); kept after the jail has ended."""
        if self._breach is None and not self._closed:
            self._breach = self._reached()
        return self._breach

    def _reached(self) -> str | None:
        limits = self.plan.limits
        processes = f"it reached its limit of {limits.processes} processes (jail.limits.processes)"
        for cgroup in self.cgroups:
            if cgroup.reached():
                if cgroup.controller == "pids":
                    return processes
                return (
                    f"it reached its memory limit of {size(limits.memory)} (jail.limits.memory), "
                    "and the kernel ended a process in its jail"
                )
        # with rlimits the kernel keeps no count of refused forks: count what is there now
        if self.plan.enforcement.processes.mechanism is Mechanism.RLIMIT and _tasks(self.pid) >= limits.processes:
            return processes
        return None

    def close(self) -> bool:
        """Remove the cgroups made for the jail; True once none is left (a cgroup can go only when
        its last task has exited, a moment after the jail ends: call again until then)."""
        self.breach()  # the last word on why it ended, kept for whoever asks later
        self._closed = True
        self.made = [path for path in self.made if not remove(path)]  # what stays is swept at the next make
        return not self.made


def _tasks(pid: int, stop: int = 1 << 20) -> int:
    """The tasks (threads included) of `pid` and all its descendants."""
    count, todo = 0, [pid]
    while todo and count < stop:
        current = todo.pop()
        try:
            threads = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue  # gone meanwhile
        count += len(threads)
        for thread in threads:
            with contextlib.suppress(OSError, ValueError):
                todo += [int(c) for c in Path(f"/proc/{current}/task/{thread}/children").read_text().split()]
    return count


def confine(pid: int, plan: LimitPlan) -> Confinement:
    """Put the held jail whose first process is `pid` under its limits, and check that they hold.

    Raises:
        JailError: a limit could not be put in place, or does not read back as set (what was made
            for it is removed again; the caller ends the jail).
    """
    confinement = Confinement(plan, pid)
    how, limits = plan.enforcement, plan.limits
    try:
        if how.scope:
            confinement.cgroups = scope_cgroups(pid)
        else:
            places: dict[Path, list[tuple[str, int]]] = {}
            for controller, method in (("pids", how.processes), ("memory", how.memory)):
                if method.mechanism is Mechanism.CGROUP and method.base is not None:
                    places.setdefault(Path(method.base), []).append((controller, method.version))
            name = name_for(plan.server)
            for base, controllers in places.items():
                confinement.cgroups += make(base, name, controllers, limits, pid)
                confinement.made.append(base / name)
        for cgroup in confinement.cgroups:
            wanted = str(limits.processes if cgroup.controller == "pids" else limits.memory // _PAGE * _PAGE)
            if cgroup.limit() != wanted:
                raise OSError(f"its {cgroup.controller} limit reads {cgroup.limit()} in {cgroup.path}, not {wanted}")
        if how.processes.mechanism is Mechanism.RLIMIT:
            _lower(pid, "RLIMIT_NPROC", limits.processes)
        if how.memory.mechanism is Mechanism.RLIMIT:
            _lower(pid, "RLIMIT_DATA", limits.memory)
        if limits.disk is not None:
            # an installer's: no one file past the disk its install may fill (sandbox/disk.py watches the rest)
            _lower(pid, "RLIMIT_FSIZE", limits.disk)
        if plan.tmpfs:
            _resize(pid, plan.tmpfs)
    except OSError as exc:
        confinement.close()
        raise JailError(
            f"server '{plan.server}': its jail could not be put under its limits ({exc}); nothing was started. "
            "See 'cellblock doctor' for what enforces them here"
        ) from exc
    return confinement


def _resize(pid: int, tmpfs: Sequence[tuple[str, int, int]]) -> None:
    """Set the bytes and files of the held jail `pid`'s writable tmpfs mounts (`sandbox/tmpfs.py`,
    a process of its own: joining the jail's namespaces needs a process with one thread).

    Raises:
        OSError: it could not, and says why.
    """
    sizes = [f"{point}={held}:{files}" for point, held, files in tmpfs]
    command = [sys.executable, "-I", "-S", TMPFS, str(pid), *sizes]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TMPFS_SECONDS, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"its tmpfs mounts were not sized within {TMPFS_SECONDS:g} s") from exc
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise OSError(f"its tmpfs mounts could not be sized: {why[0]}")


def _lower(pid: int, name: str, value: int) -> None:
    """Set both of `pid`'s limits `name` (`RLIMIT_NPROC`) to `value`, or to its hard limit where that is lower.

    Raises:
        OSError: the process is gone, or may not be changed.
    """
    import resource  # Linux only; the module is imported everywhere the gateway runs

    which = getattr(resource, name)
    _, hard = resource.prlimit(pid, which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.prlimit(pid, which, (value, value))
