"""Where Cellblock keeps its files, and how it writes them without losing any.

State files are written atomically by the project's one writer (`policy.files`: temp file, fsync,
rename, fsync of the directory) and created 0600, so a crash mid-write leaves the old file, never
half of a new one; the temp file a killed writer leaves is removed at the next start
(`clean_stale_temps`). A file that several processes change (two gateways, a gateway and the CLI)
is read, changed and written under `locked`, so none of them works from a copy another has
replaced meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from platformdirs import user_cache_path, user_config_path, user_data_path, user_state_path

from cellblock.policy import files
from cellblock.policy.errors import CellblockError
from cellblock.policy.files import TEMP_NAME, atomic_write_bytes, make_dirs, write_once
from cellblock.policy.jsontext import loads

try:  # POSIX: a temp file being written is locked, so a start removes only a dead writer's
    import fcntl
except ImportError:  # pragma: no cover - Windows: temp files are removed by age alone
    fcntl = None  # type: ignore[assignment]  # reason: the module is optional on Windows

__all__ = [
    "RuntimeDirError",
    "StateWriteError",
    "atomic_write_json",
    "atomic_write_text",
    "clean_stale_temps",
    "config_file",
    "create_once",
    "data_dir",
    "default_config_path",
    "lock_path",
    "locked",
    "own_dirs",
    "pending_path",
    "private_dir",
    "read_json",
    "runtime_dir",
    "state_dir",
    "swappable",
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


class RuntimeDirError(CellblockError):
    """No private directory for the gateway's state or sockets can be had; the message says where and why."""


def lock_path(state: Path, server: str) -> Path:
    """The lock file of `server`: its approved catalog."""
    return state / "locks" / f"{server}.json"


def unasked_path(state: Path, server: str) -> Path:
    """The tools of `server` the user let run without asking (`policy/unasked.py`)."""
    return state / "locks" / f"{server}.unasked.json"


def pending_path(state: Path, server: str) -> Path:
    """What `server` lists that its lock holds for review."""
    return state / "locks" / f"{server}.pending.json"


def state_dir() -> Path:
    """`$CELLBLOCK_STATE_DIR`, else the per-user state directory (it holds the locks and the
    approvals); see `_own_dir`.

    Raises:
        RuntimeDirError: see `_own_dir`.
    """
    env = os.environ.get("CELLBLOCK_STATE_DIR")
    path = Path(env).expanduser().absolute() if env else user_state_path("cellblock")
    return _own_dir(path, "state", "CELLBLOCK_STATE_DIR", "its locks and approvals")


def data_dir() -> Path:
    """`$CELLBLOCK_DATA_DIR`, else the per-user data directory (it holds the packages installed for
    servers and their records); see `_own_dir`.

    Raises:
        RuntimeDirError: see `_own_dir`.
    """
    env = os.environ.get("CELLBLOCK_DATA_DIR")
    path = Path(env).expanduser().absolute() if env else user_data_path("cellblock")
    return _own_dir(path, "data", "CELLBLOCK_DATA_DIR", "the code servers run")


def _own_dir(path: Path, what: str, variable: str, holds: str) -> Path:
    """`path`, created 0700, and made 0700 when it is this user's and only readable by others.

    Raises:
        RuntimeDirError: it cannot be made; it belongs to another user, or another user can write
            it or replace it (through a directory on its path they can write).
    """
    try:
        make_dirs(path)
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077 and not info.st_mode & 0o022:
            path.chmod(0o700)  # others could read it, but not have put anything in it
    except OSError as exc:
        raise RuntimeDirError(f"cannot use the {what} directory {path}: {exc.strerror or exc}") from exc
    if info.st_uid != os.getuid():
        raise RuntimeDirError(
            f"the {what} directory {path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}): "
            f"another user could change {holds}; use a directory of your own ({variable})"
        )
    if info.st_mode & 0o022:
        raise RuntimeDirError(
            f"the {what} directory {path} is writable by others (mode {info.st_mode & 0o7777:o}): another user "
            f"could have changed {holds}; check what is in it, then `chmod 700 {path}`"
        )
    unsafe = swappable(path)
    if unsafe is not None:
        raise RuntimeDirError(
            f"the {what} directory {path} can be replaced by another user: {unsafe}; "
            f"use a directory whose every parent only you or root can write ({variable})"
        )
    return path


def swappable(path: Path) -> str | None:
    """Why another user could swap `path` for a directory of theirs, if they could: a directory
    on its way (as given or resolved) that is not this user's or root's, or that others may write
    without the sticky bit (which keeps them from renaming what is not theirs, as in /tmp)."""
    uid = os.getuid()
    resolved = Path(os.path.realpath(path))
    for parent in dict.fromkeys([*path.parents, *resolved.parents]):
        try:
            info = parent.lstat()
        except OSError as exc:
            return f"{parent} cannot be checked ({exc.strerror or exc})"
        if stat.S_ISLNK(info.st_mode):
            continue  # who may change a link is decided by the directory holding it, checked too
        if info.st_uid not in (uid, 0):
            return f"{parent} belongs to uid {info.st_uid}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return f"{parent} is writable by others (mode {info.st_mode & 0o7777:o})"
    return None


def own_dirs() -> list[Path]:
    """Every directory Cellblock keeps files of its own in: config, state, cache, data, runtime."""
    dirs = [user_config_path("cellblock"), user_state_path("cellblock"), user_cache_path("cellblock")]
    dirs.append(user_data_path("cellblock"))
    for variable in ("CELLBLOCK_STATE_DIR", "CELLBLOCK_DATA_DIR"):
        if os.environ.get(variable):
            dirs.append(Path(os.environ[variable]).expanduser())
    if os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "cellblock")
    dirs.append(Path(f"/run/user/{os.getuid()}/cellblock"))
    return dirs


def runtime_dir() -> Path:
    """A directory for the control and egress sockets, private to this user (0700, theirs, no
    symlink), and the same for a gateway a client starts with little environment and for the CLI
    in a terminal: `cellblock` in `$XDG_RUNTIME_DIR`, else in `/run/user/<uid>` (what the login
    manager makes), else `<state dir>/run`. A runtime base is used only when it is itself private
    and no other user can replace it; none of them is a place another user can create first (a
    shared `/tmp` would be).

    Raises:
        RuntimeDirError: the directory cannot be made, or exists but is not private to this user.
    """
    uid = os.getuid()
    bases = [os.environ.get("XDG_RUNTIME_DIR", ""), f"/run/user/{uid}"]
    base = next((Path(b) for b in bases if b and private_dir(Path(b), uid) and swappable(Path(b)) is None), None)
    path = base / "cellblock" if base is not None else state_dir() / "run"
    try:
        make_dirs(path)
    except OSError as exc:
        raise RuntimeDirError(f"cannot create the runtime directory {path}: {exc.strerror or exc}") from exc
    if not private_dir(path, uid):
        raise RuntimeDirError(
            f"the runtime directory {path} is not private to this user (it must be a directory of "
            f"uid {uid}, mode 0700, not a link); remove it and start again, or set XDG_RUNTIME_DIR "
            "to a private directory"
        )
    return path


def private_dir(path: Path, uid: int) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o077


class StateWriteError(OSError):
    """A state file could not be written; the message names the file and why (a full disk says so)."""


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON in one step, as `policy.files.atomic_write_json` writes
    it (0600, sorted keys, no NaN); its failure as a `StateWriteError`.

    Raises:
        StateWriteError: see `atomic_write_text`.
        ValueError: `data` holds NaN or an infinity, which JSON cannot carry.
    """
    with _state_write(path):
        files.atomic_write_json(path, data)


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` in one step (`policy.files`: temp file, fsync, rename, fsync of
    the directory); the file gets `mode`. A crash leaves the old file whole, and at worst a temp
    file that the next gateway start removes (`clean_stale_temps`).

    Raises:
        StateWriteError: it could not be written (the old file, if any, is unchanged).
    """
    with _state_write(path):
        atomic_write_bytes(path, text.encode("utf-8"), mode)


def create_once(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Make `path` with `data`, whole, unless it exists (then whoever made it first wins).

    Raises:
        StateWriteError: it could not be written.
    """
    with contextlib.suppress(FileExistsError), _state_write(path):
        write_once(path, data, mode)


@contextlib.contextmanager
def _state_write(path: Path) -> Iterator[None]:
    """An `OSError` of writing `path` as a `StateWriteError` that says a full disk is full."""
    try:
        yield
    except FileExistsError:
        raise
    except OSError as exc:
        full = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise StateWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}{full}") from exc


# A writer holds the lock for one read, change and atomic write: milliseconds. One held this long
# is a stuck or hostile process of the user's; the change is refused, not waited for without end.
LOCK_SECONDS = 10.0
LOCK_POLL = 0.01  # a held flock gives no event to wait on in a thread; it is tried again this often


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_SECONDS) -> Iterator[None]:
    """Hold the lock for changing `path`: an exclusive `flock` of `<path>.lock` beside it (made
    0600), which every process that changes `path` takes; read `path` again inside, then change
    and write it. It blocks: call it off the event loop.

    Raises:
        StateWriteError: the lock file cannot be made, or another process has held it for `timeout` s.
    """
    lock = path.with_name(path.name + ".lock")
    with _state_write(lock):
        make_dirs(path.parent)  # 0700 whatever the umask, as every directory Cellblock makes
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StateWriteError(
                        errno.EWOULDBLOCK,
                        f"cannot change {path}: another process has held {lock.name} for {timeout:g} s; "
                        f"see which with 'fuser {lock}', then try again",
                    ) from None
                time.sleep(LOCK_POLL)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def clean_stale_temps(directory: Path, before: float) -> int:
    """Remove the temp files `policy.files` left in `directory` (and below) when a writer was killed:
    only ours by name, only made before `before`, only when no live writer holds their lock.
    How many were removed."""
    removed = 0
    for candidate in directory.rglob("*.tmp"):
        if not TEMP_NAME.match(candidate.name):
            continue
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone already, or a link: not ours
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_mtime >= before or info.st_uid != os.getuid():
                continue
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live writer's
            candidate.unlink(missing_ok=True)
            removed += 1
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def read_json(path: Path) -> Any | None:
    """The JSON in `path`, or None when it is missing, unreadable or not strict JSON (callers treat
    that as 'no state'); lone surrogates in it are replaced (see `policy.jsontext`)."""
    try:
        return loads(path.read_bytes())
    except (OSError, ValueError):
        return None
