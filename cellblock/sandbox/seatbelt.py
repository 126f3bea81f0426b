"""macOS jail: a `JailSpec` as a Seatbelt (SBPL) profile, run by `sandbox-exec -p PROFILE -D NAME=PATH... argv...`.

Pure text generation, so it is built and golden-tested on any OS (`tests/sandbox/golden/*.sb`).
No path from the config or the host enters the profile's text: each is a parameter,
`(param "MOUNT_0")`, whose value `sandbox-exec -D MOUNT_0=/path` passes (as codex does with its
writable roots). Only this module's constants are written as string literals.

The profile starts from `(deny default)` and adds, in this order:

1. process basics (fork, signals and process info within the same sandbox, a list of sysctls,
   POSIX semaphores) and a short list of Mach services;
2. the system roots, read-only, plus a few files under `/private/etc` and `/dev`;
3. the caller's mounts that lie outside the protected trees (below);
4. a deny on the protected trees: the user's home, `/private/tmp`, `/private/var/folders` and
   `/System/Volumes` (where the Data volume shows the home again);
5. what dyld needs of `/System/Volumes`, the mounts inside a protected tree, the private temp dir
   and `exec.allow`;
5b. a deny on what the spec hides (Cellblock's own files, the user's session and the machine's
    sockets, where a mount holds them), then the mounts inside those again;
6. metadata (stat, not listing) of every ancestor directory of what is shared, so realpath works;
7. the network rule.

Seatbelt lets the last matching rule win, so step 4 hides the protected trees even from a mount
of `/` or `/Users`, and step 5 shares back exactly what was asked for inside them.
"""

from __future__ import annotations

import os
import posixpath
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cellblock.policy.constraints import within
from cellblock.sandbox.closure import exec_closure
from cellblock.sandbox.types import JailError, JailSpec, LaunchPlan, Mount, MountMode, Network

__all__ = ["SANDBOX_EXEC", "seatbelt_compile", "seatbelt_executables", "seatbelt_plan"]

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

# /tmp, /var and /etc are symlinks into /private, and Seatbelt matches the resolved path: a rule on
# "/tmp/x" would never match anything. Every path is therefore written in its /private form.
_SYMLINKED_ROOTS = ("/tmp", "/var", "/etc")

# Readable, executable and mappable (dyld loads libraries from here). Deliberately not /Users,
# /Applications, /opt or /private: launchers outside these roots arrive as the caller's mounts.
_SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/System", "/Library")

# /System covers /System/Volumes/Data, the Data volume, where the whole home shows again at
# /System/Volumes/Data/Users/NAME: it is denied with the home (agent-sandbox.nix denies it and keeps
# a pentest for it). The OS cryptex, where macOS 13 and later keep dyld's shared cache, is shared
# back, read-only: no peer read here does so (agent-sandbox.nix denies /System/Volumes whole), so
# whether dyld needs it under sandbox-exec is unverified; it holds only Apple's signed system files.
_SYSTEM_VOLUMES = "/System/Volumes"
_CRYPTEXES = "/System/Volumes/Preboot/Cryptexes"

# Homebrew on Apple silicon lives outside /usr: a venv on Homebrew's Python maps libssl from another
# keg through /opt/homebrew/opt/openssl@3. Shared read-only, never executable, when anything shared
# lies under /opt/homebrew, as agent-sandbox.nix shares the whole Nix store read-only for the same
# reason. Intel's /usr/local is under /usr already.
_HOMEBREW = "/opt/homebrew"
_HOMEBREW_LIBS = ("/opt/homebrew/Cellar", "/opt/homebrew/opt")

# Read-only files and data a CLI program needs; nothing here is executable.
_SYSTEM_DATA: tuple[tuple[str, bool], ...] = (  # (path, is_dir)
    ("/private/etc/hosts", False),
    ("/private/etc/localtime", False),  # a symlink into /private/var/db/timezone
    ("/private/etc/protocols", False),
    ("/private/etc/services", False),
    ("/private/etc/ssl", True),  # OpenSSL's CA bundle
    ("/private/var/db/timezone", True),
    ("/private/var/select/sh", False),  # which shell /bin/sh runs (agent-sandbox.nix reads it too)
    ("/dev/null", False),
    ("/dev/zero", False),  # mmap of anonymous memory by older code (agent-sandbox.nix allows it too)
    ("/dev/random", False),
    ("/dev/urandom", False),
    # Usable only with a controlling terminal, which a downstream started in a new session has not.
    ("/dev/tty", False),
)

# The only Mach services a CLI program is allowed to look up: user and group lookups (getpwuid,
# getgrgid; codex, agent-sandbox.nix) and syslog(3). Not notification_center: notify(3) is a channel
# between every process that may post to it, and libc works without it (codex leaves it out).
_MACH_SERVICES = ("com.apple.system.opendirectoryd.libinfo", "com.apple.system.logger")
# With any network: certificate checks of Security.framework users (Go, curl, Swift), which TLS
# needs through the egress proxy too, and DNS settings (codex's network policy has the same four).
# trustd may fetch a certificate's issuer or OCSP URL for the server, outside the egress proxy
# (hlyn measured it and refuses trustd in its proxy mode): a residual of network: allowlist.
_MACH_SERVICES_NETWORK = (
    "com.apple.SecurityServer",
    "com.apple.trustd.agent",
    "com.apple.ocspd",
    "com.apple.SystemConfiguration.DNSConfiguration",
)
# Read with any network: the Security framework's keychain schema, without which certificate checks
# fail with errSecInternalComponent (agent-sandbox.nix reads it for that reason).
_NETWORK_DATA = ("/private/etc/resolv.conf", "/private/var/run/resolv.conf", "/private/var/db/mds")
# The one Unix socket a server with an open network reaches: the DNS resolver's (agent-sandbox.nix
# and hlyn allow exactly this one besides what their config names).
_RESOLVER_SOCKET = "/private/var/run/mDNSResponder"

# The sysctls a runtime reads at start (CPU count and features, page size, OS version): codex's
# list, less what no server needs. Never kern.procargs2 (any process's argv and environment, where
# a sibling server's secrets are) nor kern.proc.* (every process's name and owner), which
# agent-sandbox.nix denies for the same reason.
_SYSCTL_NAMES = (
    *("hw.activecpu", "hw.byteorder", "hw.cachelinesize", "hw.cpufamily", "hw.cputype", "hw.l1dcachesize"),
    *("hw.l1icachesize", "hw.l2cachesize", "hw.l3cachesize", "hw.logicalcpu", "hw.logicalcpu_max"),
    *("hw.machine", "hw.memsize", "hw.model", "hw.ncpu", "hw.nperflevels", "hw.pagesize", "hw.pagesize_compat"),
    *(
        "hw.cpufrequency",
        "hw.physicalcpu",
        "hw.physicalcpu_max",
        "hw.tbfrequency",
        "hw.vectorunit",
        "machdep.cpu.brand_string",
    ),
    *("kern.argmax", "kern.boottime", "kern.hostname", "kern.maxfiles", "kern.maxfilesperproc", "kern.maxproc"),
    *("kern.osproductversion", "kern.osrelease", "kern.ostype", "kern.osvariant_status", "kern.osversion"),
    *("kern.secure_kernel", "kern.usrstack64", "kern.version", "sysctl.proc_cputype", "vm.loadavg"),
)
_SYSCTL_PREFIXES = ("hw.optional.", "hw.perflevel", "machdep.cpu.")

# Shared trees that are never visible unless a mount, the private temp dir or exec.allow lies inside.
_SHARED_TEMP_TREES = ("/private/tmp", "/private/var/folders")

_READ = ("file-read*", "file-map-executable")
_WRITE = ("file-write*",)
_EXEC = ("process-exec*",)  # the star covers process-exec-interpreter, i.e. #! scripts
_DENIED = ("file-read*", "file-write*", "file-map-executable", "process-exec*")
# What `/bin/sh` is on macOS: a launcher that runs the shell /private/var/select/sh names.
_SH = "/bin/sh"
_SH_CHOICE = "/private/var/select/sh"


class _Params:
    """The profile's parameters: one name per host path, in the order they are first used."""

    def __init__(self, constants: Iterable[str]) -> None:
        self.constants = set(constants)
        self.values: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._counts: dict[str, int] = {}

    def ref(self, path: str, role: str) -> str:
        """`path` as an SBPL expression: a literal for this module's constants, else a parameter."""
        if path in self.constants:
            return _string(path)
        name = self._names.get(path)
        if name is None:
            count = self._counts.get(role, 0)
            self._counts[role] = count + 1
            name = f"{role}_{count}"
            self._names[path] = name
            self.values[name] = path
        return f"(param {_string(name)})"


@dataclass(frozen=True, slots=True)
class _Target:
    """One path in the profile: already resolved to its /private form and validated."""

    path: str
    is_dir: bool
    role: str = "SYSTEM"

    def sbpl(self, params: _Params) -> str:
        return f"({'subpath' if self.is_dir else 'literal'} {params.ref(self.path, self.role)})"


def seatbelt_compile(
    spec: JailSpec,
    mounts: Sequence[Mount],
    *,
    proxy_port: int | None = None,
    tmp_dir: str | None = None,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> tuple[str, dict[str, str]]:
    """Return the SBPL profile that jails `spec`, for `sandbox-exec -p`, and its parameters, for `-D`.

    `mounts` are every host path the jail shares (system paths, launcher installs and the user's
    `read_only`/`read_write` grants), computed by the caller; they are shared at their own path
    and should cover `spec.cwd`. `tmp_dir` is the server's private temp dir, created (and later
    removed) by the caller, who also points `TMPDIR` in `spec.env` at it; it is required exactly
    when `spec.tmp` is set. `proxy_port` is the egress proxy's TCP port on localhost, required for
    `network: allowlist` and ignored otherwise. `is_dir` decides `subpath` (a tree) or `literal`
    (one file) for mounts and `exec.allow` entries; tests pass a fake. `spec.exec_allow` is used
    as given: `seatbelt_executables` resolves it.

    Raises:
        JailError: a path cannot be passed safely (relative, `.`/`..`, a NUL), `tmp_dir` and
            `spec.tmp` disagree, the allowlist has no proxy port, or `exec.allow` does not permit
            the server's own command.
    """
    if not spec.argv:
        raise JailError(f"server '{spec.name}' has no command to run; set its command in the config")
    home = _resolve(spec.home, "home")
    protected = (home, *_SHARED_TEMP_TREES, _SYSTEM_VOLUMES)
    tmp = _tmp_target(spec, tmp_dir, protected)
    execs = _exec_targets(spec, is_dir)
    exec_anything = not execs

    exec_ops = _EXEC if exec_anything else ()
    read_exec = _READ + exec_ops
    system = [_Target(p, True) for p in _SYSTEM_ROOTS]
    data = [_Target(p, d) for p, d in _SYSTEM_DATA]
    constant = [*system, *data, *(_Target(p, True) for p in (*_SHARED_TEMP_TREES, _CRYPTEXES, *_HOMEBREW_LIBS))]
    params = _Params([*_ancestors(constant), *(t.path for t in constant), _RESOLVER_SOCKET, *_NETWORK_DATA])
    params.ref(home, "HOME")
    outside: list[str] = []
    inside: list[str] = [_rule("allow", read_exec, [_Target(_CRYPTEXES, True)], params)]
    shared: list[_Target] = []
    hidden = [_Target(_resolve(p, "hidden"), is_dir(p), "HIDDEN") for p in spec.hidden]
    again: list[str] = []
    for target, mode in _merge(mounts, is_dir):
        ops = _READ + (_WRITE if mode is MountMode.READ_WRITE else ()) + exec_ops
        rule = _rule("allow", ops, [target], params)
        (inside if _within_any(target.path, protected) else outside).append(rule)
        if any(within(target.path, h.path) and target.path != h.path for h in hidden):
            again.append(rule)
        shared.append(target)
    if tmp is not None:
        inside.append(_rule("allow", _READ + _WRITE + exec_ops, [tmp], params))
        shared.append(tmp)
    for target in execs:
        inside.append(_rule("allow", _READ + _EXEC, [target], params))
        shared.append(target)
    brew = [_Target(p, True) for p in _HOMEBREW_LIBS] if any(within(t.path, _HOMEBREW) for t in shared) else []
    services = _MACH_SERVICES + (_MACH_SERVICES_NETWORK if spec.network is not Network.NONE else ())

    lines = [
        "(version 1)",
        "(deny default)",
        "",
        ";; Processes: start children; signal and inspect only this jail's processes (a server ends its",
        ";; own children on a timeout), as codex does; POSIX semaphores for Python's multiprocessing",
        ";; (codex). No POSIX shared memory but the notification center's read-only page (hlyn's).",
        "(allow process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow process-info* (target same-sandbox))",
        "(allow ipc-posix-sem)",
        '(allow ipc-posix-shm-read-data (ipc-posix-name "apple.shm.notification_center"))',
        "",
        ";; Kernel settings runtimes read at start (codex's list); never kern.procargs2 or kern.proc.*",
        ";; (agent-sandbox.nix denies those too).",
        _rule("allow", ("sysctl-read",), _sysctl_filters(), params),
        "",
        ";; Mach services: user/group lookups, syslog(3); with a network, TLS trust and DNS settings.",
        _rule("allow", ("mach-lookup",), [f"(global-name {_string(s)})" for s in services], params),
        "",
        ";; The root directory itself: a new process reads it at start and dyld aborts without it",
        ";; (agent-sandbox.nix and hlyn allow it). What lies under it is ruled on below.",
        '(allow file-read* (literal "/"))',
        "",
        ";; System roots, read-only." + ("" if exec_anything else " Executables only from exec.allow, below."),
        _rule("allow", read_exec, system, params),
        _rule("allow", ("file-read*",), data, params),
        ";; /dev/null, and /dev/fd: the descriptors a process already holds (agent-sandbox.nix).",
        _rule("allow", ("file-write-data",), ['(literal "/dev/null")'], params),
        '(allow file-read-data file-write-data (subpath "/dev/fd"))',
        *(
            [
                ";; Homebrew's kegs and their opt links: libraries one keg maps from another.",
                _rule("allow", _READ, brew, params),
            ]
            if brew
            else []
        ),
        "",
        ";; Shared paths outside the home and temp trees.",
        *(outside or [";; (none)"]),
        "",
        ";; The home, the shared temp trees and the Data volume stay hidden, even under a mount of an ancestor.",
        _rule("deny", _DENIED, [_Target(p, True, "HOME") for p in protected], params),
        "",
        ";; Shared back inside them: dyld's cryptex, mounts, the private temp dir and exec.allow.",
        *inside,
        "",
        *_hiding(hidden, again, params),
        ";; Metadata (not listing) of every ancestor directory, so realpath() and getcwd() work.",
        _rule(
            "allow",
            ("file-read-metadata",),
            [_Target(p, False, "DIR") for p in _ancestors(system, data, shared)],
            params,
        ),
        "",
        *_network_rules(spec.network, proxy_port),
    ]
    return "\n".join(lines) + "\n", params.values


def seatbelt_executables(allowed: Sequence[str], path: str) -> tuple[str, ...]:
    """What `exec.allow` must let run on macOS for the programs `allowed` (absolute paths).

    Seatbelt judges the file a path resolves to, so each program is listed with every symlink hop
    to its real file (Homebrew's `/opt/homebrew/bin/node`), and a script with its `#!` interpreter
    (and for `#!/usr/bin/env NAME`, NAME found on `path`): the same walk that builds the Linux
    jail's closure (`closure.exec_closure`). `/bin/sh` comes too, with the shell it runs, since
    `system(3)`, `popen(3)` and Node's `exec` start every command through it; the shell can run
    only what is listed here.
    """
    if not allowed:
        return ()
    shell = os.path.realpath(_SH_CHOICE) if os.path.lexists(_SH_CHOICE) else "/bin/bash"
    return exec_closure([*allowed, _SH, shell], path).executables


def seatbelt_plan(
    spec: JailSpec,
    mounts: Sequence[Mount],
    *,
    proxy_port: int | None = None,
    tmp_dir: str | None = None,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> LaunchPlan:
    """Return the plan that runs `spec` under `sandbox-exec` with `seatbelt_compile`'s profile,
    each path passed as a `-D NAME=PATH` parameter.

    The plan's mounts are the caller's, then the private temp dir and the `exec.allow` entries,
    which the profile also makes visible.

    Raises:
        JailError: as `seatbelt_compile`.
    """
    profile, params = seatbelt_compile(spec, mounts, proxy_port=proxy_port, tmp_dir=tmp_dir, is_dir=is_dir)
    extra: list[Mount] = []
    if tmp_dir is not None:
        extra.append(Mount(tmp_dir, MountMode.READ_WRITE, "tmp"))
    extra.extend(Mount(path, MountMode.READ_ONLY, "exec_allow") for path in spec.exec_allow)
    defines = [word for name, value in params.items() for word in ("-D", f"{name}={value}")]
    return LaunchPlan(
        argv=(SANDBOX_EXEC, "-p", profile, *defines, *spec.argv),
        env=spec.env,
        cwd=spec.cwd,
        mounts=(*mounts, *extra),
        network=spec.network,
        backend="seatbelt",
    )


def _sysctl_filters() -> list[str]:
    return [
        *(f"(sysctl-name {_string(n)})" for n in _SYSCTL_NAMES),
        *(f"(sysctl-name-prefix {_string(p)})" for p in _SYSCTL_PREFIXES),
    ]


def _hiding(hidden: Sequence[_Target], again: Sequence[str], params: _Params) -> list[str]:
    if not hidden:
        return []
    return [
        ";; Cellblock's own files, the user's session and the machine's sockets, hidden even under a",
        ";; mount that holds them, and what is shared back inside them (a server's own package cache).",
        _rule("deny", _DENIED, hidden, params),
        *again,
        "",
    ]


def _network_rules(network: Network, proxy_port: int | None) -> list[str]:
    if network is Network.OPEN:
        return [
            ";; Network: open, but no Unix socket besides the DNS resolver's: not Docker's, not an",
            ";; ssh-agent's, not the gateway's control socket (agent-sandbox.nix and hlyn do the same).",
            "(allow network*)",
            "(deny network-outbound (remote unix-socket))",
            f"(allow network-outbound (remote unix-socket (path-literal {_string(_RESOLVER_SOCKET)})))",
            _rule(
                "allow",
                ("file-read*",),
                [_Target(p, p.endswith("/mds")) for p in _NETWORK_DATA],
                _Params(_NETWORK_DATA),
            ),
        ]
    if network is Network.ALLOWLIST:
        # bool is an int: refuse it too, rather than emitting port 1.
        if isinstance(proxy_port, bool) or not isinstance(proxy_port, int) or not 0 < proxy_port < 65536:
            raise JailError(
                f"network: allowlist needs the egress proxy's localhost port (got {proxy_port!r}, "
                "expected 1-65535); the gateway starts the proxy before the server"
            )
        return [
            ";; Network: allowlist. Only the gateway's egress proxy, which checks every host.",
            f'(allow network-outbound (remote tcp "localhost:{proxy_port}"))',
            ";; TLS through the proxy still checks certificates here.",
            '(allow file-read* (subpath "/private/var/db/mds"))',
        ]
    return [";; Network: none. No sockets at all, not even Unix ones (default deny)."]


def _tmp_target(spec: JailSpec, tmp_dir: str | None, protected: Sequence[str]) -> _Target | None:
    if not spec.tmp:
        if tmp_dir is not None:
            raise JailError(f"server '{spec.name}' has tmp: false but was given a private temp dir {tmp_dir!r}")
        return None
    if tmp_dir is None:
        raise JailError(f"server '{spec.name}' has tmp: true but no private temp dir was created for it")
    path = _resolve(tmp_dir, "tmp_dir")
    if any(within(p, path) for p in protected):
        raise JailError(
            f"private temp dir {tmp_dir!r} would share the home or a system temp tree; "
            "create a fresh directory for the server instead"
        )
    return _Target(path, True, "TMP")


def _exec_targets(spec: JailSpec, is_dir: Callable[[str], bool]) -> list[_Target]:
    targets: list[_Target] = []
    for raw in spec.exec_allow:
        path = _resolve(raw, "exec.allow")
        targets.append(_Target(path, is_dir(raw), "EXEC"))  # ask about the path as given: /tmp is a link
    if targets:
        command = spec.argv[0]
        resolved = _resolve(command, "command")
        if not any(resolved == t.path or (t.is_dir and within(resolved, t.path)) for t in targets):
            raise JailError(
                f"exec.allow of server '{spec.name}' does not include its own command {command!r}; add it to exec.allow"
            )
    return targets


def _merge(mounts: Iterable[Mount], is_dir: Callable[[str], bool]) -> list[tuple[_Target, MountMode]]:
    """Resolve the mounts, first occurrence fixing the order; a path mounted twice is read-write if either is."""
    modes: dict[str, MountMode] = {}
    given: dict[str, str] = {}
    for mount in mounts:
        path = _resolve(mount.path, f"mount ({mount.why})")
        given.setdefault(path, mount.path)
        if modes.get(path) is not MountMode.READ_WRITE:
            modes[path] = mount.mode
    # ask about the path as given: its /private form exists only on macOS
    return [(_Target(path, is_dir(given[path]), "MOUNT"), mode) for path, mode in modes.items()]


def _ancestors(*groups: Iterable[_Target]) -> list[str]:
    found = {"/", *_SYMLINKED_ROOTS}
    for group in groups:
        for target in group:
            parent = posixpath.dirname(target.path)
            while parent not in found:
                found.add(parent)
                parent = posixpath.dirname(parent)
    return sorted(found)


def _resolve(path: str, what: str) -> str:
    """Validate an absolute path and return it normalised, in its /private form.

    A path reaches the profile only as a `-D` parameter, so quotes, backslashes and newlines are
    harmless; a NUL cannot be passed in an argument at all, and `.` or `..` are refused since the
    sandbox matches resolved paths (a lexical `..` would not mean what it says).
    """
    if "\x00" in path:
        raise JailError(
            f"{what} path {path!r} contains a NUL character, which no sandbox parameter can hold; "
            "rename the path or remove it from the jail config"
        )
    if not path.startswith("/"):
        raise JailError(f"{what} path {path!r} is not absolute; write the full path")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise JailError(f"{what} path {path!r} contains '.' or '..'; write the path without them")
    path = "/" + "/".join(parts)
    for root in _SYMLINKED_ROOTS:
        if within(path, root):
            return "/private" + path
    return path


def _string(text: str) -> str:
    """An SBPL string literal, for this module's constants and parameter names only."""
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in text):
        raise JailError(f"internal error: {text!r} cannot be an SBPL string literal")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _rule(action: str, ops: Sequence[str], filters: Sequence[_Target | str], params: _Params) -> str:
    rendered = [f.sbpl(params) if isinstance(f, _Target) else f for f in filters]
    head = f"({action} {' '.join(ops)}"
    if len(rendered) == 1:
        return f"{head} {rendered[0]})"
    return head + "".join(f"\n    {f}" for f in rendered) + ")"


def _within_any(path: str, roots: Iterable[str]) -> bool:
    return any(within(path, r) for r in roots)
