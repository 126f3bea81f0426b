"""Packages installed for servers (`install:`): the install `cellblock install` / `update` run
(their command line: gateway/cli/install.py), and the check before each start.

A server's package lives in a tree of its own, `<data dir>/installs/<server>/<id>/pkg`, with a
record beside it, `<data dir>/installs/<server>.json`: the package at its exact version (the pin,
when the config names none), the tree, and the sha256 of every file in it. Before each start
`installed()` compares the tree with the record and refuses one that changed, naming what changed;
the jail then shows the tree read-only, so no server (nor the model through it) can change the
code it runs next time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import anyio.from_thread
from pydantic import BaseModel, ValidationError

from cellblock.gateway.config.model import DEFAULT_DISK, InstallConfig, LocalServer
from cellblock.gateway.state import atomic_write_json, data_dir, read_json, runtime_dir
from cellblock.gateway.terminal import printable
from cellblock.policy.files import make_dirs
from cellblock.policy.hosts import HostRule, parse_rule
from cellblock.sandbox.backends import backend_plan, choose
from cellblock.sandbox.disk import DiskWatch, remove_tree
from cellblock.sandbox.egress import Decision, EgressProxy
from cellblock.sandbox.installer import (
    Ecosystem,
    Package,
    PackageError,
    changes,
    digest,
    installed_version,
    installer_steps,
    manifest,
    program_of,
    programs_dir,
    registry_hosts,
    seal,
    tree_of,
)
from cellblock.sandbox.launchers import resolve_command
from cellblock.sandbox.limits import limit_plan, size
from cellblock.sandbox.spawn import Bounded, run_bounded
from cellblock.sandbox.types import JailError, Limits

__all__ = [
    "InstallError",
    "Installed",
    "Record",
    "install",
    "installed",
    "read_record",
    "recorded",
]

# An install that takes longer is ended: a registry that hangs must not hang `wrap`.
INSTALL_SECONDS = 600.0
# how a limit an install reached is named in why it was stopped: `(limits.disk)`, `(jail.limits.memory)`
_LIMIT = re.compile(r"\((?:jail\.)?limits\.[a-z]+\)")
# Lines of an installer's output shown when it fails, and changed paths named when a tree changed.
SHOWN = 5
# Characters of one such line shown: an installer's last line may be megabytes long.
LINE = 300


class InstallError(JailError):
    """A server's package is not installed as its config asks, or cannot be; the message says what
    to run. Its jail cannot be built, so it does not start; unlike other jail errors, running the
    command fixes it without restarting the gateway."""


class Record(BaseModel):
    """What was installed for one server, kept at `<data dir>/installs/<server>.json`."""

    ecosystem: Ecosystem
    name: str
    extras: str = ""
    version: str
    tree: str
    runtime: str | None = None  # the node an npm package's programs run with
    digest: str
    installed_at: float
    files: dict[str, str]
    # each file's fingerprint when installed (sandbox.installer.manifest), so a start reads only what changed
    prints: dict[str, str] = {}

    @property
    def package(self) -> Package:
        return Package(self.ecosystem, self.name, self.version, self.extras)


@dataclass(frozen=True, slots=True)
class Installed:
    """A server's installed package, checked against its record: what the jail runs and shows."""

    record: Record
    program: str
    bin_dir: str

    @property
    def why(self) -> str:
        record = self.record
        return f"installed {record.package.spec()} ({record.digest[:19]}…, checked at start)"


def _record_path(server: str) -> Path:
    return data_dir() / "installs" / f"{server}.json"


def read_record(server: str) -> Record | None:
    data = read_json(_record_path(server))
    try:
        return Record.model_validate(data) if data is not None else None
    except ValidationError:
        return None


def recorded(name: str, server: LocalServer) -> Record | None:
    """The record of the install `server` asks for, None when it has no `install:`; its files are
    not looked at (`installed` checks them), so this is cheap enough to ask before every call.

    Raises:
        InstallError: it is not installed, or installed at another version.
    """
    if server.install is None:
        return None
    wanted = server.install.package
    record = read_record(name)
    if record is None:
        raise InstallError(f"server '{name}': {wanted.spec()} is not installed; run `cellblock install {name}`")
    have = record.package
    same = (have.ecosystem, have.name, have.extras) == (wanted.ecosystem, wanted.name, wanted.extras)
    if not same or wanted.version not in (None, have.version):
        raise InstallError(
            f"server '{name}': the config asks for {wanted.spec()}, but {have.spec()} is installed; "
            f"run `cellblock install {name}`"
        )
    return record


def installed(name: str, server: LocalServer) -> Installed | None:
    """The verified install of `server`, None when it has no `install:`.

    Raises:
        InstallError: it is not installed, installed at another version, or its tree changed.
    """
    record = recorded(name, server)
    if record is None or server.install is None:
        return None
    wanted, have = server.install.package, record.package
    known = {path: (print_, record.files[path]) for path, print_ in record.prints.items() if path in record.files}
    try:
        now, _ = manifest(record.tree, known)
    except (OSError, PackageError) as exc:
        raise InstallError(
            f"server '{name}': its installed tree {record.tree} cannot be read ({exc}); "
            f"reinstall it with `cellblock install {name}`"
        ) from None
    if digest(now) != record.digest or digest(record.files) != record.digest:
        found = [printable(c) for c in changes(record.files, now)] or ["its record"]
        more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise InstallError(
            f"server '{name}': its installed tree {record.tree} changed since it was installed "
            f"({', '.join(found[:SHOWN])}{more}), so it is not started; find out what changed it, then "
            f"reinstall with `cellblock install {name}`"
        )
    try:
        program = program_of(wanted.at(record.version), record.tree, server.command)
    except PackageError as exc:
        raise InstallError(f"server '{name}': {exc}") from None
    return Installed(record, program, programs_dir(have.ecosystem, record.tree))


def install(
    name: str,
    server: LocalServer,
    limits: Limits,
    version: str | None = None,
    newest: bool = False,
    out: TextIO | None = None,
) -> Record:
    """Install `server`'s package (at `version`; else the newest when `newest` or when the config
    pins none; else the config's) into a new tree, record it, and remove the trees of earlier
    installs. The installer runs under `limits` (`Config.install_limits_of`): its jail's processes
    and memory, and the disk its install may fill. Progress goes to `out`.

    Raises:
        InstallError: it has no `install:`, no installer is found, the install failed.
        JailError: the installer's jail cannot be built here.
    """
    out = out or sys.stderr
    spec = server.install
    if spec is None:
        raise InstallError(f"server '{name}' has no install: to install")
    if not sys.platform.startswith("linux"):
        raise InstallError(
            f"server '{name}': packages are installed in a bubblewrap jail, on Linux only for now; "
            "here, run it with its launcher (command: npx or uvx) instead of install:"
        )
    package = spec.package
    if version is not None or newest:
        package = Package(package.ecosystem, package.name, version, package.extras)
    base = data_dir() / "installs" / name
    make_dirs(base)
    with _only_install(base, name):
        return _install(name, server, spec, package, base, version, limits, out)


@contextlib.contextmanager
def _only_install(base: Path, name: str) -> Iterator[None]:
    """One install of a server at a time: two would remove each other's trees."""
    with open(base / ".lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InstallError(f"server '{name}' is being installed by another cellblock; wait for it") from None
        yield


def _install(
    name: str,
    server: LocalServer,
    spec: InstallConfig,
    package: Package,
    base: Path,
    version: str | None,
    limits: Limits,
    out: TextIO,
) -> Record:
    before = read_record(name)
    staging = base / secrets.token_hex(4)
    tree, work = Path(tree_of(str(staging))), staging / "work"
    tool = _installer(package)
    home = os.path.expanduser("~")
    how = "npm" if package.ecosystem is Ecosystem.NPM else os.path.basename(tool)
    cap = limits.disk or DEFAULT_DISK  # an install's disk is always bounded
    limits = replace(limits, disk=cap)
    bounds = f"at most {limits.processes} processes, {size(limits.memory)} of memory, {size(cap)} of disk"
    extra = spec.hosts
    reaches = "the registry" + (f" and {', '.join(extra)}" if extra else "")
    scripts = "" if spec.scripts else ", no install scripts"
    choice = choose(name, (server.jail.backend if server.jail else None) or "auto")
    print(
        f"cellblock: installing {package.spec()} for '{name}' ({how}, in a jail that reaches {reaches}{scripts}; "
        f"{bounds})…",
        file=out,
        flush=True,
    )
    began = time.monotonic()
    refused: dict[str, str] = {}  # host:port -> why the proxy refused it

    def decided(decision: Decision) -> None:
        if not decision.allowed and decision.host:  # a request it could not read names no host
            refused.setdefault(f"{printable(decision.host)}:{decision.port}", printable(decision.reason))

    hosts = registry_hosts(package.ecosystem)
    egress = str(runtime_dir() / f"egress-install-{os.getpid()}-{name}.sock")
    # the hosts an install script may reach are rules as a server's allow_hosts are: a name that
    # leads to a private address stays refused (only the registry's addresses are pinned)
    rules = [*_registry_rules(hosts), *(parse_rule(h) for h in extra)]
    proxy = EgressProxy(f"install of {name}", rules, egress, decided)
    python = os.path.realpath(sys.executable)
    try:
        make_dirs(work)  # and the staging above it: the tree is made in there
        disk = DiskWatch(str(staging), cap)
        with anyio.from_thread.start_blocking_portal() as portal:
            serving, _ = portal.start_task(proxy.serve)
            try:
                steps = installer_steps(
                    package,
                    str(staging),
                    tool,
                    home,
                    python,
                    egress,
                    spec.scripts,
                    spec.env,
                    landlock=choice.backend == "landlock",
                )
                for step, mounts in steps:
                    # a Landlock jail's home and tmp are made in the staging directory: its disk bounds them too
                    plan = limit_plan(backend_plan(step, mounts, choice, str(work / "jail")), name, limits)
                    try:
                        ran = run_bounded(plan, INSTALL_SECONDS, disk)
                    except subprocess.TimeoutExpired:
                        raise InstallError(
                            f"installing {package.spec()} for server '{name}' took longer than {INSTALL_SECONDS:.0f} s "
                            "and was ended; "
                            + (_refused_advice(name, server, refused, hosts) or "if the registry is slow, try again")
                        ) from None
                    if ran.stopped is None:  # what the step did last counts as much
                        ran = replace(ran, stopped=disk.measure())
                    if ran.stopped is not None or ran.returncode != 0:
                        command = step.argv[step.argv.index("--") + 1 :] if "--" in step.argv else step.argv
                        program = os.path.basename(command[0])
                        failure = _failure(name, package, program, ran, time.monotonic() - began)
                        advice = _refused_advice(name, server, refused, hosts)
                        raise InstallError(f"{failure}\n  {advice}" if advice else failure)
            finally:
                serving.cancel()
        seal(str(staging), package.ecosystem)  # removes work/ too
        files, prints = manifest(str(tree))  # before anything in the tree is read
        found = installed_version(package, str(tree))
        record = Record(
            ecosystem=package.ecosystem,
            name=package.name,
            extras=package.extras,
            version=found,
            tree=str(tree),
            runtime=_runtime(tool) if package.ecosystem is Ecosystem.NPM else None,
            digest=digest(files),
            installed_at=time.time(),
            files=files,
            prints=prints,
        )
        program_of(package.at(found), str(tree), server.command)  # a package with nothing to run fails now
    except PackageError as exc:
        remove_tree(str(staging))
        raise InstallError(f"server '{name}': {exc}") from None
    except BaseException:
        remove_tree(str(staging))
        raise
    atomic_write_json(_record_path(name), record.model_dump(mode="json"))
    # the tree before stays until the next install: a gateway running it goes on until it restarts
    keep = {staging, *([Path(before.tree).parent] if before else []), base / ".lock"}
    for old in base.iterdir():
        if old not in keep:
            remove_tree(str(old))
    pinned = "" if spec.package.version or version else f" (the config pins no version: pinned at {found})"
    print(
        f"cellblock: installed {record.package.spec()} for '{name}': {len(files)} files, {record.digest[:19]}…, "
        f"in {time.monotonic() - began:.1f} s{pinned}",
        file=out,
    )
    if refused:  # it did without them; what it fetched may be missing when it runs
        print(f"cellblock: note: '{name}': {_refused_advice(name, server, refused, hosts)}", file=out)
    return record


def _failure(name: str, package: Package, program: str, ran: Bounded, took: float) -> str:
    """Why an install failed after `took` seconds: what stopped it or how its installer exited, and
    the end of its output (SHOWN lines of at most LINE characters, saying how much output there was
    before)."""
    kept = [line for line in ran.tail.splitlines() if line.strip()][-SHOWN:]
    shown = [printable(line[:LINE]) + ("…" if len(line) > LINE else "") for line in kept]
    if ran.total > sum(len(line.encode()) + 1 for line in kept) or any(len(line) > LINE for line in kept):
        shown.append(f"(the end of its output, {ran.total:,} bytes in all)")
    what = f"installing {package.spec()} for server '{name}'"
    if ran.stopped is not None:
        # a reason may hold a path the installer named: nothing in it reaches the terminal as a control
        head = f"{what} was stopped: {printable(ran.stopped)}"
        if _LIMIT.search(ran.stopped):  # a limit it reached, named by its key: it may be raised
            head += (
                f"; if the package needs more, raise that limit in servers.{name}.jail.limits (or "
                f"defaults.limits), then run `cellblock install {name}` again"
            )
    else:
        head = f"{what} failed after {took:.1f} s ({program} exited {ran.returncode})"
    return f"{head}:\n  " + "\n  ".join(shown or ["(no output)"])


def _refused_advice(name: str, server: LocalServer, refused: dict[str, str], hosts: list[str]) -> str:
    """What the installer's proxy refused (from its decisions) and the two ways on: let the install
    reach those hosts, or install without scripts; "" when nothing was refused."""
    if not refused or server.install is None:
        return ""
    listed = set(server.install.hosts)
    named = [h.removesuffix(":443") for h in refused if h.removesuffix(":443") not in listed]
    # a host it may reach but that was refused all the same (it resolves to a private address): why
    tried = [f"{h} ({why})" if h.removesuffix(":443") in listed else h for h, why in refused.items()]
    allowed = ", ".join([*hosts, *server.install.hosts])
    return (
        f"its install reached for {', '.join(tried)}, which the installer's jail refused (it may reach only "
        f"{allowed}). Either let the install reach it: set `hosts: [{', '.join([*server.install.hosts, *named])}]` "
        f"under servers.{name}.install in the config; or, if the server works without what its install scripts "
        f"download, set `scripts: false` there. Then run `cellblock install {name}`"
    )


def _registry_rules(hosts: list[str]) -> list[HostRule]:
    """The proxy's rules for an install: the registry's hosts, and the addresses they have now.

    The proxy refuses a name that leads to a private or reserved address (DNS rebinding onto the
    machine's own services); a registry may well have one (a mirror in your network, a company's
    TLS gateway), so exactly the addresses its names resolve to as the install begins are allowed.
    """
    rules = [parse_rule(h) for h in hosts]
    for host in hosts:
        name, _, port = host.partition(":")
        with contextlib.suppress(OSError):
            for *_, address in socket.getaddrinfo(name, int(port or 443), proto=socket.IPPROTO_TCP):
                ip = str(address[0])
                rules.append(parse_rule(f"[{ip}]:{port or 443}" if ":" in ip else f"{ip}:{port or 443}"))
    return rules


def _installer(package: Package) -> str:
    """npm for an npm package; for PyPI uv (on PATH or where its installer puts it), else the
    Python Cellblock runs on, which makes a virtualenv with pip (a pyenv shim on PATH is a script
    that needs all of ~/.pyenv, so no `python3` is looked up)."""
    path = os.environ.get("PATH", "")
    name = "npm" if package.ecosystem is Ecosystem.NPM else "uv"
    for search in (path, os.path.join(os.path.expanduser("~"), ".local", "bin")):
        try:
            return resolve_command(name, search)
        except JailError:
            continue
    if package.ecosystem is Ecosystem.PYPI:
        return os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    raise InstallError(f"cannot install {package.spec()}: npm (Node.js) is not on PATH; install it, then try again")


def _runtime(npm: str) -> str | None:
    """The node beside `npm` (nvm, fnm, volta, Homebrew keep them together), else the one on PATH."""
    beside = os.path.join(os.path.dirname(os.path.realpath(npm)), "node")
    for candidate in (os.path.join(os.path.dirname(npm), "node"), beside):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("node")
