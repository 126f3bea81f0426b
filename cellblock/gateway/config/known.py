"""What Cellblock knows of particular servers: the hosts an API client needs, where a server keeps
its data, which ones fetch any URL or change the directories they are given, and what a client's
own keys become.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cellblock.gateway.config.draft import Draft

__all__ = ["CARRIED", "DATA_FILE", "EXTRA_HINTS", "KNOWN_HOSTS", "WORKS_IN", "carry", "data_file", "network_for"]

# Package (or command) name without version -> (what it talks to, the hosts it needs).
KNOWN_HOSTS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "@modelcontextprotocol/server-github": ("the GitHub API", ("api.github.com",)),
    "github-mcp-server": ("the GitHub API", ("api.github.com",)),
    "@modelcontextprotocol/server-gitlab": ("the GitLab API", ("gitlab.com",)),
    "@modelcontextprotocol/server-slack": ("the Slack API", ("slack.com",)),
    "@modelcontextprotocol/server-brave-search": ("the Brave Search API", ("api.search.brave.com",)),
    "@brave/brave-search-mcp-server": ("the Brave Search API", ("api.search.brave.com",)),
    "@modelcontextprotocol/server-google-maps": ("the Google Maps API", ("maps.googleapis.com",)),
    "mcp-server-sentry": ("the Sentry API", ("sentry.io",)),
    "@sentry/mcp-server": ("the Sentry API", ("sentry.io",)),
    "@notionhq/notion-mcp-server": ("the Notion API", ("api.notion.com",)),
}
# An environment variable that points a known package at another instance (self-hosted GitLab).
_HOST_FROM_ENV = {"@modelcontextprotocol/server-gitlab": "GITLAB_API_URL"}
# Servers that fetch whatever URL they are given: their hosts cannot be inferred.
_FETCHERS = frozenset({"mcp-server-fetch", "@modelcontextprotocol/server-fetch"})
# Servers that keep their data beside their own code unless a variable says where: an installed
# package is read-only, so the data goes to a directory of the user's (variable, default file).
DATA_FILE = {"@modelcontextprotocol/server-memory": ("MEMORY_FILE_PATH", "~/.local/share/mcp-memory/memory.jsonl")}
# Servers that change the directories their arguments name (besides any filesystem server): the
# git server commits to its --repository
WORKS_IN = frozenset({"mcp-server-git"})
# Client keys with a hint on how to get the same in Cellblock.
EXTRA_HINTS = {
    "autoApprove": "to allow tools without asking, add them under tools.rules as allow",
    "alwaysAllow": "to allow tools without asking, add them under tools.rules as allow",
    "disabled": "Cellblock starts every server it lists; remove it, or set start: lazy",
    "timeout": "set timeout: SECONDS on the server",
    "bearer_token_env_var": "now auth: bearer, see above",
    "startup_timeout_sec": "Cellblock has no per-server start timeout",
    "startup_timeout_ms": "Cellblock has no per-server start timeout",
    "enabled": "Cellblock runs every server it lists",
    "enabled_tools": "to keep tools from the model, deny the others under tools.rules",
    "disabled_tools": "to keep these tools from the model, deny them under tools.rules",
    "disabledTools": "to keep these tools from the model, deny them under tools.rules",
    "includeTools": "to keep tools from the model, deny the others under tools.rules",
    "excludeTools": "to keep these tools from the model, deny them under tools.rules",
    "trust": "Cellblock asks per its policy: write tools.rules to allow without asking",
    "envFile": "Cellblock reads no env file: put the variables under env, secrets under secrets:",
    "dev": "VS Code's watch-and-debug mode; Cellblock restarts a server only when it exits",
    "oauth": "set auth: {type: oauth} on the server, then `cellblock auth login NAME`",
    "authProviderType": "set auth: {type: oauth} on the server, then `cellblock auth login NAME`",
    "description": "only the client shows it",
}
# A client's own per-server key with an equivalent in Cellblock: (client kind, key) -> (Cellblock
# key, the factor to its unit). Gemini CLI's `timeout` is in milliseconds (docs/tools/mcp-server.md);
# Codex's `tool_timeout_sec` bounds each call (codex-rs config, mcp_types.rs), as `timeout` does.
CARRIED: Mapping[tuple[str, str], tuple[str, float]] = {
    ("gemini", "timeout"): ("timeout", 0.001),
    ("codex", "tool_timeout_sec"): ("timeout", 1.0),
}
_MAX_TIMEOUT = 3600.0  # the largest `timeout` the config takes (model.Seconds)


def network_for(draft: Draft, package: str, env: Mapping[str, str], *, node: bool) -> dict[str, Any]:
    """`network: none`, or an allowlist for a known API client, with the note saying which and why."""
    if package in _FETCHERS:
        draft.notes.append(
            f"network: none, so {package} can fetch nothing until you choose: network: allowlist with "
            "allow_hosts: [the hosts it may fetch] (only those, checked by Cellblock's proxy), or network: open "
            "(any host, as it ran before)"
        )
        return {"network": "none"}
    known = KNOWN_HOSTS.get(package)
    if known is None:
        draft.notes.append("no network: if it needs one, set jail.network")
        return {"network": "none"}
    what, hosts = known
    override = env.get(_HOST_FROM_ENV.get(package, ""), "")
    host = urlsplit(override).hostname if override.startswith(("http://", "https://")) else None
    if host:
        hosts, what = (host,), f"{what} at {host} ({_HOST_FROM_ENV[package]})"
    draft.notes.append(f"network: allowlist {', '.join(hosts)} (inferred: {package} talks to {what})")
    if node:
        draft.notes.append("the allowlist reaches Node's fetch from Node 24 on; older Node fails closed")
    return {"network": "allowlist", "allow_hosts": list(hosts)}


def data_file(draft: Draft, package: str, env: dict[str, str]) -> None:
    """A writable directory for the data file of a server that would keep it beside its code."""
    variable, default = DATA_FILE[package]
    given = env.get(variable)
    if given is not None and not posixpath.isabs(draft.expand(given)):
        draft.notes.append(f"{variable} is relative, so {package} writes beside its code: make it absolute")
        return
    path = draft.expand(given or default)
    env[variable] = path
    directory = posixpath.dirname(path)
    draft.share(directory, writable=True)
    if not os.path.isdir(directory):
        draft.make.append(directory)
    draft.notes.append(f"{package} keeps its data in {path} ({variable}), so {directory} is writable")


def carry(draft: Draft, client: str, key: str, value: Any) -> bool:
    """Carry client key `key` into the server's config when Cellblock has its equivalent (with a
    note); False when it has none, or the value is not a positive number."""
    known = CARRIED.get((client, key))
    if known is None or isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return False
    target, factor = known
    seconds = min(value * factor, _MAX_TIMEOUT)
    draft.body[target] = int(seconds) if seconds == int(seconds) else seconds
    capped = " (the most Cellblock takes)" if value * factor > _MAX_TIMEOUT else ""
    draft.notes.append(f"carried over: {key}={value} as {target}: {draft.body[target]}{capped}")
    return True
