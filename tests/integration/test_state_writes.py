"""State writes that survive the disk and SIGKILL, through the real `cellblock serve`.

A 2 MiB tmpfs as the state dir, filled mid-run (root only: mounting needs it): calls are refused
while it is full, the audit log has no glued or cut line after, and "always allow" is refused
naming the file and the disk. A writer killed many times mid-write leaves temp files, which the
next start removes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.audit.log import rotated_paths
from tests.integration.conftest import cli, gateway, probe_server, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, private to the test; skipped (failed under CELLBLOCK_REQUIRE_PEERS=1 as root) without one."""
    mount = tmp_path / "disk"
    mount.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)], check=False)
    if done.returncode != 0:
        if os.environ.get("CELLBLOCK_REQUIRE_PEERS") == "1":
            pytest.fail("cannot mount a tmpfs as root (a container without CAP_SYS_ADMIN?)", pytrace=False)
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the disk says it is full; return it (remove it to free the space)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    return filler


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for file in rotated_paths(path) for line in file.read_bytes().splitlines()]


BIG = {f"field_{n}": f"{n}" * 255 for n in range(40)}  # a ~11 KB audit line: more than a page


async def test_a_full_disk_leaves_no_partial_audit_line_and_the_marker_after_it_is_whole(
    tmp_path: Path, small_disk: Path
) -> None:
    state = small_disk / "state"
    config = write_config(tmp_path, {"p": probe_server()})
    async with gateway(config, state) as client:
        assert not (await client.call_tool("p__echo", {"message": "before"})).is_error
        log = state / "audit.jsonl"
        control = small_disk / "control.jsonl"  # a file with room left in its last page, as the log has
        control.write_bytes(b"x" * 100)
        filler = fill(small_disk)
        # control: on this disk a write now lands in part (what the audit log used to leave behind)
        fd = os.open(control, os.O_WRONLY | os.O_APPEND)
        try:
            written = os.write(fd, json.dumps(BIG).encode())
        except OSError as exc:
            written = 0 if exc.errno == errno.ENOSPC else -1
        finally:
            os.close(fd)
        control.unlink()
        for _ in range(3):
            refused = await client.call_tool("p__echo", {"message": "while full", **BIG})
            assert refused.is_error and "audit" in text(refused).lower(), text(refused)
        filler.unlink()
        assert not (await client.call_tool("p__echo", {"message": "marker"})).is_error
    assert 0 < written < len(json.dumps(BIG))
    found = lines_of(log)  # json.loads fails on any glued or cut line
    assert [e["arguments"]["message"] for e in found if e["event"] == "call"] == ["before", "marker"]
    env = {"CELLBLOCK_STATE_DIR": str(state)}
    report = cli(env, "audit", "--json", "--config", str(config))
    assert report.returncode == 0 and json.loads(report.stdout)["unreadable_lines"] == 0
    assert cli(env, "audit", "--verify", "--config", str(config)).returncode == 0


class Human:
    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "allow_always"})


async def test_always_allow_on_a_full_disk_is_refused_naming_the_file_and_the_disk(
    tmp_path: Path, small_disk: Path
) -> None:
    state = small_disk / "state"
    ask = {"default": "deny", "rules": {"echo": "ask"}}
    # the audit log on another disk: the call is recorded, only the approval cannot be saved
    config = write_config(tmp_path, {"p": probe_server(tools=ask)}, audit={"path": str(tmp_path / "audit.jsonl")})
    async with gateway(config, state, elicitation_callback=Human()) as client:
        filler = fill(small_disk)
        refused = await client.call_tool("p__echo", {"message": "x"})
        filler.unlink()
        assert refused.is_error
        message = text(refused)
        assert f"cannot write {state / 'approvals.json'}" in message and "the disk is full" in message, message
        assert "Traceback" not in message
        # control: with space again, the same answer is saved and the call runs
        allowed = await client.call_tool("p__echo", {"message": "y"})
        assert text(allowed) == "y"
    assert json.loads((state / "approvals.json").read_text())["always"] == {"p": ["echo"]}


WRITER = """
import sys
from pathlib import Path
from cellblock.gateway.state import atomic_write_json
target = Path(sys.argv[1])
n = 0
while True:
    n += 1
    atomic_write_json(target, {"version": 1, "always": {"s": [f"tool{i}" for i in range(n % 500)]}})
"""


def kill_writers_mid_write(state: Path, target: Path, times: int) -> None:
    """Start a writer of `target` and SIGKILL it at a random moment of its writing, `times` times."""
    for _ in range(times):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)])
        while not target.exists() and writer.poll() is None:
            pass  # its first write is under way: from here on, any moment is somewhere in a write
        time.sleep(random.uniform(0.05, 0.15))  # the kill lands at a random moment on purpose
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()


async def test_temp_files_left_by_writers_killed_mid_write_are_removed_at_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = state / "approvals.json"
    await anyio.to_thread.run_sync(kill_writers_mid_write, state, target, 40)
    left = list(state.glob(".approvals.json.*.tmp"))
    assert left, "no kill landed mid-write: the test proves nothing"  # the control: the kills leave them
    other = state / ".not-ours.tmp"
    other.write_text("x")
    async with gateway(write_config(tmp_path, {}), state) as client:
        await client.list_tools()
    assert list(state.glob(".approvals.json.*.tmp")) == []
    assert other.exists()  # only our own temp files are removed
    json.loads(target.read_text())
