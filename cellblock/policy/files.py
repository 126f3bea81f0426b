"""Cellblock's one writer of files that a crash must never leave half written.

DESIGN.md "State on disk": the data goes into a temp file beside the target (created 0600 with
O_EXCL, locked while it is written so a start can tell a live writer's from a dead one's), is
synced, then renamed (or linked) over the target, and the directory is synced; a missing
directory is made 0700 whatever the umask (`make_dirs`, which every directory Cellblock makes goes
through). It lives in `policy/`, the lowest layer, so that the lock files, the gateway's state
(`gateway/state.py`) and the sandbox's verified copies all share it. Errors are plain `OSError`;
callers translate them.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # POSIX: a temp file being written is locked, so a start removes only a dead writer's
    import fcntl
except ImportError:  # pragma: no cover - Windows: temp files are removed by age alone
    fcntl = None  # type: ignore[assignment]  # reason: the module is optional on Windows

__all__ = ["TEMP_NAME", "atomic_write_bytes", "atomic_write_json", "make_dirs", "write_once"]

TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")  # what `tempfile.mkstemp` makes for a write here


def make_dirs(path: Path, mode: int = 0o700) -> None:
    """`path` and every missing directory above it, each made with exactly `mode`.

    mkdir's mode is masked by the umask, and `Path.mkdir(parents=True)` gives the parents it makes
    the umask's mode alone: under umask 002 (Ubuntu's for users) a first start made `~/.local/state`
    0775, and then refused it as writable by others. So each directory made here is chmodded after
    it is made. A directory that exists is left as it is: a user's own `~/.local` is not ours to change.

    Raises:
        OSError: a directory cannot be made, or something on the way is not a directory.
    """
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # another process made it meanwhile: theirs, as it is
        os.chmod(directory, mode)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` in one step; the file gets `mode`. A crash leaves the old file
    whole, and at worst a temp file beside it (named as `TEMP_NAME` says).

    Raises:
        OSError: it could not be written; the old file, if any, is unchanged.
    """
    _commit(path, data, mode, os.replace)


def write_once(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Make `path` with `data`, whole, unless it exists.

    Raises:
        FileExistsError: `path` exists (whoever made it first wins).
        OSError: it could not be written.
    """
    _commit(path, data, mode, os.link)


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as UTF-8 JSON (sorted keys, non-ASCII escaped); the file is 0600.

    Raises:
        OSError: as `atomic_write_bytes`.
        ValueError: `data` holds NaN or an infinity, which JSON cannot carry.
        TypeError: `data` holds something that is not JSON.
    """
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def _commit(path: Path, data: bytes, mode: int, put: Callable[[str, Path], None]) -> None:
    """`data` into a locked temp file beside `path`, synced, then `put` in place and the directory synced."""
    tmp = ""
    try:
        make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            _write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
            put(tmp, path)
        finally:
            os.close(fd)
        _sync_dir(path.parent)
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd` (`os.write` may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_dir(directory: Path) -> None:
    """Make a rename in `directory` survive a power cut (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is done
    finally:
        os.close(fd)
