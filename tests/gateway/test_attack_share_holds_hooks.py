"""Hostile: a call names a file in a repository, and the share it asks for is the repository read-write,
`.git/hooks` and a virtualenv's `bin` inside it: code the user runs outside the jail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cellblock.gateway.scan.shares import ShareGate
from cellblock.policy.pathargs import grant_for, on_disk, path_arguments


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    repo = home / "code" / "app"
    (repo / ".git" / "hooks").mkdir(parents=True)
    (repo / "venv" / "bin").mkdir(parents=True)
    (repo / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / "venv" / "bin" / "activate").write_text("# sourced by the user's shell\n")
    (repo / "README.md").write_text("x\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a client's PATH
    return home


@pytest.mark.xfail(
    strict=True,
    reason="the gate refuses a writable grant that IS or is INSIDE a hidden entry, never one that HOLDS one: "
    "a file named in a repository shares the repository read-write, its .git/hooks with it",
)
def test_a_share_a_call_asks_for_never_makes_a_repositorys_hooks_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, monkeypatch)
    (argument,) = path_arguments({"path": "~/code/app/README.md"}, str(home))
    grant = grant_for(argument.path, str(home), True, on_disk)
    assert grant is not None and grant.write
    why = ShareGate(None).check(grant.path, grant.write, [])
    hooks = home / "code" / "app" / ".git" / "hooks"
    # shared read-write and holding the hooks: the server writes pre-commit, the user's next commit runs it
    assert why is not None or not os.path.realpath(hooks).startswith(os.path.realpath(grant.path) + "/")


@pytest.mark.xfail(
    strict=True,
    reason="a virtualenv's bin is a folder of programs the user runs (activate, python) but is not on the "
    "gateway's PATH: the gate shares it read-write",
)
def test_a_share_a_call_asks_for_never_makes_a_virtualenvs_programs_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, monkeypatch)
    (argument,) = path_arguments({"out": str(home / "code/app/venv/bin/activate")}, str(home))
    grant = grant_for(argument.path, str(home), True, on_disk)
    assert grant is not None and grant.path == str(home / "code/app/venv/bin")
    assert ShareGate(None).check(grant.path, grant.write, []) is not None


def test_the_control_the_gate_refuses_the_hooks_folder_named_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, monkeypatch)
    (argument,) = path_arguments({"path": "~/code/app/.git/hooks/pre-commit"}, str(home))
    grant = grant_for(argument.path, str(home), True, on_disk)
    assert grant is not None
    assert ShareGate(None).check(grant.path, grant.write, []) is not None
