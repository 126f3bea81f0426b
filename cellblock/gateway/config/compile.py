"""Turning a server's `tools:`, `prompts:` and `resources:` config into the pure policies the gateway asks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cellblock.gateway.config.model import Config, LocalServer, RuleConfig
from cellblock.gateway.namespacing import assign_names, voiced
from cellblock.gateway.state import lock_path
from cellblock.policy.lint import JailView, lint_items, lint_policy
from cellblock.policy.lock import LockError, load_lock
from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision

__all__ = ["lint_config", "policy_for"]


def policy_for(config: Config, server: str, kind: str = "tool") -> Policy:
    """The policy of `server` for its tools (or "prompt", "resource"): its own section, else the
    one in `defaults`, else ask for everything (`Config.rules_of` says how the defaults fall back).

    Raises:
        ValueError: a rule cannot be compiled (the config's own validation catches this first).
    """
    default, raw = config.rules_of(server, kind)
    rules = tuple(
        parse_rule_entry(pattern, body.model_dump() if isinstance(body, RuleConfig) else body, kind)
        for pattern, body in raw.items()
    )
    entry = config.servers[server]
    cwd = entry.cwd if isinstance(entry, LocalServer) else None
    read_only = config.tools_of(server).read_only if kind == "tool" else "ask"
    home = os.path.expanduser("~")
    return Policy(default=Decision(default), rules=rules, cwd=cwd, home=home, kind=kind, read_only=read_only)


def lint_config(config: Config, state: Path) -> list[str]:
    """Lint findings for every server, against its jail and the catalog its lock approved, the
    exposed names of those catalogs that collide (one of each pair gets a hashed name) or read as
    Cellblock's, and their titles that read as Cellblock's (clients are shown them without)."""
    findings: list[str] = []
    items: dict[str, list[tuple[str, str]]] = {"tool": [], "prompt": []}
    home = os.path.expanduser("~")
    for name, entry in sorted(config.servers.items()):
        jail = entry.jail if isinstance(entry, LocalServer) else False
        view = (
            JailView(tuple(jail.read_only), tuple(jail.read_write), jail.network, tuple(jail.allow_hosts))
            if jail
            else None
        )
        catalog = None
        try:
            lock = load_lock(lock_path(state, name))
        except LockError as exc:
            findings.append(str(exc))
            lock = None
        if lock is not None:
            for key, item in lock.snapshot.items():
                kind, _, original = key.partition(":")
                if kind in items:
                    items[kind].append((name, original))
                findings += [
                    f"server '{name}': the {what} of {kind} {original!r} reads as Cellblock's; clients are "
                    f"shown the {kind} without it"
                    for what in (voiced(kind, item) if isinstance(item, Mapping) else ())
                ]
            catalog = {
                key.removeprefix("tool:"): (item.get("annotations") or {}).get("readOnlyHint")
                for key, item in lock.snapshot.items()
                if key.startswith("tool:")
            }
        if config.tools_of(name).read_only == "review" and not config.lock_of(name).enabled:
            findings.append(
                f"server '{name}': tools.read_only: review does nothing with lock: {{enabled: false}} (a grant is "
                "bound to the definition the lock approves): every tool asks; turn the lock on, or remove it"
            )
        cwd = entry.cwd if isinstance(entry, LocalServer) else None
        findings += lint_policy(name, policy_for(config, name).rules, view, home, catalog, cwd)
        for kind in ("prompt", "resource"):
            names = _locked_names(lock.snapshot, kind) if lock is not None else None
            findings += lint_items(name, kind, policy_for(config, name, kind).rules, names)
    for kind, pairs in items.items():
        table = assign_names(
            pairs, separator=config.names.separator, max_length=config.names.max_length, bare=config.unprefixed()
        )
        findings += [f"{kind} name collision: {collision}" for collision in table.collisions]
    return findings


def _locked_names(snapshot: Mapping[str, Any], kind: str) -> list[str]:
    """The prompt names, or the resource URIs and template texts, of a locked catalog."""
    if kind == "prompt":
        return [key.removeprefix("prompt:") for key in snapshot if key.startswith("prompt:")]
    return [key.partition(":")[2] for key in snapshot if key.startswith(("resource:", "template:"))]
