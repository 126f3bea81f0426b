"""What a Landlock plan refuses, says it cannot close, and carries (sandbox/landlock.py); no process is run."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import landlock, limits
from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.landlock import LANDLOCKED, landlock_gaps, landlock_plan, landlock_refusal
from cellblock.sandbox.limits import BLOCK_FD, INFO_FD, limit_plan
from cellblock.sandbox.seccomp import (
    LANDLOCK_NO_NETWORK_RULES,
    LANDLOCK_PROXIED_RULES,
    LANDLOCK_ROOT_RULES,
    LANDLOCK_RULES,
    LANDLOCK_SIDECAR_RULES,
    RULES,
    build_filter,
)
from cellblock.sandbox.sockets import SCOPE
from cellblock.sandbox.spawn import GATE_FD, GATE_PORT
from cellblock.sandbox.types import (
    Closure,
    Enforcement,
    GatePlan,
    JailError,
    JailSpec,
    Limits,
    Mechanism,
    Method,
    Mount,
    MountMode,
    Network,
)


def spec(tmp_path: Path, **extra: Any) -> JailSpec:
    values: dict[str, Any] = {
        "name": "srv",
        "argv": ("/usr/bin/env", "true"),
        "env": {"PATH": "/usr/bin", "HOME": "/root", "TMPDIR": "/tmp"},
    }
    return JailSpec(**(values | extra))


def options(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[: argv.index("--")]) if word == flag]


@pytest.mark.parametrize(
    ("abi", "network", "says"),
    [
        (0, Network.OPEN, "no Landlock"),
        (3, Network.NONE, "needs Landlock ABI 4"),
    ],
)
def test_what_landlock_cannot_enforce_is_refused_naming_the_server_and_the_bwrap_fix(
    tmp_path: Path, abi: int, network: Network, says: str
) -> None:
    refusal = landlock_refusal(spec(tmp_path, network=network), abi)
    assert refusal is not None
    assert "server 'srv'" in refusal and says in refusal and "jail.backend: bwrap" in refusal


@pytest.mark.parametrize(
    ("abi", "network"),
    [(1, Network.OPEN), (4, Network.NONE), (7, Network.NONE), (1, Network.ALLOWLIST), (7, Network.ASK)],
)
def test_what_landlock_can_enforce_is_not_refused(tmp_path: Path, abi: int, network: Network) -> None:
    if network in (Network.ALLOWLIST, Network.ASK) and gate_missing() is not None:
        pytest.skip(f"this machine cannot run a gate: {gate_missing()}")
    assert landlock_refusal(spec(tmp_path, network=network), abi) is None


@pytest.mark.parametrize("network", [Network.ALLOWLIST, Network.ASK])
def test_where_the_gateway_cannot_make_the_jails_connections_a_proxied_network_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, network: Network
) -> None:
    monkeypatch.setattr(landlock, "gate_missing", lambda: "pidfd_getfd is refused here (Operation not permitted)")
    refusal = landlock_refusal(spec(tmp_path, network=network), 7)
    assert refusal is not None
    assert "server 'srv'" in refusal and "pidfd_getfd is refused" in refusal and "jail.backend: bwrap" in refusal
    assert landlock_refusal(spec(tmp_path, network=Network.NONE), 7) is None  # what needs no gate is not


def test_a_proxied_plan_hands_its_connects_to_a_gate_and_points_the_proxy_variables_at_it(tmp_path: Path) -> None:
    if gate_missing() is not None:
        pytest.skip(f"this machine cannot run a gate: {gate_missing()}")
    egress = str(tmp_path / "egress.sock")
    plan = landlock_plan(spec(tmp_path, network=Network.ALLOWLIST, egress_socket=egress), [], str(tmp_path), abi=7)
    assert plan.gate == GatePlan("srv", egress)
    assert options(plan.argv, "--gate") == [GATE_FD] and options(plan.argv, "--proxy-port") == [GATE_PORT]
    assert "--no-network" not in plan.argv
    assert plan.seccomp == build_filter((*LANDLOCK_RULES, *LANDLOCK_PROXIED_RULES, *root_rules()))
    with pytest.raises(JailError, match="needs the gateway's egress proxy"):
        landlock_plan(spec(tmp_path, network=Network.ALLOWLIST), [], str(tmp_path), abi=7)


def test_a_file_granted_alone_hands_its_opens_to_a_gate_and_one_in_a_writable_directory_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if gate_missing() is not None:
        pytest.skip(f"this machine cannot run a gate: {gate_missing()}")
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    alone, beside = tmp_path / "home" / "test.db", tmp_path / "project" / "kept.db"
    alone.touch()
    beside.touch()
    grants = (str(alone), str(tmp_path / "project"), str(beside))
    plan = landlock_plan(spec(tmp_path, read_write=grants), [], str(tmp_path / "private"), abi=7)
    assert plan.gate == GatePlan("srv", beside=(str(alone),))
    assert options(plan.argv, "--gate") == [GATE_FD] and "--proxy-port" not in plan.argv
    assert "--no-network" in plan.argv  # its network is what it was
    assert plan.seccomp == build_filter(
        (*LANDLOCK_RULES, *LANDLOCK_NO_NETWORK_RULES, *root_rules(), *LANDLOCK_SIDECAR_RULES)
    )
    # a file in a directory it may write: no gate, and no call of its waits for one
    plain = landlock_plan(spec(tmp_path, read_write=grants[1:]), [], str(tmp_path / "private"), abi=7)
    assert plain.gate is None
    assert plain.seccomp == build_filter((*LANDLOCK_RULES, *LANDLOCK_NO_NETWORK_RULES, *root_rules()))
    # where no gate can run, the database is read-only to SQLite, and the plan says so
    monkeypatch.setattr(landlock, "gate_missing", lambda: "pidfd_getfd is refused here (Operation not permitted)")
    plan = landlock_plan(spec(tmp_path, read_write=grants), [], str(tmp_path / "private"), abi=7)
    assert plan.gate is None
    assert any("beside a file granted alone" in gap and "grant its directory" in gap for gap in plan.gaps), plan.gaps


def root_rules() -> tuple[Any, ...]:
    return LANDLOCK_ROOT_RULES if os.geteuid() == 0 else ()


def test_a_hidden_path_inside_a_grant_is_refused_and_a_hidden_socket_is_not(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    hidden = {str(tmp_path / "state"): "Cellblock's own"}
    refusal = landlock_refusal(spec(tmp_path, read_only=(str(tmp_path),), hidden=hidden), 7)
    assert refusal is not None and str(tmp_path / "state") in refusal and "cannot take part of a grant back" in refusal
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "agent.sock"))
        sockets = {str(tmp_path / "agent.sock"): "an ssh-agent's socket"}
        # no Unix socket can be made in this jail: one in a grant is out of reach without hiding it
        assert landlock_refusal(spec(tmp_path, read_only=(str(tmp_path),), hidden=sockets), 7) is None


def test_a_read_only_grant_inside_a_writable_grant_is_refused(tmp_path: Path) -> None:
    inner = str(tmp_path / "project" / "docs")
    refusal = landlock_refusal(spec(tmp_path, read_write=(str(tmp_path / "project"),), read_only=(inner,)), 7)
    assert refusal is not None and inner in refusal and "read-only" in refusal


def test_a_launchers_installation_inside_a_writable_grant_runs_with_the_gap_named(tmp_path: Path) -> None:
    """A project's own .venv in the project it may write: the server starts, and is told it may change it."""
    project = tmp_path / "project"
    inner = str(project / ".venv")
    venv = [Mount(inner, MountMode.READ_ONLY, "virtualenv")]
    jailed = spec(tmp_path, read_write=(str(project),))
    assert landlock_refusal(jailed, 7, venv) is None
    [gap] = [g for g in landlock_gaps(jailed, 7, venv) if inner in g]
    assert f"{inner} (virtualenv) is inside the read_write grant {project}, so the server may change it" in gap
    assert not any(inner in g for g in landlock_gaps(jailed, 7))  # a gap of what the jail shows only


def test_pinned_executables_are_refused(tmp_path: Path) -> None:
    refusal = landlock_refusal(spec(tmp_path, pinned={"/usr/bin/env": str(tmp_path / "copy")}), 7)
    assert refusal is not None and "exec.sha256" in refusal


def test_the_plan_raises_the_refusal(tmp_path: Path) -> None:
    with pytest.raises(JailError, match="needs Landlock ABI 4"):
        landlock_plan(spec(tmp_path, network=Network.NONE), [], str(tmp_path / "private"), abi=3)


def test_the_gaps_follow_the_abi_and_the_jail(tmp_path: Path) -> None:
    old, new = landlock_gaps(spec(tmp_path), 5), landlock_gaps(spec(tmp_path), 6)
    assert any("signals" in gap for gap in old) and not any("signals" in gap for gap in new)
    assert any("truncate" in gap for gap in landlock_gaps(spec(tmp_path), 2))
    assert any("command lines" in gap for gap in new) and any("metadata" in gap for gap in new)
    closure = Closure((), ("/usr/bin/env",), ())
    assert any("loaded as code" in gap for gap in landlock_gaps(spec(tmp_path, exec_closure=closure), 7))


def test_the_server_gets_a_private_home_and_tmp_and_its_secrets_never_reach_the_command_line(tmp_path: Path) -> None:
    private = tmp_path / "private"
    plan = landlock_plan(spec(tmp_path), [], str(private), secrets={"API_KEY": "DECOY"}, abi=7)
    assert plan.backend == "landlock" and plan.gaps and plan.seccomp is not None
    assert plan.argv[:4] == (os.path.realpath(sys.executable), "-I", "-S", LANDLOCKED)
    assert not any("DECOY" in arg for arg in plan.argv)
    assert plan.env["API_KEY"] == "DECOY" and options(plan.argv, "--keep") == ["API_KEY"]
    home, tmp = plan.env["HOME"], plan.env["TMPDIR"]
    assert Path(home).parent == private and Path(tmp).parent == private and home != tmp
    assert Path(home).stat().st_mode & 0o777 == 0o700
    assert home in options(plan.argv, "--write-run") and tmp in options(plan.argv, "--write-run")
    assert "/root" not in [*options(plan.argv, "--read"), *options(plan.argv, "--run")]
    assert "/tmp" not in options(plan.argv, "--write-run")
    assert options(plan.argv, "--chdir") == [home]
    assert "--no-network" in plan.argv


def test_a_kept_home_is_used_and_no_tmp_when_tmp_is_off(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    plan = landlock_plan(spec(tmp_path, home_source=str(kept), tmp=False), [], str(tmp_path / "p"), abi=7)
    assert plan.env["HOME"] == str(kept) and "TMPDIR" not in plan.env


def test_under_exec_allow_only_the_closure_is_executable(tmp_path: Path) -> None:
    granted = tmp_path / "work"
    granted.mkdir()
    closure = Closure((), ("/usr/bin/env",), ())
    plan = landlock_plan(
        spec(tmp_path, read_write=(str(granted),), exec_closure=closure), [], str(tmp_path / "p"), abi=7
    )
    assert options(plan.argv, "--exec") == ["/usr/bin/env"]
    assert not options(plan.argv, "--run") and not options(plan.argv, "--write-run")
    assert str(granted) in options(plan.argv, "--write") and "/usr" in options(plan.argv, "--read")


def test_a_missing_grant_or_a_cwd_outside_the_grants_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JailError, match="does not exist"):
        landlock_plan(spec(tmp_path, read_only=(str(tmp_path / "nope"),)), [], str(tmp_path / "p"), abi=7)
    with pytest.raises(JailError, match="is not shared"):
        landlock_plan(spec(tmp_path, cwd=str(tmp_path)), [], str(tmp_path / "p"), abi=7)


def test_the_bwrap_jails_own_wrappers_are_left_out(tmp_path: Path) -> None:
    wrapped = ("/usr/bin/python3", "-I", "-S", SCOPE, "--", "/usr/bin/env", "true")
    plan = landlock_plan(spec(tmp_path, argv=wrapped), [], str(tmp_path / "p"), abi=7)
    assert plan.argv[plan.argv.index("--") + 1 :] == ("/usr/bin/env", "true")


def test_limits_hold_the_launcher_after_its_script(tmp_path: Path) -> None:
    plan = landlock_plan(spec(tmp_path), [], str(tmp_path / "p"), abi=7)
    held = limit_plan(plan, "srv", Limits(processes=64, memory=256 << 20))
    at = held.argv.index(LANDLOCKED)
    assert held.argv[at + 1 : at + 5] == ("--info-fd", INFO_FD, "--block-fd", BLOCK_FD)


def test_the_landlock_filter_keeps_every_rule_of_the_jail_filter_and_builds() -> None:
    assert set(RULES) <= set(LANDLOCK_RULES)
    assert build_filter((*LANDLOCK_RULES, *LANDLOCK_NO_NETWORK_RULES, *LANDLOCK_ROOT_RULES))


def test_where_only_rlimits_bound_processes_a_landlock_jail_says_its_processes_are_not_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rlimit = Method(Mechanism.RLIMIT, "RLIMIT_NPROC in the jail's own user namespace", whole=True)
    memory = Method(Mechanism.RLIMIT, "RLIMIT_DATA, per process only", whole=False)
    monkeypatch.setattr(limits, "enforcement", lambda: Enforcement(rlimit, memory))
    plan = limit_plan(landlock_plan(spec(tmp_path), [], str(tmp_path / "p"), abi=7), "srv", Limits(64, 256 << 20))
    assert plan.limits is not None
    processes = plan.limits.enforcement.processes
    assert processes.mechanism is Mechanism.NONE and not processes.whole and "NOT ENFORCED" in processes.how
    assert plan.limits.enforcement.memory == memory
