"""The Landlock jail where it will run: as a normal user, where user namespaces are refused, on
kernels with older Landlock ABIs (plans made for them, run here), traced by learn and scan; and a
launcher that cannot lock itself down, which starts nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox.landlock import landlock_abi, landlock_plan
from cellblock.sandbox.spawn import run_plan, spawn_args
from cellblock.sandbox.trace import Kind, jail_refused, parse_trace, traced
from cellblock.sandbox.types import JailSpec, LaunchPlan, Network
from tests.gateway.cli.test_demo import NO_USERNS as NO_USER_NAMESPACES
from tests.sandbox.conftest import SANDBOX, USER, ensure_user
from tests.sandbox.test_landlock import (
    INTERPRETER,
    PYTHON,
    READ_KEY,
    SECONDS,
    UNIX,
    WRITE_OUTSIDE,
    arrived,
    jail,
    run,
    script,
    unjailed,
)

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(landlock_abi() < 4, reason="the Landlock jail's network: none needs Landlock ABI 4 (Linux 6.7)"),
]
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="the unprivileged case runs the system's python3")
def test_as_a_normal_user_with_no_capability_to_drop_the_jail_holds(area: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs the jail as another user through runuser, which needs root")
    user = ensure_user()
    # what the user runs must be readable by the user: the launcher and pin.py, copied out of a
    # checkout that may sit in root's 0700 home, with the package files they import through
    package = area / "cellblock" / "sandbox"
    package.mkdir(parents=True)
    for name in ("__init__.py", "sandbox/__init__.py", "sandbox/pin.py", "sandbox/landlocked.py"):
        shutil.copy(SANDBOX.parent / name, area / "cellblock" / name)
    for path in (area, area / "cellblock", package, *area.rglob("*.py")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    home = Path(user.pw_dir)
    decoy, outside = home / f".cellblock-decoy-{area.name}", home / f".cellblock-outside-{area.name}"
    decoy.write_text("DECOY-KEY\n")
    os.chown(decoy, user.pw_uid, user.pw_gid)
    try:
        code = script(READ_KEY + WRITE_OUTSIDE, key=str(decoy), home=str(home), outside=str(outside))
        spec = JailSpec(
            name="user", argv=(SYSTEM_PYTHON, "-I", "-S", "-c", code), env={"PATH": "/usr/bin:/bin", "HOME": str(home)}
        )
        private = area / "private"
        private.mkdir(mode=0o700)
        os.chown(private, user.pw_uid, user.pw_gid)
        plan = landlock_plan(spec, [], str(private))
        os.chown(plan.env["HOME"], user.pw_uid, user.pw_gid)
        os.chown(plan.env["TMPDIR"], user.pw_uid, user.pw_gid)
        launcher = (SYSTEM_PYTHON, "-I", "-S", str(package / "landlocked.py"))
        plan = replace(plan, argv=(*launcher, *plan.argv[plan.held_at :]))
        done = run_plan(plan, SECONDS, prefix=("runuser", "-u", USER, "--"))
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout.strip().splitlines()[-1])
        assert said == {"read": "PermissionError", "list": "PermissionError", "outside": "PermissionError"}
        assert not outside.exists()
        # the control: the same user, unjailed, reads the key and writes outside
        assert unjailed(code, ("runuser", "-u", USER, "--"), SYSTEM_PYTHON)["key"] == "DECOY-KEY\n"
        assert outside.exists()
    finally:
        decoy.unlink(missing_ok=True)
        outside.unlink(missing_ok=True)


def older(tmp_path: Path, code: str, abi: int, **extra: Any) -> LaunchPlan:
    """`jail`'s plan as it is made on a kernel with Landlock `abi` (run here, on a newer one)."""
    spec = JailSpec(
        name="older",
        argv=(PYTHON, "-I", "-S", "-c", code),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "user")},
        **extra,
    )
    return landlock_plan(spec, [INTERPRETER], str(tmp_path / "private"), abi=abi)


def test_below_abi_6_the_hosts_abstract_sockets_stay_out_of_reach_through_seccomp(tmp_path: Path) -> None:
    name = f"cellblock-test-{os.getpid()}-{tmp_path.name}"
    with socket.socket(socket.AF_UNIX) as abstract:
        abstract.bind("\0" + name)
        abstract.listen(8)
        code = script(UNIX.replace('attempt("path", lambda: connect(path))\n', ""), abstract=name)
        assert run(older(tmp_path, code, 5, network=Network.OPEN))["abstract"] != "ok"  # no Unix socket is made
        assert arrived(abstract) == 0


GAP_ATTACKS = {
    "signal": 'attempt("signal", lambda: os.kill(pid, 15))',
    "truncate": 'attempt("truncate", lambda: os.truncate(victim, 0))',
}


@pytest.mark.parametrize(
    ("abi", "attack", "gap"),
    [(5, "signal", "signals reach any process"), (2, "truncate", "truncate() works on any file")],
)
def test_below_an_abi_what_the_plan_names_as_a_gap_is_one(
    tmp_path: Path, bystander: subprocess.Popen[bytes], abi: int, attack: str, gap: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("kept")
    body = GAP_ATTACKS[attack]
    plan = older(tmp_path, script(body, pid=bystander.pid, victim=str(victim)), abi, network=Network.OPEN)
    assert any(gap in said for said in plan.gaps)
    assert run(plan) == {attack: "ok"}  # not stopped: the gap is real, and named
    assert bystander.wait(SECONDS) == -signal.SIGTERM if attack == "signal" else victim.read_text() == ""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("--abi", "99"), "planned for ABI 99"),
        (("--chdir", "/nonexistent-cellblock"), "cannot lock the jail down"),
        (("--frobnicate", "x"), "unknown option"),
    ],
)
def test_a_launcher_that_cannot_lock_itself_down_starts_nothing(
    tmp_path: Path, change: tuple[str, str], says: str
) -> None:
    marker = tmp_path / "started"
    plan = jail(tmp_path, f"open({str(marker)!r}, 'w')")
    split = plan.argv.index("--")
    plan = replace(plan, argv=(*plan.argv[:split], *change, *plan.argv[split:]))
    done = run_plan(plan, SECONDS)
    assert done.returncode == 126 and says in done.stderr
    assert not marker.exists()


def test_where_user_namespaces_are_refused_bwrap_cannot_start_and_the_landlock_jail_holds(
    tmp_path: Path, user_home: Path
) -> None:
    bwrap = subprocess.run(
        [*NO_USER_NAMESPACES, "bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        text=True,
        timeout=SECONDS,
        check=False,
    )
    assert bwrap.returncode != 0 and "namespace" in bwrap.stderr  # the machine the backend is for
    code = script(READ_KEY, key=str(user_home / ".ssh" / "id_ed25519"), home=str(user_home))
    done = run_plan(jail(tmp_path, code), SECONDS, prefix=NO_USER_NAMESPACES)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"read": "PermissionError", "list": "PermissionError"}
    # the control: there, unjailed, the key is read
    assert unjailed(code, NO_USER_NAMESPACES)["key"] == "DECOY-KEY\n"


@pytest.mark.skipif(shutil.which("strace") is None, reason="learn and scan trace with strace (apt-get install strace)")
def test_a_traced_landlock_jail_starts_at_the_server_and_shows_what_the_jail_refused(
    tmp_path: Path, user_home: Path
) -> None:
    key = str(user_home / ".ssh" / "id_ed25519")
    plan = jail(tmp_path, script(READ_KEY, key=key, home=str(user_home)))
    output = tmp_path / "trace"
    with spawn_args(plan) as spawn:
        argv = traced(spawn.argv, str(output), shutil.which("strace") or "strace")
        subprocess.run(argv, env=dict(plan.env), pass_fds=spawn.pass_fds, timeout=SECONDS, check=True)
    trace = parse_trace(output.read_text())
    assert trace.command == PYTHON  # the server, not the launcher before it
    reads = [e for e in trace.events if e.kind is Kind.READ and e.target == key]
    assert reads and all(e.errno == "EACCES" and jail_refused(e) for e in reads)
