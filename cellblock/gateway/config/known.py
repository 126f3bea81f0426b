"""What Cellblock knows of particular servers: the hosts an API client needs, where a server keeps
its data, which ones fetch any URL or change the directories they are given, and what a client's
own keys become. The servers are a table of data, `known_servers.json` beside this module, checked
by `KnownServer` when first read.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import posixpath
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cellblock.gateway.config.draft import Draft
from cellblock.policy.hosts import is_special_address, parse_rule

__all__ = [
    "CARRIED",
    "DATA_FILE",
    "EXTRA_HINTS",
    "KNOWN_HOSTS",
    "WORKS_IN",
    "KnownServer",
    "carry",
    "data_file",
    "install_hosts",
    "install_variables",
    "known_servers",
    "network_for",
    "url_rule",
]

# The table itself is data, shipped in the package: what each server needs is read in its own source.
TABLE = "known_servers.json"


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataFile(_Data):
    variable: str = Field(min_length=1)
    default: str = Field(min_length=1)


class KnownServer(_Data):
    """One server of the table: the hosts it needs at run time (and what they are), a variable
    that points it at another instance, whether it fetches any URL, where it keeps its data,
    whether it changes the directories its arguments name, the hosts its install scripts
    (`install_hosts`, and why) or its own browser command (`browser_hosts`) download from, and
    whether its source opens no connection at all (`needs_no_network`)."""

    talks_to: str = ""
    hosts: tuple[str, ...] = ()
    host_from_env: str | None = None
    fetches_any_url: bool = False
    data_file: DataFile | None = None
    works_in_arguments: bool = False
    install_hosts: tuple[str, ...] = ()
    install_why: str = ""
    browser_hosts: tuple[str, ...] = ()
    needs_no_network: bool = False

    @field_validator("hosts", "install_hosts", "browser_hosts")
    @classmethod
    def _rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            parse_rule(entry)
        return value


class _Table(_Data):
    about: str
    install_variables: dict[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")], str] = {}
    servers: dict[str, KnownServer]


@functools.cache
def _table() -> _Table:
    """The table, read and checked once.

    Raises:
        ValueError: the shipped table is not what `_Table` describes (a broken install of Cellblock).
    """
    text = importlib.resources.files(__package__ or "cellblock.gateway.config").joinpath(TABLE).read_text("utf-8")
    try:
        return _Table.model_validate_json(text)
    except ValidationError as exc:
        raise ValueError(
            f"Cellblock's table of known servers ({TABLE}) is broken, reinstall Cellblock: {exc}"
        ) from None


def known_servers() -> Mapping[str, KnownServer]:
    """The table's servers, by package name (see `_table` for what it raises)."""
    return _table().servers


# Package -> (what it talks to, the hosts it needs), for the API clients of the table.
KNOWN_HOSTS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    name: (known.talks_to, known.hosts) for name, known in known_servers().items() if known.hosts
}
# Servers that keep their data beside their own code unless a variable says where: an installed
# package is read-only, so the data goes to a directory of the user's (variable, default file).
DATA_FILE = {
    name: (known.data_file.variable, known.data_file.default)
    for name, known in known_servers().items()
    if known.data_file is not None
}
# Servers that change the directories their arguments name (besides any filesystem server): the
# git server commits to its --repository
WORKS_IN = frozenset(name for name, known in known_servers().items() if known.works_in_arguments)
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


def network_for(draft: Draft, package: str, env: Mapping[str, str]) -> dict[str, Any]:
    """`network: none` for a server known to need none, an allowlist for a known API client, and
    `ask` for the rest (nobody knows which hosts they need), with the note saying which and why."""
    known = known_servers().get(package)
    if known is not None and known.needs_no_network:
        draft.notes.append(f"network: none ({package} needs no network)")
        return {"network": "none"}
    if known is not None and known.fetches_any_url:
        draft.notes.append(
            f"network: ask: {package} fetches whatever URL it is given, so the first connection to each host "
            "waits while you are asked (once, always, deny); 'always' adds it to allow_hosts. Or network: open "
            "(any host, as it ran before, asking nothing)"
        )
        return {"network": "ask"}
    if known is None or not known.hosts:
        draft.notes.append(
            "network: ask: which hosts it needs is not known, so a connection to any host waits while you are "
            "asked (once, always, deny), and 'always' adds it to allow_hosts; set network: none if it needs none"
        )
        return {"network": "ask"}
    what, hosts = known.talks_to, known.hosts
    override = env.get(known.host_from_env, "") if known.host_from_env else ""
    host = url_rule(override)
    if host:
        hosts, what = (host,), f"{what} at {host} ({known.host_from_env})"
        rule = parse_rule(host)
        if rule.is_ip and is_special_address(rule.host):  # the proxy refuses these unless listed
            what += ", an address of this machine or its network: allowed because your config names it"
    draft.notes.append(f"network: allowlist {', '.join(hosts)} (inferred: {package} talks to {what})")
    return {"network": "allowlist", "allow_hosts": list(hosts)}


def url_rule(url: str) -> str | None:
    """The `allow_hosts` entry for an http(s) URL: its host, with its port when it names one (the
    entry's default is 80 and 443 alone, so `http://10.0.0.5:8080/api` needs `10.0.0.5:8080`); None
    for anything else, or a host no entry can name."""
    if not url.startswith(("http://", "https://")):
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None
    if not host:
        return None
    rule = f"[{host}]" if ":" in host else host
    rule = f"{rule}:{port}" if port is not None else host
    try:
        parse_rule(rule)
    except ValueError:
        return None
    return rule


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


def install_variables(draft: Draft, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(install.hosts, install.env) for the variables of the client's entry `env` that point an
    install script at another download host (puppeteer's download base URL): npx gave its install
    the entry's environment, so the installer gets them too, and may reach their hosts. A note
    names each."""
    hosts: list[str] = []
    given: dict[str, str] = {}
    for variable, why in _table().install_variables.items():
        rule = url_rule(env.get(variable, ""))
        if rule is None:
            continue
        given[variable] = env[variable]
        hosts.append(rule)
        draft.notes.append(
            f"install.hosts: {rule} and install.env: {variable} ({why}); remove both and set "
            "install.scripts: false if it works without"
        )
    return list(dict.fromkeys(hosts)), given


def install_hosts(draft: Draft, package: str) -> list[str]:
    """The hosts `package`'s install scripts download from, as the table knows them, with the note
    saying why; none for a package it does not know."""
    known = known_servers().get(package)
    if known is None or not known.install_hosts:
        return []
    hosts = list(known.install_hosts)
    draft.notes.append(
        f"install.hosts: {', '.join(hosts)} (its install reaches them: {known.install_why}); remove them and set "
        "install.scripts: false if it works without"
    )
    return hosts
