"""`cellblock show` and `cellblock doctor`: what they report, and what they must never print."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.sandbox.landlock import landlock_abi
from tests.integration.conftest import NO_USERNS, no_landlock

HOME = os.path.expanduser("~")


def cellblock(
    *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "cellblock.gateway.cli.main", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""version: 1
servers:
  jailed:
    command: {sys.executable}
    env: {{API_TOKEN: "tok-never-shown"}}
    jail: {{read_only: ["{shared}"]}}
  thrown:
    command: {sys.executable}
    jail: {{read_only: ["{shared}"], home: throwaway}}
  loose:
    command: {sys.executable}
    jail: false
    tools: {{default: deny}}
    resources: {{rules: {{"note://*": allow}}}}
  missing:
    command: {sys.executable}
    jail: {{read_write: ["{tmp_path / "nope"}"]}}
  web:
    url: https://example.com/mcp
"""
    )
    return path


def test_show_lists_every_mount_and_never_an_env_value(config: Path) -> None:
    done = cellblock("show", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    servers = {s["name"]: s for s in json.loads(done.stdout)}
    jailed = servers["jailed"]
    assert jailed["network"] == "none"
    mounts = {(m["path"], m["mode"], m["why"]) for m in jailed["mounts"]}
    assert (str(config.parent / "shared"), "ro", "read_only") in mounts
    # its home is a directory of its own, kept across restarts in Cellblock's data directory
    kept = jailed["home"]
    assert (
        kept.endswith("/cellblock/homes/jailed")
        and (HOME, "rw", f"private home, its own, kept across restarts ({kept})") in mounts
    )
    # of the home directory only launcher installations are shared, never the home itself
    assert not any(p == HOME and not why.startswith("private home") for p, _, why in mounts)
    # a throw-away home is sized within the default memory limit of 4 GiB (/tmp half, the home and
    # /dev/shm a quarter each, a sixteenth of which is for the kernel's part of their files)
    thrown = {(m["path"], m["mode"], m["why"]) for m in servers["thrown"]["mounts"]}
    assert (HOME, "rw", "private empty home (tmpfs), at most 960 MiB in 32,768 files") in thrown
    assert ("/tmp", "rw", "private /tmp (tmpfs), at most 1920 MiB in 65,536 files") in thrown
    assert servers["thrown"]["home"].startswith("throwaway")
    assert "API_TOKEN" in jailed["env"] and "tok-never-shown" not in done.stdout
    if sys.platform.startswith("linux"):
        assert jailed["seccomp"].startswith("on: refuses the kernel keyring")
    assert servers["loose"]["jail"].startswith("OFF")
    assert "does not exist" in servers["missing"]["error"]
    assert servers["web"]["kind"] == "remote"
    assert jailed["learn"] is None


def test_show_says_whether_a_server_learns(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\nservers:\n  l:\n    command: {sys.executable}\n    learn: true\n    jail: {{}}\n")
    done = cellblock("show", "--config", str(config), "l")
    assert done.returncode == 0, done.stderr
    if shutil.which("strace") is not None and sys.platform.startswith("linux"):
        assert "  learn    traced while serving (strace, outside the jail); cellblock scan l --from" in done.stdout
    else:
        assert "  learn    NOT LEARNING: strace is not installed" in done.stdout


def test_show_text_marks_the_unjailed_server(config: Path) -> None:
    done = cellblock("show", "--config", str(config), "loose")
    assert done.returncode == 0
    assert "jail     OFF (jail: false)" in done.stdout


def test_show_gives_the_effective_prompt_and_resource_policy(config: Path) -> None:
    done = cellblock("show", "--config", str(config), "loose")
    assert done.returncode == 0
    # no prompts section: the tools default; a resources section without a default: the same
    assert "policy   tools: default deny" in done.stdout and "policy   prompts: default deny" in done.stdout
    assert "policy   resources: default deny\n  rule     note://*: allow" in done.stdout


def test_show_of_an_unknown_server_is_a_usage_error(config: Path) -> None:
    done = cellblock("show", "--config", str(config), "ghost")
    assert done.returncode == 2 and "no server named 'ghost'" in done.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_doctor_passes_where_jails_work() -> None:
    done = cellblock("doctor")
    assert done.returncode == 0, done.stdout
    assert "OK    trial jail" in done.stdout


# what pyseccomp itself raises on import when ctypes finds no libseccomp
NO_LIBSECCOMP = 'raise RuntimeError("Unable to find libseccomp")\n'


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the seccomp filter is Linux's")
def test_doctor_fails_and_says_what_to_install_without_libseccomp(tmp_path: Path) -> None:
    (tmp_path / "pyseccomp.py").write_text(NO_LIBSECCOMP)
    done = cellblock("doctor", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1
    # neither backend can run without the filter: bubblewrap's trial fails, and Landlock is refused
    assert "WARN  bubblewrap: cannot build jails here: trial jail" in done.stdout, done.stdout
    assert "FAIL  jail backend: none" in done.stdout and "apt-get install libseccomp2" in done.stdout


@pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock's TCP rules to hold a network: none jail")
def test_doctor_without_bwrap_says_what_to_install_and_that_landlock_jails_servers_instead(tmp_path: Path) -> None:
    done = cellblock("doctor", env={"PATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout
    assert "WARN  bubblewrap: cannot build jails here: not installed: apt-get install bubblewrap" in done.stdout
    assert f"OK    jail backend: Landlock, ABI {landlock_abi()}" in done.stdout and "not enforced here: " in done.stdout
    assert "network: allowlist and ask" not in done.stdout  # the gateway can make its jails' connections here


@pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock's TCP rules to hold a network: none jail")
def test_doctor_fails_where_its_trial_landlock_jail_cannot_lock_itself_down(tmp_path: Path) -> None:
    """The trial is a real jail: planned for an ABI this kernel lacks (the gateway told 99, its launcher
    asking the kernel itself), it does not start, and doctor says so in the launcher's words."""
    folder = tmp_path / "abi-99"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import cellblock.sandbox.landlock as landlock\nlandlock.landlock_abi = lambda: 99\n"
    )
    done = cellblock("doctor", env={"PATH": str(tmp_path), "PYTHONPATH": str(folder)})
    assert done.returncode == 1, done.stdout
    assert "FAIL  jail backend: none: bubblewrap cannot build jails here, nor Landlock" in done.stdout, done.stdout
    assert "the trial Landlock jail failed: cellblock-landlock: cannot lock the jail down" in done.stdout
    assert f"this kernel has Landlock ABI {landlock_abi()}, and the jail was planned for ABI 99" in done.stdout


@pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock's TCP rules to hold a network: none jail")
def test_doctor_on_landlock_warns_where_the_gateway_cannot_make_a_jails_connections(tmp_path: Path) -> None:
    """As in a container whose seccomp profile refuses pidfd_getfd: allowlist servers cannot start."""
    folder = tmp_path / "no-gate"
    folder.mkdir()
    refused = "pidfd_getfd is refused here (Operation not permitted)"
    (folder / "sitecustomize.py").write_text(
        f"import cellblock.sandbox.connects as connects\nconnects.gate_missing = lambda: {refused!r}\n"
    )
    done = cellblock("doctor", env={"PATH": str(tmp_path), "PYTHONPATH": str(folder)})
    assert done.returncode == 0, done.stdout  # the other servers still start
    assert f"WARN  network: allowlist and ask: servers with them will not start here, {refused}" in done.stdout


def test_doctor_fails_without_bwrap_where_landlock_cannot_stand_in(tmp_path: Path) -> None:
    """The control: with Landlock missing too (an unknown system call where the ABI is asked), no jail."""
    done = cellblock("doctor", env={"PATH": str(tmp_path), "PYTHONPATH": str(no_landlock(tmp_path))})
    assert done.returncode == 1, done.stdout
    assert "apt-get install bubblewrap" in done.stdout and "FAIL  jail backend: none" in done.stdout


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs the tests to run from a virtualenv")
def test_show_says_what_each_launcher_mount_is_and_why(config: Path) -> None:
    done = cellblock("show", "--config", str(config), "jailed")
    assert done.returncode == 0, done.stderr
    # the server's command is this virtualenv's python: the virtualenv is shared, and says so
    assert f"mount    ro  {sys.prefix}  [virtualenv, for the command itself]" in done.stdout


@pytest.mark.skipif(landlock_abi() < 4 or shutil.which("unshare") is None, reason="needs Landlock's TCP rules")
def test_show_where_namespaces_are_refused_names_the_landlock_jail_and_what_it_lacks(
    config: Path, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    done = cellblock("show", "--config", str(config), "jailed", prefix=NO_USERNS, env={"XDG_RUNTIME_DIR": str(runtime)})
    assert done.returncode == 0, done.stderr
    assert f"  jail     Landlock, ABI {landlock_abi()}" in done.stdout, done.stdout
    assert "  lacks    other processes are visible" in done.stdout
    # shown, never run: nothing it would have made for a start is left behind
    assert not [p for p in runtime.rglob("*") if p.name.startswith(("home.", "tmp."))]
    plain = cellblock("show", "--config", str(config), "jailed")
    assert "  jail     bubblewrap" in plain.stdout and "  lacks " not in plain.stdout  # the control


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="limits are enforced on Linux")
def test_show_prints_each_limit_and_what_enforces_it_here(config: Path) -> None:
    from cellblock.sandbox.limits import enforcement

    how = enforcement()
    done = cellblock("show", "--config", str(config), "jailed")
    assert done.returncode == 0, done.stderr
    assert f"  limits   processes 512: {how.processes.how}\n" in done.stdout
    assert f"  limits   memory 4 GiB: {how.memory.how}\n" in done.stdout
    shown = json.loads(cellblock("show", "--config", str(config), "--json").stdout)
    limits = {s["name"]: s.get("limits") for s in shown}
    assert limits["jailed"] == {
        "processes": 512,
        "memory": 4 << 30,
        "processes_by": how.processes.how,
        "memory_by": how.memory.how,
    }
    assert limits["loose"] is None and limits["web"] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="limits are enforced on Linux")
def test_doctor_says_what_enforces_a_jails_limits_here() -> None:
    from cellblock.sandbox.limits import enforcement

    how = enforcement()
    done = cellblock("doctor")
    processes = "FAIL" if how.processes.mechanism.value == "none" else "OK  "
    assert f"{processes}  process limit: {how.processes.how}\n" in done.stdout
    assert f"  memory limit: {how.memory.how}\n" in done.stdout


def test_show_and_doctor_warn_of_a_launcher_the_jail_cannot_run(tmp_path: Path) -> None:
    shim = tmp_path / "home" / ".pyenv" / "shims" / "python3"
    shim.parent.mkdir(parents=True)
    shim.write_text('#!/bin/sh\nexec pyenv exec python3 "$@"\n')
    shim.chmod(0o755)
    path = tmp_path / "c.yaml"
    path.write_text(f"version: 1\nservers:\n  shimmed:\n    command: {shim}\n")
    shown = cellblock("show", "--config", str(path))
    assert f"  warning  {shim} is a version manager's shim" in shown.stdout, shown.stdout
    doctor = cellblock("doctor", "--config", str(path))
    assert f"WARN  server 'shimmed': {shim} is a version manager's shim" in doctor.stdout, doctor.stdout
