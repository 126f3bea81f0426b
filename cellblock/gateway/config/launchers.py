"""How a client starts a server (npx, uvx, `uv run`, node or python SCRIPT): the package it runs,
the code the jail must share, and how Cellblock installs or caches it instead.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import sys
import tomllib
from collections.abc import Collection, Sequence
from typing import Any

from cellblock.gateway.config.draft import Draft
from cellblock.sandbox.installer import PackageError, parse_package

__all__ = [
    "INSTALLS",
    "NODES",
    "fill_cache",
    "installable",
    "launched_package",
    "package_name",
    "project_name",
    "script_root",
    "uv_run",
]

# files that mark a script's package root
_PATH_ANCHORS = ("package.json", "pyproject.toml", "setup.py")
NODES = frozenset({"node", "nodejs"})
_PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)?)?$")
_NPX_VALUE_OPTIONS = frozenset({"-p", "--package", "-c", "--call", "--registry", "-w", "--workspace"})
_UVX_VALUE_OPTIONS = frozenset(
    {
        *("--from", "--with", "--with-editable", "--with-requirements", "--python", "-p", "--index"),
        *("--index-url", "--extra-index-url", "--default-index", "--cache-dir", "--directory"),
        *("--project", "--config-file", "--env-file", "--constraints", "--overrides", "--build-constraints"),
    }
)
# `uv run` options that take a value; the ones that change what runs (--with, --python…) are not
# the project's environment as it is, so such an entry keeps uv
_UV_RUN_PLAIN = frozenset({"--directory", "--project"})
_UV_RUN_FLAGS = frozenset({"--frozen", "--locked", "--no-sync", "--offline", "-q", "--quiet", "--no-dev"})


def uv_run(draft: Draft, args: list[str], cwd: str | None) -> tuple[str, list[str], str] | None:
    """(command, args, cwd) that run `uv run [--directory DIR] TARGET ARGS…` from the project's own
    `.venv` as it is: uv would first sync it (network, its cache), which the jail has neither of.
    TARGET is a script (run by the virtualenv's Python) or one of its programs. None when the
    project has no `.venv`, or options change what runs."""
    project = cwd
    at = args.index("run")  # also `uv --directory DIR run …`
    words = [*args[:at], *args[at + 1 :]]
    j = 0
    while j < len(words):
        word = words[j]
        name, eq, value = word.partition("=")
        if name in _UV_RUN_PLAIN:
            if not eq:
                j += 1
                value = words[j] if j < len(words) else ""
            project = value
        elif word in _UV_RUN_FLAGS:
            pass
        elif word.startswith("-"):
            return None
        else:
            break
        j += 1
    target, target_args = (words[j], words[j + 1 :]) if j < len(words) else ("", [])
    full = draft.path(project, None) if project else None
    if not target or full is None or not os.path.isdir(draft.expand(full) + "/.venv/bin"):
        return None
    venv = posixpath.join(full, ".venv", "bin")
    if target.endswith(".py"):
        command, new_args = posixpath.join(venv, "python"), [target, *target_args]
    elif target in ("python", "python3") or os.path.isfile(posixpath.join(draft.expand(venv), target)):
        command, new_args = posixpath.join(venv, target), target_args
    else:
        return None
    draft.share(full, writable=False)
    draft.notes.append(
        f"uv run: runs {full}/.venv as it is (uv would sync it first, with the network and its cache, "
        f"which the jail has not); after changing the project, run `uv sync` in {full}"
    )
    return command, new_args, full


def launched_package(program: str, args: Sequence[str]) -> tuple[str | None, int | None, str | None]:
    """(launcher, index of the package's argument, package spec) for npx, uvx and `uv tool run`."""
    if program == "npx":
        return ("npx", *_first_positional(args, _NPX_VALUE_OPTIONS, ("-p", "--package")))
    if program == "uvx":
        return ("uvx", *_first_positional(args, _UVX_VALUE_OPTIONS, ("--from",)))
    if program == "uv" and list(args[:2]) == ["tool", "run"]:
        index, spec = _first_positional(args[2:], _UVX_VALUE_OPTIONS, ("--from",))
        return "uvx", None if index is None else index + 2, spec
    return None, None, None


def _first_positional(
    args: Sequence[str], takes_value: Collection[str], names_package: Collection[str]
) -> tuple[int | None, str | None]:
    """The index of the first positional argument and the package: that argument, or an option's."""
    package: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        option, eq, value = arg.partition("=")
        if arg == "--":
            i += 1
            break
        if eq and option in names_package:
            package = value
        elif arg in takes_value:
            if arg in names_package and i + 1 < len(args):
                package = args[i + 1]
            i += 1
        elif not arg.startswith("-"):
            return i, package or arg
        i += 1
    return (i, package or args[i]) if i < len(args) else (None, package)


def package_name(spec: str, launcher: str | None) -> str:
    if launcher == "npx":
        spec = spec.removeprefix("npm:")
        if spec.startswith("@"):
            scope, _, rest = spec.partition("/")
            return f"{scope}/{rest.split('@', 1)[0]}".lower()
        return spec.split("@", 1)[0].lower()
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else spec.lower()


def _pinned(spec: str, launcher: str) -> bool:
    if launcher == "npx":
        version = spec.removeprefix("npm:").lstrip("@").partition("@")[2]
    else:
        version = spec.partition("==")[2] or spec.partition("@")[2]
    return version not in ("", "latest")


def script_root(draft: Draft, program: str, args: Sequence[str], cwd: str | None) -> tuple[str | None, str | None]:
    """(script, its package root shared read-only) for `node`/`python SCRIPT`; Nones for `-m`, `-c`…"""
    if program not in NODES and not _PYTHON.match(program):
        return None, None
    for arg in args:
        if arg in ("-m", "-c", "-e", "--eval", "-p", "--print"):
            return None, None
        if arg.startswith("-"):
            continue
        path = draft.path(arg, cwd, bare=True)
        if path is None or not os.path.isfile(draft.expand(path)):
            draft.notes.append(f"script {arg!r} not found: nothing shared for it; add its folder to jail.read_only")
            return None, None
        root = _package_root(draft, path)
        # a package installed under node_modules finds its dependencies in the outermost
        # node_modules (npm hoists them there), so that whole folder is shared
        parts = root.split("/")
        code = "/".join(parts[: parts.index("node_modules") + 1]) if "node_modules" in parts else root
        draft.share(code, writable=False)
        draft.notes.append(f"read_only: {code} (the code of the script it runs)")
        return path, root
    return None, None


def _package_root(draft: Draft, script: str) -> str:
    """The nearest parent of `script` holding a package manifest, else its folder; never home or `/`."""
    folder = posixpath.dirname(script)
    current = folder
    while current not in ("/", "~", "") and draft.expand(current) != draft.home:
        if any(os.path.isfile(os.path.join(draft.expand(current), anchor)) for anchor in _PATH_ANCHORS):
            return current
        current = posixpath.dirname(current)
    return script if folder in ("/", "~") or draft.expand(folder) == draft.home else folder


def project_name(root: str) -> str | None:
    """The package name the manifest in `root` declares (package.json, pyproject.toml), if any."""
    name: Any = None
    try:
        with open(os.path.join(root, "package.json"), encoding="utf-8") as file:
            name = json.load(file).get("name")
    except (OSError, ValueError, AttributeError):
        try:
            with open(os.path.join(root, "pyproject.toml"), "rb") as file:
                name = tomllib.load(file).get("project", {}).get("name")
        except (OSError, ValueError, AttributeError):
            return None
    return package_name(name, None) if isinstance(name, str) else None


# A package is installed in a bubblewrap jail: on Linux only, for now (elsewhere the launcher stays).
INSTALLS = sys.platform.startswith("linux")
# launcher options that change nothing about what an installed package runs
_NPX_PLAIN = frozenset({"-y", "--yes", "--offline", "-q", "--quiet", "--no-install"})


def installable(
    draft: Draft, launcher: str, args: list[str], index: int, spec: str
) -> tuple[dict[str, str], str, list[str]] | None:
    """(install:, command, args) for an npx or uvx entry Cellblock can install instead: the package
    named once, with no launcher options but the plain ones (`-y`; uvx's `--from PKG CMD`). None
    for what only the launcher can do (`--with`, `-p A -p B`, a git URL, a local path)."""
    before = args[:index]
    if launcher == "npx":
        if any(a not in _NPX_PLAIN for a in before):
            return None
        kind, name, version = "npm", package_name(spec, "npx"), spec.removeprefix("npm:").lstrip("@").partition("@")[2]
        command = ""
    else:
        tool_run = before[:2] == ["tool", "run"]
        options = before[2:] if tool_run else before
        if options not in ([], ["--from", spec]):
            return None
        kind = "pypi"
        name, _, version = spec.partition("==") if "==" in spec else spec.partition("@")
        # `--from PKG CMD` runs CMD of PKG; `uvx PKG` runs PKG's own program
        command = args[index] if options else ""
    pinned = version not in ("", "latest")
    package = (f"{name}@{version}" if kind == "npm" else f"{name}=={version}") if pinned else name
    try:
        parse_package(kind, package)
    except PackageError:
        return None  # a range, a tag, a URL: only the launcher knows what it means
    draft.notes.append(
        f"{launcher} {spec}: installed once by `cellblock install {draft.name}` (wrap runs it) and run "
        "read-only from Cellblock's data directory, checked before each start; "
        + ("pinned" if pinned else "the newest release is pinned when installed")
        + f"; move it with `cellblock update {draft.name}`"
    )
    return {kind: package}, command, args[index + 1 :]


def fill_cache(
    draft: Draft, launcher: str, args: list[str], index: int, spec: str, env: dict[str, str], cache_root: str
) -> list[str]:
    """A per-server npx or uvx cache, offline in the jail, and the command that fills it once."""
    cache = posixpath.join(cache_root, f"{'npm' if launcher == 'npx' else 'uv'}-{draft.name}")
    real = draft.expand(cache)
    draft.share(cache, writable=True)
    fill = [a for a in args[: index + 1] if a != "--offline"]
    if launcher == "npx":
        env["npm_config_cache"] = real
        if "-y" not in fill and "--yes" not in fill:
            fill.insert(0, "-y")
        if "--offline" not in args:
            at = next((i for i, a in enumerate(args[:index]) if a in ("-y", "--yes")), index)
            args = [*args[:at], "--offline", *args[at:]]
        command = f"npm_config_cache={shlex.quote(real)} npx {shlex.join(fill)} </dev/null"
    else:
        env["UV_CACHE_DIR"] = real
        env["UV_OFFLINE"] = "1"
        prefix = "uvx" if args[:2] != ["tool", "run"] else "uv"
        command = f"UV_CACHE_DIR={shlex.quote(real)} {prefix} {shlex.join(fill)} </dev/null"
    draft.notes.append(f"fill the {launcher} cache once: {command}")
    if not _pinned(spec, launcher):
        draft.notes.append(f"{spec} has no version: the jail runs whatever the cache holds; pin one")
    return args
