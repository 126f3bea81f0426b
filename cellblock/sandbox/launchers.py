"""Find what a server's command needs in order to run inside a jail, and share only that.

A command is usually a launcher: a virtualenv's `python` that links to an interpreter under
`~/.pyenv`, a `node` under `~/.nvm`, a script whose `#!` line names another program. From the
command, this follows what the kernel follows — each symlink, the `#!` interpreter (also
`#!/usr/bin/env NAME`, looked up on the PATH) — and a virtualenv's base Python. Each file met is
shared read-only with its installation when `installs.installation_of` recognises one around it,
else as that one file. Nothing is shared because a file names it: a `#!` target is followed only
when it is itself an executable interpreter (an ELF binary, or a script with such a `#!`), and
a `pyvenv.cfg`'s `home =` only for the executable Python in it. A launcher that runs a program
beside itself (`uvx` runs its `uv`) gets that program, when it is an executable there.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import deque
from collections.abc import Sequence

from cellblock.policy.constraints import within
from cellblock.sandbox.installs import installation_of
from cellblock.sandbox.pin import is_elf, shebang
from cellblock.sandbox.types import InstallKind, JailError, Mount, MountMode

__all__ = [
    "COMMAND",
    "SYSTEM_PREFIXES",
    "env_program",
    "is_interpreter",
    "launcher_gaps",
    "launcher_mounts",
    "link_chain",
    "resolve_command",
]

# Shared with every jail already (read-only); an installation inside these needs no mount.
SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
COMMAND = "the command itself"
# Symlinks followed from one program; the kernel gives up at 40, real launchers use one or two.
MAX_LINKS = 8
# Nested `#!` interpreters, as many as Linux runs (BINPRM_MAX_RECURSION).
MAX_SCRIPT_DEPTH = 4
# Programs looked at for one command: itself, its interpreters, a virtualenv's base.
MAX_PROGRAMS = 16
# env(1) options that take the next word as their value, so it is not the program.
ENV_VALUED = ("-u", "--unset", "-C", "--chdir")
# Launchers that run a program beside their own executable rather than one on the PATH: uvx
# execs the `uv` next to it (uv's installer puts both in ~/.local/bin, which is no installation).
SIBLINGS = {"uvx": ("uv",)}
# The first bytes of a Mach-O program, which macOS's kernel loads itself: thin 32- and 64-bit, in
# either byte order, and universal (fat). Only on macOS: Linux's kernel cannot run one.
MACHO_MAGICS = (b"\xfe\xed\xfa\xce", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")
# Version managers' shims: scripts that need the whole manager (its config, its other versions).
SHIMS = ("/.pyenv/shims/", "/.asdf/shims/", "/.rbenv/shims/", "/.nodenv/shims/", "/.local/share/mise/shims/")


def resolve_command(command: str, path: str) -> str:
    """The absolute path of `command`, looked up on `path` when it has no slash.

    Raises:
        JailError: the command cannot be found, is not executable, or is not a file.
    """
    found = shutil.which(command, path=path) if "/" not in command else command
    if found is None or not os.access(found, os.X_OK):
        raise JailError(f"command not found or not executable: {command}")
    if not os.path.isfile(found):
        raise JailError(f"command {command} is not a file ({found}); give the program to run, not a directory")
    return os.path.abspath(found)


def launcher_mounts(executable: str, home: str, path: str, role: str = COMMAND) -> list[Mount]:
    """Read-only mounts for what `executable` runs from, each with why it is shared, in a stable order.

    `home` is the user's home (never shared whole), `path` the PATH that `#!/usr/bin/env NAME`
    is looked up on, `role` what `executable` is to the server (shown by `cellblock show`).
    """
    shares: dict[str, str] = {}  # host path -> why; the first reason found is kept
    queue = deque([(executable, role)])
    seen: set[str] = set()
    while queue and len(seen) < MAX_PROGRAMS:
        program, why = queue.popleft()
        if program in seen:
            continue
        seen.add(program)
        hops = link_chain(program)
        for index, hop in enumerate(hops):
            if _system(hop) or not os.path.lexists(hop):
                continue
            reason = why if index == 0 else f"{why}, through the link {program}"
            install = installation_of(hop, home)
            if install is None:
                shares.setdefault(hop, reason)
                continue
            shares.setdefault(install.root, f"{install.kind.value}, for {reason}")
            if install.kind is InstallKind.VIRTUALENV:
                base = virtualenv_base(install.root)
                if base is not None:
                    queue.append((base, f"base interpreter of virtualenv {install.root}"))
        queue.extend((found, f"interpreter named by #! of {program}") for found in _interpreters(hops[-1], path))
        queue.extend(_siblings(hops[-1]))
    return [Mount(p, MountMode.READ_ONLY, why) for p, why in shares.items() if not _inside_another(p, shares)]


def launcher_gaps(executable: str, jail_path: str, shared: Sequence[str]) -> list[str]:
    """What `executable` needs that its jail will not have, one sentence each (for `show` and
    `doctor`; the server would fail at start): a version manager's shim, a launcher's missing
    sibling, a `#!/usr/bin/env NAME` with no NAME on the jail's `jail_path` among what it shows
    (the system, the `shared` mounts)."""
    gaps = []
    real = link_chain(executable)[-1]
    if any(shim in path for shim in SHIMS for path in (executable, real)):
        gaps.append(
            f"{executable} is a version manager's shim, which needs the whole manager: point command at "
            "the program it runs (`pyenv which python`, `asdf which node`)"
        )
    name = os.path.basename(real)
    for sibling in SIBLINGS.get(name, ()):
        beside = os.path.join(os.path.dirname(real), sibling)
        if not is_interpreter(beside):
            gaps.append(f"{name} runs the {sibling} beside it, and {beside} is not there: reinstall uv, or use its uvx")
    words = shebang(real)
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        program = env_program(words[1])
        if program and "/" not in program and not _shown_on(program, jail_path, shared):
            gaps.append(
                f"{executable} starts `#!/usr/bin/env {program}`, and the jail has no {program} on its PATH "
                f"({jail_path}): put the directory of your {program} on the gateway's PATH, or run it by its "
                "absolute path as the command"
            )
    return gaps


def _shown_on(program: str, jail_path: str, shared: Sequence[str]) -> bool:
    for directory in jail_path.split(":"):
        candidate = os.path.join(directory, program)
        if is_interpreter(candidate) and (_system(candidate) or any(within(candidate, m) for m in shared)):
            return True
    return False


def link_chain(path: str) -> list[str]:
    """`path` and each symlink hop after it, ending in the file the kernel executes."""
    hops = [path]
    for _ in range(MAX_LINKS):
        if not os.path.islink(hops[-1]):
            break
        hops.append(_physical(os.path.join(os.path.dirname(hops[-1]), os.readlink(hops[-1]))))
    return hops


def is_interpreter(path: str, depth: int = 0) -> bool:
    """Whether the kernel can run `path` as a `#!` interpreter: an executable ELF file (on macOS a
    Mach-O one: uv's and Homebrew's Pythons, Node), or an executable script whose own `#!` names
    one (as deep as the kernel nests them)."""
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return False
    if is_elf(path) or (sys.platform == "darwin" and _is_macho(path)):
        return True
    words = shebang(path)
    if words is None or not os.path.isabs(words[0]) or depth >= MAX_SCRIPT_DEPTH:
        return False
    return is_interpreter(words[0], depth + 1)


def virtualenv_base(venv: str) -> str | None:
    """The executable Python in the directory a virtualenv's `home =` names, or None.

    Only an interpreter there is followed (and with it its installation): the directory itself is
    never shared because the file names it.
    """
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8", errors="replace") as handle:
            lines = handle.read(64 * 1024).splitlines()
    except OSError:
        return None
    settings = {key.strip(): value.strip() for key, sep, value in (ln.partition("=") for ln in lines) if sep}
    home = settings.get("home", "")
    if not os.path.isabs(home):
        return None
    version = ".".join(settings.get("version_info", settings.get("version", "")).split(".")[:2])
    for name in ("python3", "python", *([f"python{version}"] if version else [])):
        candidate = _physical(os.path.join(home, name))
        if is_interpreter(candidate):
            return candidate
    return None


def _interpreters(script: str, search: str) -> list[str]:
    """What `script`'s `#!` line runs, when that is an interpreter: a key file or a directory never is."""
    words = shebang(script)
    if words is None or not os.path.isabs(words[0]):
        return []  # a relative interpreter depends on the caller's directory: never guessed
    interpreter = _physical(words[0])
    if not is_interpreter(interpreter):
        return []
    found = [interpreter]
    if os.path.basename(interpreter) == "env" and len(words) > 1:
        name = env_program(words[1])
        located = shutil.which(name, path=search) if name and "/" not in name else name
        if located and os.path.isabs(located) and is_interpreter(_physical(located)):
            found.append(_physical(located))
    return found


def _siblings(program: str) -> list[tuple[str, str]]:
    """The programs `program` runs from its own directory, when they are there and executable."""
    name, directory = os.path.basename(program), os.path.dirname(program)
    found = [os.path.join(directory, sibling) for sibling in SIBLINGS.get(name, ())]
    return [(s, f"the {os.path.basename(s)} that {name} runs, beside it") for s in found if is_interpreter(s)]


def env_program(argument: str) -> str | None:
    """The program `#!/usr/bin/env ARGUMENT` runs. The kernel hands env ARGUMENT as one word, which
    env splits only after `-S` (`#!/usr/bin/env tool x` runs a program named "tool x")."""
    if argument.startswith("--split-string"):
        words = argument.removeprefix("--split-string").lstrip("=").split()
    elif argument.startswith("-S"):
        words = argument[2:].split()
    else:
        words = [argument]
    return _env_program(words)


def _env_program(words: list[str]) -> str | None:
    """The program `env WORDS` runs: the first word that is not an option or a NAME=VALUE."""
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in ENV_VALUED:
            skip = True
        elif not word.startswith("-") and "=" not in word:
            return word
    return None


def _physical(path: str) -> str:
    """`path` with its directory resolved on the disk (`..` after a symlink goes where the kernel goes)."""
    directory, name = os.path.split(path)
    if name in ("", ".", ".."):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(directory), name)


def _is_macho(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) in MACHO_MAGICS
    except OSError:
        return False


def _system(path: str) -> bool:
    return any(within(path, p) for p in SYSTEM_PREFIXES)


def _inside_another(path: str, shares: dict[str, str]) -> bool:
    return any(other != path and path.startswith(other + "/") for other in shares)
