"""`cellblock check` and `show`: a config's servers, and what each will be able to reach, exactly as
the gateway would start it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_OK, load
from cellblock.gateway.config.compile import lint_config
from cellblock.gateway.config.loading import load_config
from cellblock.gateway.config.model import Config, LocalServer
from cellblock.gateway.downstream.jailspec import jail_spec
from cellblock.gateway.downstream.launch import kept_home, own_paths
from cellblock.gateway.downstream.packages import read_record
from cellblock.gateway.serve.approvals import describe
from cellblock.gateway.serve.remembered import read_always
from cellblock.gateway.state import RuntimeDirError, read_json, runtime_dir, state_dir
from cellblock.sandbox.backends import backend_plan, choose
from cellblock.sandbox.bwrap import bwrap_plan
from cellblock.sandbox.closure import GUARANTEE
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.limits import limit_plan, size
from cellblock.sandbox.seccomp import SUMMARY
from cellblock.sandbox.spawn import discard
from cellblock.sandbox.types import JailError, LaunchPlan

__all__ = ["check", "describe_server", "show", "show_command"]


def check(config_path: str | None) -> int:
    """`cellblock check`: each server on stdout, lint findings on stderr; 1 when there are any."""
    config, source = load_config(config_path)
    for name, server in sorted(config.servers.items()):
        if isinstance(server, LocalServer):
            package = server.install.package.spec() if server.install else None
            kind = f"stdio: {server.command or ''}" + (f" (installed {package})" if package else "")
        else:
            kind = f"http: {server.url}"
        print(f"{name}\t{config.start_of(name)}\t{kind}")
    findings = lint_config(config, state_dir())
    for finding in findings:
        print(f"cellblock: lint: {finding}", file=sys.stderr)
    if findings:
        print(f"cellblock: {source}: valid, with {len(findings)} lint finding(s)", file=sys.stderr)
        return EXIT_FINDING
    print(f"cellblock: OK: {source}: {len(config.servers)} server(s)", file=sys.stderr)
    return EXIT_OK


def show_command(config_path: str | None, server: str | None, as_json: bool) -> int:
    """`cellblock show [SERVER]`."""
    config, source = load(config_path, server)
    return show(config, server, as_json, state_dir(), source)


def _policy(config: Config, name: str, kind: str) -> dict[str, Any]:
    default, rules = config.rules_of(name, kind)
    return {"default": default, "rules": {p: (r if isinstance(r, str) else r.model_dump()) for p, r in rules.items()}}


def describe_server(
    config: Config, name: str, always: dict[str, list[str]] | None = None, own: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """The effective settings of one server, as data (env values are never included); `own` as
    for `jail_spec`."""
    server = config.servers[name]
    info: dict[str, Any] = {
        "name": name,
        "start": config.start_of(name),
        "timeout": config.timeout_of(name),
        "policy": _policy(config, name, "tool"),
        # the effective default: a section without one takes the tools default
        "prompt_policy": _policy(config, name, "prompt"),
        "resource_policy": _policy(config, name, "resource"),
        "lock": config.lock_of(name).model_dump(),
        "always_allowed": sorted((always or {}).get(name, [])),
    }
    if not isinstance(server, LocalServer):
        auth = {"none": "none", "bearer": f"bearer token from keyring entry '{name}'", "oauth": "OAuth (keyring)"}
        return info | {
            "kind": "remote",
            "url": server.url,
            "jail": "none: a remote server runs elsewhere; Cellblock applies policy, lock and audit only",
            "auth": auth[server.auth.type],
            "headers": sorted(server.headers),
        }
    info |= {
        "kind": "local",
        "command": [server.command or "(the package's own program)", *server.args],
        "env": sorted(server.env),
        # variable -> keyring entry; the values are read only when the server starts
        "secrets": dict(server.secrets),
    }
    if server.install is not None:
        record = read_record(name)
        info["install"] = {
            "package": server.install.package.spec(),
            "installed": record.package.spec() if record else None,
            "tree": record.tree if record else None,
            "digest": record.digest if record else None,
        }
    if server.jail is False:
        return info | {"jail": "OFF (jail: false): runs as you, with your files and network"}
    linux = sys.platform.startswith("linux")
    limits = config.limits_of(name)
    try:
        kept = kept_home(name, server, make=False)
        if linux:  # what builds it here, as a start would choose (docs/jail.md, "Backends")
            choice = choose(name, server.jail.backend or "auto")
            landlock = choice.backend == "landlock"
            spec, launchers = jail_spec(name, server, server.jail, own=own, kept=kept, landlock=landlock)
            plan = backend_plan(spec, launchers, choice, str(runtime_dir() / "servers" / name))
            discard(plan)  # shown, never run
        else:
            spec, launchers = jail_spec(name, server, server.jail, own=own, kept=kept)
            plan = bwrap_plan(spec, launchers, seccomp=False)
    except (JailError, RuntimeDirError) as exc:
        return info | {"jail": "cannot be built", "error": str(exc)}
    if linux and limits is not None:
        plan = limit_plan(plan, name, limits)
    enforced = plan.limits.enforcement if plan.limits is not None else None
    return info | {
        "limits": {
            "processes": limits.processes if limits else None,
            "memory": limits.memory if limits else None,
            # what enforces each here, in words; "not enforced" says so
            "processes_by": enforced.processes.how if enforced else f"NOT ENFORCED: no limits on {sys.platform} yet",
            "memory_by": enforced.memory.how if enforced else f"NOT ENFORCED: no limits on {sys.platform} yet",
        },
        "jail": _backend(plan) if linux else f"none on {sys.platform}",
        # what this jail does not enforce here that bubblewrap's would (a Landlock jail)
        "not_enforced": list(plan.gaps),
        "network": plan.network.value,
        "allow_hosts": list(spec.allow_hosts),
        # where what it keeps in its home is on the host (docs/jail.md, "The home")
        "home": spec.home_source or "throwaway: an empty tmpfs, gone when it exits",
        "mounts": [{"path": m.path, "mode": m.mode.value, "why": m.why} for m in plan.mounts],
        "seccomp": SUMMARY if plan.seccomp is not None else "off",
        "warnings": list(spec.gaps),
        "jail_env": sorted(spec.env),
        "exec_allow": list(spec.exec_allow),
        "exec_guarantee": GUARANTEE if spec.exec_closure is not None else None,
        "exec_sha256": dict(spec.exec_sha256),
        "learn": _learning(name, server),
    }


def _backend(plan: LaunchPlan) -> str:
    if plan.backend == "landlock":
        return f"Landlock, ABI {landlock_abi()} (no namespaces: see 'not enforced')"
    return "bubblewrap"


def _learning(name: str, server: LocalServer) -> str | None:
    """What `learn: true` does here, in words (None: off)."""
    if not server.learn:
        return None
    if sys.platform.startswith("linux") and shutil.which("strace") is not None:
        return f"traced while serving (strace, outside the jail); cellblock scan {name} --from-learned reads it"
    return "NOT LEARNING: strace is not installed here (the server still runs jailed)"


def show(config: Config, only: str | None, as_json: bool, state: Path | None = None, source: Path | None = None) -> int:
    names = [only] if only else sorted(config.servers)
    stored = read_always(read_json(state / "approvals.json")) if state is not None else {}
    always = {server: [describe(kind, name) for kind, name in keys] for server, keys in stored.items()}
    own = own_paths(config, state, source) if state is not None else ()
    described = [describe_server(config, n, always, own) for n in names]
    if as_json:
        print(json.dumps(described, indent=2))
        return 0
    for item in described:
        print(f"{item['name']}  ({item['kind']}, start: {item['start']}, timeout: {item['timeout']:g}s)")
        if item["kind"] == "local":
            print(f"  command  {' '.join(item['command'])}")
            if "install" in item:
                install = item["install"]
                at = f"{install['installed']} in {install['tree']} ({install['digest']})" if install["tree"] else ""
                print(f"  install  {install['package']}: " + (f"installed {at}" if at else "NOT INSTALLED"))
        else:
            print(f"  url      {item['url']}")
            print(f"  auth     {item['auth']}")
        print(f"  jail     {item['jail']}")
        for variable, entry in item.get("secrets", {}).items():
            print(f"  secret   {variable} <- keyring entry '{entry}'")
        if "error" in item:
            print(f"  error    {item['error']}")
        for warning in item.get("warnings", []):
            print(f"  warning  {warning}")
        for gap in item.get("not_enforced", []):
            print(f"  lacks    {gap}")
        if "network" in item:
            hosts = f" ({', '.join(item['allow_hosts'])})" if item["allow_hosts"] else ""
            print(
                f"  network  {item['network']}{' (host network, unrestricted)' if item['network'] == 'open' else ''}"
                f"{hosts}"
            )
            print(f"  seccomp  {item['seccomp']}")
            print(f"  home     {item['home']}")
            limits = item["limits"]
            print(f"  limits   processes {limits['processes']}: {limits['processes_by']}")
            print(f"  limits   memory {size(limits['memory'])}: {limits['memory_by']}")
            for mount in item["mounts"]:
                print(f"  mount    {mount['mode']}  {mount['path']}  [{mount['why']}]")
            if item["exec_allow"]:
                print(f"  exec     only {', '.join(item['exec_allow'])}")
                if item["exec_guarantee"]:
                    print(f"           {item['exec_guarantee']}")
            for path, digest in item["exec_sha256"].items():
                print(f"  pinned   {path}  sha256 {digest}")
            print(f"  env      {', '.join(item['jail_env'])}")
            if item["learn"]:
                print(f"  learn    {item['learn']}")
        for key, what in (("policy", "tools"), ("prompt_policy", "prompts"), ("resource_policy", "resources")):
            policy = item[key]
            print(f"  policy   {what}: default {policy['default']}")
            for pattern, rule in policy["rules"].items():
                print(f"  rule     {pattern}: {rule if isinstance(rule, str) else json.dumps(rule)}")
        print(f"  lock     {'first ' + item['lock']['first'] if item['lock']['enabled'] else 'off'}")
        if item["always_allowed"]:
            print(f"  always   {', '.join(item['always_allowed'])}  (revoke with 'cellblock revoke {item['name']}')")
        print()
    return 0
