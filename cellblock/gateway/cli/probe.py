"""`cellblock probe`: attack each server's jail from the inside and report what got through.

For every local server the gateway builds the jail it would start the server in — same mounts,
network, exec rules and pins — but runs the escape attempts (`sandbox/escape/`) in place of the
server. Targets that do not exist on this machine are left out, since failing to read a missing
file proves nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from cellblock.gateway.cli.options import load
from cellblock.gateway.config.model import Config, JailConfig, LocalServer
from cellblock.gateway.downstream.launch import launch_plan, own_paths
from cellblock.gateway.state import runtime_dir, state_dir
from cellblock.sandbox.escape import listed_keys
from cellblock.sandbox.spawn import discard, run_plan
from cellblock.sandbox.types import JailError, LaunchPlan

__all__ = ["probe", "probe_command"]

ESCAPE = Path(__file__).resolve().parents[2] / "sandbox" / "escape"  # a folder python runs
# Long enough for a slow machine to start Python in a jail and try every attempt.
PROBE_SECONDS = 120
CANARY = "cellblock-probe-canary"
KEYS_TRIED = 5  # of the user's kernel keys, the first few: one readable is as bad as all
# A fork bomb tries a few processes past the jail's limit; a limit higher than this is not tried,
# since a probe must not cost the machine what it tests for.
FORK_PAST_LIMIT, FORK_MOST = 8, 2000
SECRETS = (".ssh/id_ed25519", ".ssh/id_rsa", ".ssh/config", ".aws/credentials", ".netrc", ".config/gh/hosts.yml")


def _attempts(
    config_path: Path,
    state: Path,
    audit: Path,
    jail: JailConfig,
    listener: int,
    shared: set[str],
    processes: int | None = None,
) -> list[dict[str, Any]]:
    home = Path.home()
    reads = [str(home / s) for s in SECRETS] + ["/etc/shadow", str(config_path), str(audit)]
    attempts: list[dict[str, Any]] = [{"kind": "read", "target": t} for t in reads if os.path.exists(t)]
    # names in the home that the jail shows on purpose (the way down to a shared path) do not count
    names = sorted(set(os.listdir(home)) - shared)[:20] if home.is_dir() else []
    if names:
        attempts.append({"kind": "list", "target": str(home), "expect": names})
    for place in (config_path.parent, state):
        if place.is_dir():
            # kept in the jail and looked for on the host afterwards: a write that lands in the
            # jail's own private home or /tmp is contained, not an escape
            attempts.append({"kind": "write", "target": str(place / CANARY), "keep": True})
    if jail.network != "open":
        attempts.append({"kind": "connect", "target": f"127.0.0.1:{listener}"})
        attempts.append({"kind": "resolve", "target": "example.com"})
    if jail.exec.allow:
        attempts.append({"kind": "exec", "argv": ["/bin/sh", "-c", "true"]})
    # the user's own kernel keys, by description: keyrings have no namespace (only sizes are reported)
    # and the serials of the keyrings they are in, which the jail's masked /proc/keys would not show
    with contextlib.suppress(OSError):
        listed = listed_keys()
        keys = [name for _, kind, name in listed if kind == "user"][:KEYS_TRIED]
        rings = [serial for serial, kind, name in listed if kind == "keyring" and name.startswith("_uid.")]
        attempts += [{"kind": "keyring", "target": name, "rings": rings} for name in keys]
    bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    attempts += [
        {"kind": "dbus", "target": bus},
        {"kind": "processes", "pid": os.getpid()},
        {"kind": "capabilities", "target": ""},
        {"kind": "userns", "target": ""},
        {"kind": "sysctl", "target": "/proc/sys/vm/stat_interval"},
        {"kind": "remount", "target": jail.read_only[0] if jail.read_only else "/usr"},
    ]
    if processes is not None and processes + FORK_PAST_LIMIT <= FORK_MOST:
        attempts.append({"kind": "fork", "ceiling": processes + FORK_PAST_LIMIT})
    return attempts


def _probe_one(
    config: Config, config_path: Path, state: Path, runtime: Path, name: str, server: LocalServer
) -> list[dict[str, Any]]:
    if server.jail is False:
        return [{"name": "jail", "target": name, "got_through": True, "detail": "jail: false: nothing is confined"}]
    jail = server.jail
    python = os.path.realpath(sys.executable)
    grants = jail.model_copy(update={"read_only": [*jail.read_only, str(ESCAPE)]})
    # allowlist jails get their relay; with no proxy behind it, it reaches nothing, like `none`
    egress = str(runtime / f"probe-{name}.sock") if jail.proxied else None

    def stand_in(attempts: list[dict[str, Any]]) -> LocalServer:
        args = ["-I", "-S", str(ESCAPE), "--json", json.dumps(attempts)]
        return server.model_copy(update={"command": python, "args": args, "jail": grants})

    with socket.create_server(("127.0.0.1", 0)) as listener:
        if egress is not None:
            Path(egress).touch(mode=0o600)
        try:
            own = own_paths(config, state, config_path, runtime)
            seen = launch_plan(name, stand_in([]), egress, runtime / "servers" / name, own=own)
            discard(seen)  # only looked at: what its home shows
            mounts = seen.mounts
            home = str(Path.home())
            shared = {m.path[len(home) + 1 :].split("/")[0] for m in mounts if m.path.startswith(home + "/")}
            limits = config.limits_of(name)
            port = listener.getsockname()[1]
            processes = limits.processes if limits is not None else None
            attempts = _attempts(config_path, state, config.audit_file(state), jail, port, shared, processes)
            # the server's own limits: the fork bomb above tries them
            plan = launch_plan(name, stand_in(attempts), egress, runtime / "servers" / name, limits=limits, own=own)
            done = run_plan(plan, PROBE_SECONDS)
        finally:
            if egress is not None:
                Path(egress).unlink(missing_ok=True)
    if done.returncode not in (0, 1):
        detail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return [{"name": "probe", "target": name, "got_through": False, "detail": f"could not run: {detail}"}]
    results: list[dict[str, Any]] = json.loads(done.stdout)
    for result in results:
        if result["name"] == "write" and result["target"].endswith(CANARY):
            landed = Path(result["target"])
            on_host = landed.exists()
            landed.unlink(missing_ok=True)
            result["detail"] = f"in the jail: {result['detail']}; on the host: {'FOUND' if on_host else 'nothing'}"
            result["got_through"] = on_host
        gap = _named_gap(plan, result)
        if gap is not None:  # what this backend does not enforce here, and says so: not an escape
            result |= {"got_through": False, "not_enforced": True, "detail": f"{result['detail']}; {gap}"}
    return results


# The attempts a Landlock jail lets through by what it is, and the words of its gap that name each
# (landlock.landlock_gaps): the host's processes (no pid namespace), a copied program run through
# the allowed loader under exec.allow (nothing is noexec).
LANDLOCK_GAPS = {"processes": "other processes are visible", "load_copy": "loaded as code by an allowed program"}


def _named_gap(plan: LaunchPlan, result: dict[str, Any]) -> str | None:
    """The gap of `plan`'s jail that `result` got through by, when the plan names it (else None)."""
    words = LANDLOCK_GAPS.get(result["name"]) if plan.backend == "landlock" and result["got_through"] else None
    found = [g for g in plan.gaps if words is not None and words in g]
    return f"NOT ENFORCED by this Landlock jail: {found[0]}" if found else None


def probe_command(config_path: str | None, server: str | None, as_json: bool) -> int:
    """`cellblock probe [SERVER]`."""
    config, source = load(config_path, server)
    return probe(config, source, state_dir(), runtime_dir(), server, as_json)


def probe(config: Config, config_path: Path, state: Path, runtime: Path, only: str | None, as_json: bool) -> int:
    """Probe each local server's jail; return 1 if anything got through anywhere."""
    names = [only] if only else sorted(config.servers)
    report: dict[str, Any] = {}
    for name in names:
        server = config.servers[name]
        if not isinstance(server, LocalServer):
            report[name] = {"skipped": "remote server: nothing runs here"}
            continue
        try:
            report[name] = {"attempts": _probe_one(config, config_path, state, runtime, name, server)}
        except JailError as exc:
            report[name] = {"error": str(exc)}
    escaped = any(a["got_through"] for r in report.values() for a in r.get("attempts", []))
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for name, result in report.items():
            print(name)
            if "skipped" in result or "error" in result:
                print(f"  {result.get('skipped') or 'jail cannot be built: ' + result['error']}")
            for a in result.get("attempts", []):
                verdict = (
                    "GOT THROUGH" if a["got_through"] else "NOT ENFORCED" if a.get("not_enforced") else "blocked    "
                )
                print(f"  {verdict}  {a['name']:<12} {a['target']}  ({a['detail']})")
            print()
    print(f"cellblock: {'FAIL: something got through' if escaped else 'OK: nothing got through'}", file=sys.stderr)
    return 1 if escaped else 0
