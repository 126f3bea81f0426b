"""A server's package installed once, in a jail of its own, then recorded file by file.

`npx`/`uvx` fetch whatever a registry holds under a name at every start, and run it as the user.
Instead a package is installed once into a directory of its own by npm or uv (pip without uv),
in a jail that has the network but can write only that directory and a scratch one (an install
script reaches neither the home nor anything else). Its tree is then recorded (`manifest`), run
from a read-only mount, and compared with the record before each start (`changes`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from cellblock.policy.constraints import within
from cellblock.sandbox.disk import remove_tree
from cellblock.sandbox.egress import relayed
from cellblock.sandbox.launchers import launcher_mounts, link_chain
from cellblock.sandbox.types import JailSpec, Mount, Network

__all__ = [
    "REGISTRY_ENV",
    "Ecosystem",
    "Package",
    "PackageError",
    "changes",
    "digest",
    "installed_version",
    "installer_steps",
    "manifest",
    "parse_package",
    "program_of",
    "programs_dir",
    "registry_hosts",
    "seal",
    "tree_of",
]

# The registry settings an install is given (a private mirror, CA bundles); nothing else of the
# user's environment reaches the installer. Proxy variables do not: it goes out through Cellblock's.
REGISTRY_ENV = (
    *("npm_config_registry", "NPM_CONFIG_REGISTRY", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX"),
    *("UV_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"),
    *("PIP_CERT", "REQUESTS_CA_BUNDLE", "UV_NATIVE_TLS", "npm_config_cafile", "NPM_CONFIG_CAFILE"),
)
# PyPI, where it keeps its files, and where uv downloads a Python from (its GitHub releases).
PYPI_HOSTS = (
    *("pypi.org", "files.pythonhosted.org"),
    *("github.com", "objects.githubusercontent.com", "release-assets.githubusercontent.com"),
)
_NPM_NAME = r"(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*"
_NPM = re.compile(rf"(?P<name>{_NPM_NAME})(?:@(?P<version>[^@]+))?")
_PYPI = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?P<extras>\[[A-Za-z0-9._,-]+\])?(?:==(?P<version>.+))?"
)
# exact versions only: a range or a tag would pick another release at the next install
_SEMVER = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")
_PEP440 = re.compile(r"(?:\d+!)?\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[a-z0-9.]+)?", re.I)


# pip's and uv's way of installing no package's code: wheels only, never a build of a source one
_WHEELS_ONLY = ("--only-binary", ":all:")
# What npm and uv read as a file on the disk rather than a registry's package.
_ARCHIVES = (".tgz", ".tar", ".tar.gz", ".tar.bz2", ".zip", ".whl")
# A program's name, as npm and pip make them: no path, nothing hidden.
_PROGRAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A package's metadata file is read only this far: its name, version and programs are near the top.
MAX_METADATA = 1024 * 1024


class PackageError(ValueError):
    """A package spec, install or installed tree is not what it must be; the message says what to do."""


class Ecosystem(StrEnum):
    NPM = "npm"
    PYPI = "pypi"


@dataclass(frozen=True, slots=True)
class Package:
    """A package of a registry, at an exact version or at none (the newest, pinned when installed)."""

    ecosystem: Ecosystem
    name: str
    version: str | None = None
    extras: str = ""  # pypi: "[cli,extra]"

    def spec(self, version: str | None = None) -> str:
        """What npm or pip is asked for: at `version`, else at this one, else the newest."""
        version = version or self.version
        if self.ecosystem is Ecosystem.NPM:
            return f"{self.name}@{version or 'latest'}"
        return f"{self.name}{self.extras}" + (f"=={version}" if version else "")

    def at(self, version: str) -> Package:
        return Package(self.ecosystem, self.name, version, self.extras)


def parse_package(ecosystem: str, spec: str) -> Package:
    """`name@1.2.3` (npm) or `name[extras]==1.2.3` (PyPI), or the bare name.

    Raises:
        PackageError: not a package name, or a version that is not exact (a range, a tag).
    """
    kind = Ecosystem(ecosystem)
    match = (_NPM if kind is Ecosystem.NPM else _PYPI).fullmatch(spec.strip())
    if spec.strip().lower().endswith(_ARCHIVES):
        raise PackageError(f"{spec!r} names a file, which npm and uv would read from the disk: name a package")
    if match is None:
        raise PackageError(f"{spec!r} is not a {kind.value} package name")
    version = match.group("version")
    exact = _SEMVER if kind is Ecosystem.NPM else _PEP440
    if version is not None and not exact.fullmatch(version):
        example = "name@1.2.3" if kind is Ecosystem.NPM else "name==1.2.3"
        raise PackageError(
            f"{spec!r}: {version!r} is not an exact version; pin one ({example}) or give the name alone "
            "(the install pins the newest)"
        )
    extras = match.groupdict().get("extras") or ""
    name = match.group("name")
    return Package(kind, name.lower() if kind is Ecosystem.NPM else name, version, extras)


def installer_steps(
    package: Package,
    staging: str,
    tool: str,
    home: str,
    python: str,
    egress_socket: str,
    scripts: bool = True,
    given: Mapping[str, str] | None = None,
    landlock: bool = False,
) -> list[tuple[JailSpec, list[Mount]]]:
    """The jailed commands that install `package` into `staging`/pkg (`tree_of`), in order, with
    what each jail shows besides the system: `tool` (npm; uv, or a Python to make a virtualenv with
    pip when there is no uv) and the egress relay (run by `python`), through which the installer
    reaches the network: only the hosts `registry_hosts` names, by the proxy at `egress_socket`.
    `staging`/work is scratch space (caches), made before and removed after; `home` is the user's
    home, which the jail replaces with an empty one. `staging` is all an installer can write.
    Without `scripts` no code of a package runs: npm skips lifecycle scripts, pip and uv take wheels
    only (a source distribution's build runs its code). `given` (the config's `install.env`) is
    passed on, under the registry settings and whatever the installer sets itself. For a `landlock`
    jail there is no relay: the gateway makes the installer's connections (`sandbox/connects.py`)."""
    tree, work = tree_of(staging), os.path.join(staging, "work")
    env = dict(given or {})
    env |= {k: os.environ[k] for k in REGISTRY_ENV if k in os.environ}
    env |= {"HOME": work, "TMPDIR": "/tmp", "PATH": f"{os.path.dirname(tool)}:/usr/local/bin:/usr/bin:/bin"}
    if package.ecosystem is Ecosystem.NPM:
        env |= {"npm_config_cache": os.path.join(work, "npm"), "npm_config_update_notifier": "false"}
        argv = [tool, "install", "--prefix", tree, "--omit=dev", "--no-audit", "--no-fund"]
        commands = [[*argv, *([] if scripts else ["--ignore-scripts"]), package.spec()]]
    elif os.path.basename(tool) == "uv":
        # a Python uv must download goes into the tree too, so the tree is all the server runs from
        env |= {"UV_CACHE_DIR": os.path.join(work, "uv"), "UV_PYTHON_INSTALL_DIR": os.path.join(tree, ".python")}
        python_of_tree = os.path.join(tree, "bin", "python")
        pip = [
            tool,
            "pip",
            "install",
            "--quiet",
            "--python",
            python_of_tree,
            "--compile-bytecode",
            "--link-mode",
            "copy",
        ]
        commands = [[tool, "venv", "--quiet", tree], [*pip, *([] if scripts else _WHEELS_ONLY), package.spec()]]
    else:
        env["PIP_CACHE_DIR"] = os.path.join(work, "pip")
        pip = [os.path.join(tree, "bin", "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        commands = [[tool, "-m", "venv", tree], [*pip, *([] if scripts else _WHEELS_ONLY), package.spec()]]
    steps = []
    for command in commands:
        jailed: tuple[str, ...] = tuple(command)
        relay: list[Mount] = []
        if not landlock:
            jailed, relay = relayed(command, python, home, env["PATH"])
        spec = JailSpec(
            name=f"install of {package.name}",
            argv=jailed,
            env=dict(env),
            cwd=staging,
            read_write=(staging,),
            network=Network.ALLOWLIST,
            home=home,
            egress_socket=egress_socket,
            modes_beneath=staging,
        )
        steps.append((spec, [*launcher_mounts(tool, home, env["PATH"]), *relay]))
    return steps


def registry_hosts(ecosystem: Ecosystem) -> list[str]:
    """The hosts an installer may reach: the registry (or the index your environment names) and
    where it keeps its files; for PyPI also where uv downloads a Python from, when it needs one."""
    if ecosystem is Ecosystem.NPM:
        urls = [os.environ.get(v, "") for v in ("npm_config_registry", "NPM_CONFIG_REGISTRY")]
        hosts = [h for h in map(_host_of, urls) if h] or ["registry.npmjs.org"]
        return hosts
    variables = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_INDEX", "PIP_INDEX_URL")
    urls = [u for v in (*variables, "PIP_EXTRA_INDEX_URL") for u in os.environ.get(v, "").split()]
    named = [h for h in (_host_of(u.rpartition("=")[2] if "=" in u else u) for u in urls) if h]
    return list(dict.fromkeys([*named, *PYPI_HOSTS]))


def _host_of(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname


def tree_of(staging: str) -> str:
    """Where `installer_steps` puts the package in `staging`."""
    return os.path.join(staging, "pkg")


def programs_dir(ecosystem: Ecosystem, tree: str) -> str:
    """Where an installed tree keeps its programs."""
    return os.path.join(tree, "node_modules", ".bin") if ecosystem is Ecosystem.NPM else os.path.join(tree, "bin")


def installed_version(package: Package, tree: str) -> str:
    """The version of `package` that `tree` holds.

    Raises:
        PackageError: the tree does not hold it.
    """
    if package.ecosystem is Ecosystem.NPM:
        version = _npm_manifest(package, tree).get("version")
        if not isinstance(version, str):
            raise PackageError(f"{package.name} in {tree} has no version in its package.json")
        return version
    return _dist_info(package, tree)[1]


def program_of(package: Package, tree: str, command: str | None) -> str:
    """The path of the program to run: `command` (a name among the package's programs), else the
    package's own, as npx and uvx pick it (its only one, or the one named after the package).

    Raises:
        PackageError: no such program, or none can be told to be the package's own.
    """
    found = _npm_programs(package, tree) if package.ecosystem is Ecosystem.NPM else _console_scripts(package, tree)
    names = [n for n in found if _PROGRAM.fullmatch(n)]  # a "program" named `../x` or `/bin/sh` is none
    if command is not None:
        if "/" in command:
            raise PackageError(f"command {command!r}: with install, name one of the package's programs, not a path")
        chosen = command
    elif len(names) == 1:
        chosen = names[0]
    else:
        own = package.name.rpartition("/")[2]
        chosen = next((n for n in names if _normal(n) == _normal(own)), "")
    if chosen not in names:
        offered = ", ".join(names) or "none"
        what = f"has no program {chosen!r}" if chosen else "has more than one program"
        raise PackageError(f"{package.name} {what} (it has: {offered}); set command: to one of them")
    path = os.path.join(programs_dir(package.ecosystem, tree), chosen)
    if not os.path.exists(path):
        raise PackageError(f"{package.name}'s program {chosen} is missing from {path}")
    # what the program's links lead to must be the package's too: the jail shares each file a link
    # passes through, and a link out of the tree would share that file of yours with the server
    outside = [os.path.realpath(h) for h in link_chain(path) if not within(os.path.realpath(h), os.path.realpath(tree))]
    if outside:
        raise PackageError(f"{package.name}'s program {chosen} leads out of its install, to {outside[0]}: refused")
    return path


def _read_inside(path: str, tree: str) -> str:
    """The text of `path`, a file of the install `tree`: never one a link in it leads to elsewhere.

    Raises:
        OSError: it cannot be read, or leads out of the tree.
    """
    if not within(os.path.realpath(path), os.path.realpath(tree)):
        raise OSError(f"{path} leads out of its install")
    with open(path, encoding="utf-8") as handle:
        return handle.read(MAX_METADATA)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _npm_manifest(package: Package, tree: str) -> dict[str, object]:
    path = os.path.join(tree, "node_modules", *package.name.split("/"), "package.json")
    try:
        data = json.loads(_read_inside(path, tree))
    except (OSError, ValueError) as exc:
        raise PackageError(f"{package.name} is not installed in {tree} ({path}: {exc})") from None
    if not isinstance(data, dict):
        raise PackageError(f"{path} is not a package manifest")
    return data


def _npm_programs(package: Package, tree: str) -> list[str]:
    bins = _npm_manifest(package, tree).get("bin")
    if isinstance(bins, str):
        return [package.name.rpartition("/")[2]]
    return sorted(k for k in bins if isinstance(k, str)) if isinstance(bins, dict) else []


def _dist_info(package: Package, tree: str) -> tuple[str, str]:
    """(the `*.dist-info` directory of `package` in the virtualenv `tree`, its version)."""
    lib = os.path.join(tree, "lib")
    for python in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        site = os.path.join(lib, python, "site-packages")
        for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
            name, _, version = entry.removesuffix(".dist-info").partition("-")
            if entry.endswith(".dist-info") and _normal(name) == _normal(package.name):
                return os.path.join(site, entry), version
    raise PackageError(f"{package.name} is not installed in {tree}")


def _console_scripts(package: Package, tree: str) -> list[str]:
    path = os.path.join(_dist_info(package, tree)[0], "entry_points.txt")
    try:
        lines = _read_inside(path, tree).splitlines()
    except (OSError, ValueError):
        return []
    names: list[str] = []
    section = ""
    for line in (ln.strip() for ln in lines):
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == "console_scripts" and "=" in line:
            names.append(line.partition("=")[0].strip())
    return sorted(names)


def manifest(tree: str, known: Mapping[str, tuple[str, str]] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Every entry under `tree` (relative path -> what it is: a file's mode and sha256, a link's
    target, a directory's mode), and each one's fingerprint (inode, size, mode and change times).

    An entry whose fingerprint is the one `known` holds for it (path -> (fingerprint, entry)) is
    taken from there unread: its content cannot have changed, since any write, rename or chmod
    moves its change time (ctime), which no process but the kernel can set. So a check before
    each start reads only what changed.

    Raises:
        PackageError: `tree` is not a directory (a link to one is not), it holds a special file, a
            name that is not text, a directory that cannot be listed, or is nested too deep.
    """
    known = known or {}
    entries: dict[str, str] = {}
    prints: dict[str, str] = {}
    hashed: dict[tuple[int, int], str] = {}  # a file's links share one content: read once
    tree = os.path.normpath(tree)
    try:
        top = os.lstat(tree)
    except OSError as exc:
        raise PackageError(f"{tree} cannot be read: {exc.strerror}") from None
    if not stat.S_ISDIR(top.st_mode):
        raise PackageError(f"{tree} is not a directory of its own (a link, or a file)")

    def unreadable(exc: OSError) -> None:
        raise PackageError(f"{exc.filename} cannot be listed: {exc.strerror}")

    try:
        for directory, dirs, files in os.walk(tree, onerror=unreadable):
            dirs.sort()
            for name in sorted(dirs + files):
                path = f"{directory}/{name}"
                rel = path[len(tree) + 1 :]
                try:
                    rel.encode("utf-8")
                except UnicodeEncodeError:
                    raise PackageError(f"{path!r}: a file name that is not text (UTF-8)") from None
                info = os.lstat(path)
                prints[rel] = f"{info.st_ino}:{info.st_size}:{info.st_mode:o}:{info.st_mtime_ns}:{info.st_ctime_ns}"
                if rel in known and known[rel][0] == prints[rel]:
                    entries[rel] = known[rel][1]
                    continue
                mode = f"{stat.S_IMODE(info.st_mode):o}"
                if stat.S_ISLNK(info.st_mode):
                    entries[rel] = f"link {os.readlink(path)}"
                elif stat.S_ISDIR(info.st_mode):
                    entries[rel] = f"dir {mode}"
                elif stat.S_ISREG(info.st_mode):
                    entries[rel] = f"file {mode} {_sha256(path, info, hashed)}"
                else:
                    raise PackageError(f"{path} is not a file, directory or link")
    except RecursionError:
        raise PackageError(f"{tree} is nested too deep to be checked") from None
    return entries, prints


def _sha256(path: str, info: os.stat_result, hashed: dict[tuple[int, int], str]) -> str:
    """The sha256 of the file at `path` (whose `lstat` is `info`), read once however many links
    lead to it: a tree's disk limit counts each inode once, so 4,000 links to one file of 16 MiB
    would otherwise be 64 GB to read."""
    inode = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and inode in hashed:
        return hashed[inode]
    with open(path, "rb") as handle:
        sha = hashlib.file_digest(handle, "sha256").hexdigest()
    if info.st_nlink > 1:
        hashed[inode] = sha
    return sha


def seal(staging: str, ecosystem: Ecosystem) -> str:
    """Make an installer's `staging` hold its tree only, and the tree nothing a jail must not run:
    whatever else the installer left is removed, set-id and group/other write bits are cleared,
    and a link that leads out of the tree is refused (it would make the jail show, or the check
    follow, a file of the host), except a virtualenv's `bin/python*` to its interpreter. Returns
    the tree.

    Raises:
        PackageError: the tree is missing or not a directory, or a link leads out of it.
    """
    tree = tree_of(staging)
    for entry in os.listdir(staging):
        path = os.path.join(staging, entry)
        if path != tree:
            if os.path.isdir(path) and not os.path.islink(path):
                remove_tree(path)
            else:
                os.unlink(path)
    entries, _ = manifest(tree)  # also refuses a tree that is a link, special files, odd names
    real = os.path.realpath(tree)
    top = stat.S_IMODE(os.lstat(tree).st_mode)  # the installer made it under the user's umask (002: 0775)
    if top & 0o6022:
        os.chmod(tree, top & ~0o6022)
    for rel, what in entries.items():
        path = os.path.join(tree, rel)
        if what.startswith("link "):
            target = os.path.realpath(path)
            venv_python = ecosystem is Ecosystem.PYPI and re.fullmatch(r"bin/python[0-9.]*", rel)
            if not within(target, real) and not venv_python:
                raise PackageError(f"{rel} in the install is a link out of it, to {target}: refused")
            continue
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & 0o6022:
            os.chmod(path, mode & ~0o6022)
    return tree


def digest(entries: Mapping[str, str]) -> str:
    """One sha256 for a whole manifest."""
    text = json.dumps(dict(sorted(entries.items())), separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def changes(recorded: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What differs between two manifests, one phrase per path, in path order."""
    found = []
    for path in sorted(set(recorded) | set(now)):
        if path not in now:
            found.append(f"{path} removed")
        elif path not in recorded:
            found.append(f"{path} added")
        elif recorded[path] != now[path]:
            found.append(f"{path} changed")
    return found
