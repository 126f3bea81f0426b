"""Launcher discovery: what of an interpreter's installation is shared, and what never is."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cellblock.sandbox.launchers import launcher_mounts, resolve_command
from cellblock.sandbox.types import JailError


def paths(executable: str, home: str, search: str = "/usr/bin") -> list[str]:
    return [m.path for m in launcher_mounts(executable, home, search)]


def make_prefix(root: Path, name: str = "python3") -> Path:
    (root / "bin").mkdir(parents=True)
    binary = root / "bin" / name
    binary.write_text("")
    binary.chmod(0o755)
    return binary


def test_an_interpreter_under_home_shares_its_prefix_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    binary = make_prefix(home / ".pyenv" / "versions" / "3.11.7")
    assert paths(str(binary), str(home)) == [str(home / ".pyenv" / "versions" / "3.11.7")]


def test_a_virtualenv_shares_itself_and_its_base_interpreter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = make_prefix(home / ".pyenv" / "versions" / "3.11.7")
    venv = tmp_path / "proj" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base.parent}\n")
    (venv / "bin" / "python").symlink_to(base)
    shared = paths(str(venv / "bin" / "python"), str(home))
    assert str(venv) in shared and str(base.parent.parent) in shared
    assert str(home) not in shared


def test_a_script_shares_its_interpreter_through_its_shebang(tmp_path: Path) -> None:
    home = tmp_path / "home"
    node = make_prefix(home / ".nvm" / "versions" / "node" / "v24", "node")
    script = tmp_path / "tool" / "bin" / "cli"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!{node}\nconsole.log(1)\n")
    shared = paths(str(script), str(home))
    assert str(home / ".nvm" / "versions" / "node" / "v24") in shared


def test_env_shebangs_are_resolved_on_the_search_path(tmp_path: Path) -> None:
    home = tmp_path / "home"
    node = make_prefix(tmp_path / "opt" / "node", "node")
    script = tmp_path / "s" / "cli"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env -S node --flag\n")
    assert str(tmp_path / "opt" / "node") in paths(str(script), str(home), search=str(node.parent))


@pytest.mark.parametrize("where", ["", ".local", "bin"])
def test_a_program_directly_in_home_never_shares_the_home(tmp_path: Path, where: str) -> None:
    home = tmp_path / "home"
    folder = home / where / "bin" if where == ".local" else home / where if where else home
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "uvx"
    binary.write_text("")
    binary.chmod(0o755)
    assert paths(str(binary), str(home)) == [str(binary)]


def test_system_programs_need_no_mount() -> None:
    assert paths("/usr/bin/env", "/root") == []


def test_this_pythons_installation_is_found() -> None:
    shared = paths(sys.executable, os.path.expanduser("~"))
    real = os.path.realpath(sys.executable)
    assert any(real.startswith(p) for p in shared) or real.startswith("/usr/")


def test_an_unknown_command_is_refused() -> None:
    with pytest.raises(JailError, match="command not found"):
        resolve_command("surely-not-a-command-xyz", "/usr/bin")
