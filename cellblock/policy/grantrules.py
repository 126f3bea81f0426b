"""Where a write runs code outside the jail: the one copy of these rules over paths, which the gate
of grants (`gateway/scan/gate.py`: a scan's proposal, a learn trace's, a share a call asks for)
and wrap's share of a command line's missing path (`gateway/config/missing.py`) both read.

A grant made writable is never a hidden entry or one inside one (a name starting with `.`: a
shell's and a login's startup files, `~/.config` with autostart and user services, `~/.local`
with programs and Python's `.pth` files, a repository's `.git` with its hooks), nor a folder of
programs, inside or above: the system's (`/usr`, `/etc`, `/opt`, cron's spool, ...), each on
`$PATH`, and each home's `~/bin` (which a login's profile puts on `$PATH`) and `~/Library`
(macOS's launch agents), and the well-known folders of programs a home keeps under a name of its
own (`~/go/bin`, `~/.cargo/bin`, conda's `~/miniconda3`, ...), on `$PATH` or not.

Nor is a folder made writable that holds, directly, what runs code the user starts outside the jail
(`held_runner`): a hidden folder (a repository's `.git` with its hooks and `core.hooksPath`, an
editor's `.vscode` with its tasks, a client's `.claude` or `.cursor` with more MCP servers), a file
that a tool runs or loads on its own (`RUN_CONFIG`: `.envrc`, `.mcp.json`, a project's
`cellblock.yaml`, ...; nor such a file itself), a `bin` folder, or a virtualenv (a `pyvenv.cfg` in
it or in a folder of it); nor a folder inside a virtualenv. Nor a file or folder made writable
directly in a home whose name tools look for upward from every project below it
(`HOME_TOOL_CONFIG`: `~/package.json`, `~/go.work`, `~/conftest.py`, ...).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    "HOME_PROGRAMS",
    "HOME_TOOL_CONFIG",
    "RUN_CONFIG",
    "SYSTEM_PROGRAMS",
    "held_runner",
    "hidden_part",
    "home_tool_config",
    "program_dirs",
]

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
HOME_PROGRAMS = (
    *("bin", "Library", ".local/bin", ".cargo/bin", "go/bin", ".deno/bin", ".bun/bin", "node_modules"),
    *("miniconda3", "anaconda3", "miniforge3", "mambaforge", ".pyenv", ".nvm", ".rbenv", ".sdkman"),
)
# Files in a project a tool runs or loads on its own when the user works there, and why: a folder
# directly holding one is not made writable (hidden folders, `bin` and virtualenvs besides).
RUN_CONFIG = {
    ".envrc": "direnv runs it on entering the folder",
    ".mcp.json": "a client starts the MCP servers it lists, unjailed",
    ".git": "a worktree's pointer to the repository whose hooks run",
    ".pre-commit-config.yaml": "pre-commit runs what it lists at each commit",
    ".npmrc": "npm runs its script-shell and node-options",
    ".yarnrc.yml": "yarn runs its yarnPath",
    ".pdbrc": "pdb runs it",
    "pyvenv.cfg": "it makes the folder a virtualenv, whose programs the user runs",
    "cellblock.yaml": "Cellblock starts the servers it lists as it says (jail: false among them)",
}
# Names tools look for upward from the folder they run in: made writable in a home itself, each is
# read by every project below the home that lacks its own, and why that runs code.
HOME_TOOL_CONFIG = {
    "package.json": "npm and node read it from any folder below that lacks one (scripts, imports)",
    "node_modules": "node loads modules from it for any project below",
    "go.work": "go reads it from any module below (replace directives: other code built and run)",
    "go.mod": "go reads it from any folder below that lacks one",
    "conftest.py": "pytest imports it for tests below it",
    "pytest.ini": "pytest reads its options (plugins to load) from any project below that lacks one",
    "tox.ini": "tox and pytest read it from any project below that lacks one",
    "setup.cfg": "pytest and other tools read it from any project below that lacks one",
    "pyproject.toml": "pytest and other tools read it from any project below that lacks one",
    "Makefile": "make runs it where you run make in your home",
    "makefile": "make runs it where you run make in your home",
    "GNUmakefile": "make runs it where you run make in your home",
    "tsconfig.json": "tsc reads it from any folder below that lacks one (plugins)",
    "babel.config.js": "babel runs it for projects below",
}


def hidden_part(path: str) -> str | None:
    """The first hidden entry on `path`'s way (a part starting with `.`, not `.` or `..`), if any."""
    return next((part for part in path.split("/") if part.startswith(".") and part not in (".", "..")), None)


def program_dirs(homes: Sequence[str], search_path: str) -> list[str]:
    """Where programs are kept that run outside the jail: the system's, each of `homes`' own, and
    each absolute directory of `search_path` (a `$PATH`), each once."""
    found = [*SYSTEM_PROGRAMS, *(os.path.join(home, part) for home in homes for part in HOME_PROGRAMS)]
    found += [p for p in search_path.split(os.pathsep) if p.startswith("/")]
    return list(dict.fromkeys(found))


def home_tool_config(path: str, homes: Sequence[str]) -> str | None:
    """Why `path`, directly in one of `homes`, is never made writable (`HOME_TOOL_CONFIG`), if it is."""
    if os.path.dirname(path) not in homes:
        return None
    why = HOME_TOOL_CONFIG.get(os.path.basename(path))
    return None if why is None else f"{os.path.basename(path)} in your home: {why}"


def held_runner(folder: str) -> str | None:
    """What `folder` holds directly, or is inside, that runs code outside the jail once written (a
    hidden folder, a `RUN_CONFIG` file, a `bin` folder, a virtualenv), said with the entry's path;
    or what `folder` is, when it is a `RUN_CONFIG` file itself (`cellblock.yaml`, not hidden)."""
    if os.path.basename(folder) in RUN_CONFIG and os.path.isfile(folder):
        return f"{folder}: {RUN_CONFIG[os.path.basename(folder)]}"
    above = folder
    while above != os.path.dirname(above):
        if os.path.isfile(os.path.join(above, "pyvenv.cfg")):
            return f"{above} is a virtualenv (it holds pyvenv.cfg), whose programs you run"
        above = os.path.dirname(above)
    try:
        with os.scandir(folder) as entries:
            listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    except OSError:
        return None  # nothing there yet (made by the grant), or not a folder
    for name, is_dir in sorted(listed):
        entry = os.path.join(folder, name)
        if is_dir and name.startswith("."):
            return f"it holds {entry}, a hidden folder where programs keep what they run (a repository's hooks)"
        if is_dir and name == "bin":
            return f"it holds {entry}, a folder of programs"
        if is_dir and os.path.isfile(os.path.join(entry, "pyvenv.cfg")):
            return f"it holds {entry}, a virtualenv (pyvenv.cfg), whose programs you run"
        if name in RUN_CONFIG and not is_dir:
            return f"it holds {entry}: {RUN_CONFIG[name]}"
    return None
