"""`cellblock wrap` / `unwrap`: a client's MCP servers moved behind one Cellblock entry, and back.

wrap PATH reads a client's config (gateway/clients/kinds.py knows each format), derives a starter jail
and policy per server (gateway/config/starter.py), and then, only when nothing stands in the way:
stores the inline secrets in the keyring, appends the servers to cellblock.yaml (validated
before it is written), keeps the original (gateway/clients/backups.py says where) with each
secret replaced by a reference to its keyring entry, and rewrites PATH so the client starts only
`cellblock serve`: by absolute path for a user's own file, by the bare `cellblock` command for a
project's file that others clone. Every file is replaced atomically; comments and unrelated keys
of the client's file are left byte for byte.

It stops before changing anything when a server's name is taken in cellblock.yaml by a different
server, when a backup already exists, or when secrets must move and no safe keyring is there.
A wrapped file is left as it is. gateway/clients/unwrap.py puts the original back.

What wrap would do is a `Plan` (clients/plan.py), the texts it writes are clients/rewrite.py's,
what it says clients/report.py's, and the entry it leaves clients/entry.py's.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from cellblock.gateway.clients.backups import is_project_file, kept
from cellblock.gateway.clients.blocks import ClientEntry, detect, read_blocks
from cellblock.gateway.clients.entry import ENTRY_KEY, WrapError, is_cellblock_entry, read_client_file
from cellblock.gateway.clients.kinds import name_budget
from cellblock.gateway.clients.placeholders import placeholder, references
from cellblock.gateway.clients.plan import Moved, Plan
from cellblock.gateway.clients.report import print_plan, say
from cellblock.gateway.clients.rewrite import backup_text, client_text, new_config_text
from cellblock.gateway.config.draft import Secret
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import Config, ConfigError, LocalServer
from cellblock.gateway.config.starter import server_name, starter
from cellblock.gateway.credentials import CredentialError, Keyring
from cellblock.gateway.downstream import packages
from cellblock.gateway.state import atomic_write_text, create_once
from cellblock.policy.files import make_dirs
from cellblock.sandbox.types import JailError

__all__ = ["plan_wrap", "wrap"]


def plan_wrap(path: Path, config_path: Path, home: str | None = None) -> Plan:
    """What wrapping `path` into `config_path` would do.

    Raises:
        WrapError: the file cannot be read or parsed, a name clashes, a backup already exists,
            or the client's file mixes the Cellblock entry with other servers.
        ConfigError: the existing cellblock.yaml is invalid.
    """
    home = home or os.path.expanduser("~")
    text = read_client_file(path)
    try:
        kind = detect(path, text)
        blocks = read_blocks(kind, text)
    except ValueError as exc:
        raise WrapError(str(exc)) from None
    config_text = read_client_file(config_path) if config_path.exists() else None
    existing = parse_config(config_text, str(config_path)) if config_text is not None else None
    existing_raw: dict[str, Any] = (yaml.safe_load(config_text) or {}).get("servers") or {} if config_text else {}
    plan = Plan(path=path, kind=kind, text=text, config_path=config_path, config_text=config_text)
    plan.project = is_project_file(kind, path, Path(home))

    own = [e for b in blocks for e in b.entries if is_cellblock_entry(e)]
    others = [(b, e) for b in blocks for e in b.entries if not is_cellblock_entry(e)]
    if own and not others:
        plan.wrapped = True
        return plan
    if own:
        names = ", ".join(e.name for _, e in others)
        raise WrapError(
            f"{path} starts Cellblock and also other servers ({names}); unwrap it first "
            f"(`cellblock unwrap {path}`), then wrap again, or move them into {config_path} by hand"
        )
    if not others:
        raise WrapError(f"{path}: no MCP servers to wrap")
    if references(text):  # an earlier unwrap's: wrap would take a reference for a secret
        raise WrapError(
            f"{path} holds {placeholder(references(text)[0])} where a secret's value belongs; nothing changed. "
            f"Run `cellblock unwrap {path}` to put the values back from the keyring, then wrap again"
        )
    for backup in plan.backups:
        if backup.exists():
            raise WrapError(
                f"{backup} exists from an earlier wrap of {path}; move it away first (it is never overwritten)"
            )

    taken = set(existing_raw)
    clashes: list[str] = []
    for block, entry in others:
        entry = _with_workspace(kind, path, entry)
        name = server_name(entry.name, set())
        if name in existing_raw:
            start = starter(entry.name, entry, taken=set(), home=home, client=kind)
            if _same_server(existing_raw[name], start.config):
                secrets, missing = _existing_entries(name, existing_raw[name], start.secrets)
                if missing:
                    clashes.append(
                        f"'{entry.name}' is the same server as '{name}' in {config_path}, which does not take "
                        f"{', '.join(missing)} from the keyring"
                    )
                else:
                    plan.moved.append(Moved(block, entry, replace(start, secrets=secrets), reused=True))
                    if entry.extra:  # never dropped silently: the server in cellblock.yaml stays as it is
                        plan.notes.append(
                            f"'{entry.name}' is '{name}' of {config_path}, kept as it is: not carried over from "
                            f"{path}: {', '.join(sorted(entry.extra))} (set its equivalent there, see docs/wrap.md)"
                        )
            else:
                clashes.append(f"'{entry.name}' would be '{name}', which {config_path} already has for another server")
            continue
        start = starter(entry.name, entry, taken=taken, home=home, client=kind)
        taken.add(start.name)
        plan.moved.append(Moved(block, entry, start))
    clashes += _entry_clashes(plan, existing)
    if clashes:
        raise WrapError(
            "name clash, nothing changed: "
            + "; ".join(clashes)
            + f". Rename the server in {path} or in {config_path}, then wrap again"
        )
    plan.notes += _client_notes(plan)
    budget = name_budget(kind, ENTRY_KEY)
    if existing is not None and existing.names.max_length > budget:
        plan.notes.append(
            f"{config_path} has names.max_length {existing.names.max_length}; this client accepts "
            f"{budget} under the key '{ENTRY_KEY}': set names: {{max_length: {budget}}}"
        )
    plan.new_text = client_text(plan, blocks)
    plan.backup_text = backup_text(plan, blocks)
    plan.new_config_text = new_config_text(plan, budget)
    try:
        parse_config(plan.new_config_text, str(config_path))
    except ConfigError as exc:  # a bug in the starter, never the user's fault: say so plainly
        raise WrapError(f"the generated config does not validate, nothing changed:\n{exc}") from None
    return plan


def _client_notes(plan: Plan) -> list[str]:
    """What the client itself may still need before it starts the new entry."""
    kind, path, text = plan.kind, plan.path, plan.text
    notes = []
    if plan.project:
        command, args = plan.command
        notes.append(
            f"{path} belongs to a project: its entry runs `{' '.join([command, *args])}` from PATH, so it works "
            "for whoever clones it and has Cellblock installed (with these servers in their own cellblock.yaml); "
            f"its backup is kept in {kept(path).parent}, outside the repository"
        )
        if "--config" in args:
            notes.append(f"the entry names {plan.config_path}, a path of this machine: others need the same file there")
    if kind == "gemini" and ('"allowed"' in text or '"excluded"' in text):
        notes.append(f"{path} has mcp.allowed / mcp.excluded: make sure '{ENTRY_KEY}' is allowed there")
    if kind == "claude-code" and path.name == ".mcp.json":
        notes.append(f"Claude Code asks once to approve the project's '{ENTRY_KEY}' server from .mcp.json")
    return notes


def _same_server(existing: Any, derived: dict[str, Any]) -> bool:
    """cellblock.yaml already runs this server (a second client with the same entry)."""
    if not isinstance(existing, dict):
        return False
    keys = ("url",) if "url" in derived else ("command", "args")
    return all(existing.get(k) == derived.get(k) for k in keys)


def _existing_entries(
    name: str, existing: dict[str, Any], secrets: tuple[Secret, ...]
) -> tuple[tuple[Secret, ...], list[str]]:
    """A reused server's secrets under the keyring entries cellblock.yaml already names for them,
    and the keys it does not take from the keyring at all."""
    named = existing.get("secrets") or {}
    bearer = (existing.get("auth") or {}).get("type") == "bearer"
    out, missing = [], []
    for secret in secrets:
        entry = (
            secret.entry
            if secret.kind == "stash"
            else name
            if secret.kind == "bearer" and bearer
            else named.get(secret.key)
        )
        if entry is None:
            missing.append(secret.key)
        else:
            out.append(replace(secret, entry=entry))
    return tuple(out), missing


def _entry_clashes(plan: Plan, existing: Config | None) -> list[str]:
    """Keyring entries two servers would share: a later `auth set` would change both."""
    owners: dict[str, str] = {}
    if existing is not None:
        owners = {entry: server for entry, server, _ in existing.credential_entries()}
    clashes = []
    for server, secret in plan.secrets:
        if owners.setdefault(secret.entry, server) != server:
            clashes.append(f"keyring entry '{secret.entry}' of '{server}' is already used by '{owners[secret.entry]}'")
    return clashes


def _project_dir(path: Path) -> Path:
    """The folder a client config belongs to: the parent of `.vscode/`, `.cursor/`, … or its own folder."""
    parent = path.parent.resolve()
    return parent.parent if parent.name.startswith(".") else parent


def _with_workspace(kind: str, path: Path, entry: ClientEntry) -> ClientEntry:
    """The entry with what only the client could resolve made concrete: `${workspaceFolder}` (VS
    Code, Cursor) becomes the project folder, and a relative `cwd` is taken from it.

    Raises:
        WrapError: `${workspaceFolder}` in a config that belongs to no project (a user-level one).
    """
    folder = _project_dir(path)
    texts = [entry.command or "", *entry.args, *entry.env.values(), entry.cwd or ""]
    if any("${workspaceFolder}" in t for t in texts) and (
        kind not in ("vscode", "cursor") or path.parent.name not in (".vscode", ".cursor") or folder == Path.home()
    ):
        raise WrapError(
            f"'{entry.name}' in {path} uses ${{workspaceFolder}}, which only the client knows here; "
            "write the folder in its place, then wrap again"
        )

    def sub(value: str) -> str:
        return value.replace("${workspaceFolder}", str(folder))

    cwd = sub(entry.cwd) if entry.cwd else entry.cwd
    if cwd and not os.path.isabs(os.path.expanduser(cwd)):
        cwd = os.path.normpath(folder / cwd)
    return replace(
        entry,
        command=sub(entry.command) if entry.command else entry.command,
        args=tuple(sub(a) for a in entry.args),
        env={k: sub(v) for k, v in entry.env.items()},
        cwd=cwd,
    )


# -- doing it ------------------------------------------------------------------------------------


def wrap(path: Path, config_path: Path, dry_run: bool = False, out: TextIO | None = None, install: bool = True) -> int:
    """Wrap `path`; with `dry_run` only print what would happen. Then install the packages of the
    servers it added (`install: false`: leave that to `cellblock install`). Returns the exit code."""
    out = out or sys.stdout
    plan = plan_wrap(path, config_path)
    if plan.wrapped:
        say(f"{path} is already wrapped: it starts only Cellblock; nothing to do")
        return 0
    secrets = plan.secrets
    store: Keyring | None = None
    if (secrets or plan.checks) and not dry_run:
        try:
            store = Keyring(plan.allow_insecure)
        except CredentialError as exc:
            raise WrapError(f"{path} holds secrets that must move to the keyring, nothing changed: {exc}") from None
        for server, secret in plan.checks:
            if store.get(secret.entry) != secret.value:
                raise WrapError(
                    f"'{server}' in {config_path} is the same server, but its {secret.key} differs from keyring "
                    f"entry '{secret.entry}'; nothing changed. A new token: `cellblock auth set {secret.entry}`, "
                    f"then wrap again; another account: rename the server in {path}"
                )
    print_plan(plan, out, dry_run)
    if dry_run:
        say("dry run: nothing changed")
        return 0
    if store is not None:
        for _, secret in secrets:
            store.set(secret.entry, secret.value)
    mode = path.stat().st_mode & 0o777
    for each in plan.moved:
        for directory in each.starter.make:
            make_dirs(Path(directory))
        for file in each.starter.touch:
            create_once(Path(file), b"")
    atomic_write_text(config_path, plan.new_config_text)
    for backup in plan.backups:
        make_dirs(backup.parent)
        atomic_write_text(backup, plan.backup_text, 0o600)
    atomic_write_text(path.resolve(), plan.new_text, mode)
    moved = [m.starter.name for m in plan.moved]
    say(f"OK: {path} now starts only Cellblock; {len(moved)} server(s) in {config_path}: {', '.join(moved)}")
    say(
        f"the original is kept as {' and '.join(map(str, plan.backups))}, secrets replaced by keyring references; "
        f"undo: cellblock unwrap {path}"
    )
    failed = _install(plan, config_path) if install else []
    if failed:
        say(f"not installed: {', '.join(failed)}; when the cause is fixed, run `cellblock install {' '.join(failed)}`")
    say(
        "each server's catalog is held for review at first start: run `cellblock review` (or `cellblock approve "
        "--all` to approve without asking), then restart the client"
    )
    return 1 if failed else 0


def _install(plan: Plan, config_path: Path) -> list[str]:
    """Install the packages of the servers wrap added; the names of those that failed."""
    config = parse_config(plan.new_config_text, str(config_path))
    failed = []
    for moved in plan.moved:
        server = config.servers[moved.starter.name]
        if moved.reused or not isinstance(server, LocalServer) or server.install is None:
            continue
        try:
            packages.install(moved.starter.name, server, config.install_limits_of(moved.starter.name))
        except JailError as exc:  # packages.InstallError too: the others still install
            say(str(exc))
            failed.append(moved.starter.name)
    return failed
