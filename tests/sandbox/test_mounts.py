"""sandbox/mounts.py: the mounts of the gateway's namespace, and where a bind mount shows a hidden
path again under another name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.sandbox.mounts import MountEntry, Mounts, mountinfo, named_again

# Run under `unshare -rm` (a mount namespace of its own): bind mounts, then what shown_again finds.
BIND = """
import json, subprocess, sys
from cellblock.sandbox.mounts import shown_again
real, alias, grant, nested, elsewhere = sys.argv[1:6]
subprocess.run(["mount", "--bind", real, alias], check=True)  # the grant is a second name for `real`
subprocess.run(["mount", "--bind", real, nested], check=True)  # a mount inside another grant
hidden = [real + "/ssh-Ab12/agent.1", real + "/ssh-Ab12", real + "/plain", elsewhere]
print(json.dumps([shown_again([alias], hidden), shown_again([grant], hidden), shown_again([real], hidden)]))
"""


def test_the_mounts_are_read_with_their_escapes_undone() -> None:
    mounts = mountinfo()
    assert any(m.point == "/" for m in mounts) and all(m.point.startswith("/") for m in mounts)
    assert any(m.fstype == "proc" and m.point == "/proc" for m in mounts)


def test_a_hidden_path_is_found_where_a_bind_mount_shows_it_under_another_name(tmp_path: Path) -> None:
    """A grant that is a bind mount of a directory on a hidden path's way, or holds one, shows it
    again; the control: a grant that shows it by its own name adds nothing (it is hidden there by
    name), and what is not on a hidden path's way is not taken."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount")
    real, alias, grant, elsewhere = tmp_path / "run", tmp_path / "alias", tmp_path / "grant", tmp_path / "else"
    for directory in (real / "ssh-Ab12", alias, grant / "deep" / "mnt", elsewhere):
        directory.mkdir(parents=True)
    (real / "ssh-Ab12" / "agent.1").touch()
    (real / "plain").touch()
    nested = grant / "deep" / "mnt"
    argv = ["unshare", "-rm", sys.executable, "-c", BIND, *map(str, (real, alias, grant, nested, elsewhere))]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ, timeout=60)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    through_alias, through_nested, by_name = json.loads(done.stdout)
    assert through_alias == {
        f"{alias}/ssh-Ab12/agent.1": f"{real}/ssh-Ab12/agent.1",
        f"{alias}/ssh-Ab12": f"{real}/ssh-Ab12",
        f"{alias}/plain": f"{real}/plain",
    }
    assert through_nested == {
        f"{nested}/ssh-Ab12/agent.1": f"{real}/ssh-Ab12/agent.1",
        f"{nested}/ssh-Ab12": f"{real}/ssh-Ab12",
        f"{nested}/plain": f"{real}/plain",
    }
    assert by_name == {}


def mount(id: int, parent: int, point: str, device: int, root: str = "/") -> MountEntry:
    return MountEntry(root, point, "x", "x", "rw", id, parent, device)


# the root; /dev with /dev/shm mounted twice over (the later on top); /a/b, then /a mounted over its
# directory above (hiding /a/b); /srv/alias, a bind mount of /home/u/state of the root's file system
TREE = Mounts(
    [
        mount(1, 0, "/", 10),
        mount(2, 1, "/dev", 20),
        mount(3, 2, "/dev/shm", 30),
        mount(4, 3, "/dev/shm", 40),
        mount(5, 1, "/a/b", 50),
        mount(6, 1, "/a", 60),
        mount(7, 1, "/srv/alias", 10, root="/home/u/state"),
    ]
)


def test_a_path_is_on_the_mount_a_lookup_of_it_reaches() -> None:
    assert {path: getattr(TREE.at(path), "id", None) for path in ("/", "/dev", "/dev/shm/x", "/a/b/c", "/home/u")} == {
        "/": 1,
        "/dev": 2,
        "/dev/shm/x": 4,  # the one on top
        "/a/b/c": 6,  # /a/b is under /a, mounted later over its directory above
        "/home/u": 1,
    }
    assert [m.id for m in TREE.inside("/")] == [6, 2, 4, 7]
    assert TREE.inside("/dev/shm") == [] and Mounts([]).at("/x") is None


def test_a_bind_mount_is_a_second_name_of_the_place_it_shows() -> None:
    assert TREE.where("/srv/alias/sub") == TREE.where("/home/u/state/sub") == (10, "/home/u/state/sub")
    assert named_again("/srv/alias", ["/home/u/state"], TREE) == "/home/u/state"
    assert named_again("/srv/alias/sub", ["/home/u/state"], TREE) == "/home/u/state"
    # by its own name, a parent of it, or the same path on another file system: no second name
    assert named_again("/home/u/state/sub", ["/home/u/state"], TREE) is None
    assert named_again("/srv", ["/home/u/state"], TREE) is None
    assert named_again("/dev/shm/home/u/state", ["/home/u/state"], TREE) is None
