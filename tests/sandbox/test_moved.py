"""The search of a jail's grants for listeners whose files are not where they were bound
(cellblock/sandbox/moved.py): found by device and inode, only on their file systems, within a deadline."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import moved, sockets
from cellblock.sandbox.mounts import Mounts, mountinfo
from cellblock.sandbox.moved import sockets_within
from cellblock.sandbox.sockets import Bound, Moved, bound_sockets
from cellblock.sandbox.types import JailError

SEARCHING = "cellblock-socket-search"  # the name of the search's thread
# how long a test waits for a search's thread to end, once nothing holds it
END_SECONDS = 10


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory in /tmp with a path short enough for a socket's."""
    with tempfile.TemporaryDirectory(prefix="cb-moved-", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
def in_tmpfs() -> Iterator[Path]:
    """A directory in a tmpfs that is a mount of its own (/dev/shm here), on another file system than /tmp."""
    mounts = Mounts.read()
    shm = mounts.at("/dev/shm")
    if shm is None or shm.fstype != "tmpfs" or shm.point != "/dev/shm":
        pytest.skip("no tmpfs mounted at /dev/shm here")
    with tempfile.TemporaryDirectory(prefix="cb-moved-", dir="/dev/shm") as directory:
        yield Path(directory)


@contextlib.contextmanager
def gone(path: Path) -> Iterator[socket.socket]:
    """A listener at `path` whose file is then removed: a socket not at the path it was bound to."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen(1)
        path.unlink()
        yield sock


def listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return sock


def listed(monkeypatch: pytest.MonkeyPatch, hold: Callable[[str], None] = lambda _: None) -> list[str]:
    """Every directory the search lists from now on (each first held by `hold`, as a slow mount would)."""
    seen: list[str] = []
    scandir = os.scandir

    def counted(path: Any) -> Any:
        seen.append(str(path))
        hold(str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    return seen


def device_of(path: Path) -> int:
    """The file system `path` is on, as mountinfo names it."""
    where = Mounts.read().where(str(path))
    assert where is not None
    return where[0]


def only(bound: Bound, *paths: Path) -> Bound:
    """`bound` with only the moved sockets bound at `paths`: not those other programs here move meanwhile."""
    assert bound.elsewhere is not None
    return Bound(bound.at, tuple(m for m in bound.elsewhere if m.path in map(str, paths)))


def searches() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SEARCHING]


def test_the_device_the_kernel_gives_a_socket_file_is_the_one_mountinfo_gives_its_mount(
    short: Path, in_tmpfs: Path
) -> None:
    """sock_diag gives a socket file's superblock device; mountinfo gives each mount's: the two agree
    on a tmpfs and on the file system /tmp is on (/dev/shm is a tmpfs mounted over another one
    here: the one on top is the one a path reaches)."""
    mounts = Mounts.read()
    with gone(in_tmpfs / "a.sock"), gone(short / "b.sock"):
        bound = bound_sockets()
    assert bound.elsewhere is not None
    devices = {m.path: m.device for m in bound.elsewhere}
    for directory in (in_tmpfs, short):
        mount = mounts.at(str(directory))
        assert mount is not None
        assert devices[str(directory / ("a.sock" if directory == in_tmpfs else "b.sock"))] == mount.device
    assert devices[str(in_tmpfs / "a.sock")] != devices[str(short / "b.sock")]


def test_a_grant_on_another_file_system_than_every_moved_socket_is_not_looked_through(
    short: Path, in_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket moved in a tmpfs is not looked for in a grant on the disk, however big; the control:
    moved beside the grant, the same grant is looked through and the socket found."""
    grant = short / "grant"
    for n in range(20):
        (grant / f"d{n}").mkdir(parents=True)
    mounts = Mounts.read()
    assert device_of(grant) != device_of(in_tmpfs)
    with gone(in_tmpfs / "a.sock"):
        bound = only(bound_sockets(), in_tmpfs / "a.sock")
        assert bound.elsewhere
        seen = listed(monkeypatch)
        assert sockets_within("s", [str(grant)], bound, mounts) == []
        assert not [d for d in seen if d.startswith(str(grant))]
        # the control: a socket moved on the grant's own file system
        with listen(grant / "d3" / "agent.1"):
            os.rename(grant / "d3", grant / "moved")
            bound = only(bound_sockets(), grant / "d3" / "agent.1")
            found = sockets_within("s", [str(grant)], bound, mounts)
    assert [s.path for s in found] == [str(grant / "moved" / "agent.1")]
    assert len([d for d in seen if d.startswith(str(grant))]) == 21  # the grant and each directory in it


def test_a_grant_is_looked_through_only_in_its_mounts_on_a_moved_sockets_file_system(
    in_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant of /dev holds /dev/shm (a tmpfs) and /dev/pts (devpts): with a socket moved in
    /dev/shm only /dev/shm is looked through, not /dev itself (devtmpfs) nor /dev/pts."""
    (in_tmpfs / "ssh-Ab12").mkdir()
    with listen(in_tmpfs / "ssh-Ab12" / "agent.1"):
        os.rename(in_tmpfs / "ssh-Ab12", in_tmpfs / "moved")
        bound = only(bound_sockets(), in_tmpfs / "ssh-Ab12" / "agent.1")
        seen = listed(monkeypatch)
        found = sockets_within("s", ["/dev"], bound, Mounts.read())
    assert str(in_tmpfs / "moved" / "agent.1") in {s.path for s in found}
    assert seen and all(d == "/dev/shm" or d.startswith("/dev/shm/") for d in seen), seen


def test_a_mount_of_another_file_system_inside_a_grant_is_not_gone_into(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant on a moved socket's file system is looked through, but not a mount inside it of
    another one (a network mount, say: here the host's mounts with one more, as fstab would add it);
    the control: the same mount of the socket's own file system is looked through too."""
    grant = short / "grant"
    (grant / "mnt" / "deep").mkdir(parents=True)
    host = mountinfo()
    on = Mounts(host).at(str(grant))
    assert on is not None
    bound = Bound(elsewhere=(Moved("/tmp/ssh-Ab12/agent.1", on.device, 1),))
    seen = listed(monkeypatch)
    for device, entered in ((on.device + 1, False), (on.device, True)):
        other = replace(on, point=str(grant / "mnt"), id=1_000_000, parent=on.id, device=device)
        seen.clear()
        assert sockets_within("s", [str(grant)], bound, Mounts([*host, other])) == []
        assert str(grant) in seen and (str(grant / "mnt" / "deep") in seen) is entered, seen


def test_a_listener_not_where_it_was_bound_is_found_in_the_grants_by_its_inode(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grant, outside = short / "grant", short / "outside"
    for directory in (grant / "ssh-Ab12", grant / "deep" / "er", outside):
        directory.mkdir(parents=True)
    mounts = Mounts.read()
    with listen(grant / "ssh-Ab12" / "agent.7"), listen(grant / "deep" / "er" / "bus"), listen(outside / "s"):
        with listen(grant / "dead"):
            pass  # its file stays, nothing listens on it: a server may bind there again
        os.rename(grant / "ssh-Ab12", grant / "moved")
        os.rename(outside / "s", outside / "t")
        bound = bound_sockets()
        (grant / "link").symlink_to(outside)  # not followed: the jail resolves it inside
        found = sockets_within("s", [str(grant)], bound, mounts)
        assert [s.path for s in found] == [str(grant / "moved" / "agent.7")]
        assert "found by its inode" in found[0].why
        # every bound socket where it was bound: nothing to look for, nothing looked through
        monkeypatch.setattr(os, "scandir", lambda *_: pytest.fail("walked"))
        assert sockets_within("s", [str(grant)], Bound(at=bound.at), mounts) == []
    monkeypatch.undo()
    # the kernel would not say: every socket file in a grant is taken, listening or not
    anything = {s.path for s in sockets_within("s", [str(grant)], Bound(elsewhere=None), mounts)}
    assert anything == {str(grant / p) for p in ("moved/agent.7", "deep/er/bus", "dead")}


def test_a_directory_the_search_cannot_list_is_taken_whole(short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway may not list a directory the jail can still reach a name in (execute without read)."""
    shut = short / "shut"
    shut.mkdir()

    def refuse(path: str) -> None:
        if path == str(shut):
            raise PermissionError(13, "Permission denied", path)

    listed(monkeypatch, refuse)
    bound = Bound(elsewhere=(Moved("/x/agent.1", device_of(short), 1),))
    [found] = sockets_within("s", [str(short)], bound, Mounts.read())
    assert found.path == str(shut) and "cannot look into" in found.why


@pytest.fixture
def stuck(short: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Bound, threading.Event, list[str]]]:
    """A grant with a directory whose listing does not return until the test lets it (as on a network
    mount that does not answer), and a socket moved on the grant's file system."""
    grant = short / "grant"
    (grant / "stuck").mkdir(parents=True)
    (grant / "after").mkdir()
    let_go = threading.Event()

    def hold(path: str) -> None:
        if path == str(grant / "stuck"):
            let_go.wait(END_SECONDS)

    seen = listed(monkeypatch, hold)
    bound = Bound(elsewhere=(Moved("/tmp/ssh-Ab12/agent.1", device_of(grant), 1),))
    try:
        yield grant, bound, let_go, seen
    finally:
        let_go.set()
        for thread in searches():
            thread.join(END_SECONDS)


def test_a_search_past_its_deadline_starts_nothing_and_names_the_grant_and_the_socket(
    stuck: tuple[Path, Bound, threading.Event, list[str]],
) -> None:
    grant, bound, let_go, seen = stuck
    mounts = Mounts.read()
    with pytest.raises(JailError) as refused:
        sockets_within("s", [str(grant)], bound, mounts, seconds=0.05)
    message = str(refused.value)
    assert message.startswith(f"server 's': jail grant {grant} could hold the file of the socket bound at ")
    assert "'/tmp/ssh-Ab12/agent.1'" in message and f"(it was listing '{grant / 'stuck'}')" in message
    assert "nothing was started" in message and "narrow the grant" in message
    # restarted while the first search is still held: refused at once, and no second thread
    with pytest.raises(JailError) as again:
        sockets_within("s", [str(grant)], bound, mounts)
    assert "an earlier start's search" in str(again.value) and f"listing '{grant / 'stuck'}'" in str(again.value)
    assert len(searches()) == 1
    # let go, the held search ends at once, listing nothing more
    let_go.set()
    [thread] = searches()
    thread.join(END_SECONDS)
    assert not thread.is_alive() and str(grant / "after") not in seen


def test_the_same_slow_search_within_a_generous_deadline_finds_the_socket(
    stuck: tuple[Path, Bound, threading.Event, list[str]],
) -> None:
    """The control: the same grant, the listing as slow, but let go before the deadline."""
    grant, _, let_go, _ = stuck
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(grant / "after" / "agent.1"))
        inode = os.lstat(grant / "after" / "agent.1").st_ino & sockets.INODE_BITS
    moved_here = Bound(elsewhere=(Moved("/tmp/ssh-Ab12/agent.1", device_of(grant), inode),))
    threading.Timer(0.05, let_go.set).start()
    found = sockets_within("s", [str(grant)], moved_here, Mounts.read(), seconds=END_SECONDS)
    assert [s.path for s in found] == [str(grant / "after" / "agent.1")]
    assert moved.SEARCH_SECONDS >= 5  # the real deadline leaves room for a grant of a large project
