"""Which sockets of the session and the machine no jail may reach (cellblock/sandbox/sockets.py)."""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellblock.sandbox import scope
from cellblock.sandbox.sockets import bound_sockets, bus_paths, host_sockets, named_sockets, socket_kind


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


def test_proc_net_unix_gives_the_sockets_bound_to_a_path_that_are_sockets_now(short: Path) -> None:
    listener = listen(short / "bus")
    plain = short / "plain"
    plain.write_text("not a socket\n")
    table = short / "unix"
    head = "Num       RefCount Protocol Flags    Type St Inode Path\n"
    rows = [
        f"0000000000000000: 00000002 00000000 00010000 0001 01 1001 {short / 'bus'}",
        "0000000000000000: 00000002 00000000 00010000 0001 01 1002 @/tmp/.X11-unix/X0",  # abstract
        "0000000000000000: 00000002 00000000 00000000 0001 03 1003",  # unnamed
        "0000000000000000: 00000002 00000000 00010000 0001 01 1004 relative.sock",
        "0000000000000000: 00000002 00000000 00010000 0001 01 1005 /proc/self/fd/7/control.sock",
        # what a socket named "x\n<a line of its own>" prints: that line's path is no socket, not taken
        f"0000000000000000: 00000002 00000000 00010000 0001 01 1006 {short}/x",
        f"0000000000000000: 00000002 00000000 00010000 0001 01 1008 {plain}",
        str(plain),
        f"0000000000000000: 00000002 00000000 00010000 0001 01 1007 {short / 'gone'}",
    ]
    table.write_text(head + "\n".join(rows) + "\n")
    with listener:
        assert bound_sockets(table) == [str(short / "bus")]
        # and the machine's own table lists it
        assert str(short / "bus") in bound_sockets()
    assert bound_sockets(short / "missing") == []


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
