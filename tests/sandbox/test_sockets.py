"""Which sockets of the session and the machine no jail may reach (cellblock/sandbox/sockets.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellblock.sandbox import scope, sockets
from cellblock.sandbox.sockets import (
    Bound,
    bound_sockets,
    bus_paths,
    host_sockets,
    named_sockets,
    socket_kind,
)


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory in /tmp with a path short enough for a socket's (and so for /proc/net/unix)."""
    with tempfile.TemporaryDirectory(prefix="cb-sock-", dir="/tmp") as directory:
        yield Path(directory)


def listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return sock


def test_a_bus_address_leads_to_each_socket_file_it_names_unescaped(tmp_path: Path) -> None:
    made = tmp_path / "by-dir"
    made.mkdir()
    (made / "dbus-Ab12Cd").touch()
    (made / "other").touch()
    address = ";".join(
        [
            "unix:path=/tmp/dbus%2dX1y2,guid=0123",  # dbus-launch's, with D-Bus's escaping
            "unix:abstract=/tmp/dbus-Zz,guid=0123",  # a name, no file: the Landlock scope's business
            f"unix:dir={made}",
            "tcp:host=127.0.0.1,port=4000",
            "unix:tmpdir=/nonexistent",
        ]
    )
    assert bus_paths(address) == ["/tmp/dbus-X1y2", str(made / "dbus-Ab12Cd")]
    assert bus_paths("") == []


def test_the_environment_names_the_bus_the_agent_the_displays_docker_gnupg_and_pulseaudio() -> None:
    env = {
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/tmp/dbus-1",
        "SSH_AUTH_SOCK": "/tmp/ssh-XYZ/agent.42",
        "DISPLAY": ":1.0",
        "WAYLAND_DISPLAY": "wayland-0",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "DOCKER_HOST": "unix:///home/u/.docker/desktop/docker.sock",
        "CONTAINER_HOST": "tcp://10.0.0.1:2375",  # no socket file
        "GPG_AGENT_INFO": "/home/u/.gnupg/S.gpg-agent:0:1",
        "PULSE_SERVER": "unix:/run/user/1000/pulse/native tcp:host",
    }
    named = {s.path: s.why for s in named_sockets(env)}
    assert list(named) == [
        "/tmp/dbus-1",
        "/tmp/ssh-XYZ/agent.42",
        "/tmp/.X11-unix/X1",
        "/run/user/1000/wayland-0",
        "/home/u/.docker/desktop/docker.sock",
        "/home/u/.gnupg/S.gpg-agent",
        "/run/user/1000/pulse/native",
    ]
    assert "(SSH_AUTH_SOCK)" in named["/tmp/ssh-XYZ/agent.42"] and "keyring" in named["/tmp/dbus-1"]
    # X over TCP, or XQuartz's socket path on macOS
    assert named_sockets({"DISPLAY": "localhost:10.0"}) == []
    [xquartz] = named_sockets({"DISPLAY": "/private/tmp/com.apple.launchd.Q/org.xquartz:0"})
    assert xquartz.path == "/private/tmp/com.apple.launchd.Q/org.xquartz:0"


def inode(path: Path) -> int:
    """A socket file's inode number as the kernel gives it (its low 32 bits)."""
    return os.lstat(path).st_ino & sockets.INODE_BITS


def test_the_kernel_tells_each_socket_bound_to_a_path_and_whether_its_file_is_still_only_there(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sock_diag gives the path a socket was bound to and its file's inode: a socket is taken by its
    path only where that path still leads to that file and no other name does; each other one is
    known by its inode."""
    (short / "ssh-Ab12").mkdir()
    (short / "rel").mkdir()
    # a name that passed for two lines of /proc/net/unix: the kernel gives it whole
    forged = short / "x\n0000000000000000: 00000002 00000000 00010000 0001 01 1 plain"
    with contextlib.ExitStack() as stack:
        for path in ("bus", "ssh-Ab12/agent.7", "linked", "gone", forged):
            stack.enter_context(listen(short / path))
        monkeypatch.chdir(short / "rel")
        stack.enter_context(listen(Path("r.sock")))
        stack.enter_context(listen(Path("\0cellblock-test-abstract")))
        gone = inode(short / "gone")
        (short / "gone").unlink()
        os.rename(short / "ssh-Ab12", short / "moved")  # what a server with a writable grant can do
        os.link(short / "linked", short / "other-name")
        bound = bound_sockets()
    assert sorted(p for p in bound.at if p.startswith(f"{short}/")) == sorted(
        [str(short / "bus"), str(short / "linked"), str(forged)]
    )
    assert bound.elsewhere is not None
    elsewhere = {(m.path, m.inode) for m in bound.elsewhere}
    moved, linked, relative = (inode(short / p) for p in ("moved/agent.7", "linked", "rel/r.sock"))
    assert {
        (str(short / "ssh-Ab12/agent.7"), moved),
        (str(short / "linked"), linked),
        ("r.sock", relative),
        (str(short / "gone"), gone),
    } <= elsewhere
    assert not {inode(short / "bus"), inode(forged)} & {m.inode for m in bound.elsewhere}
    # each file's device, as the kernel names its file system: the one stat gives here
    assert {m.device for m in bound.elsewhere if m.path.startswith(f"{short}/")} == {os.lstat(short).st_dev}


def test_without_sock_diag_any_socket_file_may_be_a_moved_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> None:
        raise OSError(errno.EPROTONOSUPPORT, "sock_diag: Protocol not supported")

    monkeypatch.setattr(sockets, "_diag_unix", refused)
    assert bound_sockets() == Bound(elsewhere=None)


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("/tmp/dbus-AbCd1234", "D-Bus"),
        ("/run/user/1000/bus", "D-Bus"),
        ("/tmp/ssh-XXXXabcd/agent.1234", "ssh-agent"),
        ("/home/u/.ssh/agent/s.Qwerty.agent.Zxcv", "ssh-agent"),
        ("/home/u/.gnupg/S.gpg-agent.ssh", "GnuPG"),
        ("/var/run/docker.sock", "Docker"),
        ("/tmp/.X11-unix/X0", "X11"),
        ("/home/u/proj/.s.PGSQL.5432", "a Unix socket a program on this machine listens on"),
    ],
)
def test_a_socket_is_named_by_where_programs_put_it(path: str, what: str) -> None:
    assert what in socket_kind(path)


def test_with_nothing_in_the_environment_the_sessions_sockets_are_still_found(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client may start the gateway with HOME, USER and PATH only: a bus dbus-launch put in /tmp
    and an agent's socket are found where they are bound, and OpenSSH's in the home by its place."""
    home = short / "home"
    (home / ".ssh" / "agent").mkdir(parents=True)
    (short / "ssh-Ab12").mkdir()
    with (
        listen(short / "dbus-Q9") as bus,
        listen(short / "ssh-Ab12" / "agent.7") as agent,
        listen(home / ".ssh" / "agent" / "s.1") as openssh,
    ):
        found = {s.path: s.why for s in host_sockets({"HOME": str(home)})}
        assert "D-Bus" in found[bus.getsockname()]
        assert "ssh-agent" in found[agent.getsockname()] and "ssh-agent" in found[openssh.getsockname()]
        # named too, the environment's reason comes first, with the variable that names it
        named = {s.path: s.why for s in host_sockets({"HOME": str(home), "SSH_AUTH_SOCK": agent.getsockname()})}
        assert named[agent.getsockname()].endswith("(SSH_AUTH_SOCK)")
    # the session's runtime directory is always among them (where it exists)
    runtime = short / "run"
    runtime.mkdir()
    assert str(runtime) in {s.path for s in host_sockets({"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)})}
    # what does not exist is not listed
    missing = "/tmp/ssh-nothing/agent.1"
    assert missing not in {s.path for s in host_sockets({"SSH_AUTH_SOCK": missing})}


def test_the_scope_launcher_starts_nothing_when_the_kernel_refuses_the_scope(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused() -> None:
        raise OSError(errno.EINVAL, "landlock_create_ruleset: Invalid argument")

    def started(*args: object) -> None:
        pytest.fail(f"the server was started: {args}")

    monkeypatch.setattr(scope, "scope_abstract_sockets", refused)
    monkeypatch.setattr(os, "execv", started)
    assert scope.main(["--", "/bin/true"]) == scope.EXIT_CANNOT_START
    assert "the host's abstract Unix sockets cannot be closed (landlock_create_ruleset" in capsys.readouterr().err
    assert scope.main(["/bin/true"]) == scope.EXIT_CANNOT_START  # no "--": a usage error, nothing run
