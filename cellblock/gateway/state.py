"""Where Cellblock keeps its files, and how it writes them without losing any.

State files are written atomically (temp file, fsync, rename) and created 0600, so a crash
mid-write leaves the old file, never half of a new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from platformdirs import user_cache_path, user_config_path, user_data_path, user_state_path

from cellblock.policy.jsontext import loads

__all__ = [
    "atomic_write_json",
    "atomic_write_text",
    "config_file",
    "default_config_path",
    "own_dirs",
    "read_json",
    "runtime_dir",
    "state_dir",
]


def default_config_path() -> Path:
    """`$CELLBLOCK_CONFIG`, else `<user config dir>/cellblock/cellblock.yaml`."""
    env = os.environ.get("CELLBLOCK_CONFIG")
    if env:
        return Path(env).expanduser()
    return user_config_path("cellblock") / "cellblock.yaml"


def config_file(path: str | Path | None) -> Path:
    """The config file to read: `path` (`~` expanded), else the default; absolute."""
    return (Path(path).expanduser() if path else default_config_path()).absolute()


def state_dir() -> Path:
    """`$CELLBLOCK_STATE_DIR`, else the per-user state directory; created 0700."""
    env = os.environ.get("CELLBLOCK_STATE_DIR")
    path = Path(env).expanduser() if env else user_state_path("cellblock")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def own_dirs() -> list[Path]:
    """Every directory Cellblock keeps files of its own in: config, state, cache, data, runtime."""
    dirs = [user_config_path("cellblock"), user_state_path("cellblock"), user_cache_path("cellblock")]
    dirs.append(user_data_path("cellblock"))
    if os.environ.get("CELLBLOCK_STATE_DIR"):
        dirs.append(Path(os.environ["CELLBLOCK_STATE_DIR"]).expanduser())
    if os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "cellblock")
    return dirs


def runtime_dir() -> Path:
    """A 0700 directory for sockets, owned by this user: `$XDG_RUNTIME_DIR/cellblock`, else under /tmp.

    Raises:
        OSError: the directory exists but belongs to someone else or is open to others.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "cellblock" if base and Path(base).is_dir() else Path(f"/tmp/cellblock-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    # a directory in /tmp may have been made by another user first, to catch our sockets
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or path.is_symlink():
        raise OSError(f"{path} is not a private directory of this user; remove it and try again")
    return path


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON in one step; the file is 0600."""
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` in one step (temp file, fsync, rename); the file gets `mode`."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any | None:
    """The JSON in `path`, or None when it is missing, unreadable or not strict JSON (callers treat
    that as 'no state'); lone surrogates in it are replaced (see `policy.jsontext`)."""
    try:
        return loads(path.read_bytes())
    except (OSError, ValueError):
        return None
