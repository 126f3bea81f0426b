"""Where a write runs code outside the jail (policy/grantrules.py): one copy for the gate and wrap."""

from __future__ import annotations

import pytest

from cellblock.policy.grantrules import hidden_part, program_dirs


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
