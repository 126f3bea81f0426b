"""Who connected to the control socket (`serve/peer.py`): a server's mark, and a peer gone before
it is checked, each refused with why; the honest control of each is a peer that gets through."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellblock.gateway.serve import peer

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="the peer's pid is Linux's")

# Connects to the socket at argv[1], then waits for a line on stdin before it exits.
CONNECT = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); sys.stdin.readline()"


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        sock.listen(4)
        yield sock, path


def connected(listener: tuple[socket.socket, str]) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """A connection from a new process, which waits until its stdin is closed."""
    sock, path = listener
    child = subprocess.Popen([sys.executable, "-c", CONNECT, path], stdin=subprocess.PIPE)
    conn, _ = sock.accept()
    return conn, child


def test_a_peer_that_exited_before_it_was_checked_is_refused(listener: tuple[socket.socket, str]) -> None:
    conn, child = connected(listener)
    with conn:
        # the control: while it lives, the same peer gets through
        assert peer.peer(conn, set()) == (child.pid, os.geteuid(), None)
        child.communicate(b"\n")  # it exits and is reaped: its pid may name another process from now on
        pid, _, why = peer.peer(conn, set())
    assert (
        pid == child.pid and why == f"refused a connection from process {pid}, which exited before it could be checked"
    )


def test_a_peer_in_a_servers_cgroup_is_refused_naming_it_escaped(
    listener: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, child = connected(listener)
    with conn:
        monkeypatch.setattr(peer, "marked", lambda pid: "/cellblock-17-fs-1/\x1b[2Jx")
        _, _, why = peer.peer(conn, set())
        assert why is not None and "a process of a server Cellblock runs" in why
        assert "\x1b" not in why and "\\u001b[2Jx" in why

        def unreadable(pid: int) -> str | None:
            raise FileNotFoundError(2, "No such file or directory")

        monkeypatch.setattr(peer, "marked", unreadable)
        assert (
            peer.peer(conn, set())[2]
            == f"refused a connection from process {child.pid}, whose cgroups could not be read"
        )
        child.communicate(b"\n")


def test_a_process_the_gateway_started_is_refused_by_its_tree_too(listener: tuple[socket.socket, str]) -> None:
    """The second line, for a server this machine could not mark: the process tree."""
    conn, child = connected(listener)
    with conn:
        why = peer.peer(conn, {child.pid})[2]
        assert why is not None and "a process the gateway started" in why
        assert peer.peer(conn, {os.getpid() + 1_000_000})[2] is None  # the control: another tree
        child.communicate(b"\n")
