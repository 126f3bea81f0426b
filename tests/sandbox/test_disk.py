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


def nest(root: Path, names: list[str]) -> None:
    """Directories in `root`, each inside the one before, named `names`: made through descriptors,
    as an installer can, however long their path grows."""
    at = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.mkdir(name, dir_fd=at)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=at)
            os.close(at)
            at = inner
        os.close(os.open("last", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=at))
    finally:
        os.close(at)


def test_a_path_nested_past_what_the_kernel_opens_stops_the_install_naming_it_cut(tmp_path: Path) -> None:
    watch = DiskWatch(str(tmp_path), 4 * MIB)
    nest(tmp_path, ["d" * 200] * 30)  # 6,000 characters: past PATH_MAX, so no path reaches its end
    said = watch.measure() or ""
    assert said.startswith(f"it made {tmp_path}/ddd"), said
    assert "which the gateway cannot measure (File name too long)" in said
    assert len(said) < 500  # the path is cut, and says how long it was
    assert watch() is not None  # and it stays stopped


@pytest.mark.parametrize(
    "names",
    [["d"] * 1500, ["d" * 200] * 30],
    ids=["deeper-than-pythons-recursion", "longer-than-path-max"],
)
def test_a_tree_is_removed_whole_however_deep_it_is_nested(tmp_path: Path, names: list[str]) -> None:
    root = tmp_path / "staging"
    root.mkdir()
    (root / "top").write_text("x")
    nest(root, names)
    os.chmod(root / names[0], 0o300)  # a directory its owner may write but not list
    disk.remove_tree(str(root))
    assert not root.exists()
    assert list(tmp_path.iterdir()) == []  # nothing moved out of it is left beside it


def test_removing_a_tree_leaves_what_is_beside_it_and_where_its_links_lead(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "file").write_text("mine")
    root = tmp_path / "staging"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "link").symlink_to(tmp_path / "kept")
    (root / "a" / "b" / "file-link").symlink_to(tmp_path / "kept" / "file")
    disk.remove_tree(str(root))
    assert not root.exists()
    assert (tmp_path / "kept" / "file").read_text() == "mine"
    disk.remove_tree(str(tmp_path / "missing"))  # nothing there: nothing to do
    disk.remove_tree(str(tmp_path / "kept" / "file"))  # not a directory: left
    assert (tmp_path / "kept" / "file").exists()
