"""What an `allow_hosts` entry a proposal would add may never be (`check_host`), and the entry an
event's target asks for (`host_entry`).

A host is an entry the egress proxy reads as one host (`policy/hosts.py`, the grammar the proxy
uses): a host name of letters, digits and hyphens with at least two labels (punycode that
decodes), or one IP address; never a wildcard (`*.`), a range (`10.0.0.0/8`, `0.0.0.0/0`), a port
smuggled into a name, a spelling other than the proxy's own, nor an address that is this machine
or no one's (loopback, `0.0.0.0`, link-local with the cloud metadata service, multicast, reserved),
nor a cloud's metadata service on an address of its own (`hosts.METADATA`: AWS's IPv6 one, ...).
"""

from __future__ import annotations

import ipaddress
import re

from cellblock.gateway.scan.gate import NotGrantable, as_shown
from cellblock.policy.hosts import HostKind, HostRule, is_ip, no_host, normalize_host, parse_rule

__all__ = ["check_host", "host_entry"]

_LDH = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def host_entry(target: str, lookup: bool) -> str:
    """The `allow_hosts` entry an event's target asks for, as the proxy spells it: for a lookup
    the name alone, for a connection `host:port`.

    Raises:
        NotGrantable: that is not one host (see `check_host`).
    """
    if lookup:
        host, port = target, None
    else:
        host, _, number = target.rpartition(":")
        if not number.isascii() or not number.isdigit():
            raise NotGrantable(f"{as_shown(target)} is not a host and a port")
        host, port = host.removeprefix("[").removesuffix("]"), int(number)
    try:
        name = normalize_host(host)
    except ValueError as exc:
        raise NotGrantable(f"{as_shown(target)} is not a host name ({exc})") from exc
    if lookup and is_ip(name):
        raise NotGrantable(f"{as_shown(target)} is an address looked up as a name")
    spelled = f"[{name}]" if ":" in name else name
    entry = spelled if port is None else f"{spelled}:{port}"
    check_host(entry)
    return entry


def check_host(entry: str) -> None:
    """`entry` may be added to `allow_hosts`: the proxy reads it as one host, spelled its way.

    Raises:
        NotGrantable: it may not, and why.
    """
    try:
        rule = parse_rule(entry)
    except ValueError as exc:
        raise NotGrantable(f"{as_shown(entry)} is not a host ({exc})") from exc
    if rule.kind is HostKind.SUFFIX:
        raise NotGrantable(f"{as_shown(entry)} is a wildcard: the proxy would let through every name under it")
    if rule.kind is HostKind.NETWORK:
        raise NotGrantable(f"{as_shown(entry)} is an IP range: the proxy would let through every address in it")
    expected = _spelling(rule)
    if entry != expected:
        raise NotGrantable(f"{as_shown(entry)} is not spelled as the proxy reads it (got {entry}, expected {expected})")
    if rule.kind is HostKind.ADDRESS:
        _check_address(entry, ipaddress.ip_address(rule.host))
        return
    labels = rule.host.split(".")
    if len(labels) < 2 or not all(_LDH.fullmatch(label) for label in labels):
        raise NotGrantable(f"{as_shown(entry)} is not a host name (letters, digits and '-', two labels or more)")
    if labels[-1] == "localhost":
        raise NotGrantable(f"{as_shown(entry)} names this machine")
    for label in labels:
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError as exc:
                raise NotGrantable(f"{as_shown(entry)} has a label that is not punycode ({label})") from exc


def _check_address(entry: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    found = no_host(ipaddress.ip_network(address))
    if found is not None:
        raise NotGrantable(f"{as_shown(entry)} is {found[0]}")


def _spelling(rule: HostRule) -> str:
    """How the proxy's own grammar writes `rule`: the normalised host, `:port` when it has one."""
    if rule.port is None:
        return rule.host
    return f"[{rule.host}]:{rule.port}" if ":" in rule.host else f"{rule.host}:{rule.port}"
