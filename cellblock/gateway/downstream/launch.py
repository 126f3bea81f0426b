"""How a local downstream server is started: the one place where the jail is applied.

Every local server is launched from the plan this module returns: in a bubblewrap jail on Linux,
unless its config says `jail: false`. If the jail cannot be built the server does not start;
there is no fallback to running it unjailed. What the jail is (its command, environment,
wrappers and grants) is `downstream/jailspec.py`'s, what it hides `downstream/private.py`'s, and
what is said of it at the start `downstream/jailreport.py`'s.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS, StdioServerParameters

from cellblock.gateway.config.model import Config, JailConfig, LocalServer
from cellblock.gateway.config.secretrefs import SECRET_REF, fill
from cellblock.gateway.downstream.jailspec import JAIL_PATH, PASSED_ENV, jail_spec, server_command
from cellblock.gateway.downstream.packages import installed
from cellblock.gateway.state import RuntimeDirError, data_dir
from cellblock.policy.files import make_dirs
from cellblock.sandbox.backends import backend_plan, choose
from cellblock.sandbox.digests import verify_pins
from cellblock.sandbox.jailnet import in_netns, relay_names
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.limits import limit_plan
from cellblock.sandbox.marks import mark_plan
from cellblock.sandbox.seatbelt import seatbelt_executables, seatbelt_plan
from cellblock.sandbox.types import JailError, LaunchPlan, Limits, Mount, MountMode, Network

__all__ = ["kept_home", "launch_plan", "macos_cwd", "own_paths", "server_plan", "stdio_parameters"]

# Where in Cellblock's data directory each server's kept home is (`kept_home`).
HOMES = "homes"


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


def own_paths(config: Config, state: Path, source: Path | None, runtime: Path | None = None) -> tuple[Path, ...]:
    """Where this gateway keeps its own things besides Cellblock's usual directories (`jail_spec`'s
    `own`): the config file, the audit log, the state and runtime directories it was given."""
    return (*([source] if source else []), config.audit_file(state), state, *([runtime] if runtime else []))


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
        command = (server_command(server, installed(name, server), os.environ.get("PATH", JAIL_PATH)), *server.args)
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


# Jails planned at once, off the event loop: one per core. Planning reads and hashes files, so more
# threads than cores gain nothing, and sixteen servers starting together would otherwise each take
# a worker thread of their own, every one kept (its stack, its part of the C heap) for as long as
# the thread pool keeps idle threads.
PLANNED_AT_ONCE = os.cpu_count() or 2
_planning: RunVar[anyio.CapacityLimiter] = RunVar("cellblock_planning")


async def plan_off_loop(build: Callable[[], LaunchPlan]) -> LaunchPlan:
    """`build` (a `server_plan`) in a worker thread, at most `PLANNED_AT_ONCE` at a time in the
    event loop.

    Raises:
        JailError: see `server_plan`.
    """
    try:
        limiter = _planning.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(PLANNED_AT_ONCE)
        _planning.set(limiter)
    return await anyio.to_thread.run_sync(build, limiter=limiter)


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
