"""Resource limits in real jails, attacked from inside, as root and as an unprivileged user.

The attacks are `escape`'s fork bomb and memory hog, run by the system Python in a held jail
(`sandbox/spawn.py`); each has an honest control, the same attempt in a jail whose limits are
above what it takes. Every attempt is bounded (300 processes, 512 MiB), so a limit that does not
hold costs the machine nothing either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import limits
from cellblock.sandbox.bwrap import bwrap_plan
from cellblock.sandbox.limits import enforcement, limit_plan
from cellblock.sandbox.spawn import run_plan, settle, spawn_args
from cellblock.sandbox.types import Enforcement, JailError, JailSpec, LaunchPlan, Limits, Mechanism, Method
from tests.sandbox import held as held_module
from tests.sandbox.conftest import escape_copy
from tests.sandbox.held import HOLDER, RLIMITS, attack

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs the system python3"),
]

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 32
CEILING = 300
MIB = 1 << 20
ROOMY = Limits(2 * CEILING, 1 << 30)  # the controls' jail: room for every attempt
FORK_REASON = f"it reached its limit of {PROCESSES} processes (jail.limits.processes)"
MEMORY_REASON = (
    "it reached its memory limit of 256 MiB (jail.limits.memory), and the kernel ended a process in its jail"
)


def held(escape: Path, home: str, attempt: dict[str, Any], bounds: Limits, seccomp: bool = True) -> LaunchPlan:
    """A jail under `bounds` that runs `attempt` and then waits (`HOLDER`)."""
    argv = ("/usr/bin/python3", "-I", "-S", "-c", HOLDER, str(escape), json.dumps(attempt))
    spec = JailSpec("attacker", argv, {"PATH": "/usr/bin:/bin"}, read_only=(str(escape.parent),), home=home)
    return limit_plan(bwrap_plan(spec, [], seccomp=seccomp), "attacker", bounds)


def attack_as(who: tuple[str, list[str], str, int], area: Path, plan: LaunchPlan) -> tuple[Any, str | None]:
    """`attack` by the jail's own user, as that user's gateway would run it: only the jail's own
    user may lower its rlimits without CAP_SYS_RESOURCE (which a root here may lack). The user runs
    copies of `held.py` and the `cellblock` package, outside the checkout."""
    _, prefix, _, _ = who
    if not prefix:
        return attack([], plan)
    driver = area / "driver"
    if not driver.exists():
        shutil.copytree(ROOT / "cellblock", driver / "cellblock", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copyfile(held_module.__file__ or "", driver / "held.py")
    assert plan.limits is not None and plan.seccomp is None
    bounds = plan.limits.limits
    given = json.dumps(
        {"argv": plan.argv, "processes": bounds.processes, "memory": bounds.memory, "tmpfs": plan.limits.tmpfs}
    )
    command = [*prefix, "/usr/bin/python3", "-I", str(driver / "held.py"), given]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out["result"], out["reason"]


def bomb(hold: float) -> dict[str, Any]:
    return {"kind": "fork", "ceiling": CEILING, "hold": hold}


@pytest.fixture
def rlimits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans enforced by rlimits, as on a machine without cgroups the gateway may use."""
    monkeypatch.setattr(limits, "enforcement", lambda: RLIMITS)


@pytest.fixture
def escape(area: Path) -> Path:
    return escape_copy(area)


# -- real jails ------------------------------------------------------------------------------


def test_a_fork_bomb_stops_at_the_jails_limit_as_root_or_as_a_user(
    who: tuple[str, list[str], str, int], escape: Path
) -> None:
    name, prefix, home, _ = who
    control, _ = attack(prefix, held(escape, home, bomb(0), ROOMY))
    assert control is not None and control["amount"] == CEILING, f"as {name}: {control}"
    result, reason = attack(prefix, held(escape, home, bomb(30), Limits(PROCESSES, 1 << 30)))
    assert result is not None and not result["got_through"], f"as {name}: {result}"
    assert result["amount"] < PROCESSES and "EAGAIN" in result["detail"], f"as {name}: {result}"
    assert reason == FORK_REASON, f"as {name}, enforced by {enforcement().processes.how}"


def test_a_memory_hog_is_ended_at_the_jails_limit_as_root_or_as_a_user(
    who: tuple[str, list[str], str, int], escape: Path
) -> None:
    if not enforcement().memory.whole:
        pytest.skip(f"this machine bounds memory per process only: {enforcement().memory.how}")
    name, prefix, home, _ = who
    hog = {"kind": "memory", "mib": 512}
    control, _ = attack(prefix, held(escape, home, hog, ROOMY))
    assert control is not None and control["amount"] == 512, f"as {name}: {control}"
    result, reason = attack(prefix, held(escape, home, hog, Limits(ROOMY.processes, 256 * MIB)))
    assert result is None, f"as {name}: the hog was not ended: {result}"
    assert reason == MEMORY_REASON, f"as {name}"


def test_with_rlimits_a_users_fork_bomb_stops_at_the_jails_limit_however_many_processes_the_user_runs(
    who: tuple[str, list[str], str, int], area: Path, escape: Path, rlimits: None
) -> None:
    name, prefix, home, _ = who
    if name == "root":
        pytest.skip("RLIMIT_NPROC does not apply to root: see the next test")
    # more of the user's processes outside than the jail may have: the kernel counts the jail's own
    outside = [subprocess.Popen([*prefix, "sleep", "60"]) for _ in range(PROCESSES + 8)]
    try:
        control, _ = attack_as(who, area, held(escape, home, bomb(0), ROOMY, seccomp=False))
        result, reason = attack_as(who, area, held(escape, home, bomb(30), Limits(PROCESSES, 1 << 30), seccomp=False))
    finally:
        for process in outside:
            process.kill()
            process.wait()
    assert control is not None and control["amount"] == CEILING, control
    assert result is not None and PROCESSES // 2 < result["amount"] < PROCESSES, result
    assert reason == FORK_REASON


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_rlimit_nproc_does_not_bound_root_so_a_root_gateway_never_counts_on_it(
    escape: Path, rlimits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = attack([], held(escape, "/root", bomb(0), Limits(PROCESSES, 1 << 30)))
    assert result is not None and result["amount"] == CEILING, result  # the kernel's rule, shown
    monkeypatch.setattr(limits, "bases", dict)  # no cgroup the gateway may make
    monkeypatch.setattr(limits, "_systemd", lambda: None)
    assert enforcement.__wrapped__().processes.mechanism is Mechanism.NONE


def test_with_rlimits_a_memory_hog_is_refused_memory_per_process(
    who: tuple[str, list[str], str, int], area: Path, escape: Path, rlimits: None
) -> None:
    """GAP: with rlimits a memory hog is refused memory (RLIMIT_DATA, per process) but not
    reported: the kernel keeps no count of refused allocations, and the server carries on."""
    name, _, home, _ = who
    hog = {"kind": "memory", "mib": 512}
    control, _ = attack_as(who, area, held(escape, home, hog, ROOMY, seccomp=False))
    result, reason = attack_as(who, area, held(escape, home, hog, Limits(ROOMY.processes, 256 * MIB), seccomp=False))
    assert control is not None and control["got_through"], f"as {name}: {control}"
    assert result is not None and not result["got_through"] and result["amount"] < 256, f"as {name}: {result}"
    assert "MemoryError" in result["detail"] and reason is None


def test_with_rlimits_a_jails_tmpfs_mounts_keep_no_more_files_than_its_memory_limit_pays_for(
    who: tuple[str, list[str], str, int], area: Path, escape: Path, rlimits: None
) -> None:
    """An empty file holds no bytes, but the kernel keeps about 1 KiB for it that no rlimit counts:
    each writable tmpfs takes as many files as a sixteenth of its share pays for (2 KiB each)."""
    name, _, home, _ = who
    files = {"kind": "tmpfs_files", "count": 20_000, "places": ["/tmp", home, "/dev/shm"]}
    control, _ = attack_as(who, area, held(escape, home, files, ROOMY, seccomp=False))
    assert control is not None and control["got_through"], f"as {name}: {control}"
    result, _ = attack_as(who, area, held(escape, home, files, Limits(ROOMY.processes, 64 * MIB), seccomp=False))
    # 64 MiB: /tmp 1,024 files, the home and /dev/shm 512 each, less what is there already (their roots)
    assert result is not None and not result["got_through"], f"as {name}: {result}"
    assert 2048 - 8 <= result["amount"] <= 2048 and result["detail"].count("ENOSPC") == 3, f"as {name}: {result}"


def touch(marker: Path) -> LaunchPlan:
    """A jail under roomy limits that makes `marker`, where the gateway would run it."""
    spec = JailSpec("t", ("/usr/bin/touch", str(marker)), {"PATH": "/usr/bin"}, read_write=(str(marker.parent),))
    return limit_plan(bwrap_plan(spec, []), "t", ROOMY)


def released(plan: LaunchPlan) -> int:
    """Run `plan` released under its limits, as the gateway does; its exit code."""
    with spawn_args(plan) as spawn:
        process = subprocess.Popen(spawn.argv, pass_fds=spawn.pass_fds)
        confinement = spawn.release()
    code = process.wait(60)
    assert confinement is not None
    settle(confinement)
    return code


def refused(plan: LaunchPlan, match: str) -> None:
    """Start `plan`, whose release must fail with a JailError that matches `match`."""
    with spawn_args(plan) as spawn:
        process = subprocess.Popen(spawn.argv, pass_fds=spawn.pass_fds)
        with pytest.raises(JailError, match=match):
            spawn.release()
    process.wait(60)


def test_a_held_jail_that_is_never_released_is_ended_not_let_go(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plan = touch(marker)
    with spawn_args(plan) as spawn:
        process = subprocess.Popen(spawn.argv, pass_fds=spawn.pass_fds)
    process.wait(60)
    assert not marker.exists()
    assert released(plan) == 0 and marker.exists()  # the control: released, it runs


def test_a_jail_whose_limits_cannot_be_put_in_place_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    nowhere = Method(Mechanism.CGROUP, "a cgroup that cannot be made", True, str(tmp_path / "no-cgroup"), 1)
    monkeypatch.setattr(limits, "enforcement", lambda: Enforcement(nowhere, RLIMITS.memory))
    refused(touch(marker), "server 't': its jail could not be put under its limits")
    assert not marker.exists()


def test_a_jail_whose_tmpfs_mounts_cannot_be_sized_does_not_start(tmp_path: Path, rlimits: None) -> None:
    marker = tmp_path / "ran"
    plan = touch(marker)
    assert plan.limits is not None
    # /etc is no mount of the jail's own (bwrap binds files into it): nothing may run unsized
    unsizable = replace(plan, limits=replace(plan.limits, tmpfs=(*plan.limits.tmpfs, ("/etc", 1 << 20, 16))))
    refused(unsizable, "its tmpfs mounts could not be sized: /etc is not a mount of its own")
    assert not marker.exists()
    assert released(plan) == 0 and marker.exists()  # the control: its own tmpfs mounts are sized, and it runs


MEMFD_HOG = """
import os
try:
    heap = bytearray(128 << 20)
    print("heap 128")
except MemoryError:
    print("heap refused")
fd, chunk, held = os.memfd_create("hog"), b"x" * (1 << 20), 0
for _ in range(128):
    os.write(fd, chunk)
    held += 1
print("memfd", held)
"""


def test_with_rlimits_memory_kept_in_a_memfd_counts_against_no_limit(tmp_path: Path, rlimits: None) -> None:
    """GAP: with rlimits only, RLIMIT_DATA refuses a process 128 MiB of its own memory under a
    limit of 64 MiB, but not 128 MiB written into a memfd (nor System V shared memory): only a
    cgroup or a systemd scope bounds those."""
    assert rlimited(MEMFD_HOG)[:2] == ["heap refused", "memfd 128"]


def rlimited(code: str) -> list[str]:
    """What the Python `code` prints in a jail with a memory limit of 64 MiB (rlimits only)."""
    spec = JailSpec("t", ("/usr/bin/python3", "-I", "-S", "-c", code), {"PATH": "/usr/bin"}, home="/root")
    done = run_plan(limit_plan(bwrap_plan(spec, []), "t", Limits(64, 64 * MIB)), 60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split("\n")


KERNEL_HOG = """
import ctypes, resource, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0, 128 << 20, 0o600)  # IPC_PRIVATE
at = libc.shmat(shm, None, 0) if shm >= 0 else None
if at is not None and at != ctypes.c_void_p(-1).value:
    ctypes.memset(at, 1, 128 << 20)  # every page touched
    print("shm 128")
else:
    print("shm refused", ctypes.get_errno())
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, pairs = 0, []
while held < 128 << 20:  # socket pairs, each one's send buffer full
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        while True:
            held += a.send(b"x" * 65536)
    except BlockingIOError:
        pairs.append((a, b))
print("sockets", held >> 20)
"""


def test_with_rlimits_memory_the_kernel_keeps_for_shared_memory_and_sockets_counts_against_no_limit(
    tmp_path: Path, rlimits: None
) -> None:
    """GAP: with rlimits only, a process under a limit of 64 MiB keeps 128 MiB in System V shared
    memory and 128 MiB more in the buffers of its sockets (pipes likewise): each open file holds
    buffers of its own, up to RLIMIT_NOFILE of them per process. So refusing memfd_create and
    shmget in such jails would not bound them (and would break servers that use them: Chromium
    keeps its shared memory in memfds); only a cgroup or a systemd scope bounds a jail's memory."""
    assert rlimited(KERNEL_HOG)[:2] == ["shm 128", "sockets 128"]


def test_a_jail_whose_grants_cover_its_home_and_tmp_starts_with_only_its_own_tmpfs_sized(
    tmp_path: Path, rlimits: None
) -> None:
    """A grant of the home (or of /tmp, or of a directory above either) is mounted over the jail's
    tmpfs there, which nothing in the jail can reach any more: it is not sized (it is no mount of
    the jail's own at that path), and the jail starts; /dev/shm is still sized."""
    home = tmp_path / "home"
    home.mkdir()
    marker = home / "ran"
    spec = JailSpec(
        "t", ("/usr/bin/touch", str(marker)), {"PATH": "/usr/bin"}, read_write=(str(home), "/tmp"), home=str(home)
    )
    plan = limit_plan(bwrap_plan(spec, []), "t", ROOMY)
    assert plan.limits is not None and [point for point, _, _ in plan.limits.tmpfs] == ["/dev/shm"]
    assert released(plan) == 0 and marker.exists()
