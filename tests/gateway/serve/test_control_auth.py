"""Who the control socket answers: the gateway's own uid, with the token of this start. Each attack
has its control: the same exchange from the CLI (or the same uid, or with the token) gets through."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import socket
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from cellblock.gateway.serve import peer
from cellblock.gateway.serve.control import ControlServer, request, socket_path, token_path
from tests.gateway.serve.test_control import FakeGateway, anyio_backend, cellblock, runtime, short_dir

__all__ = ["anyio_backend", "runtime", "short_dir"]

pytestmark = pytest.mark.anyio

# The client runs as another user, who may not reach the test's own interpreter.
PYTHON = "/usr/bin/python3"
APPROVE = {"op": "approve", "id": "k3x9", "scope": "always"}

# A client of its own: connects, sends one line, prints the reply line (the line comes on stdin).
CLIENT = """
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.settimeout(5)
    sock.connect(sys.argv[1])
    sock.sendall(sys.stdin.buffer.read())
    sys.stdout.write(sock.makefile("rb").readline().decode())
"""


class Refusals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None, int | None, str]] = []

    def __call__(self, op: str, pid: int | None, uid: int | None, why: str) -> None:
        self.seen.append((op, pid, uid, why))


@pytest.fixture
async def served(short_dir: Path) -> AsyncIterator[tuple[Path, FakeGateway, Refusals]]:
    handler, refusals = FakeGateway(), Refusals()
    path = socket_path(short_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, handler, refused=refusals).serve)
        yield path, handler, refusals
        tg.cancel_scope.cancel()


def exchange(path: Path, message: dict[str, Any]) -> dict[str, Any]:
    """One request as a client that reaches the socket but does not read the token file."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply = sock.makefile("rb").readline()
    answer: dict[str, Any] = json.loads(reply)
    return answer


@pytest.mark.parametrize(
    ("token", "error"),
    [
        (None, "refused a request without the control token"),
        ("x" * 43, "refused a request with a wrong control token"),
        ("", "refused a request with a wrong control token"),
        (7, "refused a request with a wrong control token"),
        ("é" * 43, "refused a request with a wrong control token"),
    ],
    ids=["none", "wrong", "empty", "not-a-string", "not-ascii"],
)
async def test_a_request_without_the_token_is_refused_and_nothing_is_approved(
    served: tuple[Path, FakeGateway, Refusals], token: Any, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    path, handler, refusals = served
    message = APPROVE if token is None else APPROVE | {"token": token}
    with caplog.at_level(logging.WARNING, logger="cellblock.gateway.serve.control"):
        reply = await anyio.to_thread.run_sync(lambda: exchange(path, message))
    assert reply["ok"] is False and reply["error"].startswith(error), reply
    assert handler.seen == []  # nothing reached the gateway: nothing was approved
    [(op, pid, uid, why)] = refusals.seen
    assert (op, pid, uid, why) == ("approve", os.getpid(), os.geteuid(), reply["error"])
    assert error in caplog.text
    # the control: the CLI's client, which reads the token beside the socket, approves
    assert (await anyio.to_thread.run_sync(lambda: request(path, APPROVE)))["ok"] is True
    assert handler.seen == [APPROVE]  # without the token: the handler never sees it
    token_text = token_path(path).read_text().strip()
    assert token_text not in caplog.text and token_text not in json.dumps(refusals.seen)


async def test_the_token_file_is_private_new_at_each_start_and_gone_at_exit(short_dir: Path) -> None:
    path = socket_path(short_dir, 4321)
    tokens = []
    for _ in range(2):
        async with anyio.create_task_group() as tg:
            await tg.start(ControlServer(path, FakeGateway()).serve)
            info = token_path(path).lstat()
            assert token_path(path) == short_dir / "control-4321.token"
            assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
            assert info.st_uid == os.geteuid() and info.st_nlink == 1
            tokens.append(token_path(path).read_text())
            assert len(tokens[-1].strip()) >= 40
            tg.cancel_scope.cancel()
        assert not token_path(path).exists() and not path.exists()
    assert tokens[0] != tokens[1]
    assert os.listdir(short_dir) == []  # no temp file left either


async def test_a_token_file_a_later_gateway_wrote_is_left_alone(short_dir: Path) -> None:
    path = socket_path(short_dir, 4321)
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, FakeGateway()).serve)
        token_path(path).unlink()
        token_path(path).write_text("the next gateway's\n")
        tg.cancel_scope.cancel()
    assert token_path(path).read_text() == "the next gateway's\n"


def run_client(path: Path, line: bytes, *, user: int | None) -> dict[str, Any]:
    done = subprocess.run(
        [PYTHON, "-I", "-c", CLIENT, str(path)],
        input=line,
        capture_output=True,
        timeout=30,
        check=True,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.mark.skipif(os.geteuid() != 0, reason="changing uid takes root")
@pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"no {PYTHON} for the other user's client")
async def test_another_uid_with_the_token_is_refused(short_dir: Path) -> None:
    """Reaching the socket and holding the token is not enough: the peer's uid must be the
    gateway's. The socket is opened to all here, as a jail or a lax mode might leave it."""
    os.chmod(short_dir, 0o755)
    handler, refusals = FakeGateway(), Refusals()
    path = socket_path(short_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, handler, refused=refusals).serve)
        path.chmod(0o666)
        line = json.dumps(APPROVE | {"token": token_path(path).read_text().strip()}).encode() + b"\n"
        reply = await anyio.to_thread.run_sync(lambda: run_client(path, line, user=65534))
        assert reply == {"ok": False, "error": peer.peer_refusal(65534)}, reply
        assert handler.seen == [] and refusals.seen[0][2] == 65534
        # the control: the same client, line and socket as the gateway's own uid approves
        reply = await anyio.to_thread.run_sync(lambda: run_client(path, line, user=None))
        assert reply == {"ok": True} and handler.seen == [APPROVE]
        tg.cancel_scope.cancel()


async def test_where_the_os_gives_only_getpeereid_the_uid_is_still_checked(
    served: tuple[Path, FakeGateway, Refusals], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The macOS path (no SO_PEERCRED): the uid comes from getpeereid, and there is no pid."""
    path, handler, refusals = served
    monkeypatch.delattr(socket, "SO_PEERCRED")
    monkeypatch.setattr(peer, "_getpeereid", lambda fd: os.geteuid() + 1)
    reply = await anyio.to_thread.run_sync(lambda: request(path, APPROVE))
    assert reply == {"ok": False, "error": peer.peer_refusal(os.geteuid() + 1)}
    assert handler.seen == [] and refusals.seen[0][1:3] == (None, os.geteuid() + 1)

    def unreadable(fd: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(peer, "_getpeereid", unreadable)
    reply = await anyio.to_thread.run_sync(lambda: request(path, APPROVE))
    assert reply["ok"] is False and "peer credentials could not be read" in reply["error"]
    # the control: the gateway's own uid, through the same path, approves
    monkeypatch.setattr(peer, "_getpeereid", lambda fd: os.geteuid())
    assert (await anyio.to_thread.run_sync(lambda: request(path, APPROVE))) == {"ok": True}
    assert handler.seen == [APPROVE]


async def test_the_cli_without_the_token_file_is_refused_with_a_clear_error(
    runtime: tuple[Path, FakeGateway],
) -> None:
    xdg, handler = runtime
    [sock] = (xdg / "cellblock").glob("control-*.sock")
    token = token_path(sock).read_text()
    token_path(sock).unlink()
    code, _, err = await cellblock(xdg, "approve", "k3x9", "--always")
    assert code == 1 and "refused a request without the control token" in err, err
    assert handler.seen == []
    # the control: with the file back the same command approves
    token_path(sock).write_text(token)
    code, _, err = await cellblock(xdg, "approve", "k3x9", "--always")
    assert code == 0 and handler.seen == [APPROVE], err
    assert token.strip() not in err


def test_getpeereid_is_called_as_libc_declares_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`int getpeereid(int, uid_t *, gid_t *)`, through a stand-in of the same C signature: the
    uid is read back from where the call wrote it, and a failure is the errno it set."""
    signature = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)
    )
    calls: list[int] = []

    def getpeereid(fd: int, uid: Any, gid: Any) -> int:
        calls.append(fd)
        if fd < 0:
            ctypes.set_errno(errno.EBADF)
            return -1
        uid[0], gid[0] = 501, 20
        return 0

    libc = type("Libc", (), {"getpeereid": signature(getpeereid)})()
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: libc)
    assert peer._getpeereid(7) == 501 and calls == [7]
    with pytest.raises(OSError) as failed:
        peer._getpeereid(-1)
    assert failed.value.errno == errno.EBADF
    # a libc without it (glibc): the peer is refused, not let through
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: object())
    with pytest.raises(OSError) as missing:
        peer._getpeereid(7)
    assert missing.value.errno == errno.ENOSYS
