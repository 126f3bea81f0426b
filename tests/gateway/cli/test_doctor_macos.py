"""`cellblock doctor` on macOS: how it reports its self-test profile. Only the process runner is
substituted (the platform is pretended); tests/macos runs the real sandbox-exec on a Mac."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from cellblock.gateway.cli.doctor import doctor
from cellblock.sandbox.types import LaunchPlan

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
DENIED = "cat: decoy: Operation not permitted"

# what the jailed program does: (status, stdout, stderr), or an exception raised starting it
Outcome = tuple[int, str, str] | Exception


def program(argv: list[str]) -> str:
    """The program a sandbox-exec command line runs: past `-p PROFILE` and each `-D NAME=VALUE`."""
    at = 1
    while argv[at] in ("-p", "-D"):
        at += 2
    return argv[at]


def runner(
    true: Outcome, cat: Outcome, plans: list[LaunchPlan]
) -> Callable[[LaunchPlan], subprocess.CompletedProcess[str]]:
    """A runner that answers jailed plans with the outcomes given, and runs unjailed ones for real."""

    def run(plan: LaunchPlan) -> subprocess.CompletedProcess[str]:
        plans.append(plan)
        if plan.argv[0] != SANDBOX_EXEC:
            return subprocess.run(plan.argv, capture_output=True, text=True, check=False)
        outcome = true if program(list(plan.argv)) == "/usr/bin/true" else cat
        if isinstance(outcome, Exception):
            raise outcome
        return subprocess.CompletedProcess(plan.argv, outcome[0], outcome[1], outcome[2])

    return run


@pytest.fixture(autouse=True)
def on_a_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")


def test_a_working_jail_is_reported_ok_with_both_checks(capsys: pytest.CaptureFixture[str]) -> None:
    plans: list[LaunchPlan] = []
    doctor(None, run=runner((0, "", ""), (1, "", DENIED), plans))
    out = capsys.readouterr().out
    assert "OK    self-test profile: /usr/bin/true started" in out
    assert f"OK    self-test decoy: a jailed cat could not read a file outside it ({DENIED})" in out
    # both jails are built by the servers' own launch code, the control runs plainly
    jailed = [p for p in plans if p.argv[0] == SANDBOX_EXEC]
    assert [program(list(p.argv)) for p in jailed] == ["/usr/bin/true", "/bin/cat"] and len(plans) == 3
    assert all(p.argv[1] == "-p" and "(deny default)" in p.argv[2] for p in jailed)


@pytest.mark.parametrize(
    ("true", "cat", "failure"),
    [
        (FileNotFoundError(SANDBOX_EXEC), (1, "", DENIED), f"FAIL  sandbox-exec: {SANDBOX_EXEC} not found"),
        (
            (134, "", "dyld: Library not loaded\nabort"),
            (1, "", DENIED),
            "FAIL  self-test profile: /usr/bin/true exited 134 in the jail: abort",
        ),
        (
            subprocess.TimeoutExpired("sandbox-exec", 30),
            (1, "", DENIED),
            "FAIL  self-test profile: sandbox-exec did not run",
        ),
        ((0, "", ""), (0, "cellblock doctor decoy\n", ""), "FAIL  self-test decoy: a jailed cat read"),
    ],
    ids=["no sandbox-exec", "nothing starts", "hangs", "the decoy leaks"],
)
def test_each_failure_is_reported_and_fails_doctor(
    capsys: pytest.CaptureFixture[str], true: Outcome, cat: Outcome, failure: str
) -> None:
    status = doctor(None, run=runner(true, cat, []))
    out = capsys.readouterr().out
    assert failure in out and status == 1, out
