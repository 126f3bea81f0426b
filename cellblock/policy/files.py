"""Write the policy layer's own state files so that a crash never leaves half of one.

`policy/` may not import `gateway/state.py`, so it keeps this small writer of its own. Same
contract (DESIGN.md "State on disk"): temp file in the same directory, fsync, rename over the
old file, created 0600 in a 0700 directory. Errors are plain `OSError`; callers translate them.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_json"]


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd` (`os.write` may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable; a no-op where directories cannot be opened (Windows)."""
    flag = getattr(os, "O_DIRECTORY", None)
    if flag is None:
        return
    fd = os.open(directory, os.O_RDONLY | flag)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one step; the new file is 0600.

    Raises:
        OSError: the directory or the temp file could not be written; the old file is untouched.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkstemp creates the file 0600 with O_EXCL, so no other user can open it before the rename
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as UTF-8 JSON (sorted keys, non-ASCII escaped); the file is 0600.

    Raises:
        OSError: as `atomic_write_bytes`.
        ValueError: `data` holds NaN or an infinity, which JSON cannot carry.
        TypeError: `data` holds something that is not JSON.
    """
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
