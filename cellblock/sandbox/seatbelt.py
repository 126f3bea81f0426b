"""macOS jail: a `JailSpec` as a Seatbelt (SBPL) profile, run by `sandbox-exec -p PROFILE argv...`.

Pure text generation, so it is built and golden-tested on any OS (`tests/sandbox/golden/*.sb`).

The profile starts from `(deny default)` and adds, in this order:

1. process basics (fork, signal itself, sysctl reads, POSIX shared memory) and a short list of
   Mach services;
2. the system roots, read-only, plus a few files under `/private/etc` and `/dev`;
3. the caller's mounts that lie outside the protected trees (below);
4. a deny on the protected trees: the user's home, `/private/tmp` and `/private/var/folders`;
5. the mounts inside a protected tree, the private temp dir and `exec.allow`;
5b. a deny on what the spec hides (Cellblock's own files and the user's session, where a mount
    holds them), then the mounts inside those again;
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
from cellblock.sandbox.types import JailError, JailSpec, LaunchPlan, Mount, MountMode, Network

__all__ = ["SANDBOX_EXEC", "seatbelt_plan", "seatbelt_profile"]

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

# /tmp, /var and /etc are symlinks into /private, and Seatbelt matches the resolved path: a rule on
# "/tmp/x" would never match anything. Every path is therefore written in its /private form.
_SYMLINKED_ROOTS = ("/tmp", "/var", "/etc")

# Readable, executable and mappable (dyld loads libraries from here). Deliberately not /Users,
# /Applications, /opt or /private: launchers outside these roots arrive as the caller's mounts.
_SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/System", "/Library")

# Read-only files and data a CLI program needs; nothing here is executable.
_SYSTEM_DATA: tuple[tuple[str, bool], ...] = (  # (path, is_dir)
    ("/private/etc/hosts", False),
    ("/private/etc/localtime", False),  # a symlink into /private/var/db/timezone
    ("/private/etc/protocols", False),
    ("/private/etc/services", False),
    ("/private/etc/ssl", True),  # OpenSSL's CA bundle
    ("/private/var/db/timezone", True),
    ("/dev/null", False),
    ("/dev/random", False),
    ("/dev/urandom", False),
    # Usable only with a controlling terminal, which a downstream started in a new session has not.
    ("/dev/tty", False),
)

# The only Mach services a CLI program is allowed to look up:
#   opendirectoryd.libinfo  user and group lookups (getpwuid, getgrgid)
#   notification_center     notify(3), which libc uses for time zone and locale changes
#   logger                  syslog(3)
_MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.notification_center",
    "com.apple.system.logger",
)
# Only with network: certificate checks of Security.framework users (Go, curl, Swift).
_MACH_SERVICES_NETWORK = ("com.apple.trustd.agent",)

# Read only when the network is open: DNS settings (mDNSResponder's socket is covered by network*).
_NETWORK_DATA = ("/private/etc/resolv.conf", "/private/var/run/resolv.conf")

# Shared trees that are never visible unless a mount, the private temp dir or exec.allow lies inside.
_SHARED_TEMP_TREES = ("/private/tmp", "/private/var/folders")

_READ = ("file-read*", "file-map-executable")
_WRITE = ("file-write*",)
_EXEC = ("process-exec*",)  # the star covers process-exec-interpreter, i.e. #! scripts
_DENIED = ("file-read*", "file-write*", "file-map-executable", "process-exec*")


@dataclass(frozen=True, slots=True)
class _Target:
    """One path in the profile: already resolved to its /private form and validated."""

    path: str
    is_dir: bool

    def sbpl(self) -> str:
        return f"({'subpath' if self.is_dir else 'literal'} {_string(self.path)})"


def seatbelt_profile(
    spec: JailSpec,
    mounts: Sequence[Mount],
    *,
    proxy_port: int | None = None,
    tmp_dir: str | None = None,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> str:
    """Return the SBPL profile that jails `spec`, for `sandbox-exec -p`.

    `mounts` are every host path the jail shares (system paths, launcher installs and the user's
    `read_only`/`read_write` grants), computed by the caller; they are shared at their own path
    and should cover `spec.cwd`. `tmp_dir` is the server's private temp dir, created (and later
    removed) by the caller, who also points `TMPDIR` in `spec.env` at it; it is required exactly
    when `spec.tmp` is set. `proxy_port` is the egress proxy's TCP port on localhost, required for
    `network: allowlist` and ignored otherwise. `is_dir` decides `subpath` (a tree) or `literal`
    (one file) for mounts and `exec.allow` entries; tests pass a fake.

    Raises:
        JailError: a path cannot be written safely into a profile (relative, `.`/`..`, control
            characters), `tmp_dir` and `spec.tmp` disagree, the allowlist has no proxy port, or
            `exec.allow` does not permit the server's own command.
    """
    if not spec.argv:
        raise JailError(f"server '{spec.name}' has no command to run; set its command in the config")
    home = _resolve(spec.home, "home")
    protected = (home, *_SHARED_TEMP_TREES)
    tmp = _tmp_target(spec, tmp_dir, protected)
    execs = _exec_targets(spec, is_dir)
    exec_anything = not execs

    exec_ops = _EXEC if exec_anything else ()
    read_exec = _READ + exec_ops
    outside: list[str] = []
    inside: list[str] = []
    shared: list[_Target] = []
    hidden = [_Target(_resolve(p, "hidden"), is_dir(p)) for p in spec.hidden]
    again: list[str] = []
    for target, mode in _merge(mounts, is_dir):
        ops = _READ + (_WRITE if mode is MountMode.READ_WRITE else ()) + exec_ops
        rule = _rule("allow", ops, [target])
        (inside if _within_any(target.path, protected) else outside).append(rule)
        if any(within(target.path, h.path) and target.path != h.path for h in hidden):
            again.append(rule)
        shared.append(target)
    if tmp is not None:
        inside.append(_rule("allow", _READ + _WRITE + exec_ops, [tmp]))
        shared.append(tmp)
    for target in execs:
        inside.append(_rule("allow", _READ + _EXEC, [target]))
        shared.append(target)

    system = [_Target(p, True) for p in _SYSTEM_ROOTS]
    data = [_Target(p, d) for p, d in _SYSTEM_DATA]
    services = _MACH_SERVICES + (_MACH_SERVICES_NETWORK if spec.network is not Network.NONE else ())

    lines = [
        "(version 1)",
        "(deny default)",
        "",
        ";; Processes: start children, signal only itself, read kernel settings, share memory.",
        "(allow process-fork)",
        "(allow signal (target self))",
        "(allow sysctl-read)",
        "(allow ipc-posix-shm)",
        "",
        ";; Mach services: user/group lookups, notify(3), syslog(3); trustd only with network.",
        _rule("allow", ("mach-lookup",), [f"(global-name {_string(s)})" for s in services]),
        "",
        ";; System roots, read-only." + ("" if exec_anything else " Executables only from exec.allow, below."),
        _rule("allow", read_exec, [t.sbpl() for t in system]),
        _rule("allow", ("file-read*",), [t.sbpl() for t in data]),
        _rule("allow", ("file-write-data",), ['(literal "/dev/null")']),
        "",
        ";; Shared paths outside the home and temp trees.",
        *(outside or [";; (none)"]),
        "",
        ";; The home and the shared temp trees stay hidden, even under a mount of an ancestor.",
        _rule("deny", _DENIED, [_Target(p, True).sbpl() for p in protected]),
        "",
        ";; Shared back inside them: mounts, the private temp dir and exec.allow.",
        *(inside or [";; (none)"]),
        "",
        *_hiding(hidden, again),
        ";; Metadata (not listing) of every ancestor directory, so realpath() and getcwd() work.",
        _rule("allow", ("file-read-metadata",), [f"(literal {_string(p)})" for p in _ancestors(system, data, shared)]),
        "",
        *_network_rules(spec.network, proxy_port),
    ]
    return "\n".join(lines) + "\n"


def seatbelt_plan(
    spec: JailSpec,
    mounts: Sequence[Mount],
    *,
    proxy_port: int | None = None,
    tmp_dir: str | None = None,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> LaunchPlan:
    """Return the plan that runs `spec` under `sandbox-exec` with `seatbelt_profile`.

    The plan's mounts are the caller's, then the private temp dir and the `exec.allow` entries,
    which the profile also makes visible.

    Raises:
        JailError: as `seatbelt_profile`.
    """
    profile = seatbelt_profile(spec, mounts, proxy_port=proxy_port, tmp_dir=tmp_dir, is_dir=is_dir)
    extra: list[Mount] = []
    if tmp_dir is not None:
        extra.append(Mount(tmp_dir, MountMode.READ_WRITE, "tmp"))
    extra.extend(Mount(path, MountMode.READ_ONLY, "exec_allow") for path in spec.exec_allow)
    return LaunchPlan(
        argv=(SANDBOX_EXEC, "-p", profile, *spec.argv),
        env=spec.env,
        cwd=spec.cwd,
        mounts=(*mounts, *extra),
        network=spec.network,
    )


def _hiding(hidden: Sequence[_Target], again: Sequence[str]) -> list[str]:
    if not hidden:
        return []
    return [
        ";; Cellblock's own files and the user's session, hidden even under a mount that holds them,",
        ";; and what is shared back inside them (a server's own package cache).",
        _rule("deny", _DENIED, hidden),
        *again,
        "",
    ]


def _network_rules(network: Network, proxy_port: int | None) -> list[str]:
    if network is Network.OPEN:
        return [
            ";; Network: open.",
            "(allow network*)",
            _rule("allow", ("file-read*",), [f"(literal {_string(p)})" for p in _NETWORK_DATA]),
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
    return _Target(path, True)


def _exec_targets(spec: JailSpec, is_dir: Callable[[str], bool]) -> list[_Target]:
    targets: list[_Target] = []
    for raw in spec.exec_allow:
        path = _resolve(raw, "exec.allow")
        targets.append(_Target(path, is_dir(raw)))  # ask about the path as given: /tmp is a link
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
    return [(_Target(path, is_dir(given[path])), mode) for path, mode in modes.items()]


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

    Input is validated before it is escaped: no control characters (a newline would end the
    string in some readers, a NUL truncates it in the kernel), no `.` or `..` (the sandbox
    matches resolved paths, so a lexical `..` would not mean what it says).
    """
    bad = next((c for c in path if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise JailError(
            f"{what} path {path!r} contains the control character {bad!r}, which a sandbox profile "
            "cannot hold; rename the path or remove it from the jail config"
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
    """An SBPL string literal; the text was validated by `_resolve` or is a constant."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _rule(action: str, ops: Sequence[str], filters: Sequence[_Target | str]) -> str:
    rendered = [f.sbpl() if isinstance(f, _Target) else f for f in filters]
    head = f"({action} {' '.join(ops)}"
    if len(rendered) == 1:
        return f"{head} {rendered[0]})"
    return head + "".join(f"\n    {f}" for f in rendered) + ")"


def _within_any(path: str, roots: Iterable[str]) -> bool:
    return any(within(path, r) for r in roots)
