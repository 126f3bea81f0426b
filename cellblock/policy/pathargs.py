"""The paths in the user's home a tool call's arguments name, and what sharing one would grant.

A jail shows the server a private home at the user's home's path (docs/jail.md, "The home"): a
file a tool is asked to write at `~/notes/x.txt` that no grant shares lands there, and the user
finds nothing at the path they named. So before such a call runs, the gateway asks the user to
share the path (`gateway/serve/shares.py`); this module finds the paths and says what to share.

A path argument is a string value, anywhere in the arguments (a list of files too, to a bounded
depth and count), that is a whole path in the home: `~` or `~/…` (the user's real home, as the
jail shows it at the same path), an absolute path under the home, or a `file://` URI of one. It is
judged normalised (`.` and `..` folded, as the user reads it); the gate judges the grant again as
the kernel will see it (links followed). Not looked for, and why a miss is no hole:

- relative paths: relative to the server's working directory in its jail, which the user cannot
  name; the jail decides what they reach;
- paths outside the home (`/etc/hosts`, `/tmp/x`): the jail shows the host's system files
  read-only, its own `/tmp`, and nothing else; no question would make them the user's;
- a path inside prose (`"see ~/notes/a.txt"`): a question is asked only for a whole value, so a
  long text is never a grant. The jail still stops what is not shared.

What a share grants is the least that works, as `gateway/config/missing.py` chose for command
lines: a tool that only reads (`readOnlyHint`) is shared what it reads, read-only, and nothing when
that does not exist; a tool that may write is shared the folder that holds the path read-write
(it may write the file through a temp file and a rename, or keep a journal beside it), the folder
made when missing; a folder it names itself, that folder; and where the folder is the home, which
is never shared whole, the file alone, made empty when missing. `config/missing.py` makes the
same choice for a command line's path that does not exist yet, with this function.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from cellblock.policy.constraints import within

__all__ = ["Grant", "Kind", "Make", "PathArgument", "covered", "grant_for", "on_disk", "path_arguments", "shared"]

MAX_DEPTH = 4  # levels of nested lists and objects looked into
MAX_STRINGS = 256  # string values looked at in one call's arguments
PATH_MAX = 4095  # the longest path the kernel takes

Kind = Literal["dir", "file"] | None  # what is at a path on the host (None: nothing)
Make = Literal["", "dir", "file"]  # what a grant makes first: nothing, its folder, or its file empty


@dataclass(frozen=True)
class PathArgument:
    """One argument that names a path in the home: where it is, as given, and the path it means."""

    where: str  # "path", "files[1]", "options.dest"
    given: str
    path: str  # absolute and normalised


@dataclass(frozen=True)
class Grant:
    """What sharing a path argument adds to the jail: `path`, read-write or not, and what to make first."""

    path: str
    write: bool
    make: Make = ""  # "dir": the folder is made; "file": the file is made empty


def path_arguments(arguments: dict[str, Any] | None, home: str) -> list[PathArgument]:
    """The arguments that name a path in `home` (see the module's docstring), each path once."""
    home = posixpath.normpath(home)
    found: dict[str, PathArgument] = {}
    for where, value in _strings(arguments or {}, "", 0, [MAX_STRINGS]):
        path = _meant(value, home)
        if path is not None and path not in found:
            found[path] = PathArgument(where, value, path)
    return list(found.values())


def _strings(value: Any, where: str, depth: int, budget: list[int]) -> Iterator[tuple[str, str]]:
    if budget[0] <= 0 or depth > MAX_DEPTH:
        return
    if isinstance(value, str):
        budget[0] -= 1
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}" if where else str(key), depth + 1, budget)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]", depth + 1, budget)


def _meant(value: str, home: str) -> str | None:
    """The absolute path in `home` that `value` names as a whole, if it names one."""
    if len(value) > PATH_MAX or not value.isprintable():
        return None
    if value.startswith("file://"):
        parts = urlsplit(value)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            return None
        path = unquote(parts.path)
    elif value == "~" or value.startswith("~/"):
        path = home + value[1:]
    elif value.startswith("/"):
        path = value
    else:
        return None
    if "\0" in path:
        return None
    path = "/" + posixpath.normpath(path).lstrip("/")  # normpath keeps a leading "//"
    return path if within(path, home) else None


def shared(path: str, grants: Sequence[str]) -> bool:
    """Whether `path` is one of `grants` or under one (a write under a read-only grant fails
    loudly, with EROFS: nothing is lost there, so it is not asked about)."""
    return any(within(path, posixpath.normpath(grant)) for grant in grants)


def covered(path: str, read_only: Sequence[str], read_write: Sequence[str], write: bool) -> bool:
    """Whether a jail of these grants shares `path` as a grant of it would (`write`: read-write).
    The deepest grant holding `path` decides, a read-write one at a tie: the jail mounts shallow
    grants first (`sandbox/bwrap.py`), so a read-only grant inside a read-write one wins there."""
    if not write:
        return shared(path, [*read_only, *read_write])
    writes, reads = _deepest(path, read_write), _deepest(path, read_only)
    return writes >= 0 and writes >= reads


def _deepest(path: str, grants: Sequence[str]) -> int:
    """How deep the deepest of `grants` holding `path` is (its slashes), -1 when none holds it."""
    return max((g.count("/") for g in map(posixpath.normpath, grants) if within(path, g)), default=-1)


def on_disk(path: str) -> Kind:
    """What is at `path` on the host, links followed: a folder, something else, or nothing."""
    if os.path.isdir(path):
        return "dir"
    return "file" if os.path.lexists(path) else None


def grant_for(path: str, home: str, write: bool, kind_of: Callable[[str], Kind]) -> Grant | None:
    """What to share for `path` (in `home`) for a tool that writes or only reads (`write`); None
    when there is nothing to share (a read of what does not exist). `kind_of` says what is at a
    path on the host."""
    home = posixpath.normpath(home)
    kind = kind_of(path)
    if not write:
        return None if kind is None else Grant(path, False)
    if kind == "dir" or path == home:
        return Grant(path, True)  # the home itself is refused by the gate, never shared
    folder = posixpath.dirname(path)
    if folder == home:
        return Grant(path, True, "file" if kind is None else "")
    return Grant(folder, True, "dir" if kind_of(folder) is None else "")
