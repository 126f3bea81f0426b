"""Linux jails without namespaces: a `JailSpec` becomes a process that locks itself down with Landlock.

Where bubblewrap cannot make its namespaces (Ubuntu 23.10 and later, containers, hardened kernels),
any process may still restrict itself. The plan runs the gateway's own interpreter on
`sandbox/landlocked.py`, which, single-threaded and right before it becomes the server, drops its
capabilities (as root), enters a Landlock domain and installs the seccomp filter of
`seccomp.LANDLOCK_RULES`. The domain allows:

- read and execute beneath the system's program and library paths bwrap shares (`/usr`, the
  `/bin`, `/lib`... that are not links), read of `bwrap.ETC_FILES`, read-only `/proc`, and read and
  write of the few devices a program needs (`DEVICES`);
- read of the `read_only` grants, read and write of the `read_write` ones (and, as bwrap shows
  them, execute of both unless `exec.allow`), read of the launchers' installations;
- read and write of the server's home (its kept one, else a new directory in `private`) and tmp
  (a new one in `private`), which it is told of as `HOME` and `TMPDIR`;
- with `exec.allow`, execute only of the allowed programs and what runs them
  (`JailSpec.exec_closure`);
- with `network: none`, no TCP bind or connect (ABI 4), and through seccomp no other protocol,
  no listen() and no TCP Fast Open;
- with `network: allowlist` or `ask`, the same, except that each connect() waits for the gateway,
  which makes the connection itself if it is to the egress proxy's loopback listener, and refuses
  any other (`sandbox/connects.py`); the proxy variables point there.

Nothing else: not the real `/tmp`, `/run/user/UID`, `/dev/shm`, the user's home. What this cannot
close that bwrap does is in `landlock_gaps`; what it cannot enforce at all refuses the plan
(`landlock_refusal`).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cellblock.policy.constraints import within
from cellblock.policy.files import make_dirs
from cellblock.sandbox.bwrap import ETC_FILES
from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.pin import landlock_version
from cellblock.sandbox.seccomp import (
    EXEC_ALLOW_RULES,
    LANDLOCK_NO_NETWORK_RULES,
    LANDLOCK_PROXIED_RULES,
    LANDLOCK_ROOT_INSTALL_RULES,
    LANDLOCK_ROOT_RULES,
    LANDLOCK_RULES,
    LANDLOCK_SIDECAR_RULES,
    RULES,
    Rule,
    jail_filter,
)
from cellblock.sandbox.sockets import ABSTRACT_SCOPE_ABI, SCOPE
from cellblock.sandbox.spawn import GATE_FD, GATE_PORT, SECCOMP_FD, run_plan
from cellblock.sandbox.types import GatePlan, JailError, JailSpec, LaunchPlan, Mount, MountMode, Network

__all__ = [
    "DEVICES",
    "LANDLOCKED",
    "NETWORK_ABI",
    "check_landlock",
    "landlock_gaps",
    "landlock_plan",
    "landlock_refusal",
]

LANDLOCKED = str(Path(__file__).resolve().with_name("landlocked.py"))
_PIN = str(Path(__file__).resolve().with_name("pin.py"))
# The Landlock ABI with TCP bind and connect rules (Linux 6.7).
NETWORK_ABI = 4
# A trial jail starts in milliseconds; one that has not ended by then will not.
CHECK_SECONDS = 10
# What of /dev a program needs: the data sinks and sources, its terminal.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts")
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_FIX = (
    "use the bwrap backend (jail.backend: bwrap; it needs unprivileged user namespaces, and "
    "'cellblock doctor' says what keeps them from bwrap here)"
)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where Landlock is missing (which exec.allow and a
    Landlock jail need)."""
    if not sys.platform.startswith("linux"):
        return 0
    return landlock_version()


def landlock_refusal(spec: JailSpec, abi: int, launchers: Sequence[Mount] = ()) -> str | None:
    """Why Landlock at `abi` cannot enforce what `spec` asks, naming the server and the fixes (None: it
    can); with the `launchers`' installations, which must stay read-only, as the grants."""
    name = f"server '{spec.name}'"
    if abi < 1:
        return (
            f"{name}: this kernel has no Landlock (Linux 5.13 or newer, with 'landlock' in the lsm= boot list), "
            f"so it cannot be jailed without namespaces; {_FIX}"
        )
    if spec.network is Network.NONE and abi < NETWORK_ABI:
        return (
            f"{name}: network: none needs Landlock ABI {NETWORK_ABI} (Linux 6.7 or newer) to refuse TCP, and this "
            f"kernel has ABI {abi}; {_FIX}, or set network: open if the server may use the host's network"
        )
    missing = gate_missing() if spec.network in (Network.ALLOWLIST, Network.ASK) else None
    if missing is not None:
        return (
            f"{name}: network: {spec.network.value} on Landlock needs the gateway to make the server's connections "
            f"itself, and {missing}; {_FIX}, or set network: none or open"
        )
    if spec.pinned:
        return (
            f"{name}: jail.exec.sha256 needs the verified copy shown at each pinned path, which takes a mount; "
            f"without one a file changed after its check could run; {_FIX}, or remove jail.exec.sha256"
        )
    taken = _taken_back(spec, spec.read_only)
    if taken:
        inner, outer = taken[0]
        return (
            f"{name}: its read_only grant {inner} is inside its read_write grant {outer}, and Landlock can only "
            f"allow: it cannot make part of a writable grant read-only; {_FIX}, or move {inner} out of {outer}"
        )
    holders = [*spec.read_only, *spec.read_write, *(m.path for m in launchers)]
    for path, why in sorted(spec.hidden.items()):
        # a socket needs no hiding here: no Unix socket can be made in this jail to connect to it
        holder = next((p for p in holders if within(path, p)), None)
        if holder is not None and not _is_socket(path):
            return (
                f"{name}: {path} ({why}) is inside {holder}, which it is granted, and Landlock can only allow: it "
                f"cannot take part of a grant back; {_FIX}, or grant a directory that does not hold it"
            )
    return None


def landlock_gaps(spec: JailSpec, abi: int, launchers: Sequence[Mount] = ()) -> tuple[str, ...]:
    """Every guarantee the bwrap jail gives that this one does not, on this machine, as short sentences;
    with the `launchers`' installations the jail shows."""
    gaps = [
        # a project's own .venv or node_modules in the project it may write: refused, no such server
        # would start where namespaces are refused; run, with what it may change said
        f"{inner} ({_why(launchers, inner)}) is inside the read_write grant {outer}, so the server may change it: "
        "Landlock cannot make part of a writable grant read-only"
        for inner, outer in _taken_back(spec, [m.path for m in launchers])
    ]
    gaps += [
        "other processes are visible, with their command lines, and what /proc shows of the machine and its "
        "network (there is no pid or network namespace); their environment, memory and files are not",
        "the metadata of any path can be read (whether it exists, its size, owner and times), though not a "
        "file's contents nor a directory's listing",
    ]
    if os.geteuid() == 0:
        gaps.append(
            "the times and extended attributes of any file root owns can be changed (Landlock governs neither; "
            "a change of mode by path is refused)"
        )
    else:
        gaps.append(
            "the mode (not set-user-ID), times and extended attributes of any file this user owns can be changed: "
            "Landlock governs none of them"
        )
    if abi < ABSTRACT_SCOPE_ABI:
        gaps.append(
            f"signals reach any process of this user: Landlock scopes them from ABI {ABSTRACT_SCOPE_ABI} (Linux "
            f"6.12), and this kernel has ABI {abi}"
        )
    if abi < 3:
        gaps.append(f"truncate() works on any file this user may write: Landlock governs it from ABI 3, this has {abi}")
    if spec.exec_closure is not None:
        gaps.append(
            "under exec.allow, a file the server writes can still be loaded as code by an allowed program (the "
            "dynamic loader, an interpreter): nothing is made noexec; and all of /usr is readable"
        )
    if spec.home_source is None or spec.tmp:
        gaps.append("its home and tmp are directories on disk: what it writes there is not bounded by its memory limit")
    if gate_missing() is not None and _lone_files(spec.read_write, spec.read_write):
        gaps.append(
            "nothing can be made beside a file granted alone in read_write (a database's journal: the database is "
            f"read-only to SQLite), since the gateway cannot make those files here ({gate_missing()}); grant its "
            "directory instead"
        )
    return tuple(gaps)


def landlock_plan(
    spec: JailSpec,
    launchers: Sequence[Mount],
    private: str,
    secrets: Mapping[str, str] | None = None,
    abi: int | None = None,
) -> LaunchPlan:
    """The command that runs `spec.argv` locked down by Landlock; spawn it through `spawn.spawn_args`.

    `private` is a directory only the gateway uses for this server: the throw-away home (when
    `spec.home_source` is None) and the private tmp are made in it, new at each plan (the plan's
    `made`, which `spawn.discard` removes once its server has ended). `secrets` reach the server
    through the environment, never its argv. `abi`: the kernel's, found when None.
    The bwrap jail's own wrappers in `spec.argv` (the scope launcher, the exec pin) are left out:
    the domain scopes itself, and restricts execution itself.

    Raises:
        JailError: Landlock here cannot enforce what the jail asks (`landlock_refusal`'s text), a
            granted path or the working directory is missing or not shared, a launcher shows one
            file at another's path, or the seccomp filter cannot be built.
    """
    abi = landlock_abi() if abi is None else abi
    refusal = landlock_refusal(spec, abi, launchers)
    if refusal is not None:
        raise JailError(refusal)
    for path, why in [*((p, "read_only") for p in spec.read_only), *((p, "read_write") for p in spec.read_write)]:
        if not os.path.exists(path):
            raise JailError(
                f"server '{spec.name}': jail.{why} path {path} does not exist; create it or remove it from the config"
            )
    for mount in launchers:
        if mount.source is not None and mount.source != mount.path:
            raise JailError(
                f"server '{spec.name}': {mount.path} ({mount.why}) is shown from {mount.source}, which takes a "
                f"mount; {_FIX}"
            )
    home, tmp = _private_dirs(spec, private)
    locked = spec.exec_closure is not None
    rules: list[tuple[str, str]] = []
    system = [d for d in ("/usr", *_SYSTEM_DIRS) if os.path.isdir(d) and not os.path.islink(d)]
    rules += [("--read" if locked else "--run", d) for d in system]
    rules += [("--read", f"/etc/{n}") for n in ETC_FILES if os.path.exists(f"/etc/{n}")]
    rules += [("--read", "/proc"), *(("--device", d) for d in DEVICES if os.path.exists(d))]
    rules += [("--read" if locked else "--run", m.path) for m in launchers if os.path.exists(m.path)]
    rules += [("--read" if locked else "--run", p) for p in spec.read_only]
    writable = [*spec.read_write, home, *([tmp] if tmp else [])]
    rules += [("--write" if locked else "--write-run", p) for p in writable]
    if spec.exec_closure is not None:
        rules += [("--exec", p) for p in spec.exec_closure.executables if os.path.exists(p)]
    cwd = spec.cwd or home
    if spec.cwd is not None and not any(
        within(spec.cwd, p) for p in [*spec.read_only, *spec.read_write, *(m.path for m in launchers)]
    ):
        raise JailError(
            f"server '{spec.name}': its cwd {spec.cwd} is not shared with the jail; "
            "add it (or a parent) to jail.read_only or jail.read_write"
        )
    env = {**spec.env, "HOME": home}
    env.pop("TMPDIR", None)
    env |= {"TMPDIR": tmp} if tmp else {}
    beside = _lone_files(spec.read_write, writable) if gate_missing() is None else ()
    calls = _seccomp_rules(spec) + (LANDLOCK_SIDECAR_RULES if beside else ())
    program = jail_filter(calls)
    options = ["--abi", str(abi), "--seccomp", SECCOMP_FD]
    options += [w for key, value in sorted(env.items()) for w in ("--setenv", key, value)]
    # secrets reach it through the spawner's environment, by name: never a value in argv (`ps` shows it)
    options += [w for key in sorted(secrets or {}) for w in ("--keep", key)]
    options += [w for rule in rules for w in rule]
    options += ["--no-network"] if spec.network is Network.NONE else []
    gate: GatePlan | None = None
    if spec.network in (Network.ALLOWLIST, Network.ASK):
        if spec.egress_socket is None:
            raise JailError(f"server '{spec.name}': network: {spec.network.value} needs the gateway's egress proxy")
        modes = spec.modes_beneath if os.geteuid() == 0 else None
        gate = GatePlan(spec.name, spec.egress_socket, modes, beside)
        options += ["--gate", GATE_FD, "--proxy-port", GATE_PORT]
    elif beside:
        gate = GatePlan(spec.name, beside=beside)
        options += ["--gate", GATE_FD]
    script = (os.path.realpath(sys.executable), "-I", "-S", LANDLOCKED)
    return LaunchPlan(
        argv=(*script, *options, "--chdir", cwd, "--", *_server_argv(spec.argv)),
        env={**env, **(secrets or {})},
        cwd=None,
        mounts=_shown(spec, launchers, system, home, tmp),
        network=spec.network,
        seccomp=program,
        rules=calls,
        held_at=len(script),
        backend="landlock",
        gaps=landlock_gaps(spec, abi, launchers),
        made=tuple(p for p in (tmp, None if spec.home_source else home) if p is not None),
        gate=gate,
    )


def check_landlock() -> None:
    """Start one trial Landlock jail (of `true`, with its seccomp filter, and no network where the
    ABI can refuse it), as `bwrap.check_bwrap` starts one of bwrap's.

    Raises:
        JailError: Landlock cannot hold even that jail here, or its launcher failed to lock it down
            (its own words, e.g. a container's seccomp profile refusing a call it makes).
    """
    program = shutil.which("true", path="/usr/bin:/bin") or "/bin/true"
    abi = landlock_abi()
    network = Network.NONE if abi >= NETWORK_ABI else Network.OPEN
    spec = JailSpec("trial", (program,), {"PATH": "/usr/bin:/bin"}, network=network)
    with tempfile.TemporaryDirectory(prefix="cellblock-landlock-") as private:
        plan = landlock_plan(spec, [], private, abi=abi)
        try:
            done = run_plan(plan, CHECK_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JailError(f"the trial Landlock jail could not be run: {exc}") from exc
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise JailError(f"the trial Landlock jail failed: {said[-1] if said else f'exit {done.returncode}'}")


def _private_dirs(spec: JailSpec, private: str) -> tuple[str, str | None]:
    """The server's home and tmp: its kept home, else a new directory in `private`; a new tmp there.

    Raises:
        JailError: they cannot be made.
    """
    try:
        make_dirs(Path(private))
        home = spec.home_source or tempfile.mkdtemp(prefix="home.", dir=private)
        tmp = tempfile.mkdtemp(prefix="tmp.", dir=private) if spec.tmp else None
    except OSError as exc:
        raise JailError(
            f"server '{spec.name}': its private home and tmp cannot be made in {private} ({exc.strerror}); "
            "nothing was started"
        ) from exc
    return home, tmp


def _seccomp_rules(spec: JailSpec) -> tuple[Rule, ...]:
    """The seccomp rules of this jail: the Landlock rules, and those of its network, exec.allow and user."""
    rules = LANDLOCK_RULES
    if spec.network is Network.NONE:
        rules += LANDLOCK_NO_NETWORK_RULES
    elif spec.network in (Network.ALLOWLIST, Network.ASK):
        rules += LANDLOCK_PROXIED_RULES
    if spec.exec_closure is not None:
        # a file made in memory is on no path, so Landlock's execute right does not govern it
        rules += tuple(r for r in EXEC_ALLOW_RULES if r not in RULES)
    if os.geteuid() == 0:
        installs = spec.modes_beneath is not None and spec.network in (Network.ALLOWLIST, Network.ASK)
        rules += LANDLOCK_ROOT_INSTALL_RULES if installs else LANDLOCK_ROOT_RULES
    return rules


def _lone_files(grants: Sequence[str], writable: Sequence[str]) -> tuple[str, ...]:
    """The `grants` that are a file in a directory no `writable` path holds: what is made beside
    them (a database's journal) the gateway makes (sandbox/sidecars.py)."""
    return tuple(
        g
        for g in grants
        if os.path.isfile(g)
        and not any(within(os.path.dirname(os.path.realpath(g)), os.path.realpath(w)) for w in writable)
    )


def _taken_back(spec: JailSpec, inner: Sequence[str]) -> list[tuple[str, str]]:
    """Each of the read-only paths `inner` (read_only grants, launchers' installations) inside a
    read_write grant, with that grant: bwrap mounts it read-only over the grant, Landlock cannot."""
    return [(i, o) for i in inner for o in spec.read_write if within(os.path.realpath(i), os.path.realpath(o))]


def _why(mounts: Sequence[Mount], path: str) -> str:
    return next((m.why for m in mounts if m.path == path), "shown read-only")


def _server_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The server's command without the bwrap jail's wrappers (each `python -I -S WRAPPER ... -- ARGV`)."""
    while len(argv) > 4 and argv[1:3] == ("-I", "-S") and argv[3] in (SCOPE, _PIN) and "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    return argv


def _shown(
    spec: JailSpec, launchers: Sequence[Mount], system: Sequence[str], home: str, tmp: str | None
) -> tuple[Mount, ...]:
    """What the jail reaches, as mounts for `cellblock show` (Landlock rules at the paths themselves)."""
    runs = "read only: exec.allow decides what runs" if spec.exec_closure is not None else "read and execute"
    shown = [Mount(d, MountMode.READ_ONLY, f"system (Landlock: {runs})") for d in system]
    shown += [Mount(f"/etc/{n}", MountMode.READ_ONLY, "system") for n in ETC_FILES if os.path.exists(f"/etc/{n}")]
    shown += [Mount("/proc", MountMode.READ_ONLY, "processes: other processes' environ and memory refused")]
    shown += [Mount(d, MountMode.READ_WRITE, "device") for d in DEVICES if os.path.exists(d)]
    shown += [Mount(m.path, MountMode.READ_ONLY, m.why) for m in launchers]
    shown += [Mount(p, MountMode.READ_ONLY, "read_only") for p in spec.read_only]
    shown += [Mount(p, MountMode.READ_WRITE, "read_write") for p in spec.read_write]
    kept = "its own, kept across restarts" if spec.home_source else "throw-away, made for this start"
    shown.append(Mount(home, MountMode.READ_WRITE, f"private home ({kept}; HOME)"))
    if tmp is not None:
        shown.append(Mount(tmp, MountMode.READ_WRITE, "private tmp (TMPDIR)"))
    if spec.exec_closure is not None:
        allowed = f"exec.allow: only {len(spec.exec_closure.executables)} files executable"
        shown.append(Mount("/usr", MountMode.READ_ONLY, allowed))
    return tuple(shown)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False
