"""Resource limits per jail: the plan that holds a jail, how this machine enforces the limits
(`sandbox/limits.py`), and what a jail's cgroup tells (`sandbox/cgroups.py`)."""

from __future__ import annotations

import mmap
import os
import shutil
from dataclasses import replace
from errno import EOPNOTSUPP
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import limits
from cellblock.sandbox.bwrap import bwrap_plan
from cellblock.sandbox.cgroups import Cgroup
from cellblock.sandbox.limits import BLOCK_FD, INFO_FD, limit_plan
from cellblock.sandbox.seccomp import DISK_WATCHED_RULES, PIN_STAGE_RULES, RULES, Rule, jail_filter
from cellblock.sandbox.spawn import spawn_args
from cellblock.sandbox.types import Enforcement, JailError, JailSpec, LaunchPlan, Limits, Mechanism, Method, Network

MIB = 1 << 20
ROOMY = Limits(600, 1 << 30)
RLIMITS = Enforcement(
    Method(Mechanism.RLIMIT, "RLIMIT_NPROC in the jail's own user namespace", whole=True),
    Method(Mechanism.RLIMIT, "RLIMIT_DATA, per process only", whole=False),
)


@pytest.fixture
def rlimits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans enforced by rlimits, as on a machine without cgroups the gateway may use."""
    monkeypatch.setattr(limits, "enforcement", lambda: RLIMITS)


# -- the plan --------------------------------------------------------------------------------


def plan_of(argv: tuple[str, ...] = ("bwrap", "--unshare-user", "--", "server")) -> LaunchPlan:
    return LaunchPlan(argv, {"PATH": "/usr/bin"}, None, (), Network.NONE)


def test_a_limited_plan_holds_bwrap_until_released(rlimits: None) -> None:
    plan = limit_plan(plan_of(), "files", Limits(64, 512 * MIB))
    assert plan.argv == ("bwrap", "--info-fd", INFO_FD, "--block-fd", BLOCK_FD, "--unshare-user", "--", "server")
    assert plan.limits is not None and plan.limits.limits == Limits(64, 512 * MIB) and plan.limits.server == "files"
    with spawn_args(plan) as spawn:
        info, block = spawn.pass_fds
        assert spawn.argv[:5] == ("bwrap", "--info-fd", str(info), "--block-fd", str(block))
    for fd in (info, block):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_with_systemd_the_jail_runs_in_a_scope_of_its_own_and_systemds_variables_stay_outside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scope = Method(Mechanism.SYSTEMD, "a scope", whole=True)
    how = Enforcement(scope, scope, ("/usr/bin/systemd-run", "--user", "--scope"), {"XDG_RUNTIME_DIR": "/run/user/7"})
    monkeypatch.setattr(limits, "enforcement", lambda: how)
    plan = limit_plan(plan_of(), "files", Limits(64, 512 * MIB))
    cut = plan.argv.index("--")
    prefix, rest = plan.argv[:cut], plan.argv[cut + 1 :]
    assert prefix[:3] == ("/usr/bin/systemd-run", "--user", "--scope")
    assert {"TasksMax=64", f"MemoryMax={512 * MIB}", "MemorySwapMax=0"} <= set(prefix)
    assert any(a.startswith(f"--unit=cellblock-{os.getpid()}-files-") for a in prefix)
    assert rest[:5] == ("bwrap", "--info-fd", INFO_FD, "--block-fd", BLOCK_FD)
    assert rest[5:7] == ("--unsetenv", "XDG_RUNTIME_DIR") and rest[7:9] == ("--unsetenv", "INVOCATION_ID")
    assert plan.env["XDG_RUNTIME_DIR"] == "/run/user/7"


@pytest.mark.parametrize(
    ("argv", "with_limits"),
    [
        (("bwrap", "--info-fd", INFO_FD, "--block-fd", BLOCK_FD, "--", "x"), False),
        (("bwrap", "--", "x"), True),
        (("bwrap", "--info-fd", INFO_FD, "--", "x"), True),
    ],
    ids=["places and no limits", "limits and no places", "half the places"],
)
def test_a_plan_whose_command_and_limits_disagree_is_not_started(
    argv: tuple[str, ...], with_limits: bool, rlimits: None
) -> None:
    plan = plan_of(argv)
    if with_limits:
        plan = replace(plan, limits=limit_plan(plan_of(), "t", ROOMY).limits)
    with pytest.raises(JailError, match="nothing was started"), spawn_args(plan):
        pytest.fail("spawned")


def sizes(argv: tuple[str, ...]) -> dict[str, int]:
    """Each sized tmpfs's mount point -> its size (`--size N --tmpfs POINT`)."""
    return {argv[i + 3]: int(argv[i + 1]) for i, a in enumerate(argv) if a == "--size" and argv[i + 2] == "--tmpfs"}


def jail(**extra: Any) -> LaunchPlan:
    return bwrap_plan(JailSpec("files", ("/usr/bin/true",), {"PATH": "/usr/bin"}, home="/root", **extra), [])


@pytest.mark.parametrize("memory", [32 * MIB, 100 * MIB + 4097, 4 << 30])
def test_a_jails_writable_tmpfs_mounts_together_hold_no_more_than_its_memory_limit(memory: int, rlimits: None) -> None:
    plan = limit_plan(jail(), "files", Limits(64, memory))
    sized = sizes(plan.argv)
    assert plan.limits is not None
    capped = {point: (held, files) for point, held, files in plan.limits.tmpfs}
    assert set(sized) == set(capped) == {"/tmp", "/root", "/dev/shm"}  # every tmpfs the jail may write
    assert all(sized[point] == held for point, (held, _) in capped.items())  # bwrap's --size, and the gateway's
    # what they hold and what the kernel keeps for their files, together
    assert sum(held + files * limits.FILE_BYTES for held, files in capped.values()) <= memory
    assert all(n % mmap.PAGESIZE == 0 for n in sized.values())
    share = {point: held + files * limits.FILE_BYTES for point, (held, files) in capped.items()}
    assert share["/tmp"] >= memory // 2 - 2 * mmap.PAGESIZE and share["/root"] >= memory // 4 - 2 * mmap.PAGESIZE
    tmp, files = capped["/tmp"]
    assert files == share["/tmp"] // 16 // limits.FILE_BYTES  # a sixteenth of it for its files
    shown = {m.path: m.why for m in plan.mounts}
    assert shown["/tmp"] == f"private /tmp (tmpfs), at most {limits.size(tmp)} in {files:,} files"


def test_before_linux_5_2_the_number_of_files_is_not_capped_and_show_says_so(
    rlimits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "_kernel", lambda: (5, 1))
    plan = limit_plan(jail(), "files", Limits(64, 64 * MIB))
    assert plan.limits is not None and plan.limits.tmpfs == ()
    assert "--size" in plan.argv  # bwrap still sizes their bytes
    shown = {m.path: m.why for m in plan.mounts}
    assert "in ANY NUMBER OF FILES (Linux 5.2 and newer can cap them)" in shown["/tmp"]


def test_without_a_private_tmp_the_home_and_dev_shm_share_the_memory_limit(rlimits: None) -> None:
    plan = limit_plan(jail(tmp=False), "files", Limits(64, 64 * MIB))
    assert plan.limits is not None
    assert plan.limits.tmpfs == (("/dev/shm", 30 * MIB, 1024), ("/root", 30 * MIB, 1024))


def test_a_bubblewrap_that_cannot_size_a_tmpfs_gets_no_size_and_show_says_so(
    rlimits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "bwrap_has_size", lambda bwrap: False)  # bubblewrap before 0.7.0
    monkeypatch.setattr(limits, "_kernel", lambda: (5, 1))  # and Linux before fspick
    plan = limit_plan(jail(), "files", Limits(64, 64 * MIB))
    assert "--size" not in plan.argv
    assert {m.path for m in plan.mounts if "NOT SIZED: this bubblewrap has no --size" in m.why} == {
        "/tmp",
        "/root",
        "/dev/shm",
    }


def test_a_bubblewrap_that_cannot_size_a_tmpfs_has_it_sized_by_the_gateway_where_linux_can(
    rlimits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "bwrap_has_size", lambda bwrap: False)  # Ubuntu 22.04: bubblewrap 0.6.1, Linux 5.15
    plan = limit_plan(jail(), "files", Limits(64, 64 * MIB))
    assert "--size" not in plan.argv and plan.limits is not None
    assert {point for point, _, _ in plan.limits.tmpfs} == {"/tmp", "/root", "/dev/shm"}
    assert {m.path: m.why for m in plan.mounts}["/tmp"] == "private /tmp (tmpfs), at most 30 MiB in 1,024 files"


def test_only_a_jail_whose_disk_is_bounded_has_fallocate_refused(rlimits: None) -> None:
    plan = jail()
    assert limit_plan(plan, "files", Limits(64, 64 * MIB)).seccomp == jail_filter(RULES)  # a server's
    installer = limit_plan(plan, "files", Limits(64, 64 * MIB, disk=32 * MIB))
    assert installer.seccomp == jail_filter(DISK_WATCHED_RULES) != jail_filter(RULES)
    assert Rule("fallocate", EOPNOTSUPP) in DISK_WATCHED_RULES
    # a plan under another filter is not silently given this one
    with pytest.raises(JailError, match="a jail whose disk is bounded needs the filter its plan was made with"):
        limit_plan(replace(plan, seccomp=jail_filter(PIN_STAGE_RULES)), "files", Limits(64, 64 * MIB, disk=32 * MIB))


def test_a_plan_whose_tmpfs_mounts_are_not_where_it_says_is_refused(rlimits: None) -> None:
    plan = jail()
    moved = replace(plan, argv=(*plan.argv[:1], "--unshare-net", *plan.argv[1:]))
    with pytest.raises(JailError, match="tmpfs mounts are not where it says"):
        limit_plan(moved, "files", Limits(64, 64 * MIB))


# -- what this machine offers ----------------------------------------------------------------


def test_where_no_cgroup_or_systemd_is_at_hand_a_user_gets_rlimits_and_root_is_told_plainly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "bases", dict)
    monkeypatch.setattr(limits, "_systemd", lambda: None)
    find = limits.enforcement.__wrapped__
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(limits, "_kernel", lambda: (6, 1))
    user = find()
    assert user.processes.mechanism is Mechanism.RLIMIT and user.processes.whole
    assert user.memory.mechanism is Mechanism.RLIMIT and not user.memory.whole
    assert "PER PROCESS ONLY" in user.memory.how
    monkeypatch.setattr(limits, "_kernel", lambda: (5, 10))
    old = find()
    assert old.processes.mechanism is Mechanism.NONE and old.processes.how.startswith("NOT ENFORCED: Linux")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    root = find()
    assert root.processes.mechanism is Mechanism.NONE and "runs as root" in root.processes.how


def test_a_cgroup_the_gateway_may_make_enforces_both_limits_for_the_jail_as_a_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(limits, "_systemd", lambda: None)
    monkeypatch.setattr(limits, "bases", lambda: {"pids": (1, tmp_path / "pids"), "memory": (2, tmp_path / "v2")})
    how = limits.enforcement.__wrapped__()
    assert (how.processes.mechanism, how.processes.base, how.processes.version) == (
        Mechanism.CGROUP,
        str(tmp_path / "pids"),
        1,
    )
    assert how.memory.whole and "memory.max" in how.memory.how and "cgroup v2" in how.memory.how


@pytest.fixture
def user_manager(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A user's systemd as `_systemd` finds one: its runtime dir, its bus, its cgroup."""
    runtime = tmp_path / "run"
    (runtime / "systemd").mkdir(parents=True)
    (runtime / "systemd" / "private").touch()
    (runtime / "bus").touch()
    unit = tmp_path / "cgroup" / "user.slice" / "user-1000.slice" / "user@1000.service"
    unit.mkdir(parents=True)
    (unit / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpu memory pids\n")
    run = tmp_path / "systemd-run"
    run.write_text("#!/bin/sh\necho 'systemd 255 (255.4-1)'\n")
    run.chmod(0o755)
    monkeypatch.setattr(limits, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(shutil, "which", lambda name: str(run) if name == "systemd-run" else None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    own = {"": "/user.slice/user-1000.slice/user@1000.service/app.slice/app-claude.scope"}
    monkeypatch.setattr(limits, "own_cgroups", lambda: own)
    return tmp_path


def test_a_users_systemd_makes_the_scope_when_the_gateway_runs_under_it(user_manager: Path) -> None:
    found = limits._systemd()
    assert found is not None
    args, env, manager = found
    assert args == (
        str(user_manager / "systemd-run"),
        "--user",
        "--scope",
        "--quiet",
        "--collect",
        "--expand-environment=no",
    )
    assert env == {"XDG_RUNTIME_DIR": str(user_manager / "run")} and manager == "your user's service manager"


@pytest.mark.parametrize(
    "change",
    ["memory not delegated", "outside the manager", "no manager", "cgroup v1"],
)
def test_no_scope_where_systemd_could_not_apply_both_limits(
    user_manager: Path, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if change == "memory not delegated":
        (user_manager / "cgroup/user.slice/user-1000.slice/user@1000.service/cgroup.controllers").write_text("pids\n")
    elif change == "outside the manager":  # an ssh session's scope: the user's manager may not move it
        monkeypatch.setattr(limits, "own_cgroups", lambda: {"": "/user.slice/user-1000.slice/session-4.scope"})
    elif change == "no manager":
        (user_manager / "run" / "systemd" / "private").unlink()
    else:
        (user_manager / "cgroup" / "cgroup.controllers").unlink()
    assert limits._systemd() is None


def test_an_older_systemd_gets_no_option_it_does_not_know(user_manager: Path) -> None:
    (user_manager / "systemd-run").write_text("#!/bin/sh\necho 'systemd 252 (252.38-1~deb12u1)'\n")
    found = limits._systemd()
    assert found is not None and "--expand-environment=no" not in found[0]


# -- what a jail's cgroup tells ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("controller", "version", "file", "text", "reached"),
    [
        ("pids", 1, "pids.events", "max 0\n", False),
        ("pids", 2, "pids.events", "max 3\n", True),
        ("memory", 1, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", True),
        ("memory", 2, "memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n", False),
        ("memory", 2, "memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\n", True),
    ],
)
def test_a_cgroup_tells_a_refused_fork_or_an_oom_kill_not_mere_pressure(
    tmp_path: Path, controller: str, version: int, file: str, text: str, reached: bool
) -> None:
    (tmp_path / file).write_text(text)
    assert Cgroup(controller, version, tmp_path).reached() is reached


def test_a_cgroup_that_is_gone_tells_nothing(tmp_path: Path) -> None:
    assert not Cgroup("pids", 2, tmp_path / "gone").reached()
