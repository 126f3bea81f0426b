"""Changing one server's `jail:` in cellblock.yaml in place: the rest of the file, comments
included, is kept. `cellblock scan --apply` writes a proposed jail this way, and `cellblock
allow-host` (or "always" to a `network: ask` question) adds a host to `allow_hosts`.

The edited text is loaded before it is written (a change that does not load is not written),
written atomically with the file's own mode, and made under a lock in the state directory, so a
gateway's "always" and a command at the same moment both keep their change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import Config, ConfigError, JailConfig, LocalServer
from cellblock.gateway.state import atomic_write_text, locked, state_dir
from cellblock.policy.hosts import HostKind, host_allowed, no_host, parse_rule

__all__ = ["ConfigEditError", "allow_host", "jail_span", "raw_jail", "write_jail"]


class ConfigEditError(ConfigError):
    """The config cannot be changed in place; the message says what to edit by hand."""


def raw_jail(source: Path, name: str) -> dict[str, Any]:
    """Server `name`'s `jail:` mapping as the file spells it ({} when it has none)."""
    raw = yaml.safe_load(source.read_text()) or {}
    server = (raw.get("servers") or {}).get(name) or {}
    jail = server.get("jail")
    return dict(jail) if isinstance(jail, dict) else {}


def jail_span(lines: list[str], name: str) -> tuple[int, int, str, int]:
    """Where the server's `jail:` key is (start, end line) and its indentation; start == end when
    it has none (insert there). The last value: the server's key line.

    Raises:
        ConfigEditError: the servers mapping or the server cannot be found as a block.
    """
    top = next((i for i, line in enumerate(lines) if re.match(r"servers\s*:\s*(#.*)?$", line)), None)
    if top is None:
        raise ConfigEditError("the config's servers: is not a block mapping; edit its jail by hand")
    head = next(
        (
            i
            for i in range(top + 1, len(lines))
            if re.match(rf"\s+['\"]?{re.escape(name)}['\"]?\s*:\s*(#.*)?$", lines[i])
        ),
        None,
    )
    if head is None:
        raise ConfigEditError(f"server '{name}' is not written as a block in the config; edit its jail by hand")
    level = len(lines[head]) - len(lines[head].lstrip())

    def indent(i: int) -> int:
        return len(lines[i]) - len(lines[i].lstrip())

    def blank(i: int) -> bool:
        return not lines[i].strip() or lines[i].lstrip().startswith("#")

    end = head + 1
    while end < len(lines) and (blank(end) or indent(end) > level):
        end += 1
    while end - 1 > head and blank(end - 1):
        end -= 1
    children = [i for i in range(head + 1, end) if not blank(i)]
    child = indent(children[0]) if children else level + 2
    for i in children:
        if indent(i) == child and re.match(r"\s*jail\s*:", lines[i]):
            stop = i + 1
            while stop < end and (blank(stop) or indent(stop) > child):
                stop += 1
            while stop - 1 > i and blank(stop - 1):
                stop -= 1
            return i, stop, " " * child, head
    return end, end, " " * child, head


def write_jail(
    source: Path, name: str, jail: dict[str, Any], check: Callable[[Config, JailConfig], None] | None = None
) -> str:
    """Write `jail` as server `name`'s `jail:` key into the config at `source`, once the edited
    config loads and `check` (given it and the server's new jail) passes; return the new text.

    Raises:
        ConfigEditError: the config cannot be edited in place, or the edited config does not load.
        StateWriteError: it could not be written.
        Exception: whatever `check` raises (nothing was written).
    """
    text = source.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    start, end, indent, _ = jail_span(lines, name)
    body = yaml.safe_dump({"jail": jail}, sort_keys=False, default_flow_style=False)
    new = [f"{indent}{line}\n" for line in body.splitlines()]
    result = "".join([*lines[:start], *new, *lines[end:]])
    try:
        edited = parse_config(result, str(source))
    except (ConfigError, ValueError) as exc:
        raise ConfigEditError(f"the changed jail of '{name}' does not load, so it was not written: {exc}") from exc
    server = edited.servers.get(name)
    if not isinstance(server, LocalServer) or server.jail is False:
        raise ConfigEditError(f"server '{name}' has no jail in the edited config, so it was not written")
    if check is not None:
        check(edited, server.jail)
    atomic_write_text(source, result, mode=source.stat().st_mode & 0o777)
    return result


def allow_host(source: Path, name: str, entry: str, *, loopback: bool = False) -> str:
    """Add `entry` ("host:port", or any `allow_hosts` entry) to server `name`'s `allow_hosts` in
    the config at `source` (a link is changed where it points); `network: none` becomes
    `allowlist`. What was done, as a sentence. An address or range that is or holds a cloud's
    metadata service, or no one's, is never added; this machine's (loopback) only with `loopback`
    (the scan gate's rule, `hosts.no_host`).

    Raises:
        ConfigEditError: the config does not load, no such local jailed server, `network: open`
            (nothing to allow), the entry is not valid or is such an address, or the config cannot
            be edited in place.
        StateWriteError: it could not be written, or another process holds the lock.
    """
    try:
        rule = parse_rule(entry)
    except ValueError as exc:
        raise ConfigEditError(f"'{entry}' is not an allow_hosts entry: {exc}") from exc
    refused = no_host(rule.network) if rule.network is not None else None
    if refused is not None and not (refused[1] and loopback):
        what, only_loopback = refused
        how = (
            "pass --loopback if you mean this server to reach a service on this machine"
            if only_loopback
            else "no server is ever let reach it"
        )
        raise ConfigEditError(f"'{entry}' is or holds {what}: not added; {how}")
    source = source.resolve()
    with locked(state_dir() / "config-edit"):
        try:
            config = parse_config(source.read_text(encoding="utf-8"), str(source))
        except (OSError, ConfigError) as exc:  # changed by hand meanwhile, or gone
            raise ConfigEditError(f"{source} cannot be read as a config now, so nothing was added: {exc}") from exc
        server = config.servers.get(name)
        if not isinstance(server, LocalServer):
            raise ConfigEditError(f"'{name}' is not a local server in {source}")
        if server.jail is False or server.jail.network == "open":
            what = "jail: false" if server.jail is False else "network: open"
            raise ConfigEditError(f"server '{name}' has {what}: it reaches every host already; nothing to allow")
        jail = raw_jail(source, name)
        network = server.jail.network
        listed = [parse_rule(h) for h in server.jail.allow_hosts]
        covered = rule.kind in (HostKind.NAME, HostKind.ADDRESS) and all(
            host_allowed(listed, rule.host, p) for p in rule.ports
        )
        if network != "none" and (covered or rule in listed):
            return f"'{name}' already allows {entry} (network: {network})"
        jail["network"] = "allowlist" if network == "none" else network
        jail["allow_hosts"] = [*(jail.get("allow_hosts") or []), entry]
        write_jail(source, name, jail)
    became = " and its network: none became allowlist (restart the client to start it so)" if network == "none" else ""
    return f"added {entry} to the allow_hosts of '{name}' in {source}{became}"
