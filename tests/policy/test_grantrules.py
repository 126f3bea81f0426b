"""Where a write runs code outside the jail (policy/grantrules.py): one copy for the gate and wrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellblock.policy.grantrules import held_runner, hidden_part, home_tool_config, program_dirs


@pytest.mark.parametrize(
    ("path", "hidden"),
    [
        ("/home/u/.bashrc", ".bashrc"),
        ("/home/u/p/.git/hooks", ".git"),
        ("/home/u/notes", None),
        (".config/x", ".config"),
    ],
)
def test_the_first_hidden_entry_on_a_paths_way_is_named(path: str, hidden: str | None) -> None:
    assert hidden_part(path) == hidden


def test_program_folders_are_the_systems_each_homes_own_and_each_absolute_one_on_the_path() -> None:
    found = program_dirs(["/home/u"], "/home/u/.venv/bin:relative/bin:/usr/bin")
    assert {"/usr", "/etc", "/opt", "/home/u/bin", "/home/u/Library", "/home/u/.venv/bin"} <= set(found)
    assert "relative/bin" not in found and len(found) == len(set(found))


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (".git/hooks", ".git"),
        (".git", ".git"),  # a worktree's pointer to its repository, a file
        (".vscode/tasks.json", ".vscode"),
        (".claude/settings.json", ".claude"),
        (".envrc", ".envrc"),
        (".mcp.json", ".mcp.json"),
        ("bin/tool", "bin"),
        ("venv/pyvenv.cfg", "venv"),
    ],
)
def test_a_folder_holding_what_runs_code_outside_the_jail_names_the_entry(
    tmp_path: Path, entry: str, named: str
) -> None:
    (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / entry).write_text("x\n")
    held = held_runner(str(tmp_path))
    assert held is not None and str(tmp_path / named) in held
    if named == ".git":  # a repository's folder, or a worktree's pointer to one (a file)
        assert ("pointer" in held) == (entry == ".git"), held


def test_a_folder_inside_a_virtualenv_is_one_of_its_programs(tmp_path: Path) -> None:
    (tmp_path / "env" / "lib" / "site-packages").mkdir(parents=True)
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert "virtualenv" in (held_runner(str(tmp_path / "env" / "lib" / "site-packages")) or "")


def test_control_a_folder_of_plain_files_or_nothing_holds_nothing_that_runs(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("x\n")
    (tmp_path / "notes" / ".gitignore").write_text("x\n")  # a hidden file no tool runs
    assert held_runner(str(tmp_path / "notes")) is None
    assert held_runner(str(tmp_path / "not-yet")) is None


def test_names_tools_read_upward_are_refused_only_in_the_home_itself() -> None:
    assert "package.json" in (home_tool_config("/home/u/package.json", ["/home/u"]) or "")
    assert home_tool_config("/home/u/app/package.json", ["/home/u"]) is None
    assert home_tool_config("/home/u/notes.txt", ["/home/u"]) is None


def test_a_homes_well_known_program_folders_are_program_folders_off_the_path() -> None:
    found = program_dirs(["/home/u"], "/usr/bin")
    assert {"/home/u/go/bin", "/home/u/.cargo/bin", "/home/u/miniconda3", "/home/u/.local/bin"} <= set(found)
