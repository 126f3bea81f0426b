"""Recognise an installation by its structure, so that it, and nothing around it, can be shared.

A directory is shared whole for a program in it only when it positively is an installation:

- a virtualenv: `pyvenv.cfg` next to `bin/python`;
- a Python install: a real `bin/pythonX.Y` next to `lib/pythonX.Y/os.py` (the standard library)
  — pyenv's `~/.pyenv/versions/3.11.7`, uv's `~/.local/share/uv/python/cpython-3.12…`, conda and
  miniforge, a Homebrew keg, `/opt/python3.12`;
- a Node install: a real `bin/node` next to `lib/node_modules` — nvm's
  `~/.nvm/versions/node/v20.x`, fnm, volta, asdf, a Homebrew keg;
- node packages: a `node_modules` directory, for a program inside one of its packages;
- an install prefix: a program in `bin/` that is an ELF binary, next to a `lib/` of shared libraries.

Where a directory is, or what file names it, never makes it one: `~/.cargo` (its `bin/` next to
`credentials.toml`) and `~/.docker` are not installations, `~/.nvm` is not (its `versions/node/vX`
is). The home, its ancestors, `/` and every directory directly under it (`/opt`, `/home`, `/tmp`)
and the catch-alls of the home (`~/.local`, `~/bin`, …) are never shared whole, whatever they hold.
"""

from __future__ import annotations

import os
import re

from cellblock.policy.constraints import within
from cellblock.sandbox.pin import is_elf
from cellblock.sandbox.types import Install, InstallKind

__all__ = ["CATCH_ALLS", "installation_of", "never_shared"]

# Directories of the home that hold anything at all: never an installation, however they look
# (~/.local has bin/ and lib/python3.X/site-packages, ~/.config and ~/.cache hold tokens).
CATCH_ALLS = (".local", ".local/bin", ".local/lib", ".local/share", ".local/state", "bin", ".config", ".cache")
# How many directories above a program are looked at, nearest first: npm's own npm-cli.js sits
# five below its Node install (lib/node_modules/npm/bin/).
MAX_LEVELS = 8
PYTHON_LIB = re.compile(r"python\d+\.\d+")
SHARED_LIBRARY = re.compile(r".+\.so(\.\d+)*")


def installation_of(path: str, home: str) -> Install | None:
    """The nearest installation holding the file at `path`, or None: then only the file is shared."""
    directory = os.path.dirname(path)
    for _ in range(MAX_LEVELS):
        if never_shared(directory, home):
            return None
        kind = _kind(directory, path)
        if kind is not None:
            return Install(directory, kind)
        directory = os.path.dirname(directory)
    return None


def never_shared(directory: str, home: str) -> bool:
    """Whether `directory` must never be shared whole: the home, above it, a catch-all, `/` or `/x`."""
    homes = {os.path.normpath(home), os.path.realpath(home)}
    for candidate in {os.path.normpath(directory), os.path.realpath(directory)}:
        if os.path.dirname(candidate) == "/" or candidate == "/":
            return True
        if any(within(h, candidate) for h in homes):
            return True
        if any(candidate == os.path.join(h, name) for h in homes for name in CATCH_ALLS):
            return True
    return False


def _kind(directory: str, path: str) -> InstallKind | None:
    if _virtualenv(directory):
        return InstallKind.VIRTUALENV
    if _python_install(directory):
        return InstallKind.PYTHON
    if _node_install(directory):
        return InstallKind.NODE
    if _node_package(directory, path):
        return InstallKind.NODE_PACKAGES
    if _install_prefix(directory, path):
        return InstallKind.PREFIX
    return None


def _real_file(path: str) -> bool:
    # A link is not the interpreter's own file: Homebrew's prefix links bin/node into its Cellar,
    # and that prefix also holds var/ (the databases of the services it runs).
    return os.path.isfile(path) and not os.path.islink(path)


def _entries(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _virtualenv(directory: str) -> bool:
    if not os.path.isfile(os.path.join(directory, "pyvenv.cfg")):
        return False
    return any(os.path.lexists(os.path.join(directory, "bin", name)) for name in ("python", "python3"))


def _python_install(directory: str) -> bool:
    """A real `bin/pythonX.Y` next to its standard library (`lib/pythonX.Y/os.py`, CPython's landmark)."""
    return any(
        PYTHON_LIB.fullmatch(name)
        and os.path.isfile(os.path.join(directory, "lib", name, "os.py"))
        and _real_file(os.path.join(directory, "bin", name))
        for name in _entries(os.path.join(directory, "lib"))
    )


def _node_install(directory: str) -> bool:
    """A real `bin/node` next to `lib/node_modules` (where npm and global packages live)."""
    return _real_file(os.path.join(directory, "bin", "node")) and os.path.isdir(
        os.path.join(directory, "lib", "node_modules")
    )


def _node_package(directory: str, path: str) -> bool:
    """`directory` is a node_modules holding `path` in one of its packages (or in its `.bin`)."""
    if os.path.basename(directory) != "node_modules":
        return False
    parts = os.path.relpath(path, directory).split(os.sep)
    if parts[0] == ".bin":
        return len(parts) == 2
    package = parts[:2] if parts[0].startswith("@") else parts[:1]
    return len(parts) > len(package) and os.path.isfile(os.path.join(directory, *package, "package.json"))


def _install_prefix(directory: str, path: str) -> bool:
    if os.path.dirname(path) != os.path.join(directory, "bin") or not is_elf(path):
        return False
    return any(SHARED_LIBRARY.fullmatch(name) for name in _entries(os.path.join(directory, "lib")))
