"""What `starter` builds for one server: the config body, the secrets it moved out, the notes."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from cellblock.policy.constraints import within

__all__ = ["ENTRY_MAX", "Draft", "Secret", "Starter"]

ENTRY_MAX = 64  # cellblock.gateway.downstream.credentials.ENTRY_NAME


@dataclass(frozen=True)
class Secret:
    """An inline secret of a client entry, to be stored in the keyring under `entry`."""

    key: str  # the environment variable (also for an argument's secret) or header name
    entry: str  # the keyring entry (under the service "cellblock")
    value: str = field(repr=False)
    # env / header / bearer: the server gets it from the keyring (env: an argument's too, named by
    # `${secrets.KEY}`); stash: a value the config cannot carry (part of a remote's URL, a client
    # key Cellblock does not use), kept in the keyring only so that unwrap can put it back
    kind: Literal["env", "header", "bearer", "stash"]


@dataclass(frozen=True)
class Starter:
    """The Cellblock config of one server, the secrets it moved out, and what to tell the user."""

    name: str
    config: dict[str, Any]
    secrets: tuple[Secret, ...]
    notes: tuple[str, ...]
    # directories the server keeps its data in, which wrap creates (a jail grants only what exists)
    make: tuple[str, ...] = ()
    # files the server will create that wrap creates empty, to share them alone (gateway/config/missing.py)
    touch: tuple[str, ...] = ()


@dataclass
class Draft:
    """What `starter` builds up for one server."""

    name: str
    home: str
    body: dict[str, Any] = field(default_factory=dict)
    secrets: list[Secret] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    read_only: dict[str, None] = field(default_factory=dict)
    read_write: dict[str, None] = field(default_factory=dict)
    make: list[str] = field(default_factory=list)
    touch: list[str] = field(default_factory=list)

    def secret(self, key: str, value: str, kind: Literal["env", "header", "bearer", "stash"]) -> str:
        """Record a secret and return its keyring entry, unique within this server."""
        entry = self.name if kind == "bearer" else _entry_name(self.name, key, {s.entry for s in self.secrets})
        self.secrets.append(Secret(key=key, entry=entry, value=value, kind=kind))
        return entry

    def expand(self, path: str) -> str:
        return self.home + path[1:] if path == "~" or path.startswith("~/") else path

    def path(self, arg: str, cwd: str | None, *, bare: bool = False) -> str | None:
        """`arg` as a normalised absolute or `~/` path, None if it is none; relative ones against `cwd`
        when they start with `./` or `../` (any relative one when `bare`)."""
        if arg.startswith(("/", "~/")) or arg == "~":
            full, tilde = posixpath.normpath(self.expand(arg)), arg.startswith("~")
        elif cwd and self.expand(cwd).startswith("/") and (bare or arg.startswith(("./", "../")) or arg == ".."):
            full, tilde = posixpath.normpath(posixpath.join(self.expand(cwd), arg)), cwd.startswith("~")
        else:
            return None
        home = self.home.rstrip("/")
        if tilde and within(full, home):
            return "~" + full[len(home) :]
        return full

    def share(self, path: str, writable: bool) -> None:
        if writable:
            self.read_only.pop(path, None)
            self.read_write[path] = None
        elif path not in self.read_write:
            self.read_only[path] = None


def _entry_name(server: str, key: str, used: Collection[str]) -> str:
    """`<server>-<key>` as a keyring entry name: lowercase, '-' for other characters, unique in `used`."""
    part = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-") or "secret"
    base = f"{server}-{part}"[:ENTRY_MAX].rstrip("-")
    entry, number = base, 2
    while entry in used:
        suffix = f"-{number}"
        entry = base[: ENTRY_MAX - len(suffix)].rstrip("-") + suffix
        number += 1
    return entry
