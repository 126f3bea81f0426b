"""The bwrap command line: what every jail always has, and what a config adds. (No bwrap needed.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox.bwrap import EGRESS_SOCKET, bwrap_plan, namespace_hint
from cellblock.sandbox.types import JailError, JailSpec, Mount, MountMode, Network


def spec(tmp_path: Path, **extra: Any) -> JailSpec:
    return replace(JailSpec(name="s", argv=("/usr/bin/true",), env={"PATH": "/usr/bin"}, home="/root"), **extra)


def pairs(argv: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_every_jail_drops_all_capabilities_and_namespaces(tmp_path: Path) -> None:
    argv = bwrap_plan(spec(tmp_path), []).argv
    for flag in ("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") : argv.index("--cap-drop") + 2] == ("--cap-drop", "ALL")
    for flag in ("--disable-userns", "--die-with-parent", "--new-session", "--clearenv", "--unshare-net"):
        assert flag in argv


def test_the_root_is_remounted_read_only_last_before_the_command(tmp_path: Path) -> None:
    argv = bwrap_plan(spec(tmp_path), []).argv
    sep = argv.index("--")
    assert argv[sep - 2 : sep] == ("--remount-ro", "/")
    assert argv[sep + 1 :] == ("/usr/bin/true",)


def test_home_is_an_empty_private_tmpfs_and_nothing_of_it_is_bound(tmp_path: Path) -> None:
    argv = bwrap_plan(spec(tmp_path), []).argv
    assert ("--tmpfs", "/root") in [(argv[i], argv[i + 1]) for i in range(len(argv) - 1)]
    bound = [src for src, _ in pairs(argv, "--bind") + pairs(argv, "--ro-bind")]
    assert not any(b == "/root" or b.startswith("/root/") for b in bound)
    assert not any(b.startswith(("/run", "/var/run", "/home")) for b in bound)


def test_a_kept_home_is_bound_at_the_home_takes_no_tmpfs_and_is_shown_with_its_place(tmp_path: Path) -> None:
    kept = tmp_path / "homes" / "s"
    kept.mkdir(parents=True)
    plan = bwrap_plan(spec(tmp_path, home_source=str(kept)), [])
    assert (str(kept), "/root") in pairs(plan.argv, "--bind")
    assert "/root" not in [point for _, point in plan.tmpfs]  # on disk, not memory: not sized
    (home,) = [m for m in plan.mounts if m.path == "/root"]
    assert (home.mode, home.source) == (MountMode.READ_WRITE, str(kept))
    assert "kept across restarts" in home.why


@pytest.mark.parametrize("link", ["projects", "projects/deep"])
def test_a_link_the_server_left_in_its_kept_home_where_a_grant_goes_refuses_the_jail(tmp_path: Path, link: str) -> None:
    """A grant of /root/projects/deep is mounted through what the kept home holds at that path: a
    link there (made by the server at its last run) would put the grant elsewhere in the jail."""
    kept, grant = tmp_path / "homes" / "s", tmp_path / "grant"
    (kept / link).parent.mkdir(parents=True)
    grant.mkdir()
    (kept / link).symlink_to(tmp_path)
    home = str(tmp_path / "home")
    jail = spec(tmp_path, home=home, home_source=str(kept), read_only=(str(grant),))
    inside = Mount(f"{home}/projects/deep", MountMode.READ_ONLY, "a launcher", str(grant))
    with pytest.raises(JailError, match=f"{kept / link} in its kept home is a link"):
        bwrap_plan(jail, [inside])
    (kept / link).unlink()
    (kept / link).mkdir()  # the control: a directory there is where the grant goes
    assert bwrap_plan(jail, [inside]).argv


def test_only_the_environment_given_is_set(tmp_path: Path) -> None:
    argv = bwrap_plan(spec(tmp_path, env={"PATH": "/usr/bin", "A": "1"}), []).argv
    assert pairs(argv, "--setenv") == [("A", "1"), ("PATH", "/usr/bin")]


def test_grants_are_mounted_at_their_own_paths_with_their_modes(tmp_path: Path) -> None:
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    plan = bwrap_plan(spec(tmp_path, read_only=(str(ro),), read_write=(str(rw),)), [])
    assert (str(ro), str(ro)) in pairs(plan.argv, "--ro-bind")
    assert (str(rw), str(rw)) in pairs(plan.argv, "--bind")
    shown = {(m.path, m.mode, m.why) for m in plan.mounts}
    assert (str(ro), MountMode.READ_ONLY, "read_only") in shown
    assert (str(rw), MountMode.READ_WRITE, "read_write") in shown


def test_a_read_only_grant_inside_a_writable_one_is_mounted_after_it(tmp_path: Path) -> None:
    inner = tmp_path / "w" / "keep"
    inner.mkdir(parents=True)
    argv = bwrap_plan(spec(tmp_path, read_only=(str(inner),), read_write=(str(tmp_path / "w"),)), []).argv
    assert argv.index(str(tmp_path / "w")) < argv.index(str(inner))


def test_a_missing_grant_refuses_to_build_the_jail(tmp_path: Path) -> None:
    with pytest.raises(JailError, match=r"jail.read_only path .*nope does not exist"):
        bwrap_plan(spec(tmp_path, read_only=(str(tmp_path / "nope"),)), [])


def test_a_cwd_outside_the_grants_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JailError, match=r"cwd .* is not shared"):
        bwrap_plan(spec(tmp_path, cwd=str(tmp_path)), [])


def test_open_network_keeps_the_host_network_and_says_so(tmp_path: Path) -> None:
    plan = bwrap_plan(spec(tmp_path, network=Network.OPEN), [])
    assert "--unshare-net" not in plan.argv and plan.network is Network.OPEN


def test_launchers_are_read_only_and_the_egress_socket_has_a_fixed_place(tmp_path: Path) -> None:
    sock = tmp_path / "egress.sock"
    sock.touch()
    launcher = Mount(str(tmp_path), MountMode.READ_ONLY, "launcher")
    argv = bwrap_plan(spec(tmp_path, egress_socket=str(sock)), [launcher]).argv
    assert (str(tmp_path), str(tmp_path)) in pairs(argv, "--ro-bind")
    assert (str(sock), EGRESS_SOCKET) in pairs(argv, "--ro-bind")


def test_no_private_tmp_when_tmp_is_off(tmp_path: Path) -> None:
    argv = bwrap_plan(spec(tmp_path, tmp=False), []).argv
    assert ("--tmpfs", "/tmp") not in [(argv[i], argv[i + 1]) for i in range(len(argv) - 1)]


def test_only_the_home_tmp_and_dev_shm_take_writes_and_every_other_tmpfs_is_made_read_only(tmp_path: Path) -> None:
    granted, hidden = tmp_path / "granted", tmp_path / "granted" / "cellblock-state"
    hidden.mkdir(parents=True)
    plan = bwrap_plan(spec(tmp_path, read_write=(str(granted),), hidden={str(hidden): "Cellblock's state"}), [])
    argv = plan.argv
    assert [point for _, point in plan.tmpfs] == ["/dev/shm", "/tmp", "/root"]
    assert all(argv[at : at + 2] == ("--tmpfs", point) for at, point in plan.tmpfs)
    # bwrap's /dev (a tmpfs it cannot size), the emptied /proc dirs and Cellblock's own directories
    # shown empty: read-only, once everything inside them is mounted, before the command
    frozen = flags(argv, "--remount-ro")
    assert {*flags(argv, "--tmpfs"), "/dev"} - {"/dev/shm", "/tmp", "/root"} == set(frozen) - {"/"}
    assert str(hidden) in frozen and "/dev" in frozen
    assert argv.index("--remount-ro") > max(i for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--tmpfs"))
    writable = {m.path for m in plan.mounts if m.why.endswith("(tmpfs)")}
    assert writable == {"/dev/shm", "/tmp", "/root"}


SPAWNER_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")  # what the SDK's stdio spawner adds on POSIX


def flags(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_a_secret_reaches_the_environment_and_never_the_command_line(tmp_path: Path) -> None:
    secrets = {"API_TOKEN": "s3cret-value-41", "DB_PASSWORD": "pw-77"}
    plan = bwrap_plan(spec(tmp_path, env={"PATH": "/usr/bin", "A": "1"}), [], "bwrap", secrets, SPAWNER_ENV)
    assert not any(value in arg for arg in plan.argv for value in secrets.values())
    assert plan.env == {"PATH": "/usr/bin", "A": "1", **secrets}
    assert pairs(plan.argv, "--setenv") == [("A", "1"), ("PATH", "/usr/bin")]


def test_with_secrets_the_spawners_variables_are_unset_instead_of_clearing_all(tmp_path: Path) -> None:
    # --clearenv would drop the secrets, which reach bwrap only through its own environment
    argv = bwrap_plan(spec(tmp_path), [], "bwrap", {"TOKEN": "v"}, SPAWNER_ENV).argv
    assert "--clearenv" not in argv
    assert flags(argv, "--unsetenv") == sorted(SPAWNER_ENV)
    # unset first, then set: PATH is both the spawner's and the jail's own
    assert max(i for i, a in enumerate(argv) if a == "--unsetenv") < argv.index("--setenv")
    assert ("PATH", "/usr/bin") in pairs(argv, "--setenv")


def test_a_secret_named_like_a_spawner_variable_is_not_unset(tmp_path: Path) -> None:
    argv = bwrap_plan(spec(tmp_path), [], "bwrap", {"TERM": "v", "TOKEN": "w"}, SPAWNER_ENV).argv
    assert flags(argv, "--unsetenv") == sorted(set(SPAWNER_ENV) - {"TERM"})


@pytest.mark.parametrize("secrets", [None, {}])
def test_without_secrets_the_environment_is_cleared(tmp_path: Path, secrets: dict[str, str] | None) -> None:
    plan = bwrap_plan(spec(tmp_path), [], "bwrap", secrets, SPAWNER_ENV)
    assert "--clearenv" in plan.argv and "--unsetenv" not in plan.argv
    assert plan.env == {"PATH": "/usr/bin"}
    assert plan.argv.index("--clearenv") < plan.argv.index("--setenv")


def _sysctls(root: Path, **values: str) -> Path:
    for name, value in values.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return root


def test_the_namespace_hint_names_the_narrowest_fix_for_what_stops_bwrap(tmp_path: Path) -> None:
    # Ubuntu 23.10 and later: AppArmor, whose per-program profile is narrower than any sysctl
    ubuntu = namespace_hint(
        _sysctls(tmp_path / "ubuntu", kernel__apparmor_restrict_unprivileged_userns="1", user__max_user_namespaces="63")
    )
    assert "bwrap-userns-restrict" in ubuntu and "apparmor-profiles" in ubuntu
    assert ubuntu.index("bwrap-userns-restrict") < ubuntu.index("apparmor_restrict_unprivileged_userns=0")
    debian = namespace_hint(_sysctls(tmp_path / "debian", kernel__unprivileged_userns_clone="0"))
    assert "`sudo sysctl kernel.unprivileged_userns_clone=1`" in debian and "AppArmor" not in debian
    limited = namespace_hint(_sysctls(tmp_path / "limited", user__max_user_namespaces="0"))
    assert "`sudo sysctl user.max_user_namespaces=15000`" in limited
    lifted = namespace_hint(_sysctls(tmp_path / "lifted", kernel__apparmor_restrict_unprivileged_userns="0"))
    assert "sysctl" not in lifted and "namespace" in lifted  # nothing known stops it: no fix to guess


def test_a_tmpfs_a_grant_covers_is_neither_sized_nor_shown_as_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    plan = bwrap_plan(spec(tmp_path, home=str(home), read_write=(str(home), "/tmp")), [])
    # bwrap mounts the grants after the tmpfs mounts, over them: only /dev/shm is the jail's own
    assert [point for _, point in plan.tmpfs] == ["/dev/shm"]
    assert {m.path for m in plan.mounts if m.why.endswith("(tmpfs)")} == {"/dev/shm"}
    assert {"/tmp", str(home)} <= set(flags(plan.argv, "--tmpfs"))  # still made: nothing changes in the jail
    above = bwrap_plan(spec(tmp_path, home=str(home), read_only=(str(tmp_path),)), [])
    assert [point for _, point in above.tmpfs] == ["/dev/shm", "/tmp"]  # a grant above the home covers it
