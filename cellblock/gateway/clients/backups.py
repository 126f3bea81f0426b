"""Where wrap keeps a client's original file, and whether that file belongs to a project.

A project's file (`.mcp.json`, `<project>/.cursor/mcp.json`, `.vscode/mcp.json`, …) is checked
into its repository and cloned by others, so its backup never sits beside it: a `.bak` there
would be committed, secrets' references and all. Every backup is kept under Cellblock's state
directory, named by the file's real path; a user's own file also gets `PATH.bak` beside it, the
copy a human finds. unwrap reads whichever is there, so deleting `PATH.bak` loses nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePath

from cellblock.gateway.clients.kinds import kind_of
from cellblock.gateway.state import state_dir

__all__ = ["beside", "is_project_file", "kept", "stored_backups"]


def is_project_file(kind: str, path: Path, home: Path) -> bool:
    """`path` is a project's config of client `kind` (a file the client reads from the folder it
    works in), not the user's own one."""
    real = path.resolve()
    for root, below in kind_of(kind).files:
        if root == "cwd" and PurePath(real).match(below) and real != (home / below).resolve():
            return True
    return False


def beside(path: Path) -> Path:
    """`PATH.bak`: the copy of a user's own file a human finds next to it."""
    return path.with_name(path.name + ".bak")


def kept(path: Path) -> Path:
    """The backup of `path` under Cellblock's state directory, named by the file's real path.

    Raises:
        RuntimeDirError: the state directory cannot be had (see `state.state_dir`).
    """
    real = str(path.resolve())
    key = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return state_dir() / "backups" / f"{key}-{path.name}"


def stored_backups(path: Path) -> list[Path]:
    """The backups of `path` that exist, `PATH.bak` first."""
    return [p for p in (beside(path), kept(path)) if p.exists()]
