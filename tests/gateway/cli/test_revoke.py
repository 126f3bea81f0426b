"""`cellblock revoke` reaches the running gateways: what each dropped, and one it could not tell."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.serve.test_control import FakeGateway, anyio_backend, cellblock, runtime, short_dir

__all__ = ["anyio_backend", "runtime", "short_dir"]

pytestmark = pytest.mark.anyio

REVOKE = {"op": "revoke", "server": "fs", "tool": "write_file", "kind": "tool"}


def config(xdg: Path) -> str:
    path = xdg / "c.yaml"
    path.write_text("version: 1\nservers:\n  fs:\n    command: x\n")
    return str(path)


@pytest.fixture
def deaf(runtime: tuple[Path, FakeGateway]) -> Iterator[str]:
    """A second gateway that hangs up on every request without an answer (its pid is alive)."""
    xdg, _ = runtime
    alive = subprocess.Popen(["sleep", "60"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(xdg / "cellblock" / f"control-{alive.pid}.sock"))
    sock.listen(8)

    def hang_up() -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                sock.accept()[0].close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        yield str(alive.pid)
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(5)
        alive.kill()
        alive.wait()


async def test_revoke_tells_each_running_gateway_and_says_what_it_dropped(runtime: tuple[Path, FakeGateway]) -> None:
    xdg, handler = runtime
    code, _, err = await cellblock(xdg, "revoke", "fs:write_file", "--config", config(xdg))
    assert (code, err) == (0, f"cellblock: OK: revoked fs:write_file (for this session, in gateway {os.getpid()})\n")
    assert handler.seen == [REVOKE]
    code, _, err = await cellblock(xdg, "revoke", "fs:other", "--config", config(xdg))
    assert code == 1 and err == "cellblock: no 'always' or session approval for fs:other\n"


async def test_a_gateway_revoke_could_not_tell_is_named_and_the_rest_is_done(
    runtime: tuple[Path, FakeGateway], deaf: str
) -> None:
    xdg, handler = runtime
    (xdg / "state").mkdir(mode=0o700)
    (xdg / "state" / "approvals.json").write_text(json.dumps({"version": 2, "always": {"fs": ["write_file"]}}))
    code, _, err = await cellblock(xdg, "revoke", "fs:write_file", "--config", config(xdg))
    assert code == 1, err
    lines = err.splitlines()
    assert lines[0] == (
        f"cellblock: OK: revoked fs:write_file (always), fs:write_file (for this session, in gateway {os.getpid()})"
    )
    assert lines[1].startswith(f"cellblock: FAIL: gateway {deaf} was not told (the gateway at ")
    assert "closed the connection without answering" in lines[1]
    assert lines[1].endswith(
        "what it allowed for this session of fs:write_file stays allowed until it restarts; run this again, "
        "or restart the client that runs it"
    )
    assert handler.seen == [REVOKE]  # the gateway that answers was told all the same
    assert json.loads((xdg / "state" / "approvals.json").read_text())["always"] == {}
