"""The mark on an unjailed server's processes (`sandbox/marks.py`): the plan that joins a cgroup of
its own, the cgroup made at spawn and removed after, and what `cgroups.marked` takes for a mark."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellblock.sandbox import cgroups, marks
from cellblock.sandbox.marks import JOIN, MARK_PROCS, mark_plan
from cellblock.sandbox.spawn import run_plan, spawn_args
from cellblock.sandbox.types import Enforcement, JailError, LaunchPlan, MarkPlan, Mechanism, Method, Network


def plan_of(*argv: str) -> LaunchPlan:
    return LaunchPlan(argv or ("server", "--flag"), {"PATH": os.environ["PATH"]}, None, (), Network.OPEN)


@pytest.fixture
def place(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    marks._place.cache_clear()
    yield
    marks._place.cache_clear()


@pytest.fixture
def base() -> Path:
    found = cgroups.mark_base()
    if found is None:
        pytest.skip("no cgroup the gateway may make children in here (root, or a delegated cgroup, needed)")
    return found


@pytest.mark.parametrize(
    ("listing", "found"),
    [
        (
            "0::/user.slice/app.slice/cellblock-4242-files-3.scope\n",
            "/user.slice/app.slice/cellblock-4242-files-3.scope",
        ),
        ("4:pids:/cellblock-17-fs-1\n0::/\n", "/cellblock-17-fs-1"),
        ("0::/cellblock-17-fs-1/made-inside\n", "/cellblock-17-fs-1/made-inside"),  # a cgroup it made below its own
        ("0::/user.slice/app.slice/term.scope\n", None),
        ("0::/cellblock-17-trial\n", None),  # a trial holds no task
        ("0::/cellblock-gateway.scope\n", None),  # a name the user chose
        ("0::/xcellblock-17-fs-1\n", None),
    ],
)
def test_a_servers_cgroup_or_scope_is_marked_and_nothing_else_is(listing: str, found: str | None) -> None:
    assert cgroups._marked_in(listing) == found


def test_this_process_is_no_servers() -> None:
    assert cgroups.marked(os.getpid()) is None


def test_an_unjailed_plan_joins_a_cgroup_of_its_own_made_at_spawn_and_removed_after(base: Path, place: None) -> None:
    plan = mark_plan(plan_of("/bin/sh", "-c", "cat /proc/self/cgroup; sh -c 'cat /proc/self/cgroup' &"), "loose")
    assert plan.argv[:4] == (marks.SHELL, "-c", JOIN, MARK_PROCS) and plan.mark == MarkPlan("loose", str(base))
    done = run_plan(plan, timeout=30)
    assert done.returncode == 0, done.stderr
    mine = f"{cgroups.PREFIX}{os.getpid()}-loose-"
    # the server, and what it started in the background, each ran in its marked cgroup
    assert done.stdout.count(mine) == 2, done.stdout
    assert not list(base.glob(f"{mine}*"))  # gone once the server ended


def test_a_cgroup_being_joined_is_not_swept_as_a_leftover(base: Path) -> None:
    path = cgroups.prepare(base, cgroups.name_for("joining"))
    try:
        cgroups._sweep(base)  # another server's start, meanwhile
        assert path.is_dir()
    finally:
        assert cgroups.remove(path)
    # the control: an empty one this process made and no longer joins is swept
    path.mkdir()
    cgroups._sweep(base)
    assert not path.exists()


def test_a_server_that_cannot_join_its_cgroup_does_not_run(base: Path, place: None, tmp_path: Path) -> None:
    witness = tmp_path / "ran"
    plan = mark_plan(plan_of("/bin/sh", "-c", f"touch {witness}"), "loose")
    with spawn_args(plan) as spawn:
        argv = list(spawn.argv)
        assert spawn.mark is not None
        argv[3] = str(tmp_path / "not-a-cgroup" / "cgroup.procs")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 126 and "could not join" in done.stderr and "nothing was started" in done.stderr
    assert not witness.exists()
    assert spawn.mark.close() and not spawn.mark.path.exists()  # the spawner's to remove; nothing is in it


def test_a_plan_that_joins_a_cgroup_it_does_not_carry_is_not_started() -> None:
    plan = plan_of(marks.SHELL, "-c", JOIN, MARK_PROCS, "server")
    with pytest.raises(JailError, match="joins a cgroup it does not carry"), spawn_args(plan):
        pass


def test_with_systemd_an_unjailed_server_runs_in_a_scope_and_systemds_variables_stay_outside(
    monkeypatch: pytest.MonkeyPatch, place: None
) -> None:
    scope = Method(Mechanism.SYSTEMD, "a scope", whole=True)
    how = Enforcement(scope, scope, ("/usr/bin/systemd-run", "--user", "--scope"), {"XDG_RUNTIME_DIR": "/run/user/7"})
    monkeypatch.setattr(marks, "enforcement", lambda: how)
    plan = mark_plan(plan_of(), "loose")
    cut = plan.argv.index("--")
    assert plan.argv[:3] == ("/usr/bin/systemd-run", "--user", "--scope") and plan.mark is None
    assert any(a.startswith(f"--unit={cgroups.PREFIX}{os.getpid()}-loose-") for a in plan.argv[:cut])
    assert not any(a.startswith("-p") for a in plan.argv[:cut])  # a mark, not limits
    env_unset = (marks.ENV, "-u", "XDG_RUNTIME_DIR", "-u", "INVOCATION_ID")
    assert plan.argv[cut + 1 :] == (*env_unset, "server", "--flag")
    assert plan.env["XDG_RUNTIME_DIR"] == "/run/user/7"


def test_where_nothing_can_mark_a_server_its_plan_is_unchanged(monkeypatch: pytest.MonkeyPatch, place: None) -> None:
    none = Method(Mechanism.RLIMIT, "rlimits", whole=True)
    monkeypatch.setattr(marks, "enforcement", lambda: Enforcement(none, none))
    monkeypatch.setattr(marks, "mark_base", lambda: None)
    assert mark_plan(plan_of(), "loose") == plan_of() and marks.how_marked() is None
