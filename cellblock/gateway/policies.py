"""Turning a server's `tools:` config into the pure policy the call path asks."""

from __future__ import annotations

import os
from pathlib import Path

from cellblock.gateway.config import Config, LocalServer, RuleConfig
from cellblock.gateway.locking import lock_path
from cellblock.gateway.namespacing import assign_names
from cellblock.policy.lint import JailView, lint_policy
from cellblock.policy.lock import LockError, load_lock
from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision

__all__ = ["lint_config", "policy_for"]


def policy_for(config: Config, server: str) -> Policy:
    """The policy of `server`: its own `tools`, else `defaults.tools`, else ask for everything.

    Raises:
        ValueError: a rule cannot be compiled (the config's own validation catches this first).
    """
    tools = config.tools_of(server)
    rules = tuple(
        parse_rule_entry(pattern, body.model_dump() if isinstance(body, RuleConfig) else body)
        for pattern, body in tools.rules.items()
    )
    entry = config.servers[server]
    cwd = entry.cwd if isinstance(entry, LocalServer) else None
    return Policy(default=Decision(tools.default), rules=rules, cwd=cwd, home=os.path.expanduser("~"))


def lint_config(config: Config, state: Path) -> list[str]:
    """Lint findings for every server, against its jail and the catalog its lock approved, and the
    exposed names of those catalogs that collide (one of each pair gets a hashed name)."""
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
            for key in lock.snapshot:
                kind, _, original = key.partition(":")
                if kind in items:
                    items[kind].append((name, original))
            catalog = {
                key.removeprefix("tool:"): (item.get("annotations") or {}).get("readOnlyHint")
                for key, item in lock.snapshot.items()
                if key.startswith("tool:")
            }
        findings += lint_policy(name, policy_for(config, name).rules, view, home, catalog)
    for kind, pairs in items.items():
        table = assign_names(pairs, separator=config.names.separator, max_length=config.names.max_length)
        findings += [f"{kind} name collision: {collision}" for collision in table.collisions]
    return findings
