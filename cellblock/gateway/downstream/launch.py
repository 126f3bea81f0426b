"""How a local downstream server is started: the one place where the jail is applied.

Every local server is launched from the plan this module returns: in a bubblewrap jail on Linux,
unless its config says `jail: false`. If the jail cannot be built the server does not start;
there is no fallback to running it unjailed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS, StdioServerParameters
from platformdirs import user_cache_dir, user_cache_path

from cellblock.gateway.config.model import Config, JailConfig, LocalServer, ServerConfig
from cellblock.gateway.config.secretrefs import SECRET_REF, fill
from cellblock.gateway.downstream.packages import Installed, installed
from cellblock.gateway.state import RuntimeDirError, data_dir, default_config_path, own_dirs
from cellblock.policy.constraints import within
from cellblock.policy.files import make_dirs
from cellblock.sandbox.backends import backend_plan, choose
from cellblock.sandbox.bwrap import PIN_FILTER
from cellblock.sandbox.closure import exec_closure
from cellblock.sandbox.egress import relayed
from cellblock.sandbox.jailnet import in_netns, relay_names
from cellblock.sandbox.launchers import launcher_gaps, launcher_mounts, resolve_command
from cellblock.sandbox.limits import Confinement, describe, limit_plan
from cellblock.sandbox.marks import mark_plan
from cellblock.sandbox.mounts import MOUNTINFO, Mounts, named_again, shown_again
from cellblock.sandbox.moved import sockets_within
from cellblock.sandbox.pins import landlock_abi, verify_pins
from cellblock.sandbox.seatbelt import seatbelt_executables, seatbelt_plan
from cellblock.sandbox.sockets import (
    ABSTRACT_SCOPE_ABI,
    Bound,
    abstract_gap,
    abstract_scoped,
    bound_sockets,
    host_sockets,
)
from cellblock.sandbox.types import (
    Closure,
    JailError,
    JailSpec,
    LaunchPlan,
    LimitPlan,
    Limits,
    Mount,
    MountMode,
    Network,
)

__all__ = [
    "JAIL_PATH",
    "PACKAGE_CACHES",
    "granted_roots",
    "jail_spec",
    "kept_home",
    "launch_plan",
    "macos_cwd",
    "own_paths",
    "server_plan",
    "stdio_parameters",
    "tell_jail",
]

logger = logging.getLogger(__name__)

# PATH inside a jail: the launchers' own bin directories come first, then the system's.
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
PIN = Path(__file__).resolve().parents[2] / "sandbox" / "pin.py"
# Where in Cellblock's data directory each server's kept home is (`kept_home`).
HOMES = "homes"
# Passed through from the gateway when set: locale only, never anything that can hold a secret.
PASSED_ENV = ("LANG", "LC_ALL", "TZ")
# Where launchers keep the packages they fetch and the tools they install, under the home (besides
# the cache home): what servers run from, never a place for their work.
PACKAGE_CACHES = (
    *(".npm", ".bun", ".yarn", ".pnpm-store", ".local/share/pnpm", ".local/share/uv", ".cargo", ".rustup"),
    *(".local/pipx", ".local/lib", ".local/share/fnm", ".nvm", ".fnm", ".volta", ".asdf", ".pyenv", "go/pkg"),
    *(".m2", ".gradle"),
)


def jail_spec(
    name: str,
    server: LocalServer,
    jail: JailConfig,
    egress_socket: str | None = None,
    pinned: Mapping[str, str] | None = None,
    own: Sequence[Path] = (),
    jail_home: str | None = None,
    kept: str | None = None,
    landlock: bool = False,
) -> tuple[JailSpec, list[Mount]]:
    """The jail `server` asks for, and the launcher installations it needs shared.

    Cellblock's own directories and the paths in `own` (the config file, the audit log, the state
    and runtime directories it was given), the user's session directory, and every socket of the
    session and the machine (`sandbox/sockets.py`: the session bus, an ssh-agent's, X11's,
    Docker's, any socket bound to a path now) are hidden in the jail where a grant or an
    installation holds them: a server must not reach the control socket (and approve its own
    calls), an egress socket of another server, the keyring, the locks or the config, nor a
    program that acts with the user's rights. A grant of or inside them is refused, by their names
    and by any other a mount gives them, except one inside Cellblock's cache (where a server's own
    package cache goes), which is shown; so is a grant that is a socket. A listener whose file is
    not at the path it was bound to is found in the grants by its device and inode
    (`sandbox/moved.py`, within a deadline) and hidden too.

    Where the kernel allows it, every jail starts in a Landlock domain that keeps it from the
    host's abstract sockets (`sandbox/scope.py`): a `network: open` jail would reach them by name,
    any other through a socket made on the host's network and handed to it; on an older kernel a
    `network: open` jail's gap is in `gaps`.

    Wrappers run inside the jail, outermost first, each by the gateway's own interpreter: the
    scope launcher; with `network: allowlist` the egress relay (a loopback listener carrying each
    connection to the gateway's proxy at `egress_socket`); with `exec.allow` the pin launcher,
    which lets only the listed executables (and the server's own command) be executed or loaded,
    then starts the server (`sandbox/pin.py`). With `exec.allow` the jail shows only what those programs need
    instead of all of /usr (`sandbox/closure.py`).

    A Landlock jail (`landlock`) has no wrappers: its launcher applies Landlock itself
    (`sandbox/landlock.py`), and the gateway makes its connections to the egress proxy
    (`sandbox/connects.py`) in place of the relay.

    `jail_home` is the home the jail shows empty and tells the server of (default: the user's);
    a scan names its scratch home, where it planted decoys the jail must hide. `kept` is the
    server's own directory the jail shows at the user's home instead (`kept_home`).

    Raises:
        JailError: the command or an allowed executable cannot be found or lies in a writable grant
            unpinned, a grant lies inside Cellblock's own state, the mounts cannot be read, or the
            search of the grants for a moved socket did not end in time.
    """
    bound = bound_sockets()
    mounts = _mounts(name) if sys.platform.startswith("linux") else None  # macOS: no bind mounts to read
    private = _private_paths(own, bound)
    _refuse_own_grants(name, jail, private, mounts)
    home = os.path.expanduser("~")
    host_path = os.environ.get("PATH", JAIL_PATH)
    package = installed(name, server)
    command = _command(server, package, host_path)
    if package is None:
        launchers = launcher_mounts(command, home, host_path)
        bins = []
    else:
        # the tree whole, read-only, and what runs its programs (an npm package's node) beside it
        runtime = [os.path.dirname(package.record.runtime)] if package.record.runtime else []
        tree = package.record.tree
        found = launcher_mounts(command, home, ":".join([package.bin_dir, *runtime, host_path]))
        launchers = [Mount(tree, MountMode.READ_ONLY, package.why), *(m for m in found if not within(m.path, tree))]
        bins = [package.bin_dir, *runtime]
    bins += [os.path.join(m.path, "bin") for m in launchers if os.path.isdir(os.path.join(m.path, "bin"))]
    env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
    env |= {"PATH": ":".join([*bins, JAIL_PATH]), "HOME": jail_home or home, "TMPDIR": "/tmp"}
    env |= server.env
    argv: tuple[str, ...] = (command, *server.args)
    # the wrappers are stdlib-only scripts, run by the base interpreter isolated from site and home
    python = os.path.realpath(sys.executable)
    closure: Closure | None = None
    # the server's own command is always allowed when anything is
    allowed = [command, *(resolve_command(p, host_path) for p in jail.exec.allow)] if jail.exec.allow else []
    _refuse_writable_programs(name, allowed, jail)
    if allowed and sys.platform.startswith("linux") and not landlock:  # macOS: the profile itself limits exec
        # what the server may run, and what the launcher's own interpreter needs: both are shown,
        # only the first stays executable (the launcher remounts the rest noexec before it starts it)
        installs = [m.path for m in launchers if os.path.isdir(m.path)]
        runs, helper = exec_closure(allowed, env["PATH"], installs), exec_closure([python], env["PATH"])
        keep = [*runs.files, *runs.directories, *(m.path for m in launchers), *(pinned or {})]
        closure = Closure(
            tuple(dict.fromkeys([*runs.files, *helper.files])),
            runs.executables,
            tuple(dict.fromkeys([*runs.directories, *helper.directories])),
        )
        pinning = launcher_mounts(python, home, host_path, role="the gateway's Python, which runs the exec pin")
        launchers += [*pinning, Mount(str(PIN), MountMode.READ_ONLY, "exec pinning")]
        options = [*(w for p in runs.executables for w in ("--allow", p)), *(w for p in keep for w in ("--exec", p))]
        argv = (python, "-I", "-S", str(PIN), *options, "--seccomp", PIN_FILTER, "--", *argv)
    gaps = launcher_gaps(command, env["PATH"], [m.path for m in launchers])
    if jail.proxied:
        env["NODE_USE_ENV_PROXY"] = "1"  # Node 24's fetch uses the proxy variables only when asked
    if landlock:
        closure = exec_closure(allowed, env["PATH"], [m.path for m in launchers]) if allowed else None
    elif jail.proxied:
        argv, relaying = relayed(argv, python, home, host_path, jail.allow_hosts, ask=jail.network == "ask")
        launchers += relaying
    if sys.platform.startswith("linux") and not landlock:  # macOS has no abstract sockets
        # every jail, not only one on the host's network: the reach goes with the socket, and a
        # socket made on the host's network (by a network: open jail) can be handed to any jail
        abi = landlock_abi()
        if abi >= ABSTRACT_SCOPE_ABI:
            argv, scoping = abstract_scoped(argv, python, home, host_path)
            launchers += scoping
        elif jail.network == "open":
            gaps.append(abstract_gap(name, abi))
    # a listener whose file is not where it was bound (a server may rename a directory on its way)
    moved = {s.path: s.why for s in sockets_within(name, [*jail.read_only, *jail.read_write], bound, mounts)}
    spec = JailSpec(
        name=name,
        argv=argv,
        env=env,
        cwd=server.cwd,
        read_only=tuple(jail.read_only),
        read_write=tuple(jail.read_write),
        network=Network(jail.network),
        allow_hosts=tuple(jail.allow_hosts),
        tmp=jail.tmp,
        home=jail_home or home,
        home_source=kept if jail_home is None else None,
        exec_allow=tuple(allowed),
        exec_sha256=dict(jail.exec.sha256),
        egress_socket=egress_socket,
        pinned=dict(pinned or {}),
        exec_closure=closure,
        hidden=_hidden([*jail.read_only, *jail.read_write, *(m.path for m in launchers)], moved | private, mounts),
        gaps=tuple(gaps),
    )
    return spec, launchers


def _command(server: LocalServer, package: Installed | None, path: str) -> str:
    """The absolute path of what `server` runs: its installed package's program, else its command."""
    if package is not None:
        return package.program
    if server.command is None:  # the config allows none only with install:
        raise JailError("a local server needs a command")
    return resolve_command(server.command, path)


def _refuse_writable_programs(name: str, allowed: Sequence[str], jail: JailConfig) -> None:
    """An allowed program that a writable grant holds is not pinned: this server (or another one
    with the same grant) could replace it before its next start. Unless its bytes are pinned."""
    pinned = {os.path.realpath(p) for p in jail.exec.sha256}
    for program in allowed:
        real = os.path.realpath(program)
        grant = next((g for g in jail.read_write if within(real, os.path.realpath(g))), None)
        if grant is not None and real not in pinned:
            raise JailError(
                f"server '{name}': exec.allow program {program} is inside the read_write grant {grant}, where "
                "a server can replace what this one may run; pin its bytes with jail.exec.sha256, or move "
                f"it out of {grant}"
            )


def own_paths(config: Config, state: Path, source: Path | None, runtime: Path | None = None) -> tuple[Path, ...]:
    """Where this gateway keeps its own things besides Cellblock's usual directories (`jail_spec`'s
    `own`): the config file, the audit log, the state and runtime directories it was given."""
    return (*([source] if source else []), config.audit_file(state), state, *([runtime] if runtime else []))


def _private_paths(own: Sequence[Path], bound: Bound) -> dict[str, str]:
    """What no server may see, each with what it is: Cellblock's own directories and files (of its
    cache, only what a server is granted: its own package cache), the user's session directory and
    the sockets of the session and the machine (`sandbox/sockets.py`; `bound`: those bound to a
    path now), all as real paths."""
    mine = "Cellblock's own (its config, state, cache, data, sockets or audit log)"
    private = [(str(p), mine) for p in [*own_dirs(), default_config_path(), *own]]
    private += [(s.path, s.why) for s in host_sockets(bound=bound)]
    found: dict[str, str] = {}
    for path, why in private:
        found.setdefault(os.path.realpath(path), why)
    return found


def _mounts(name: str) -> Mounts:
    """The mounts of the gateway's namespace, read once for a jail.

    Raises:
        JailError: they cannot be read, so where a mount shows a hidden path again is not known.
    """
    try:
        return Mounts.read()
    except OSError as exc:
        raise JailError(
            f"server '{name}': the mounts that could show what its jail hides under another name cannot be "
            f"read ({exc.strerror}: {MOUNTINFO}); nothing was started"
        ) from exc


def _refuse_own_grants(name: str, jail: JailConfig, private: Mapping[str, str], mounts: Mounts | None) -> None:
    """A grant of what `_hidden` would hide (a jail shows a grant whole) is refused, not emptied,
    by its own name or by another one a mount gives it (`mounts`); so is a grant that is a socket,
    whatever listens on it."""
    cache = os.path.realpath(user_cache_path("cellblock"))
    others = [p for p in private if p != cache]
    for key, paths in (("read_only", jail.read_only), ("read_write", jail.read_write)):
        for path in paths:
            real = os.path.realpath(path)
            place = mounts.where(real) if mounts is not None else None
            if real == cache or (place is not None and mounts is not None and place == mounts.where(cache)):
                named = "" if real == cache else f" under another name ({cache})"
                raise JailError(
                    f"server '{name}': jail.{key} path {path} is Cellblock's cache{named}, which holds every "
                    "server's package cache; grant the server's own directory inside it"
                )
            held = next((p for p in others if within(real, p)), None)
            where = held if real == held else f"inside {held}"
            if held is None and mounts is not None and (held := named_again(real, others, mounts)) is not None:
                inside = "" if place == mounts.where(held) else "inside "
                where = f"{inside}{held} under another name"  # a bind mount shows the one place at both
            if held is None and _is_socket(real):
                held = where = real
            if held is not None:
                why = private.get(held, "a Unix socket, a way into the program that listens on it")
                fix = "grant another directory" if os.path.isdir(held) else f"remove it from jail.{key}"
                raise JailError(
                    f"server '{name}': jail.{key} path {path} is {where}: {why}, which Cellblock keeps from "
                    f"every server; {fix}"
                )


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _hidden(shared: Sequence[str], private: Mapping[str, str], mounts: Mounts | None) -> dict[str, str]:
    """Where, in the jail, the shared directories show what no server may see, with what it is:
    each such path at the place the jail shows it, which for a grant given through a symlink is not
    its real path, and with `mounts` (Linux) at each place a mount shows it under another name (a
    grant that is a bind mount of a directory on its way, or holds one: `sandbox/mounts.py`)."""
    found = {p: why for p, why in private.items() if os.path.lexists(p)}
    hidden: dict[str, str] = {}
    for path in shared:
        real = os.path.realpath(path)
        for p, why in found.items():
            if within(p, real):
                hidden.setdefault(os.path.normpath(os.path.join(path, os.path.relpath(p, real))), why)
    if mounts is not None:
        for place, p in shown_again(shared, found, mounts).items():
            hidden.setdefault(place, f"{found[p]}, shown here by a mount as {p}")
    return dict(sorted(hidden.items()))


def kept_home(name: str, server: LocalServer, make: bool = True) -> str | None:
    """The directory `name`'s jail shows as its home, kept across its starts: its own under
    Cellblock's data directory (`homes/NAME`, 0700, made when `make`), which no other jail is shown
    (it is Cellblock's own, hidden in every grant). None for `jail.home: throwaway`, a jail-less
    server and macOS (whose jail keeps the home from every server: docs/jail.md).

    Raises:
        RuntimeDirError: the data directory cannot be used.
        OSError: the directory cannot be made.
    """
    if server.jail is False or server.jail.home == "throwaway" or not sys.platform.startswith("linux"):
        return None
    path = data_dir() / HOMES / name
    if make:
        make_dirs(path)
    return str(path)


def granted_roots(server: LocalServer) -> list[str]:
    """The directories a server is told it may work in when it asks for roots: what its jail was
    granted (`read_only`, `read_write`), minus every grant that is not the user's work — one inside
    a package cache or a directory of Cellblock's own, or one holding the server's own code (its
    command's installation, a script its arguments name) — so it never offers the model a way to
    change the code it runs or Cellblock's state."""
    if server.jail is False:
        return []
    home = os.path.expanduser("~")
    caches = [user_cache_dir(), *(os.path.join(home, c) for c in PACKAGE_CACHES)]
    not_work = [os.path.realpath(p) for p in [*map(str, own_dirs()), *caches]]
    # what the command line names: a script, `--require=FILE`, relative to the server's cwd
    named = [part for arg in [server.command or "", *server.args] for part in (arg, arg.partition("=")[2]) if part]
    cwd = server.cwd or os.getcwd()
    code = [os.path.realpath(os.path.join(cwd, a)) for a in named if os.path.isfile(os.path.join(cwd, a))]
    # (an installed package's tree is in Cellblock's data directory, which is no one's work)
    with contextlib.suppress(JailError):  # a command that cannot be found holds no grant either
        command = _command(server, None, os.environ.get("PATH", JAIL_PATH)) if server.install is None else ""
        mounts = launcher_mounts(command, home, os.environ.get("PATH", JAIL_PATH)) if command else []
        code += [os.path.realpath(m.path) for m in mounts]
    roots = []
    for path in sorted({*server.jail.read_only, *server.jail.read_write}):
        real = os.path.realpath(path)
        if not any(within(real, other) for other in not_work) and not any(within(c, real) for c in code):
            roots.append(path)
    return roots


def launch_plan(
    name: str,
    server: LocalServer,
    egress_socket: str | None = None,
    private: Path | None = None,
    secrets: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    own: Sequence[Path] = (),
    jail_home: str | None = None,
    kept: str | None = None,
) -> LaunchPlan:
    """How to start `server`: jailed per its config, or plainly when it says `jail: false`.

    `private` is a directory only the gateway uses for this server (verified copies of pinned
    executables; the private temp dir on macOS). `secrets` are the values of its `secrets:`
    variables, read from the keyring; they go into the environment, and into the arguments that
    name them (`${secrets.NAME}`, config/secretrefs.py): a server that takes its key on the
    command line shows it there, as any such program does.
    `limits` (`Config.limits_of`) bound what a Linux jail may take; macOS has none yet.
    `jail_home`, `kept`: see `jail_spec` (Linux only).

    Raises:
        JailError: the jail cannot be built here (no bwrap, no user namespaces, a missing path,
            a feature this OS has no jail for).
    """
    if secrets and any(SECRET_REF.search(arg) for arg in server.args):
        # filled here and no earlier: what a config or a message shows keeps the reference
        server = server.model_copy(update={"args": fill(server.args, secrets)})
    if server.jail is False:
        env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ} | server.env | dict(secrets or {})
        command = (_command(server, installed(name, server), os.environ.get("PATH", JAIL_PATH)), *server.args)
        # no jail, but a mark on all it runs: no control socket takes its processes for the user's
        plain = LaunchPlan(argv=command, env=env, cwd=server.cwd, mounts=(), network=Network.OPEN, backend="none")
        return mark_plan(plain, name)
    jail = server.jail
    if jail.proxied and egress_socket is None:
        raise JailError(
            f"server '{name}': network: {jail.network} needs the gateway's egress proxy, which is not running"
        )
    if sys.platform == "darwin":
        plan = _macos_plan(name, server, jail, private, own)
        return replace(plan, env={**plan.env, **(secrets or {})})
    if not sys.platform.startswith("linux"):
        raise JailError(
            f"server '{name}': Cellblock has no jail for {sys.platform}; set 'jail: false' to run it unjailed "
            "(it then runs as you, with your files and network)"
        )
    if jail.exec.allow and landlock_abi() < 1:
        raise JailError(
            f"server '{name}': jail.exec.allow needs Landlock, which this kernel lacks or has disabled "
            "(Linux 5.13 or newer, with 'landlock' in the lsm= boot list); remove exec.allow to run it without"
        )
    pinned: dict[str, str] = {}
    if jail.exec.sha256:
        if private is None:
            raise JailError(f"server '{name}': jail.exec.sha256 needs a private directory for verified copies")
        pinned = verify_pins(name, jail.exec.sha256, private / "pinned")
    choice = choose(name, jail.backend or "auto")
    landlock = choice.backend == "landlock"
    spec, launchers = jail_spec(name, server, jail, egress_socket, pinned, own, jail_home, kept, landlock)
    plan = backend_plan(spec, launchers, choice, str(private) if private else None, secrets, DEFAULT_INHERITED_ENV_VARS)
    plan = plan if limits is None else limit_plan(plan, name, limits)
    if choice.bwrap and (jail.network == "ask" or (jail.proxied and relay_names(jail.allow_hosts)[1])):
        # the relay answers DNS on port 53, and takes :80, :443 and the listed ports
        plan = in_netns(plan, choice.bwrap)
    return plan


def server_plan(
    name: str,
    server: LocalServer,
    egress_socket: str | None,
    private: Path | None,
    secrets: Mapping[str, str] | None,
    limits: Limits | None,
    own: Sequence[Path] = (),
) -> LaunchPlan:
    """`launch_plan` for a server's own run (not a probe's or a scan's): its jail shows its kept home
    (`kept_home`, made now unless `jail.home: throwaway`).

    Raises:
        JailError: see `launch_plan`; or the kept home cannot be made.
    """
    try:
        kept = kept_home(name, server)
    except (OSError, RuntimeDirError) as exc:
        raise JailError(
            f"server '{name}': its kept home in Cellblock's data directory cannot be made ({exc}); "
            "fix that directory, or set jail.home: throwaway"
        ) from exc
    return launch_plan(name, server, egress_socket, private, secrets, limits, own, kept=kept)


def _macos_plan(
    name: str, server: LocalServer, jail: JailConfig, private: Path | None, own: Sequence[Path]
) -> LaunchPlan:
    """sandbox-exec with a generated profile. Not yet run on a Mac: see docs/jail.md."""
    if jail.proxied:
        raise JailError(f"server '{name}': network: {jail.network} is not available on macOS yet; use none or open")
    if jail.exec.sha256:
        raise JailError(f"server '{name}': jail.exec.sha256 is not available on macOS yet")
    spec, launchers = jail_spec(name, server, jail, own=own)
    # Seatbelt judges the file a path resolves to: each program with its links, interpreters and sh
    spec = replace(spec, exec_allow=seatbelt_executables(spec.exec_allow, spec.env["PATH"]))
    tmp = None
    if jail.tmp:
        if private is None:
            raise JailError(f"server '{name}': a private /tmp needs a private directory")
        make_dirs(private / "tmp")
        tmp = str(private / "tmp")
        spec = replace(spec, env={**spec.env, "TMPDIR": tmp})
    spec = replace(spec, cwd=spec.cwd or macos_cwd(jail, tmp))
    grants = [Mount(p, MountMode.READ_ONLY, "read_only") for p in jail.read_only]
    grants += [Mount(p, MountMode.READ_WRITE, "read_write") for p in jail.read_write]
    return seatbelt_plan(spec, [*launchers, *grants], tmp_dir=tmp)


def macos_cwd(jail: JailConfig, tmp: str | None) -> str:
    """Where a server without `cwd` starts on macOS: a directory its profile lets it read, never the
    gateway's own (often the home, which the profile hides: npm then fails in `uv_cwd` with EPERM).
    Its private temp dir, else its first granted directory (writable first), else `/`."""
    granted = [p for p in [*jail.read_write, *jail.read_only] if os.path.isdir(p)]
    return tmp or next(iter(granted), "/")


def stdio_parameters(plan: LaunchPlan) -> StdioServerParameters:
    """The SDK's spawn parameters for a plan."""
    return StdioServerParameters(
        command=plan.argv[0], args=list(plan.argv[1:]), env=dict(plan.env), cwd=Path(plan.cwd) if plan.cwd else None
    )


def tell_jail(name: str, plan: LaunchPlan) -> None:
    """Say, at a server's first start, what its jail keeps from it though its grants hold it (as a
    warning: the grant is wider than it works), what it cannot close here, and how its limits are
    enforced."""
    hidden = [f"{m.path} ({m.why})" for m in plan.mounts if m.mode is MountMode.HIDDEN]
    if hidden:
        logger.warning("server '%s': its jail keeps from it what its grants hold: %s", name, "; ".join(hidden))
    if plan.network is Network.OPEN and plan.seccomp is not None and landlock_abi() < ABSTRACT_SCOPE_ABI:
        logger.warning("%s", abstract_gap(name, landlock_abi()))
    if plan.backend == "landlock":
        lacks = "; ".join(plan.gaps) or "nothing bubblewrap does"
        logger.warning(
            "server '%s': its jail is Landlock's (ABI %d), which does not enforce here: %s", name, landlock_abi(), lacks
        )
    if plan.limits is not None:
        _tell_limits(name, plan.limits)


def jail_fields(config: ServerConfig, plan: LaunchPlan | None, confined: Confinement | None) -> dict[str, Any]:
    """What the `server_ready` audit event says of a server's jail: its network (or `off`,
    `remote`), the backend that built it, a Landlock jail's ABI and what it does not enforce
    here, and how its limits are enforced."""
    jail = getattr(config, "jail", None)
    fields: dict[str, Any] = {"jail": "remote" if jail is None else "off" if jail is False else jail.network}
    if jail and plan is not None:
        fields["backend"] = plan.backend
        if plan.backend == "landlock":
            fields |= {"landlock_abi": landlock_abi(), "not_enforced": list(plan.gaps)}
    if confined is not None:
        fields["limits"] = describe(confined.plan)
    return fields


def jail_line(fields: dict[str, Any]) -> str:
    """The jail of `jail_fields` in a few words, for the line that says a server is ready."""
    if fields["jail"] in ("off", "remote"):
        return "unjailed" if fields["jail"] == "off" else "remote"
    abi = f" ABI {fields['landlock_abi']}" if "landlock_abi" in fields else ""
    return f"jail {fields.get('backend', '?')}{abi}, network {fields['jail']}"


def _tell_limits(name: str, limits: LimitPlan) -> None:
    """Say how a server's jail limits are enforced here, as a warning where not for the jail as a whole."""
    how = limits.enforcement
    weak = [f"{key} {m.how}" for key, m in (("processes:", how.processes), ("memory:", how.memory)) if not m.whole]
    if weak:
        logger.warning("server '%s': its jail's limits are not all enforced as a whole: %s", name, "; ".join(weak))
    logger.info("server '%s': limits: %s", name, describe(limits))
