"""approvals.json changed by several writers at once (`serve/remembered.py`, `state.locked`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cellblock.gateway.serve import remembered
from cellblock.gateway.serve.remembered import Remembered
from cellblock.gateway.state import StateWriteError, atomic_write_json, locked

WRITERS, EACH = 6, 25
# Holds an flock of argv[1] until its stdin closes; says "held" once it has it.
HOLDER = (
    "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
    "sys.stdin.read()"
)


def grant_at_once(path: Path) -> dict[str, set[tuple[str, str]]]:
    """WRITERS threads, each with a Remembered of its own (as separate processes have), adding EACH grants."""
    start = threading.Barrier(WRITERS)

    def write(n: int) -> None:
        mine = Remembered(path)
        start.wait()
        for i in range(EACH):
            mine.add(f"s{n}", "tool", f"t{i}")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Remembered(path).table()


def test_writers_at_once_keep_every_grant(tmp_path: Path) -> None:
    table = grant_at_once(tmp_path / "approvals.json")
    assert {server: len(names) for server, names in table.items()} == {f"s{n}": EACH for n in range(WRITERS)}


def test_control_without_the_lock_writers_lose_grants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remembered, "locked", lambda path: contextlib.nullcontext())
    for round_ in range(5):
        table = grant_at_once(tmp_path / f"approvals-{round_}.json")
        if sum(len(names) for names in table.values()) < WRITERS * EACH:
            return
    pytest.fail("5 rounds of writers at once lost nothing without the lock")


def test_a_change_is_made_to_the_file_as_it_is_not_to_a_copy_read_before(tmp_path: Path) -> None:
    path = tmp_path / "approvals.json"
    gateway, cli = Remembered(path), Remembered(path)
    gateway.add("p", "tool", "echo")
    assert gateway.table() == {"p": {("tool", "echo")}}  # what the gateway holds now
    assert cli.remove("p", ("tool", "echo")) == [("tool", "echo")]
    gateway.add("p", "tool", "other")  # from the file, where echo is gone: the revoke stays
    assert json.loads(path.read_text())["always"] == {"p": ["other"]}


def test_a_lock_held_too_long_is_a_refusal_naming_it_and_then_it_is_had(tmp_path: Path) -> None:
    path = tmp_path / "approvals.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "approvals.json.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        held = pytest.raises(StateWriteError, match=r"another process has held approvals.json.lock for 0.2 s")
        with held, locked(path, timeout=0.2):
            pass
    finally:
        holder.communicate("")
    with locked(path, timeout=1):  # the control: once it is let go, the lock is had at once
        pass


def test_the_lock_makes_the_directories_it_needs_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state" / "cellblock" / "approvals.json"
    before = os.umask(0o002)  # Ubuntu's for users
    try:
        with locked(path):
            pass
    finally:
        os.umask(before)
    assert [oct(p.stat().st_mode & 0o777) for p in (path.parent.parent, path.parent)] == ["0o700", "0o700"]


def test_a_file_replaced_within_one_tick_of_the_clock_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "approvals.json"
    gateway = Remembered(path)
    atomic_write_json(path, {"version": 2, "always": {"p": ["echo"]}})
    assert gateway.table() == {"p": {("tool", "echo")}}
    stamp = path.stat()
    atomic_write_json(path, {"version": 2, "always": {"p": ["ohce"]}})  # a revoke and a grant no gateway was told of
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as a coarse clock stamps two writes alike
    assert path.stat().st_size == stamp.st_size
    assert gateway.table() == {"p": {("tool", "ohce")}}
