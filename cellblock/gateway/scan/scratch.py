"""The throw-away world a scan runs a server in: copies of its granted directories, a home with
decoys, a file outside every grant, and a symlink planted in a grant that points out.

The server's config is rewritten to name the copies in place of the user's directories (in its
jail, its arguments and its working directory), so a tool that deletes or writes changes only
the copies; what the trace shows of the copies is mapped back to the user's paths in the report.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cellblock.gateway.config.model import JailConfig, LocalServer
from cellblock.gateway.downstream.roots import granted_roots
from cellblock.policy.constraints import within
from cellblock.policy.errors import CellblockError
from cellblock.policy.probes import Places

__all__ = ["DECOYS", "MAX_COPIED_FILES", "ScanError", "Scratch", "jail_of", "scratch_world", "service"]

# Planted in the scratch home: what a server has no business reading.
DECOYS = (".ssh/id_rsa", ".ssh/id_ed25519", ".aws/credentials", ".netrc", ".config/gh/hosts.yml")
# A grant bigger than this is not copied: the scan says so instead of filling the disk.
MAX_COPIED_FILES = 20000
SAMPLE = "cellblock-scan.txt"
LINK = "cellblock-scan-link"


class ScanError(CellblockError):
    """A scan cannot be run as asked; the message says why and what to do."""


def jail_of(server: LocalServer) -> JailConfig:
    """`server`'s jail: a scan never runs a server unjailed (nor widens a jail it does not have).

    Raises:
        ScanError: it has `jail: false` (the scan's commands refuse that before they get here).
    """
    if server.jail is False:
        raise ScanError("a server with jail: false is not scanned: a scan never runs a server unjailed")
    return server.jail


@dataclass
class Scratch:
    """Where the scan's world is (`root`), and the user's grants each copy stands for."""

    root: Path
    home: Path
    outside: Path
    copies: dict[str, str] = field(default_factory=dict)  # the user's grant -> its copy
    canary: str = ""
    # the user's read_write grants not copied (the server's own code, a package cache): shown
    # read-only, so that nothing the server does changes a file of the user's
    frozen: list[str] = field(default_factory=list)

    def places(self, denied_url: str) -> Places:
        writable = next(iter(self.copies.values()), None)
        directory = writable
        file = os.path.join(directory, SAMPLE) if directory else None
        link = os.path.join(directory, LINK) if directory else None
        traversal = None
        if directory:
            up = os.path.relpath(self.home / ".ssh" / "id_rsa", directory)
            traversal = os.path.join(directory, up)
        return Places(directory, file, link, str(self.outside), "~/.ssh/id_rsa", traversal, denied_url)

    def server(self, server: LocalServer) -> LocalServer:
        """`server` with the copies in place of the user's grants, and every read_write grant that
        has no copy shown read-only: the jail can write in nothing but the scan's own world."""
        given = jail_of(server)
        writable = [p for p in given.read_write if p not in self.frozen]
        jail = given.model_copy(
            update={
                "read_only": [self.to_copy(p) for p in [*given.read_only, *self.frozen]],
                "read_write": [self.to_copy(p) for p in writable],
            }
        )
        args = [self.to_copy(a) for a in server.args]
        cwd = self.to_copy(server.cwd) if server.cwd else None
        return server.model_copy(update={"jail": jail, "args": args, "cwd": cwd})

    def to_copy(self, value: str) -> str:
        """A path (or `--option=PATH`) under a grant, moved under its copy."""
        for grant, copy in self.copies.items():
            if within(value, grant):
                return copy + value[len(grant.rstrip("/")) :]
        key, equals, path = value.partition("=")
        if equals and path.startswith("/") and self.to_copy(path) != path:
            return f"{key}={self.to_copy(path)}"
        return value

    def to_user(self, path: str) -> str:
        """A path of the scan's world as the user knows it: a copy's as the grant's, the scratch
        home's under `~`."""
        for grant, copy in self.copies.items():
            if within(path, copy):
                return grant.rstrip("/") + path[len(copy) :]
        if within(path, str(self.home)):
            return "~" + path[len(str(self.home)) :]
        if within(path, str(self.root)):  # the scan's own world, by a name that is the same every run
            return "<scan>" + path[len(str(self.root)) :]
        return path

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _count(path: str) -> int:
    total = 0
    for _, dirs, files in os.walk(path):
        total += len(dirs) + len(files)
        if total > MAX_COPIED_FILES:
            break
    return total


# What a grant may be that is no file: behind it a service or a device, the same in any copy
_SERVICES = (
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def service(path: str) -> str | None:
    """What `path` (links followed) is when it is no file nor directory but a way to something
    else: "a socket", "a pipe", "a device"; None for a file, a directory, or nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((what for test, what in _SERVICES if test(mode)), None)


def _refuse_services(name: str, server: LocalServer) -> None:
    """A grant that is a socket, a pipe or a device cannot be copied, and shown read-only it still
    reaches what is behind it (a socket is connected to all the same).

    Raises:
        ScanError: `server` has one.
    """
    for grant in [*server.jail.read_only, *server.jail.read_write] if server.jail is not False else []:
        kind = service(grant)
        if kind is not None:
            raise ScanError(
                f"server '{name}': its grant {grant} is {kind}: a scan cannot copy what is behind it, and never "
                "lets a server reach your own services or data through one; scan it without that grant, or with "
                "one to a copy made for the scan"
            )


def scratch_world(name: str, server: LocalServer) -> Scratch:
    """Copies of `server`'s work grants (not its code or package caches, which run read-only as
    they are, even where granted read_write), a home with decoys, a file outside, and a symlink in
    the first copy.

    Raises:
        ScanError: a grant is too big to copy, is or holds a socket, a pipe or a device.
    """
    root = Path(tempfile.mkdtemp(prefix=f"cellblock-scan-{name}-"))
    canary = f"CELLBLOCK-DECOY-{secrets.token_hex(8)}"
    home = root / "home"
    for decoy in DECOYS:
        path = home / decoy
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{canary} {decoy}\n")
    outside = root / "outside" / "not-granted.txt"
    outside.parent.mkdir()
    outside.write_text(f"{canary} outside\n")
    scratch = Scratch(root, home, outside, canary=canary)
    try:
        _refuse_services(name, server)
        # the probes aim at the first copy: a directory the server is told of, a writable one first
        told = [a.partition("=")[2] or a for a in server.args]
        grants = sorted(
            granted_roots(server),
            key=lambda g: (not any(within(t, g) for t in told), g not in server.jail.read_write),  # type: ignore[union-attr]
        )
        for index, grant in enumerate(grants):
            copy = root / "grants" / f"{index}-{os.path.basename(grant.rstrip('/')) or 'root'}"
            if os.path.isfile(grant):
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(grant, copy)
            elif os.path.isdir(grant):
                if _count(grant) > MAX_COPIED_FILES:
                    raise ScanError(
                        f"server '{name}': its grant {grant} holds more than {MAX_COPIED_FILES} files, too many to "
                        "copy for a scan; scan it with a smaller directory granted"
                    )
                try:
                    shutil.copytree(grant, copy, symlinks=True)
                except shutil.Error as exc:  # each file that could not be copied: (source, copy, why)
                    what = next((str(e[0]) for e in exc.args[0] if isinstance(e, tuple)), grant)
                    raise ScanError(
                        f"server '{name}': its grant {grant} holds {what}, which cannot be copied for a scan "
                        "(a socket or a pipe: a service, not a file); scan it with a grant that holds only files"
                    ) from exc
            else:
                continue  # a grant that does not exist is the jail's to refuse
            scratch.copies[grant] = str(copy)
        writable = server.jail.read_write if server.jail is not False else []
        scratch.frozen = [g for g in writable if scratch.to_copy(g) == g]
        first = next(iter(scratch.copies.values()), None)
        if first is not None:
            sample = Path(first) / SAMPLE
            if not sample.exists():
                sample.write_text("a file the scan planted\n")
            link = Path(first) / LINK
            if not link.is_symlink():
                link.symlink_to(home / ".ssh" / "id_rsa")
    except BaseException:
        scratch.close()
        raise
    return scratch
