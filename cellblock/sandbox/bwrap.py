"""Linux jails: a `JailSpec` becomes a bubblewrap command line.

Every jail gets new user, mount, pid, ipc, uts and cgroup namespaces, and a new network namespace
unless the network is `open`; all capabilities dropped (the gateway may run as root, and root
with capabilities can remount a read-only share writable); no nested user namespaces; a cleared
environment; read-only `/usr` and a few `/etc` files; an empty private home, `/tmp` and `/dev/shm`
(the only tmpfs mounts it may write, which `limits.limit_plan` sizes); the granted directories at
their own paths; a read-only root over all of it; and the seccomp filter
of `sandbox/seccomp.py`, handed over at spawn by `sandbox/spawn.py`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from cellblock.policy.constraints import within
from cellblock.sandbox.seccomp import EXEC_ALLOW_RULES, PIN_STAGE_RULES, RULES, jail_filter
from cellblock.sandbox.spawn import PIN_FILTER_FD, SECCOMP_FD, run_plan
from cellblock.sandbox.types import Closure, JailError, JailSpec, LaunchPlan, Mount, MountMode, Network

__all__ = [
    "EGRESS_SOCKET",
    "ETC_FILES",
    "EXEC_ALLOW_DATA",
    "MASKED_PROC",
    "MASKED_PROC_DIRS",
    "PIN_FILTER",
    "READ_ONLY_PROC",
    "bwrap_plan",
    "check_bwrap",
    "find_bwrap",
    "namespace_hint",
]

# What programs read from /etc: users and groups, name resolution, the loader cache, TLS roots,
# the alternatives symlinks /usr/bin points through, the time zone. Each is a mount, and each
# mount costs a jail's start about 0.2 ms, so files read only by tools a server does not run
# (ld.so.conf for ldconfig) or whose absence means their defaults (host.conf, gai.conf) are left out.
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "ld.so.cache",
    "ssl",
    "ca-certificates",
    "alternatives",
    "localtime",
    "mime.types",
)
# What the jail's /proc shows of the host that no server needs: the descriptions of the user's
# kernel keys, the users that hold keys, and kernel internals, some of them readable by uid 0 alone
# (which a jail of a gateway run as root is): the physical pages' flags and counts, the kernel's
# heap and its allocations. Masked with /dev/null, and the hardware directories with an empty
# tmpfs, as container runtimes do (those this kernel has).
MASKED_PROC = (
    *("/proc/keys", "/proc/key-users", "/proc/kcore", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug"),
    *("/proc/kpageflags", "/proc/kpagecount", "/proc/kpagecgroup", "/proc/slabinfo", "/proc/pagetypeinfo"),
    *("/proc/vmallocinfo", "/proc/latency_stats"),
)
MASKED_PROC_DIRS = ("/proc/acpi", "/proc/scsi", "/proc/asound")
# What of /proc the kernel lets uid 0 write without any capability: sysctls (kernel.core_pattern,
# kernel.modprobe: a program the kernel runs as root on the host), IRQ affinities, sysrq. A jail
# of a gateway run as root runs as uid 0, so these are shown read-only, from the gateway's own /proc
# (bwrap covers them only where the directory itself is writable, which /proc/sys is not).
READ_ONLY_PROC = ("/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs", "/proc/sysrq-trigger")
# Where the egress proxy's socket appears inside a jail.
EGRESS_SOCKET = "/run/cellblock/egress.sock"
# With exec.allow: where the pin launcher finds the filter it installs (sandbox/pin.py).
PIN_FILTER = "/run/cellblock/seccomp"
# With exec.allow, /usr is not shared whole: besides the allowed programs' closure, only data that
# programs commonly read (time zones, CA certificates, compiled locales), and never executable.
EXEC_ALLOW_DATA = ("/usr/share/zoneinfo", "/usr/share/ca-certificates", "/usr/lib/locale")
# A trial jail must come up in well under this; a hung bwrap means something is badly wrong.
CHECK_SECONDS = 10


def find_bwrap() -> str:
    """The bwrap binary.

    Raises:
        JailError: bubblewrap is not installed.
    """
    found = shutil.which("bwrap")
    if found is None:
        raise JailError(
            "bubblewrap is not installed, so the server cannot be jailed; install it "
            "(Debian/Ubuntu: apt-get install bubblewrap, Fedora: dnf install bubblewrap), "
            "or set 'jail: false' on the server to run it unjailed"
        )
    return found


# Where the kernel (or a security module) keeps unprivileged user namespaces from bwrap, and the
# narrowest fix for each: a profile that lets bwrap alone create them beats a system-wide sysctl.
_APPARMOR = (
    "AppArmor keeps unprivileged programs from creating user namespaces "
    "(kernel.apparmor_restrict_unprivileged_userns = 1, the default from Ubuntu 23.10). The narrowest fix "
    "lets bwrap alone create them with the bwrap-userns-restrict profile: on Ubuntu 24.04 "
    "`sudo apt install apparmor-profiles && sudo cp /usr/share/apparmor/extra-profiles/bwrap-userns-restrict "
    "/etc/apparmor.d/ && sudo apparmor_parser -r /etc/apparmor.d/bwrap-userns-restrict` (Ubuntu 25.04 and "
    "later ship it loaded). Lifting it for every program instead: "
    "`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`"
)
SYSCTLS = Path("/proc/sys")
_SYSCTLS = (
    ("kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=1"),
    ("user/max_user_namespaces", "0", "user.max_user_namespaces=15000"),
)


def namespace_hint(sysctls: Path = SYSCTLS) -> str:
    """Why bwrap may not create the user namespace a jail needs here, and what to do about it."""

    def reads(name: str) -> str:
        try:
            return (sysctls / name).read_text().strip()
        except OSError:
            return ""

    if reads("kernel/apparmor_restrict_unprivileged_userns") == "1":
        return _APPARMOR
    for name, off, fix in _SYSCTLS:
        if reads(name) == off:
            return f"unprivileged user namespaces are disabled ({name.replace('/', '.')} = {off}): `sudo sysctl {fix}`"
    return (
        "the kernel refused bwrap a new namespace; jails need unprivileged user namespaces (and, "
        "inside a container, one that allows nesting them)"
    )


@functools.cache
def check_bwrap() -> str:
    """Start one trial jail, with the seccomp filter; return the bwrap path if jails can be built here.

    Raises:
        JailError: bwrap is missing, the kernel refuses the namespaces it needs, or the seccomp
            filter cannot be built or installed.
    """
    bwrap = find_bwrap()
    base = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent"]
    argv = (
        bwrap,
        *base,
        "--seccomp",
        SECCOMP_FD,
        *_system_mounts()[0],
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        "true",
    )
    trial = LaunchPlan(argv, {}, None, (), Network.NONE, seccomp=jail_filter())
    try:
        done = run_plan(trial, CHECK_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JailError(f"bubblewrap could not be run: {exc}") from exc
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        if "seccomp" in reason.lower():
            hint = (
                "the kernel refused the jail's seccomp filter (it needs CONFIG_SECCOMP_FILTER); "
                "see 'cellblock doctor', or set 'jail: false' on a server to run it unjailed"
            )
        elif "namespace" in reason or "uid map" in reason or "Operation not permitted" in reason:
            hint = namespace_hint()
        else:
            hint = "see 'cellblock doctor'"
        raise JailError(f"bubblewrap cannot build a jail on this machine: {reason}; {hint}")
    return bwrap


def _system_mounts(closure: Closure | None = None, files: Sequence[str] = ()) -> tuple[list[str], list[Mount]]:
    """The system part of a jail: all of /usr read-only, or with exec.allow only the `closure`'s
    directories, its `files` that no later mount holds (see `_closure_files`) and `EXEC_ALLOW_DATA`."""
    args = [] if closure is not None else ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path) and closure is None:
            args += ["--ro-bind", path, path]
    mounts = [] if closure is not None else [Mount("/usr", MountMode.READ_ONLY, "system")]
    if closure is not None:
        directories = [d for d in (*closure.directories, *EXEC_ALLOW_DATA) if os.path.isdir(d)]
        for directory in directories:
            args += ["--ro-bind", directory, directory]
            why = "system data (not executable)" if directory in EXEC_ALLOW_DATA else "a Python's standard library"
            mounts.append(Mount(directory, MountMode.READ_ONLY, why))
        for path in files:
            args += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
        mounts.append(
            Mount("/usr", MountMode.READ_ONLY, f"exec.allow: only the {len(files)} files the allowed programs need")
        )
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    mounts += [Mount(f"/etc/{n}", MountMode.READ_ONLY, "system") for n in ETC_FILES if os.path.exists(f"/etc/{n}")]
    return args, mounts


def _closure_files(
    closure: Closure | None, installs: Sequence[str], later: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The closure's files (and symlinks) the system part shows, and those shown after the mounts
    that hold them (a grant, the home, /tmp), each as a read-only mount of its own: under a grant
    it must be neither writable nor the reason the whole grant stays executable, under a tmpfs it
    must not be hidden. An installation shown whole shows its files itself."""
    if closure is None:
        return [], []
    early: list[str] = []
    late: list[str] = []
    for path in closure.files:
        if _inside(path, [*closure.directories, *installs]):
            continue
        (late if _inside(path, later) else early).append(path)
    return early, late


def bwrap_plan(
    spec: JailSpec,
    launchers: Sequence[Mount],
    bwrap: str = "bwrap",
    secrets: Mapping[str, str] | None = None,
    spawner_env: Sequence[str] = (),
    seccomp: bool = True,
) -> LaunchPlan:
    """The bwrap command that runs `spec.argv` in its jail; spawn it through `spawn.spawn_args`.

    `secrets` (variable -> value) reach the server through bwrap's own environment, never its
    argv (which `ps` shows to every user); `spawner_env` names the variables whatever spawns
    bwrap adds to that environment, which are then removed inside. `seccomp=False` leaves the
    filter out: for the tests' controls (what the filter stops), and `show` where there is none.

    Raises:
        JailError: a granted path or the working directory does not exist or is not shared, or
            the seccomp filter cannot be built.
    """
    grants = [Mount(p, MountMode.READ_ONLY, "read_only") for p in spec.read_only]
    grants += [Mount(p, MountMode.READ_WRITE, "read_write") for p in spec.read_write]
    for grant in grants:
        if not os.path.exists(grant.path):
            raise JailError(
                f"server '{spec.name}': jail.{grant.why} path {grant.path} does not exist; "
                "create it or remove it from the config"
            )
    # shallow paths first, so a grant inside another grant (read_only inside read_write) wins
    shared = sorted([*launchers, *grants], key=lambda m: (m.path.count("/"), m.path))

    args = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup"]
    if spec.network is not Network.OPEN:
        args.append("--unshare-net")  # only loopback inside
    locked = spec.exec_closure is not None
    # with exec.allow the pin launcher makes a user namespace of its own (see sandbox/pin.py) and
    # then installs a filter that refuses any further one, which --disable-userns would forbid it
    args += ([] if locked else ["--disable-userns"]) + ["--cap-drop", "ALL", "--die-with-parent", "--new-session"]
    rules = PIN_STAGE_RULES if locked else RULES
    program = jail_filter(rules) if seccomp else None
    pin_filter = jail_filter(EXEC_ALLOW_RULES) if locked else None
    if program is not None:
        args += ["--seccomp", SECCOMP_FD]
    args += ["--hostname", "cellblock"]
    if secrets:
        # --clearenv would drop the secrets too; remove by name what the spawner added instead
        args += [a for key in sorted(set(spawner_env) - set(secrets)) for a in ("--unsetenv", key)]
    else:
        args.append("--clearenv")
    for key, value in sorted(spec.env.items()):
        args += ["--setenv", key, value]
    tmpfs = [spec.home, *(["/tmp"] if spec.tmp else [])]
    early, late = _closure_files(spec.exec_closure, [m.path for m in launchers], [*(g.path for g in grants), *tmpfs])
    system_args, system = _system_mounts(spec.exec_closure, early)
    args += system_args
    args += ["--proc", "/proc", "--dev", "/dev"]
    # bwrap's /dev is a tmpfs it cannot size and the jail's user may write: it is made read-only
    # (its devices still work) below, and shared memory gets a tmpfs of its own, sized by the limits.
    # A tmpfs that a share mounted later covers (a grant of the home, of /tmp, or above them) is out
    # of every process's reach, and no mount of its own at its path: it is not one to size.
    covered = [m.path for m in shared]
    writable: list[int] = []

    def private_tmpfs(point: str) -> list[str]:
        if not _inside(point, covered):
            writable.append(len(args))
        return ["--tmpfs", point]

    args += private_tmpfs("/dev/shm")
    args += [a for f in READ_ONLY_PROC for a in ("--ro-bind-try", f, f)]
    # the user's kernel keys are out of reach (seccomp), but /proc would still list their names
    # (a device: --ro-bind would mount it nodev, unreadable; /dev/null discards what is written)
    args += [a for f in MASKED_PROC if os.path.exists(f) for a in ("--dev-bind", "/dev/null", f)]
    args += [a for d in MASKED_PROC_DIRS if os.path.isdir(d) for a in ("--tmpfs", d)]
    if spec.tmp:
        args += private_tmpfs("/tmp")
    if spec.home_source is None:
        args += private_tmpfs(spec.home)  # an empty, private, throw-away home
    else:
        # the server's own directory, kept across starts: files on disk, not memory, so not sized
        _check_kept_home(spec, [*(m.path for m in shared), *spec.hidden], late)
        args += ["--bind", spec.home_source, spec.home]
    # verified copies of pinned executables go last, over whatever else is at their paths
    pinned = [
        Mount(p, MountMode.READ_ONLY, "pinned (sha256 verified)", copy) for p, copy in sorted(spec.pinned.items())
    ]
    for mount in shared:
        args += _bind(mount)
    hidden = [
        Mount(p, MountMode.HIDDEN, f"{why}: {'shown empty' if os.path.isdir(p) else '/dev/null in its place'}")
        for p, why in spec.hidden.items()
    ]
    # the outermost hidden paths are emptied; what is shared inside one (a server's own package
    # cache in Cellblock's) is shown again over it, and hidden paths inside that are emptied last
    outer = [h for h in spec.hidden if not _beneath(h, list(spec.hidden))]
    again = [m for m in shared if _beneath(m.path, outer)]
    inner = [h for h in spec.hidden if h not in outer and _beneath(h, [m.path for m in again])]
    args += [a for h in outer for a in _emptied(h)]
    args += [a for m in again for a in _bind(m)]
    args += [a for h in inner for a in _emptied(h)]
    for path in late:
        # a symlink under a grant is there already, and making one would write into the grant
        if not os.path.islink(path):
            args += ["--ro-bind", path, path]
        elif _inside(path, tmpfs) and not _inside(path, [g.path for g in grants]):
            args += ["--symlink", os.readlink(path), path]
    for mount in pinned:
        args += ["--ro-bind", mount.source or mount.path, mount.path]
    if spec.egress_socket is not None:
        args += ["--ro-bind", spec.egress_socket, EGRESS_SOCKET]
    if pin_filter is not None:
        args += ["--ro-bind-data", PIN_FILTER_FD, PIN_FILTER]
    cwd = spec.cwd or spec.home
    if spec.cwd is not None and not _inside(spec.cwd, [m.path for m in shared]):
        raise JailError(
            f"server '{spec.name}': its cwd {spec.cwd} is not shared with the jail; "
            "add it (or a parent) to jail.read_only or jail.read_write"
        )
    # what is written to a tmpfs is memory: only those in `writable` take writes, each sized within
    # the jail's memory limit (sandbox/limits.py); the rest, shown empty or with devices, are made
    # read-only once everything inside them is mounted
    emptied = [h for h in (*outer, *inner) if os.path.isdir(h)]  # (a file is shown as /dev/null)
    frozen = ["/dev", *(d for d in MASKED_PROC_DIRS if os.path.isdir(d)), *emptied]
    args += [a for path in frozen for a in ("--remount-ro", path)]
    args += ["--chdir", cwd, "--remount-ro", "/", "--", *spec.argv]

    private = [Mount("/dev/shm", MountMode.READ_WRITE, "private shared memory (tmpfs)")]
    if spec.home_source is None:
        private.append(Mount(spec.home, MountMode.READ_WRITE, "private empty home (tmpfs)"))
    else:
        kept = f"private home, its own, kept across restarts ({spec.home_source})"
        private.append(Mount(spec.home, MountMode.READ_WRITE, kept, spec.home_source))
    if spec.tmp:
        private.append(Mount("/tmp", MountMode.READ_WRITE, "private /tmp (tmpfs)"))
    private = [m for m in private if not _inside(m.path, covered)]  # a share shows itself there
    return LaunchPlan(
        argv=tuple(args),
        env={**spec.env, **(secrets or {})},
        cwd=None,
        # a launcher's file shown over a system one (an allowlist jail's resolv.conf) is listed alone
        mounts=tuple(
            [*(m for m in system if m.path not in {s.path for s in launchers}), *private, *shared, *hidden, *pinned]
        ),
        network=spec.network,
        seccomp=program,
        rules=rules if program is not None else (),
        pin_filter=pin_filter,
        tmpfs=tuple((at, args[at + 1]) for at in writable),
        backend="bwrap",
    )


def _check_kept_home(spec: JailSpec, points: Sequence[str], files: Sequence[str]) -> None:
    """No mount the jail makes inside a kept home (at `points`, or of the closure's `files`, which
    may be links the jail made there itself) passes through a link the server left there: bwrap
    would follow it, and a grant, or what hides Cellblock's own directories in one, would land
    elsewhere in the jail than its plan says.

    Raises:
        JailError: one does; the message names it and how to remove it.
    """
    for point in [*points, *files]:
        if spec.home_source is None or point == spec.home or not within(point, spec.home):
            continue
        parts = os.path.relpath(point, spec.home).split(os.sep)
        places = [os.path.join(spec.home_source, *parts[: n + 1]) for n in range(len(parts))]
        for place in places[:-1] if point in files else places:
            last = place == places[-1]
            if os.path.islink(place) or (not last and os.path.lexists(place) and not os.path.isdir(place)):
                raise JailError(
                    f"server '{spec.name}': {place} in its kept home is a link or a file where its jail mounts "
                    f"{point}; remove it (`rm {place}`) and start the server again"
                )


def _bind(mount: Mount) -> list[str]:
    return ["--ro-bind" if mount.mode is MountMode.READ_ONLY else "--bind", mount.source or mount.path, mount.path]


def _emptied(path: str) -> list[str]:
    return ["--tmpfs", path] if os.path.isdir(path) else ["--dev-bind", "/dev/null", path]


def _beneath(path: str, roots: Sequence[str]) -> bool:
    """Strictly inside one of `roots`."""
    return any(path != r and _inside(path, [r]) for r in roots)


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(within(path, r) for r in roots)
