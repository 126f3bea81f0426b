"""The control socket: framing, limits and deadlines, stale sockets, and the CLI that talks to it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from cellblock.gateway.serve import control
from cellblock.gateway.serve.control import (
    ControlError,
    ControlServer,
    gateways,
    request,
    socket_path,
    token_path,
)

pytestmark = pytest.mark.anyio

# a pid above Linux's PID_MAX_LIMIT (2**22) and macOS's 99999: never a live process
DEAD_PID = 4_194_305


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private dir with a short path: a Unix socket path must fit in about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="cb-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


TIMES = ("created", "waits_until", "expires")


class FakeGateway:
    """A handler that records requests and answers like a gateway with one pending call."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        now = self.made = time.time()
        self.pending = [
            {
                "id": "k3x9",
                "server": "fs",
                "tool": "write_file",
                "arguments": ['"path": "/tmp/a"', '"text": "hi"'],
                "cut": 0,
                "created": now - 12,
                "waits_until": now + 100,
                "expires": now + 580,
            },
            {  # its call gave up waiting: an answer now lets the model's retry through
                "id": "p2m4",
                "server": "fs",
                "tool": "delete_file",
                "arguments": ['"path": "/tmp/b"'],
                "cut": 0,
                "created": now - 130,
                "waits_until": None,
                "expires": now + 470,
            },
        ]

    async def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(message)
        op = message["op"]
        if op == "boom":
            raise RuntimeError("handler bug")
        if op == "pending":
            # the times as of this answer, not of the fixture: the CLI's start may take seconds under load
            shift, self.made = time.time() - self.made, time.time()
            for item in self.pending:
                item.update({k: v + shift for k, v in item.items() if k in TIMES and v is not None})
            return {"ok": True, "pending": self.pending}
        if op in ("approve", "deny"):
            if any(item["id"] == message.get("id") for item in self.pending):
                return {"ok": True}
            return {"ok": False, "error": f"no pending approval '{message.get('id')}'", "code": control.NOT_FOUND}
        if op == "revoke":  # it holds a session approval of fs:write_file
            held = message.get("server") == "fs" and message.get("tool") in ("write_file", None)
            return {"ok": True, "revoked": [{"kind": "tool", "tool": "write_file", "scope": "session"}] if held else []}
        if op == "ps":
            return {
                "ok": True,
                "pid": os.getpid(),
                "config": "/home/u/.config/cellblock/cellblock.yaml",
                "servers": [
                    {"name": "fs", "state": "running", "jail": "none", "tools": 4, "calls": 7, "fast_calls": 5},
                    {"name": "legacy", "state": "stopped", "jail": False, "tools": 0},
                    {
                        "name": "boxed",
                        "state": "running",
                        "jail": "none",
                        "backend": "landlock",
                        "not_enforced": ["other processes are visible"],
                    },
                ],
                "pending": len(self.pending),
            }
        return {"ok": False, "error": f"unknown op '{op}'"}


@pytest.fixture
async def served(short_dir: Path) -> AsyncIterator[tuple[Path, FakeGateway]]:
    """A real ControlServer on a socket in `short_dir`, answered by a FakeGateway."""
    handler = FakeGateway()
    path = socket_path(short_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, handler).serve)
        yield path, handler
        tg.cancel_scope.cancel()


async def ask(path: Path, message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(lambda: request(path, message, timeout))


def raw_exchange(path: Path, data: bytes, *, half_close: bool = False) -> bytes:
    """Send raw bytes, read until the server closes; a server that cut us off still answers first."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


# -- the server --------------------------------------------------------------------------------------


async def test_the_socket_is_private_and_removed_on_exit(short_dir: Path) -> None:
    path = socket_path(short_dir, 1234)
    assert path == short_dir / "control-1234.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, FakeGateway()).serve)
        info = path.lstat()
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        tg.cancel_scope.cancel()
    assert not path.exists()


async def test_a_stale_socket_file_is_replaced_on_start(short_dir: Path) -> None:
    path = socket_path(short_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening: what a crashed gateway leaves behind
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, FakeGateway()).serve)
        assert (await ask(path, {"op": "ps"}))["ok"] is True
        tg.cancel_scope.cancel()


async def test_a_request_round_trips(served: tuple[Path, FakeGateway]) -> None:
    path, handler = served
    reply = await ask(path, {"op": "pending"})
    assert reply == {"ok": True, "pending": handler.pending}
    assert handler.seen == [{"op": "pending"}]


async def test_connections_are_served_concurrently(short_dir: Path) -> None:
    entered, release = anyio.Event(), anyio.Event()

    async def handler(message: dict[str, Any]) -> dict[str, Any]:
        if message["op"] == "wait":
            entered.set()
            await release.wait()
        return {"ok": True, "op": message["op"]}

    path = socket_path(short_dir)
    replies: dict[str, dict[str, Any]] = {}

    async def call(op: str) -> None:
        replies[op] = await ask(path, {"op": op})

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(ControlServer(path, handler).serve)
            async with anyio.create_task_group() as calls:
                calls.start_soon(call, "wait")
                await entered.wait()
                await call("ping")  # answered while "wait" is still in its handler
                assert replies == {"ping": {"ok": True, "op": "ping"}}
                release.set()
            assert replies["wait"] == {"ok": True, "op": "wait"}
            tg.cancel_scope.cancel()


async def test_past_the_connection_cap_peers_wait_their_turn(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "MAX_CONNECTIONS", 1)
    seen: list[str] = []

    async def handler(message: dict[str, Any]) -> dict[str, Any]:
        seen.append(message["op"])
        return {"ok": True}

    path = socket_path(short_dir)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(ControlServer(path, handler).serve)
            first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            first.connect(str(path))  # holds the only slot, silent for now
            async with anyio.create_task_group() as calls:
                calls.start_soon(ask, path, {"op": "second"})
                token = token_path(path).read_text().strip()
                first.sendall(json.dumps({"op": "first", "token": token}).encode() + b"\n")
                await anyio.to_thread.run_sync(first.recv, 100)
                first.close()
            assert seen == ["first", "second"]
            tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"not json\n", "request is not JSON"),
        (b"[1, 2]\n", "request must be a JSON object, got list"),
        (b'{"id": "x"}\n', "request has no 'op' string"),
        (b'{"op": 3}\n', "request has no 'op' string"),
        (b"\xff\xfe\n", "request is not JSON"),
        (b"[" * 60000 + b"\n", "request is not JSON"),
        (b'{"op": "ps"}', "request ended without a newline"),
    ],
    ids=["garbage", "array", "no-op", "op-not-string", "not-utf8", "deep-nesting", "no-newline"],
)
async def test_a_malformed_request_is_answered_not_passed_on(
    served: tuple[Path, FakeGateway], data: bytes, error: str
) -> None:
    path, handler = served
    raw = await anyio.to_thread.run_sync(lambda: raw_exchange(path, data, half_close=True))
    reply = json.loads(raw)
    assert reply["ok"] is False and reply["error"].startswith(error)
    assert handler.seen == []
    assert (await ask(path, {"op": "ps"}))["ok"] is True  # the server lives on


async def test_an_oversized_request_is_refused(served: tuple[Path, FakeGateway]) -> None:
    path, handler = served
    big = {"op": "pending", "pad": "a" * (control.MAX_REQUEST + 10)}
    reply = await ask(path, big)
    assert reply == {"ok": False, "error": f"request too large (limit {control.MAX_REQUEST} bytes)"}
    no_newline = await anyio.to_thread.run_sync(lambda: raw_exchange(path, b"x" * (control.MAX_REQUEST * 3)))
    assert json.loads(no_newline)["error"].startswith("request too large")
    assert handler.seen == []


async def test_a_slow_client_is_cut_off_after_the_deadline(
    served: tuple[Path, FakeGateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "REQUEST_TIMEOUT", 0.05)
    path, handler = served
    with anyio.fail_after(5):
        raw = await anyio.to_thread.run_sync(lambda: raw_exchange(path, b'{"op": "pend'))
    assert json.loads(raw) == {"ok": False, "error": "no complete request within 0.05 s"}
    assert handler.seen == []


async def test_a_handler_exception_is_an_internal_error_and_logged(
    served: tuple[Path, FakeGateway], caplog: pytest.LogCaptureFixture
) -> None:
    path, _ = served
    with caplog.at_level(logging.ERROR, logger="cellblock.gateway.serve.control"):
        reply = await ask(path, {"op": "boom"})
    assert reply == {"ok": False, "error": "internal error"}
    assert "handler bug" not in json.dumps(reply)
    assert any("handler failed for op 'boom'" in r.getMessage() and r.exc_info for r in caplog.records)
    assert (await ask(path, {"op": "ps"}))["ok"] is True


async def test_a_reply_that_is_not_json_is_an_internal_error(short_dir: Path) -> None:
    async def handler(message: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "when": object()}

    path = socket_path(short_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, handler).serve)
        assert await ask(path, {"op": "ps"}) == {"ok": False, "error": "internal error"}
        tg.cancel_scope.cancel()


# -- the client ----------------------------------------------------------------------------------------


def test_request_to_no_gateway_says_so(short_dir: Path) -> None:
    with pytest.raises(ControlError, match=r"no gateway is listening at .*; is 'cellblock serve' running"):
        request(short_dir / "control-1.sock", {"op": "ps"})


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"hello\n", "answered something that is not a control reply: b'hello'"),
        (b'{"pending": []}\n', "not a control reply"),
        (b"", "closed the connection without answering"),
    ],
)
def test_request_rejects_a_garbage_answer(short_dir: Path, answer: bytes, message: str) -> None:
    path = short_dir / "impostor.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)

        def serve_once() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1000)
                conn.sendall(answer)

        thread = threading.Thread(target=serve_once)
        thread.start()
        try:
            with pytest.raises(ControlError, match=message):
                request(path, {"op": "ps"})
        finally:
            thread.join(5)


async def test_gateways_lists_live_sockets_and_removes_stale_ones(served: tuple[Path, FakeGateway]) -> None:
    path, handler = served
    runtime = path.parent
    stale = socket_path(runtime, DEAD_PID)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(stale))
    token_path(stale).write_text("left by a gateway that was killed\n")
    starting = socket_path(runtime, os.getppid())  # refused, but its process lives: maybe not listening yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as early:
        early.bind(str(starting))
    (runtime / "control-99.sock").write_text("not a socket")
    found = await anyio.to_thread.run_sync(gateways, runtime)
    assert found == [path]
    assert not stale.exists() and not token_path(stale).exists()  # its token goes with it
    assert starting.exists() and (runtime / "control-99.sock").exists()
    assert handler.seen == []  # the probe connects and leaves; nothing reaches the handler


# -- the CLI ---------------------------------------------------------------------------------------------


@pytest.fixture
async def runtime(short_dir: Path) -> AsyncIterator[tuple[Path, FakeGateway]]:
    """XDG_RUNTIME_DIR for the CLI, with one fake gateway serving in `cellblock/`."""
    (short_dir / "cellblock").mkdir(mode=0o700)
    handler = FakeGateway()
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(socket_path(short_dir / "cellblock"), handler).serve)
        yield short_dir, handler
        tg.cancel_scope.cancel()


async def cellblock(xdg: Path, *args: str, state: Path | None = None) -> tuple[int, str, str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg), "CELLBLOCK_STATE_DIR": str(state or xdg / "state")}
    env["CELLBLOCK_CONFIG"] = str(xdg / "no-such-config.yaml")
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "cellblock.gateway.cli.main", *args], check=False, env=env
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_cli_pending_lists_the_call(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    code, out, err = await cellblock(xdg, "pending")
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert rows[0] == ["id", "server", "tool", "age", "left", "arguments"]
    assert rows[1][:3] == ["k3x9", "fs", "write_file"]
    assert 12 <= int(rows[1][3].removesuffix("s")) < 60 and rows[1][4].startswith("1m")
    assert rows[1][5] == '"path": "/tmp/a", "text": "hi"'
    assert rows[2][:4] == ["p2m4", "fs", "delete_file", "2m10s"] and rows[2][4].startswith("retry 7m")
    assert handler.seen == [{"op": "pending"}]

    code, out, _ = await cellblock(xdg, "pending", "--json")
    assert code == 0 and json.loads(out) == handler.pending


async def test_cli_pending_escapes_what_a_terminal_would_act_on(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    handler.pending[0]["tool"] = "rm\x1b[2K\rread_file"
    handler.pending[0]["arguments"] = ['"path": "\x1b]0;owned\x07"']
    _, out, _ = await cellblock(xdg, "pending")
    assert "\x1b" not in out and "\\u001b" in out


async def test_cli_pending_with_none_says_so(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    handler.pending.clear()
    code, out, err = await cellblock(xdg, "pending")
    assert (code, out, err) == (0, "", "cellblock: no pending approvals\n")


async def test_cli_approve_always_sends_the_scope(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    code, _, err = await cellblock(xdg, "approve", "k3x9", "--always")
    assert code == 0, err
    assert handler.seen == [{"op": "approve", "id": "k3x9", "scope": "always"}]
    assert err == "cellblock: OK: approved 'k3x9' always\n"
    code, _, _ = await cellblock(xdg, "approve", "k3x9")
    assert code == 0 and handler.seen[-1]["scope"] == "once"


async def test_cli_approve_an_unknown_id_exits_1(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    code, out, err = await cellblock(xdg, "approve", "nope", "--session")
    assert (code, out) == (1, "")
    assert err == "cellblock: no pending approval 'nope' (see 'cellblock pending')\n"
    assert handler.seen == [{"op": "approve", "id": "nope", "scope": "session"}]


async def test_cli_deny(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    code, _, err = await cellblock(xdg, "deny", "k3x9")
    assert code == 0 and err == "cellblock: OK: denied 'k3x9'\n"
    assert handler.seen == [{"op": "deny", "id": "k3x9"}]
    code, _, err = await cellblock(xdg, "deny", "gone")
    assert code == 1 and "no pending approval 'gone'" in err


async def test_cli_ps(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, _ = runtime
    code, out, err = await cellblock(xdg, "ps")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"gateway {os.getpid()}\tconfig /home/u/.config/cellblock/cellblock.yaml\tpending 2"
    assert lines[1].split("\t") == ["  fs", "running", "network none", "4 tools", "7 calls (5 on the fast path)"]
    assert lines[2].split("\t") == ["  legacy", "stopped", "UNJAILED", "0 tools", "0 calls (0 on the fast path)"]
    # a jail that is not bubblewrap's says what built it, and what it does not enforce
    assert lines[3].split("\t")[:3] == ["  boxed", "running", "network none (landlock)"]
    assert lines[4] == "    not enforced: other processes are visible"
    code, out, _ = await cellblock(xdg, "ps", "--json")
    assert code == 0 and [g["pid"] for g in json.loads(out)] == [os.getpid()]


async def test_cli_without_a_gateway_says_so(short_dir: Path) -> None:
    (short_dir / "cellblock").mkdir(mode=0o700)
    assert await cellblock(short_dir, "ps") == (0, "", "cellblock: no running gateway\n")
    code, _, err = await cellblock(short_dir, "approve", "k3x9")
    assert code == 1 and err.endswith("cellblock: no pending approval 'k3x9' (see 'cellblock pending')\n")


async def test_cli_approve_server_still_takes_the_lock_path(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    config = xdg / "c.yaml"
    config.write_text("version: 1\nservers:\n  fs:\n    command: x\n")
    code, _, err = await cellblock(xdg, "approve", "fs", "--config", str(config))
    assert code == 1
    # the server is met first (a command that does not run is named), then nothing is held
    assert "could not meet 'fs': command not found" in err
    assert err.endswith("cellblock: nothing held for 'fs'; nothing to approve\n")
    code, _, err = await cellblock(xdg, "approve", "fs", "--always", "--config", str(config))
    assert code == 2 and "--always applies to a pending call's ID" in err
    assert handler.seen == []  # a server name never reaches the gateways
