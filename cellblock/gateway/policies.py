"""Turning a server's `tools:` config into the pure policy the call path asks."""

from __future__ import annotations

import os

from cellblock.gateway.config import Config, LocalServer, RuleConfig
from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision

__all__ = ["policy_for"]


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
