"""What wrap shares for a path a server's arguments name that does not exist yet (a database the
server will create, a folder it is to fill): never nothing, so that what the server writes there
lands where the user asked and not in its jail's private home.

Only inside the home, where the user's own work is, and never where a write is code that runs
outside the jail or Cellblock's own state (the rules of `gateway/scan/gate.py` that apply to a
path that holds nothing yet; those of hidden entries and program folders are one copy,
`policy/grantrules.py`): not the home itself, no hidden entry on the way (`~/.config`,
`~/.local`, a repository's `.git`: startup files, autostart, hooks, and every secret a home keeps),
no directory of programs (`~/bin`, one on `$PATH`, macOS's `~/Library` with its launch agents),
no folder that holds what runs code (a repository's `.git`, `.envrc`, a `bin`, a virtualenv) or is
inside a virtualenv, no `~/package.json` or other name tools read upward, nothing of Cellblock's.
The narrowest grant that works, in order:

- a server that works in the directories it is given (a filesystem server): the folder itself,
  made by wrap and shared read-write;
- else its folder shared read-write (made by wrap when missing): the server creates the file,
  and a journal or a temp file beside it, as it would unjailed;
- else (its folder is the home, which is never shared) the file itself, made empty by wrap and
  shared read-write alone.
"""

from __future__ import annotations

import os
import posixpath

from cellblock.gateway.config.draft import Draft
from cellblock.gateway.state import default_config_path, own_dirs
from cellblock.policy.constraints import within
from cellblock.policy.grantrules import held_runner, hidden_part, home_tool_config, program_dirs
from cellblock.policy.pathargs import grant_for, on_disk

__all__ = ["share_missing"]

# What a missing script is named like (a server whose code is not where its entry says): never
# given a writable folder, where the server could put the code it is started with next.
CODE_SUFFIXES = (".js", ".mjs", ".cjs", ".ts", ".py", ".sh", ".rb", ".pl", ".jar", ".exe")


def share_missing(draft: Draft, path: str, *, writable: bool) -> None:
    """Share what `path` (as `Draft.path` gives it; it does not exist) needs, with a note saying
    what and why, or a note saying why nothing; `writable`: the server works in what it is given."""
    real = posixpath.normpath(draft.expand(path))
    refused = _refused(draft.home, real)
    if refused is not None:
        draft.notes.append(f"{path} is in its arguments but does not exist: not shared ({refused})")
        return
    # the least grant that works, as a call's share makes it (policy/pathargs.py)
    grant = grant_for(real, draft.home, True, on_disk)
    target = real if writable or grant is None else grant.path
    held = home_tool_config(target, [posixpath.normpath(draft.home)]) or held_runner(target)
    if held is not None:
        draft.notes.append(
            f"{path} is in its arguments but does not exist: {target} is not shared read_write ({held}, so a "
            "server that may write there runs code outside its jail); if you mean it to, add it to "
            "jail.read_write yourself"
        )
        return
    if writable:
        draft.share(path, writable=True)
        draft.make.append(real)
        draft.notes.append(f"read_write: {path} (does not exist yet: wrap creates the folder the server works in)")
    elif grant is not None and grant.path != real:
        shown = _shown(draft, path, grant.path)
        draft.share(shown, writable=True)
        if grant.make == "dir":
            draft.make.append(grant.path)
        draft.notes.append(
            f"read_write: {shown} ({path} does not exist yet: the server creates it there, "
            "where you find it; adjust jail.read_write if it needs less)"
        )
    else:
        draft.share(path, writable=True)
        draft.touch.append(real)
        draft.notes.append(
            f"read_write: {path} (does not exist yet and its folder is your home, which is never shared: "
            "wrap creates it empty and shares that file alone; a database's journal beside it is made for it, "
            "but a server that replaces the file through a temp file cannot: give it a folder instead)"
        )


def _refused(home: str, real: str) -> str | None:
    """Why nothing may be shared for the missing `real`, if nothing may."""
    home = posixpath.normpath(home)
    if real == home or not within(real, home):
        return "outside your home: share its folder by hand in jail.read_write"
    existing = real
    while not os.path.exists(existing):
        existing = posixpath.dirname(existing)
    if existing != home and within(home, existing):
        return f"your home {home} does not exist"
    if not within(os.path.realpath(existing), os.path.realpath(home)):
        return f"{existing} leads outside your home: share its folder by hand in jail.read_write"
    if real.endswith(CODE_SUFFIXES):
        return "named like a program, whose folder is never made writable; if it is the server's, fix the path"
    if hidden_part(posixpath.relpath(real, home)) is not None:
        return "a hidden folder on its way, where programs keep what they run and what is secret"
    if any(within(real, p) for p in program_dirs([home], os.environ.get("PATH", ""))):
        return "a folder of programs, which a jail never writes"
    mine = [os.path.realpath(p) for p in (*map(str, own_dirs()), str(default_config_path()))]
    if any(within(os.path.realpath(real), m) or within(m, os.path.realpath(real)) for m in mine):
        return "Cellblock's own"
    return None


def _shown(draft: Draft, path: str, folder: str) -> str:
    """`folder` spelled as `path` is (`~/` or absolute)."""
    home = posixpath.normpath(draft.home)
    return "~" + folder[len(home) :] if path.startswith("~") and within(folder, home) else folder
