"""sandbox/disk.py: what a tree takes on the disk, and the watch that ends an install past its cap."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import disk
from cellblock.sandbox.disk import ENTRY_BYTES, DiskWatch, tree_bytes

MIB = 1 << 20


def fill(path: Path, mib: int) -> None:
    with open(path, "wb") as handle:
        handle.write(b"\x01" * (mib * MIB))
        handle.flush()


def test_a_tree_takes_its_files_blocks_or_length_each_inode_once_and_a_block_at_least_per_entry(
    tmp_path: Path,
) -> None:
    fill(tmp_path / "a", 2)
    os.link(tmp_path / "a", tmp_path / "a-again")  # many links to one file do not fill the disk more
    (tmp_path / "deep" / "er").mkdir(parents=True)
    fill(tmp_path / "deep" / "er" / "b", 1)
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(8 * MIB)  # no block, but whatever reads the tree reads 8 MiB
    (tmp_path / "link").symlink_to("/usr")  # not followed
    (tmp_path / "empty").touch()  # an inode and no block
    # 11 MiB of files, and a block each for the two directories, the link and the empty file
    entries = 4 * ENTRY_BYTES
    assert 11 * MIB + entries <= tree_bytes(str(tmp_path)) < 11 * MIB + entries + (64 << 10)


def test_a_million_empty_files_would_each_count_a_block(tmp_path: Path) -> None:
    for i in range(1000):
        (tmp_path / str(i)).touch()
    assert tree_bytes(str(tmp_path)) == 1000 * ENTRY_BYTES  # not 0


def test_the_watch_says_why_once_the_tree_is_past_its_cap_and_not_before(tmp_path: Path) -> None:
    watch = DiskWatch(str(tmp_path), 4 * MIB)
    fill(tmp_path / "a", 3)
    assert watch() is None
    fill(tmp_path / "b", 2)  # the file system grew past the room left: the tree is measured at once
    assert watch() == "it wrote more than its disk limit of 4 MiB (limits.disk)"


def test_growth_the_file_system_does_not_show_is_still_found_by_the_next_measure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "_used", lambda path: 0)  # as if another program freed as much meanwhile
    watch = DiskWatch(str(tmp_path), 4 * MIB)
    fill(tmp_path / "a", 5)
    assert watch() is None  # the file system shows nothing: no measure yet
    monkeypatch.setattr(disk.time, "monotonic", lambda: float("inf"))  # a second later
    assert watch() is not None


def test_empty_files_are_seen_at_once_by_the_file_systems_count_of_inodes(tmp_path: Path) -> None:
    watch = DiskWatch(str(tmp_path), 4 * MIB)
    for i in range(2000):  # 8 MiB at a block each, and (nearly) no block taken
        (tmp_path / str(i)).touch()
    assert watch() == "it wrote more than its disk limit of 4 MiB (limits.disk)"  # not a second later


def test_a_step_that_has_ended_is_measured_once_more_whatever_the_file_system_showed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "_used", lambda path: 0)
    watch = DiskWatch(str(tmp_path), 4 * MIB)
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(8 * MIB)
    assert watch() is None  # between looks: nothing shows yet
    assert watch.measure() == "it wrote more than its disk limit of 4 MiB (limits.disk)"


def test_a_directory_the_watch_cannot_look_into_stops_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = DiskWatch(str(tmp_path), 4 * MIB)
    (tmp_path / "hidden").mkdir()
    listed = os.scandir

    def scandir(path: str) -> Any:
        if path.endswith("hidden"):  # as a user's gateway meets a directory of mode 0300
            raise PermissionError(13, "Permission denied", path)
        return listed(path)

    monkeypatch.setattr(disk.os, "scandir", scandir)
    hidden = str(tmp_path / "hidden")
    assert (watch.measure() or "").startswith(f"it made {hidden}, a directory it keeps the gateway from looking into")
    assert watch() is not None  # and it stays stopped
