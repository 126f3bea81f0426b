"""What a local server's jail is: its command, environment, wrappers and grants (`jail_spec`).

The jail's spec is built here; what no server may see (hidden in it, refused as a grant) is
`downstream/private.py`'s, and how the spec becomes a plan to start is `downstream/launch.py`'s.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from cellblock.gateway.config.model import JailConfig, LocalServer
from cellblock.gateway.downstream.packages import Installed, installed
from cellblock.gateway.downstream.private import hidden_paths, private_paths, read_mounts, refuse_own_grants
from cellblock.policy.constraints import within
from cellblock.sandbox.bwrap import PIN_FILTER
from cellblock.sandbox.closure import exec_closure
from cellblock.sandbox.egress import relayed
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.launchers import launcher_gaps, launcher_mounts, resolve_command
from cellblock.sandbox.moved import sockets_within
from cellblock.sandbox.sockets import ABSTRACT_SCOPE_ABI, abstract_gap, abstract_scoped, bound_sockets
from cellblock.sandbox.types import Closure, JailError, JailSpec, Mount, MountMode, Network

__all__ = ["JAIL_PATH", "PASSED_ENV", "PIN", "jail_spec", "server_command"]

# PATH inside a jail: the launchers' own bin directories come first, then the system's.
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
PIN = Path(__file__).resolve().parents[2] / "sandbox" / "pin.py"
# Passed through from the gateway when set: locale only, never anything that can hold a secret.
PASSED_ENV = ("LANG", "LC_ALL", "TZ")


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
    mounts = read_mounts(name) if sys.platform.startswith("linux") else None  # macOS: no bind mounts to read
    private = private_paths(own, bound)
    refuse_own_grants(name, jail, private, mounts)
    home = os.path.expanduser("~")
    host_path = os.environ.get("PATH", JAIL_PATH)
    package = installed(name, server)
    command = server_command(server, package, host_path)
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
        hidden=hidden_paths([*jail.read_only, *jail.read_write, *(m.path for m in launchers)], moved | private, mounts),
        gaps=tuple(gaps),
    )
    return spec, launchers


def server_command(server: LocalServer, package: Installed | None, path: str) -> str:
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
