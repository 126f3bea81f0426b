"""Where a write runs code outside the jail: the one copy of these rules over paths, which the gate
of grants (`gateway/scan/gate.py`: a scan's proposal, a learn trace's, a share a call asks for)
and wrap's share of a command line's missing path (`gateway/config/missing.py`) both read.

A grant made writable is never a hidden entry or one inside one (a name starting with `.`: a
shell's and a login's startup files, `~/.config` with autostart and user services, `~/.local`
with programs and Python's `.pth` files, a repository's `.git` with its hooks), nor a folder of
programs, inside or above: the system's (`/usr`, `/etc`, `/opt`, cron's spool, ...), each on
`$PATH`, and each home's `~/bin` (which a login's profile puts on `$PATH`) and `~/Library`
(macOS's launch agents).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["HOME_PROGRAMS", "SYSTEM_PROGRAMS", "hidden_part", "program_dirs"]

# Where the system keeps the programs and configuration it runs, and what cron and at run.
SYSTEM_PROGRAMS = (
    "/usr",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/opt",
    "/var/spool",
)
# Under a home, where a write is a program (or its launch) that runs outside the jail.
HOME_PROGRAMS = ("bin", "Library")


def hidden_part(path: str) -> str | None:
    """The first hidden entry on `path`'s way (a part starting with `.`, not `.` or `..`), if any."""
    return next((part for part in path.split("/") if part.startswith(".") and part not in (".", "..")), None)


def program_dirs(homes: Sequence[str], search_path: str) -> list[str]:
    """Where programs are kept that run outside the jail: the system's, each of `homes`' own, and
    each absolute directory of `search_path` (a `$PATH`), each once."""
    found = [*SYSTEM_PROGRAMS, *(os.path.join(home, part) for home in homes for part in HOME_PROGRAMS)]
    found += [p for p in search_path.split(os.pathsep) if p.startswith("/")]
    return list(dict.fromkeys(found))
