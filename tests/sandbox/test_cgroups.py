"""Where the gateway makes jails' cgroups, from several threads at once (jails' plans are built in
worker threads, several servers starting together)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import cgroups
from cellblock.sandbox.types import Limits

THREADS = 8


def _at_once(work: Callable[[int], Any]) -> list[Any]:
    """`work(i)` for each of THREADS threads, started together; what each returned or raised."""
    start = threading.Barrier(THREADS)
    out: list[Any] = [None] * THREADS

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = work(i)
        except OSError as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


@pytest.fixture
def places() -> dict[str, tuple[int, Path]]:
    found = cgroups.bases()
    if not found:
        pytest.skip("no cgroup the gateway may make children in here (root, or a delegated cgroup, needed)")
    return found


def test_threads_that_look_for_a_place_at_once_all_find_every_one(places: dict[str, tuple[int, Path]]) -> None:
    for _ in range(25):
        assert _at_once(lambda _: cgroups.bases()) == [places] * THREADS


def test_control_without_the_lock_threads_find_fewer_places(
    places: dict[str, tuple[int, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same look-ups as above with the lock taken away: trials of one name collide
    monkeypatch.setattr(cgroups, "_LOCK", contextlib.nullcontext())
    for _ in range(200):
        if any(found != places for found in _at_once(lambda _: cgroups.bases())):
            return
    pytest.fail("200 rounds of concurrent look-ups all agreed without the lock")


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(THREADS)]
    try:
        yield children
    finally:
        for child in children:
            child.kill()
            child.wait()


def _make_each(base: Path, sleepers: list[subprocess.Popen[bytes]], round_: int) -> list[Any]:
    def make(i: int) -> Any:
        name = f"{cgroups.PREFIX}{os.getpid()}-test-{round_}-{i}"
        return cgroups.make(base, name, [("pids", 1)], Limits(64, 1 << 30), sleepers[i].pid)

    return _at_once(make)


def _release(base: Path, sleepers: list[subprocess.Popen[bytes]]) -> None:
    """Move the sleepers back to `base` and remove their cgroups (a cgroup with a task stays)."""
    for child in sleepers:
        (base / "cgroup.procs").write_text(str(child.pid))
    for path in base.glob(f"{cgroups.PREFIX}{os.getpid()}-test-*"):
        assert cgroups.remove(path)


def test_jails_cgroups_made_at_once_each_get_their_process(
    places: dict[str, tuple[int, Path]], sleepers: list[subprocess.Popen[bytes]]
) -> None:
    if places.get("pids", (0,))[0] != 1:
        pytest.skip("the test moves processes in a cgroup v1 pids hierarchy")
    base = places["pids"][1]
    try:
        for round_ in range(10):
            made = _make_each(base, sleepers, round_)
            assert not [m for m in made if isinstance(m, OSError)]
            for i, child in enumerate(sleepers):
                assert str(child.pid) in (made[i][0].path / "cgroup.procs").read_text().split()
            _release(base, sleepers)
    finally:
        _release(base, sleepers)
