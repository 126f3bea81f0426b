"""What a jail is made of, independent of the OS that builds it.

`JailSpec` is what the gateway asks for (from a server's `jail:` config); a `LaunchPlan` is how
one OS layer carries it out (the argv to run, every mount it makes, for `cellblock show`, the
seccomp filter bwrap installs, which `sandbox/spawn.py` hands over at spawn, and the jail's
resource limits with how this machine enforces them, which `sandbox/limits.py` puts in place).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from cellblock.policy.errors import CellblockError

__all__ = [
    "Backend",
    "Closure",
    "Enforcement",
    "Install",
    "InstallKind",
    "JailError",
    "JailSpec",
    "LaunchPlan",
    "LimitPlan",
    "Limits",
    "MarkPlan",
    "Mechanism",
    "Method",
    "Mount",
    "MountMode",
    "Network",
]


# What builds a Linux jail (sandbox/backends.py): bubblewrap, Landlock, or the first that holds it.
Backend = Literal["auto", "bwrap", "landlock"]


class JailError(CellblockError):
    """A jail cannot be built; the message says what to install or change. The server does not start."""


class Network(StrEnum):
    NONE = "none"
    ALLOWLIST = "allowlist"
    ASK = "ask"  # an allowlist jail whose proxy asks the human about other hosts
    OPEN = "open"


class MountMode(StrEnum):
    READ_ONLY = "ro"
    READ_WRITE = "rw"
    HIDDEN = "hidden"  # shown empty (a directory) or as /dev/null (a file, a socket) over what a share holds


@dataclass(frozen=True, slots=True)
class Mount:
    """One host path made visible inside the jail, at the same path."""

    path: str
    mode: MountMode
    why: str  # "read_only", "system", "virtualenv, for the command itself", ... shown by `cellblock show`
    source: str | None = None  # the host file shown at `path`, when it is not `path` itself


@dataclass(frozen=True, slots=True)
class Closure:
    """What running some programs needs, as host paths the jail shows at the same paths (see sandbox/closure.py)."""

    files: tuple[str, ...]  # every file and symlink opened or walked, with no symlink in its directory part
    executables: tuple[str, ...]  # what is executed: the programs, their loaders and `#!` interpreters
    directories: tuple[str, ...]  # whole directories loaded from (a system Python's standard library)


@dataclass(frozen=True, slots=True)
class JailSpec:
    """Everything a jail needs to know about one server. Paths are absolute and already expanded."""

    name: str
    argv: tuple[str, ...]  # the server's command (absolute) and its arguments
    env: Mapping[str, str]  # exactly the environment the server gets
    cwd: str | None = None
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    network: Network = Network.NONE
    allow_hosts: tuple[str, ...] = ()
    tmp: bool = True
    home: str = "/root"  # the user's home: replaced by a private directory in the jail
    # the host directory shown at `home`, the server's own, kept across starts; None: an empty tmpfs
    home_source: str | None = None
    exec_allow: tuple[str, ...] = ()
    exec_sha256: Mapping[str, str] = field(default_factory=dict)
    # in-jail path -> the verified copy of its bytes that is mounted there (see sandbox/digests.py)
    pinned: Mapping[str, str] = field(default_factory=dict)
    # host-side Unix socket of the egress proxy, for network: allowlist
    egress_socket: str | None = None
    # an installer's: the directory beneath which the gateway makes the mode changes of a Landlock
    # jail run as root (sandbox/modes.py)
    modes_beneath: str | None = None
    # with exec.allow: the system files the jail shows instead of all of /usr (what the allowed
    # programs and the gateway's launcher need to run)
    exec_closure: Closure | None = None
    # what no jail may reach inside a shared path (Cellblock's own config, state, runtime and control
    # socket; the session's and the machine's sockets), at the place the jail shows it -> what it is:
    # the jail shows an empty directory (or /dev/null) there instead
    hidden: Mapping[str, str] = field(default_factory=dict)
    # what the command needs that this jail will not have (sandbox/launchers.launcher_gaps), for show and doctor
    gaps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Limits:
    """What one jail may take: tasks (processes and threads alike, as the kernel counts both) and
    memory, in bytes; and for an installer's jail, the bytes of disk its install may fill."""

    processes: int
    memory: int
    disk: int | None = None  # None: a server's own jail, whose writes go to its grants


class Mechanism(StrEnum):
    """What enforces one limit on this machine."""

    SYSTEMD = "systemd"  # a transient scope of the service manager (the user's, or as root the system's)
    CGROUP = "cgroup"  # a cgroup of the jail's own, made by the gateway in the cgroup filesystem
    RLIMIT = "rlimit"  # a resource limit of the jail's first process, inherited by everything it starts
    NONE = "none"  # nothing here can enforce it


@dataclass(frozen=True, slots=True)
class Method:
    """How one limit is enforced here, and what that covers, in words for `show`, `doctor` and the log."""

    mechanism: Mechanism
    how: str
    whole: bool  # it bounds the jail as a whole (not each process, or nothing)
    base: str | None = None  # cgroup: the directory the jail's cgroup is made in
    version: int = 0  # cgroup: 1 or 2


@dataclass(frozen=True, slots=True)
class Enforcement:
    """How this machine enforces each of a jail's limits."""

    processes: Method
    memory: Method
    # with systemd: the systemd-run command that makes the scope, and what it needs in its environment
    scope: tuple[str, ...] = ()
    scope_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """A jail's limits, how they are enforced, and the server's name for what is made in the OS
    (its cgroup or systemd scope)."""

    server: str
    limits: Limits
    enforcement: Enforcement
    # each writable tmpfs's mount point -> the bytes and files it may hold, set from outside the
    # held jail (`sandbox/tmpfs.py`); empty where this kernel cannot (before Linux 5.2)
    tmpfs: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MarkPlan:
    """A cgroup to make at spawn in `base`, which a server's first process joins itself before it
    runs the server (see sandbox/marks.py)."""

    server: str
    base: str


# -- a seccomp rule (sandbox/seccomp.py builds filters of them) --------------------------------


class Compare(StrEnum):
    """How a rule looks at one argument; the values are libseccomp's names for the comparisons."""

    EQ = "EQ"
    GE = "GE"
    MASKED_EQ = "MASKED_EQ"  # (argument & mask) == datum


@dataclass(frozen=True, slots=True)
class Check:
    """One more comparison a `Rule` needs to hold as well: of another argument."""

    arg: int
    compare: Compare = Compare.EQ
    datum: int = 0
    mask: int = 0  # MASKED_EQ only


@dataclass(frozen=True, slots=True)
class Rule:
    """`syscall` fails with `error` (an errno) when its argument `arg` compares true (and every one
    of `also` does); always when `arg` is None.

    Rules for one system call are ORed. libseccomp refuses two comparisons of one argument in
    one rule, so a range is written as several rules.
    """

    syscall: str
    error: int
    arg: int | None = None
    compare: Compare = Compare.EQ
    datum: int = 0
    mask: int = 0  # MASKED_EQ only
    also: tuple[Check, ...] = ()


@dataclass(frozen=True, slots=True)
class GatePlan:
    """A Landlock jail some of whose calls the gateway makes (sandbox/connects.py), a gate opened at
    spawn for server `server`: the connects of `network: allowlist` or `ask`, carried to its egress
    proxy; a root installer's mode changes; the files beside the lone granted files (sandbox/sidecars.py)."""

    server: str
    egress_socket: str | None = None  # the egress proxy's socket, where the jail's network goes through it
    modes_beneath: str | None = None  # a root installer's: its mode changes, made beneath this directory
    beside: tuple[str, ...] = ()  # read_write grants of a file alone in a directory the jail may not write


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """The command that starts a server, and what it will be able to see.

    With a `seccomp` program, `argv` holds a placeholder where bwrap expects the descriptor to
    read it from: spawn such a plan through `sandbox.spawn.spawn_args`, which supplies both. Run
    as it is, bwrap refuses the placeholder and the server does not start. With `limits`, the argv
    also holds bwrap's `--info-fd` and `--block-fd` placeholders: the jail waits before its command
    runs until `Spawn.release` has put it under them.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    mounts: tuple[Mount, ...]
    network: Network
    seccomp: bytes | None = field(default=None, repr=False)  # a compiled BPF program (sandbox/seccomp.py)
    rules: tuple[Rule, ...] = field(default=(), repr=False)  # what `seccomp` is compiled from (limit_plan adds one)
    # with exec.allow: the stricter program the pin launcher installs itself (shown to it as a file)
    pin_filter: bytes | None = field(default=None, repr=False)
    limits: LimitPlan | None = None  # see sandbox/limits.py
    mark: MarkPlan | None = None  # an unjailed server's marked cgroup: see sandbox/marks.py
    # the tmpfs mounts the jail may write (what is written there is memory): where each one's
    # `--tmpfs` stands in `argv`, and its mount point; `limit_plan` sizes them within the memory limit
    tmpfs: tuple[tuple[int, str], ...] = ()
    held_at: int = 1
    # what builds the jail: "bwrap", "landlock" (sandbox/landlock.py), "seatbelt" (macOS), "none" (jail: false)
    backend: str = "bwrap"
    # every guarantee of the bwrap jail this one does not give on this machine, as sentences for
    # doctor, show and the log (a Landlock jail's: landlock.landlock_gaps)
    gaps: tuple[str, ...] = ()
    # directories made for this run alone (a Landlock jail's throw-away home and its tmp), which
    # `spawn.discard` removes once it has ended
    made: tuple[str, ...] = ()
    gate: GatePlan | None = None  # a Landlock jail's connects, made by the gateway: see sandbox/spawn.py


class InstallKind(StrEnum):
    """What a directory shared for a launcher is, recognised by its structure (see sandbox/installs.py)."""

    VIRTUALENV = "virtualenv"  # pyvenv.cfg next to bin/python
    PYTHON = "python install"  # bin/pythonX.Y next to lib/pythonX.Y/os.py
    NODE = "node install"  # bin/node next to lib/node_modules
    NODE_PACKAGES = "node packages"  # a node_modules directory
    PREFIX = "install prefix"  # bin/PROGRAM (ELF) next to lib/ with shared libraries


@dataclass(frozen=True, slots=True)
class Install:
    """A directory that is an installation of `kind`, shared whole (read-only) for a program in it."""

    root: str
    kind: InstallKind
