"""`make_dirs`: the directories Cellblock makes get their mode whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellblock.policy.files import atomic_write_bytes, make_dirs


@pytest.fixture(params=[0o002, 0o022, 0o077])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_directory_made_gets_the_mode_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    make_dirs(tmp_path / "home" / ".local" / "state" / "cellblock")
    made = [tmp_path / "home", tmp_path / "home/.local", tmp_path / "home/.local/state"]
    assert [mode(p) for p in [*made, tmp_path / "home/.local/state/cellblock"]] == [0o700] * 4


def test_mkdir_with_parents_leaves_the_umasks_mode_on_the_parents(tmp_path: Path) -> None:
    """The control: what Cellblock did before, under Ubuntu's umask for users."""
    old = os.umask(0o002)
    try:
        (tmp_path / ".local" / "state" / "cellblock").mkdir(mode=0o700, parents=True)
    finally:
        os.umask(old)
    assert mode(tmp_path / ".local" / "state") == 0o775


def test_a_directory_that_was_there_keeps_its_mode(tmp_path: Path, umask: int) -> None:
    mine = tmp_path / ".local"
    mine.mkdir()
    mine.chmod(0o755)
    make_dirs(mine / "share" / "cellblock", 0o700)
    make_dirs(mine, 0o700)
    assert (mode(mine), mode(mine / "share"), mode(mine / "share" / "cellblock")) == (0o755, 0o700, 0o700)


def test_a_file_on_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        make_dirs(tmp_path / "file")
    with pytest.raises(OSError):
        make_dirs(tmp_path / "file" / "below")


def test_an_atomic_write_makes_its_missing_directories_private(tmp_path: Path, umask: int) -> None:
    atomic_write_bytes(tmp_path / "config" / "cellblock" / "cellblock.yaml", b"version: 1\n")
    assert (mode(tmp_path / "config"), mode(tmp_path / "config" / "cellblock")) == (0o700, 0o700)
