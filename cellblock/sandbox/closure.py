"""Everything a set of programs needs in order to run, and nothing else: their exec closure.

With `exec.allow`, a jail shows the listed programs and what starting them reads — every symlink
on the way, each ELF program's loader and its libraries (found as the loader finds them, see
`sandbox/elf.py`), each script's `#!` interpreter — instead of all of `/usr`. What is not there
cannot be run, not even through the loader (`ld.so /bin/sh`), which an exec-only rule cannot stop.

A Python interpreter loads its standard library (and the C extensions in it) by path at run time,
so for a Python in a system directory its library directories come too; any other interpreter
gets its ELF closure only.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections import deque
from collections.abc import Sequence

from cellblock.policy.constraints import within
from cellblock.sandbox.elf import Elf, find_library, read_elf, system_library_dirs
from cellblock.sandbox.launchers import SYSTEM_PREFIXES, env_program, link_chain
from cellblock.sandbox.pin import shebang
from cellblock.sandbox.types import Closure

__all__ = ["GUARANTEE", "exec_closure"]

# What exec.allow guarantees on Linux, as `cellblock show` and docs/jail.md say it.
GUARANTEE = (
    "only these programs, their loaders, libraries and #! interpreters are in the jail, and only they can be "
    "executed (Landlock) or mapped executable (every other mount is noexec; memfd_create is refused); "
    "an allowed interpreter (python, node, sh) still runs any code it is given"
)

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)")
_SHARED = re.compile(r".+\.(so(\.\d+)*|node)")
# Loaded with dlopen, not named by DT_NEEDED: glibc opens it to unwind (thread cancellation, C++).
_DLOPENED = ("libgcc_s.so.1",)
# Programs and libraries followed for one jail; real closures have a few dozen.
MAX_OBJECTS = 512


def exec_closure(programs: Sequence[str], path: str, installations: Sequence[str] = ()) -> Closure:
    """The closure of `programs` (absolute paths); `path` is where `#!/usr/bin/env NAME` looks NAME up.

    The shared objects inside `installations` (a virtualenv's C extensions, a Node install's
    native modules) are loaded at run time by path: the libraries they need come too.
    """
    files: dict[str, None] = {}
    executables: dict[str, None] = {}
    directories: dict[str, None] = {}
    queue: deque[str] = deque(programs)
    libraries: deque[tuple[str, Elf]] = deque(
        (found, elf) for found in _shared_objects(installations) if (elf := read_elf(found)) is not None
    )
    seen: set[str] = set()
    while (queue or libraries) and len(seen) < MAX_OBJECTS:
        if queue:
            program = queue.popleft()
            if program in seen:
                continue
            seen.add(program)
            real = _add(program, files)
            executables.setdefault(program, None)
            executables.setdefault(real, None)
            elf = read_elf(real)
            if elf is None:
                queue.extend(_interpreters(real, path))
                continue
            if elf.interpreter:
                queue.append(elf.interpreter)
            shared, extensions = _python_library(real, elf)
            directories.update(dict.fromkeys(shared))
            libraries.append((real, elf))
            libraries.extend((ext, loaded) for ext in extensions if (loaded := read_elf(ext)) is not None)
            continue
        _, elf = libraries.popleft()
        system = system_library_dirs(elf.machine)
        names = [*elf.needed, *(_DLOPENED if any(n.startswith("libc.so") for n in elf.needed) else ())]
        for name in names:
            found = find_library(name, elf, system)
            if found is None or found in seen:
                continue
            seen.add(found)
            real = _add(found, files)
            loaded = read_elf(real)
            if loaded is not None:
                libraries.append((real, loaded))
    return Closure(tuple(files), tuple(executables), tuple(directories))


def _shared_objects(installations: Sequence[str]) -> list[str]:
    """The shared objects (`*.so`, `*.so.N`, Node's `*.node`) an installation's programs load by
    path: a virtualenv's packages, a Python's own packages unless it is only a virtualenv's base,
    a Node install's global modules, a node_modules tree, an install prefix's `lib/`."""
    venvs = [root for root in installations if os.path.isfile(os.path.join(root, "pyvenv.cfg"))]
    bases = {os.path.realpath(home) for home in map(_venv_base, venvs) if home}
    found: list[str] = []
    for root in installations:
        if root in venvs or (glob.glob(f"{root}/lib/python3*/os.py") and os.path.realpath(root) not in bases):
            tops = glob.glob(f"{root}/lib/python3*/site-packages")
        elif glob.glob(f"{root}/lib/python3*/os.py"):
            tops = []  # a virtualenv's base: its own packages are not on the virtualenv's path
        elif os.path.isdir(f"{root}/lib/node_modules"):
            tops = [f"{root}/lib/node_modules"]
        else:
            tops = [root if os.path.basename(root) == "node_modules" else f"{root}/lib"]
        for top in tops:
            for directory, subdirs, names in os.walk(top):
                subdirs[:] = [d for d in subdirs if d != "__pycache__"]
                found += [os.path.join(directory, n) for n in sorted(names) if _SHARED.fullmatch(n)]
                if len(found) > MAX_OBJECTS:
                    return found
    return found


def _venv_base(venv: str) -> str | None:
    """The installation a virtualenv's `home =` names (the directory holding its python)."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), errors="replace") as handle:
            settings = dict(line.partition("=")[::2] for line in handle.read(65536).splitlines())
    except OSError:
        return None
    home = {k.strip(): v.strip() for k, v in settings.items()}.get("home", "")
    return os.path.dirname(home) if os.path.isabs(home) else None


def _add(path: str, files: dict[str, None]) -> str:
    """Add `path` and each symlink hop after it, by their physical paths; return the real file."""
    hops = [_physical(hop) for hop in link_chain(path)]
    files.update(dict.fromkeys(hops))
    return hops[-1]


def _physical(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(os.path.realpath(directory), name)


def _interpreters(script: str, path: str) -> list[str]:
    words = shebang(script)
    if words is None or not os.path.isabs(words[0]):
        return []
    found = [words[0]]
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        name = env_program(words[1])
        located = shutil.which(name, path=path) if name and "/" not in name else name
        if located:
            found.append(located)
    return found


def _python_library(real: str, elf: Elf) -> tuple[list[str], list[str]]:
    """For a Python interpreter: its library directories to share whole when it is a system one (the
    rest come with their installation's launcher mount), and its standard library's C extensions,
    whose own libraries (libffi for ctypes, libssl for ssl, ...) must be there too."""
    name = os.path.basename(real)
    if not _PYTHON.fullmatch(name):
        return [], []
    version = next((m.group(1) for n in elf.needed if (m := _LIBPYTHON.match(n))), None)
    version = version or (name.removeprefix("python") if "." in name else None)
    if version is None:
        return [], []
    prefix = os.path.dirname(os.path.dirname(real))
    library = f"{prefix}/lib/python{version}"
    extensions = sorted(glob.glob(f"{library}/lib-dynload/*.so"))
    if not any(real != p and within(real, p) for p in SYSTEM_PREFIXES):
        return [], extensions
    candidates = [library, f"{prefix}/lib/python3/dist-packages", f"/usr/local/lib/python{version}/dist-packages"]
    return [c for c in candidates if os.path.isdir(c)], extensions
