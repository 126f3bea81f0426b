"""Find what a server's command needs in order to run inside a jail.

A command is usually a launcher: a virtualenv's `python` that points at an interpreter under
`~/.pyenv`, a `node` under `~/.nvm`, a script whose `#!` line names another program. Each of
those installations is shared read-only, found by following symlinks and `#!` lines; nothing else
of the home directory comes with them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cellblock.sandbox.types import JailError, Mount, MountMode

__all__ = ["SYSTEM_PREFIXES", "launcher_mounts", "resolve_command"]

# Shared with every jail already (read-only); an installation inside these needs no mount.
SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# How many launcher hops (symlink -> script -> interpreter ...) are followed.
MAX_HOPS = 6


def resolve_command(command: str, path: str) -> str:
    """The absolute path of `command`, looked up on `path` when it has no slash.

    Raises:
        JailError: the command cannot be found or is not executable.
    """
    found = shutil.which(command, path=path) if "/" not in command else command
    if found is None or not os.access(found, os.X_OK):
        raise JailError(f"command not found or not executable: {command}")
    return os.path.abspath(found)


def launcher_mounts(executable: str, home: str, path: str) -> list[Mount]:
    """Read-only mounts for the installations `executable` runs from, in a stable order."""
    roots: dict[str, None] = {}
    queue, seen = [executable], set()
    while queue and len(seen) < MAX_HOPS * 4:
        current = queue.pop(0)
        if current in seen:
            continue
        seen.add(current)
        for candidate in _chain(current):
            root = _installation(candidate, home)
            if root is not None:
                roots.setdefault(root, None)
            queue.extend(_interpreters(candidate, path))
    return [Mount(root, MountMode.READ_ONLY, "launcher") for root in roots]


def _chain(path: str) -> list[str]:
    """`path` and every hop of its symlinks, ending in the real file."""
    hops = [path]
    current = path
    for _ in range(MAX_HOPS):
        if not os.path.islink(current):
            break
        target = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
        hops.append(current)
    real = os.path.realpath(path)
    if real not in hops:
        hops.append(real)
    return hops


def _system(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in SYSTEM_PREFIXES)


def _installation(path: str, home: str) -> str | None:
    """The directory to share for the program at `path`: its virtualenv or its install prefix."""
    if _system(path) or not os.path.exists(path):
        return None
    parent = Path(path).parent
    for directory in [parent, *parent.parents]:
        if (directory / "pyvenv.cfg").is_file():
            return str(directory)
    prefix = parent.parent if parent.name == "bin" else parent
    # Never share the home directory, one of its ancestors, or a catch-all like ~/.local: only
    # the file itself is shared then.
    home_path = Path(home)
    catch_all = {home_path, home_path / ".local", home_path / "bin", Path("/"), Path("/opt"), Path("/home")}
    if prefix in catch_all or prefix in home_path.parents:
        return path
    return str(prefix)


def _interpreters(path: str, search: str) -> list[str]:
    """Programs `path` needs besides itself: its `#!` interpreter, a virtualenv's base Python."""
    found: list[str] = []
    venv_cfg = Path(path).parent.parent / "pyvenv.cfg"
    if venv_cfg.is_file():
        for line in venv_cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                found.append(os.path.join(value.strip(), "python3"))
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return found
    if not head.startswith(b"#!"):
        return found
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return found
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        located = shutil.which(names[0], path=search) if names else None
        if located:
            found.append(located)
    else:
        found.append(words[0])
    return found
