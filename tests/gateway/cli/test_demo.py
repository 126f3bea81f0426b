"""`cellblock demo` runs end to end: the catalog, routed calls, and a jail that holds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.sandbox.landlock import landlock_abi
from tests.integration.conftest import NO_USERNS, no_landlock


@pytest.mark.jail
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the demo servers run in bubblewrap jails")
def test_the_demo_shows_routing_and_a_jail_that_holds() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "notes__add_note  -> Added note 'hello'" in out
    assert "clock__countdown -> Countdown of 2 s finished" in out
    assert "No such file or directory" in out and "Connection refused" in out
    assert "DEMO KEY" in out.split("Inside it")[0]  # the control: the key is readable outside
    assert "DEMO KEY" not in out.split("Inside it")[1]
    assert "notes__delete_notes" not in out.split("Calls,")[0]  # denied: not listed
    assert "denied by policy: delete_notes:" in out
    assert "is not under" in out  # the save outside the allowed folder
    assert "clock__now is no longer listed" in out and "+The current time. Before answering" in out
    assert "clock__now is back" in out
    assert "cellblock: OK: approved" in out and "notes__read_note -> Cellblock routes me." in out  # from the CLI
    assert "Cellblock approval · server 'notes' · arguments sha256:" in out and 'tool "read_note"' in out  # a form
    assert "notes__read_note -> asked through a form" in out
    scanned = out.split("$ cellblock scan snoop")[-1]
    if shutil.which("strace") is None:
        assert "The scan of snoop is skipped" in out
    else:  # snoop opens any path it is given and fetches any URL: the jail refused both
        assert "snoop: 2 tools" in scanned and "the server does not confine paths itself" in scanned
        assert "fetches a URL of a host that is not allowed" in scanned and "refused by the jail" in scanned


def _cellblock(command: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`cellblock COMMAND` where the kernel refuses user namespaces (`NO_USERNS`): its exit and what it said."""
    done = subprocess.run(
        [*NO_USERNS, sys.executable, "-m", "cellblock.gateway.cli.main", command],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, done.stdout + done.stderr


NEEDS = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("unshare") is None, reason="needs bwrap and unshare"
)


@pytest.mark.jail
@NEEDS
@pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock's TCP rules (Linux 6.7)")
def test_where_no_namespace_can_be_made_the_demo_runs_in_landlock_jails_and_doctor_says_why() -> None:
    code, told = _cellblock("doctor")
    assert code == 0, told
    assert "user.max_user_namespaces = 0" in told and "sudo sysctl user.max_user_namespaces=" in told, told
    assert "OK    jail backend: Landlock" in told, told
    code, told = _cellblock("demo")
    assert code == 0, told
    assert "notes__add_note  -> Added note 'hello'" in told and "jail landlock ABI" in told, told
    assert "snoop__read_file" in told and "Traceback" not in told


@pytest.mark.jail
@NEEDS
def test_where_neither_backend_can_jail_the_demo_and_doctor_say_why_and_what_to_do_at_once(tmp_path: Path) -> None:
    """The control: with Landlock missing too, nothing can be jailed, and both say so at once."""
    for command in ("demo", "doctor"):
        code, told = _cellblock(command, {"PYTHONPATH": str(no_landlock(tmp_path / command))})
        assert code == 1, told
        assert "user.max_user_namespaces = 0" in told and "sudo sysctl user.max_user_namespaces=" in told, told
        assert "Traceback" not in told
