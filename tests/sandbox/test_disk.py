"""sandbox/disk.py: what a tree takes on the disk, and the watch that ends an install past its cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cellblock.sandbox import disk
from cellblock.sandbox.disk import DiskWatch, tree_bytes

MIB = 1 << 20


def fill(path: Path, mib: int) -> None:
    with open(path, "wb") as handle:
        handle.write(b"\x01" * (mib * MIB))
        handle.flush()


def test_a_tree_takes_its_files_blocks_each_inode_once_and_nothing_for_a_hole(tmp_path: Path) -> None:
    fill(tmp_path / "a", 2)
    os.link(tmp_path / "a", tmp_path / "a-again")  # many links to one file do not fill the disk more
    (tmp_path / "deep" / "er").mkdir(parents=True)
    fill(tmp_path / "deep" / "er" / "b", 1)
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(512 * MIB)  # a hole of 512 MiB takes no block
    (tmp_path / "link").symlink_to("/usr")  # not followed
    assert 3 * MIB <= tree_bytes(str(tmp_path)) < 3 * MIB + (256 << 10)


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
