"""Attempts on the machine's resources: a fork bomb, a memory hog, and hogs of memory through files
in the jail's tmpfs mounts (what they hold, and how many there are), which the jail's limits stop."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import BinaryIO

from .attempt import Attempt, errno_name, never_raises

__all__ = ["FORK_CEILING", "FORK_HOLD_MAX", "MEMORY_STEP", "fork_bomb", "memory_hog", "tmpfs_files", "tmpfs_hog"]

FORK_CEILING = 1000  # forks a fork bomb makes at most: far above a test's limit, and harmless to the machine
FORK_HOLD_MAX = 120  # seconds a forked child lives at most, whatever becomes of its parent
MEMORY_STEP = 64  # MiB a memory hog takes at a time
_MIB = b"\x01" * (1 << 20)


@never_raises("fork")
def fork_bomb(ceiling: int = FORK_CEILING, hold: float = 0) -> Attempt:
    """Fork children that sleep, up to `ceiling`. Through if all `ceiling` of them were made.

    They exit when the attempt ends, or with `hold` that many seconds later, counting against the
    jail's processes meanwhile (its parent then returns at once); never later than
    `FORK_HOLD_MAX` seconds, nor than their parent.
    """
    target = f"{ceiling} processes"
    read_end, write_end = os.pipe()  # the children wait for its end: their parent's end, or its release
    children: list[int] = []

    def release() -> None:
        os.close(write_end)
        for child in children:
            os.waitpid(child, 0)

    # started before the forks: a jail at its limit has no thread to spare for it later
    timer = threading.Timer(hold, release) if hold > 0 else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    refused = "none refused"
    try:
        for _ in range(ceiling):
            try:
                pid = os.fork()
            except OSError as exc:
                refused = f"fork: {errno_name(exc.errno or 0)}"
                break
            if pid == 0:
                try:
                    os.close(write_end)
                    signal.alarm(FORK_HOLD_MAX)
                    os.read(read_end, 1)
                finally:
                    os._exit(0)
            children.append(pid)
    finally:
        os.close(read_end)
        if timer is None:
            release()
    made = len(children)
    return Attempt("fork", target, made >= ceiling, f"made {made} of {ceiling} ({refused})", amount=made)


@never_raises("memory")
def memory_hog(mib: int, step: int = MEMORY_STEP) -> Attempt:
    """Allocate and touch `mib` MiB, `step` MiB at a time. Through if all of it was had (then freed)."""
    chunks: list[bytes] = []
    try:
        while len(chunks) * step < mib:
            chunks.append(b"\x01" * (step << 20))  # written, so every page is really taken
    except MemoryError:
        had = len(chunks) * step
        chunks.clear()
        return Attempt("memory", f"{mib} MiB", False, f"had {had} MiB of {mib}, then MemoryError", amount=had)
    had = len(chunks) * step
    chunks.clear()
    return Attempt("memory", f"{mib} MiB", True, f"had all {had} MiB", amount=had)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _spread(places: Sequence[str], wanted: int, put: Callable[[str], None]) -> tuple[int, list[str]]:
    """`put` one unit after another into each of `places` in turn, going on to the next when one
    takes no more (an OSError), until `wanted` are in. Returns how many are, and why each place stopped."""
    done, stops = 0, []
    for place in places:
        try:
            while done < wanted:
                put(place)
                done += 1
        except OSError as exc:
            stops.append(f"{place}: {errno_name(exc.errno or 0)}")
        if done >= wanted:
            break
    return done, stops


@never_raises("tmpfs")
def tmpfs_hog(mib: int, places: Sequence[str]) -> Attempt:
    """Write `mib` MiB of files into the directories `places` (a jail's /tmp, home, /dev/shm: memory
    that no process's RLIMIT_DATA counts), each until it is full, 1 MiB at a time, and hold them all
    at once. Through if all of it was written; the files are removed at the end."""
    handles: dict[str, BinaryIO] = {}
    with contextlib.ExitStack() as held:

        def put(place: str) -> None:
            if place not in handles:
                path = os.path.join(place, f"cellblock-tmpfs-hog-{os.getpid()}")
                held.callback(_remove, path)  # last: after the file is closed
                # unbuffered: each MiB reaches the file system now, and closing has nothing left to fail on
                handles[place] = held.enter_context(open(path, "wb", buffering=0))
            handles[place].write(_MIB)

        written, stops = _spread(places, mib, put)
    detail = f"held {written} MiB of {mib} at once" + (f" ({'; '.join(stops)})" if stops else "")
    return Attempt("tmpfs", f"{mib} MiB in {', '.join(places)}", written >= mib, detail, amount=written)


@never_raises("tmpfs_files")
def tmpfs_files(count: int, places: Sequence[str]) -> Attempt:
    """Make `count` empty files in the directories `places` (a jail's /tmp, home, /dev/shm), each
    until it takes no more, and hold them all at once: an empty file holds no bytes, but the kernel
    keeps an inode and a name for it, about 1 KiB of memory that no process's RLIMIT_DATA counts.
    Through if all of them were made; they are removed at the end."""
    made: list[str] = []

    def put(place: str) -> None:
        path = os.path.join(place, f"cellblock-tmpfs-file-{os.getpid()}-{len(made)}")
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        made.append(path)

    try:
        held, stops = _spread(places, count, put)
    finally:
        for path in made:
            _remove(path)
    detail = f"held {held} files of {count} at once" + (f" ({'; '.join(stops)})" if stops else "")
    return Attempt("tmpfs_files", f"{count} files in {', '.join(places)}", held >= count, detail, amount=held)
