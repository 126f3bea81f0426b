"""Host allowlist rules: parse `allow_hosts` entries, normalise hosts, and match them.

Pure: stdlib only. Used by the egress proxy (`sandbox/egress.py`) for `network: allowlist`, and
meant for the `hosts:` argument constraint too, so both layers agree on what a host is.

Entry forms (`parse_rule`):

    api.github.com          exact name, ports 80 and 443
    *.example.com           any subdomain of example.com (not example.com itself), ports 80 and 443
    h.example.com:8443      exact name, that port only
    127.0.0.1:8080          IPv4 literal (no port: 80 and 443)
    [::1]:9000  / ::1       IPv6 literal, bracketed when a port follows
    10.0.0.0/8  / [fd00::/8]:443
                            CIDR block (host bits must be zero)

Normalisation is strict on purpose: anything two parsers could read differently (IPv4 written in
hex, octal or fewer than four parts; Unicode that IDNA 2003 and IDNA 2008 map differently;
IPv6 zone ids) is a `ValueError`, never a guess.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_PORTS",
    "METADATA",
    "HostKind",
    "HostRule",
    "address_allowed",
    "embedded_ipv4",
    "host_allowed",
    "is_ip",
    "is_loopback",
    "is_special_address",
    "no_host",
    "normalize_host",
    "parse_rule",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# An entry without a port allows the two ports a web client uses; anything else must be named.
DEFAULT_PORTS: tuple[int, ...] = (80, 443)

_MAX_NAME = 253  # RFC 1035 limit on a whole name, in its ASCII (A-label) form
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")
_HEX_NUMBER = re.compile(r"0[xX][0-9a-fA-F]*")

# NAT64 well-known prefix: the low 32 bits are an IPv4 address the translator will reach.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Where a cloud answers a machine about itself (its credentials among it) on an address of its own,
# besides link-local 169.254.169.254: AWS's and Google's IPv6 metadata, Alibaba's, Azure's WireServer
# (an address that reads as public). Special: a listed name never leads there.
METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("fd00:ec2::254", "fd20:ce::254", "100.100.100.200", "168.63.129.16")
)

# Addresses that are this machine or no one's: never one host to allow (`no_host`).
_NO_HOST = (
    ("is_loopback", "this machine (loopback)"),
    ("is_unspecified", "the unspecified address, which reaches this machine"),
    ("is_link_local", "link-local (where the cloud's metadata service answers)"),
    ("is_multicast", "multicast"),
    ("is_reserved", "reserved"),
)
# What a range is looked into for besides its ends: the metadata services and loopback.
_WITHIN = (*METADATA, *map(ipaddress.ip_address, ("169.254.169.254", "127.0.0.1", "::1")))


class HostKind(StrEnum):
    NAME = "name"  # exact DNS name
    SUFFIX = "suffix"  # "*.example.com": strict subdomains of `host`
    ADDRESS = "address"  # one IP literal
    NETWORK = "network"  # a CIDR block


@dataclass(frozen=True, slots=True)
class HostRule:
    """One parsed `allow_hosts` entry.

    `host` is the normalised name (for SUFFIX: without the leading `*.`), or the canonical address
    or network text. `network` is set for ADDRESS (a /32 or /128) and NETWORK. `port` None means
    `DEFAULT_PORTS`.
    """

    text: str
    kind: HostKind
    host: str
    port: int | None = None
    network: IPNetwork | None = None

    @property
    def ports(self) -> tuple[int, ...]:
        return DEFAULT_PORTS if self.port is None else (self.port,)

    @property
    def is_ip(self) -> bool:
        """True for ADDRESS and NETWORK rules: the only rules that may open special ranges."""
        return self.network is not None

    def allows_port(self, port: int) -> bool:
        return port in self.ports

    def matches_host(self, host: str) -> bool:
        """Whether the already-normalised `host` is this rule's host (ports not considered)."""
        if self.kind is HostKind.NAME:
            return host == self.host
        if self.kind is HostKind.SUFFIX:
            return host.endswith("." + self.host)
        return self.covers(host)

    def covers(self, ip: str | IPAddress) -> bool:
        """Whether this IP rule covers the address `ip` (always False for name rules)."""
        if self.network is None:
            return False
        try:
            address = _unmap(ip if not isinstance(ip, str) else ipaddress.ip_address(ip))
        except ValueError:
            return False
        return address.version == self.network.version and address in self.network

    def __str__(self) -> str:
        return self.text


def parse_rule(text: str) -> HostRule:
    """Parse one `allow_hosts` entry.

    Raises:
        ValueError: the entry is empty, has spaces, a scheme, a path or a bad port, is a wildcard
            wider than one registrable name (`*`, `*.com`), or its host is not a valid name or IP.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("allow_hosts entry is empty; write a host such as 'api.github.com'")
    if any(c.isspace() for c in text):
        raise ValueError(f"allow_hosts entry {text!r} contains whitespace; write the host alone")
    if "://" in text:
        raise ValueError(f"allow_hosts entry {text!r} has a scheme; write only the host (and ':port')")
    if "@" in text:
        raise ValueError(f"allow_hosts entry {text!r} has userinfo ('@'); write only the host")

    host_text, port = _split_rule_port(text)

    if "/" in host_text:
        return _parse_network(text, host_text, port)

    if host_text == "*":
        raise ValueError(f"allow_hosts entry {text!r} would allow every host; list the hosts, or use 'network: open'")
    if host_text.startswith("*"):
        if not host_text.startswith("*.") or "*" in host_text[2:]:
            raise ValueError(f"allow_hosts entry {text!r}: a wildcard is only allowed as a leading '*.'")
        suffix = _normalize_rule_name(text, host_text[2:])
        if is_ip(suffix):
            raise ValueError(f"allow_hosts entry {text!r}: a wildcard cannot apply to an IP address")
        if "." not in suffix:
            raise ValueError(
                f"allow_hosts entry {text!r} is too wide (got a one-label suffix {suffix!r}); "
                f"name a domain, e.g. '*.example.{suffix}'"
            )
        return HostRule(text=text, kind=HostKind.SUFFIX, host=suffix, port=port)
    if "*" in host_text:
        raise ValueError(f"allow_hosts entry {text!r}: a wildcard is only allowed as a leading '*.'")

    host = _normalize_rule_name(text, host_text)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return HostRule(text=text, kind=HostKind.NAME, host=host, port=port)
    network = ipaddress.ip_network(address)
    return HostRule(text=text, kind=HostKind.ADDRESS, host=str(address), port=port, network=network)


def normalize_host(host: str) -> str:
    """Return the canonical form of a host: what is compared against rules and connected to.

    Lowercases, strips userinfo (`user@`), one trailing dot and IPv6 brackets, encodes Unicode
    labels to A-labels (IDNA), and writes IP literals canonically (`::1`, `127.0.0.1`).

    Raises:
        ValueError: not a valid DNS name or IP literal, including IPv4 written any way other than
            four decimal parts without leading zeros, IPv6 zone ids, and Unicode labels whose IDNA
            mapping is not their own lowercase form (fullwidth letters, `ß`, zero-width characters).
    """
    if not isinstance(host, str):
        raise ValueError(f"host must be text (got {type(host).__name__})")
    host = host.rpartition("@")[2]
    if not host:
        raise ValueError("host is empty")

    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")):
            raise ValueError(f"host {host!r} has unbalanced brackets")
        return str(_parse_ipv6(host[1:-1]))
    if ":" in host:
        # an unbracketed IPv6 literal; "name:port" must be split by the caller
        return str(_parse_ipv6(host))

    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError("host is empty")

    labels = [_to_ascii_label(label, host) for label in host.split(".")]
    name = ".".join(labels)
    if len(name) > _MAX_NAME:
        raise ValueError(f"host is longer than {_MAX_NAME} characters (got {len(name)})")

    if _ends_in_number(labels):
        # Everything that a URL parser would read as an IPv4 address must be a plain dotted quad;
        # '127.1', '0x7f.1', '0177.0.0.1' and '2130706433' all mean 127.0.0.1 to someone.
        try:
            return str(ipaddress.IPv4Address(name))
        except ValueError as exc:
            raise ValueError(
                f"host {host!r} looks like an IPv4 address but is not written as four decimal parts "
                f"without leading zeros (e.g. '127.0.0.1')"
            ) from exc
    return name


def host_allowed(rules: Iterable[HostRule], host: str, port: int) -> HostRule | None:
    """Return the first rule that allows `host:port`, or None.

    `host` is normalised first; a host that cannot be normalised matches nothing.
    """
    try:
        canonical = normalize_host(host)
    except ValueError:
        return None
    for rule in rules:
        if rule.allows_port(port) and rule.matches_host(canonical):
            return rule
    return None


def is_special_address(ip: str | IPAddress) -> bool:
    """True for addresses a name rule must not reach: loopback, private, link-local, multicast,
    unspecified, reserved, shared (CGNAT) and other non-global ranges, a cloud's metadata
    service (`METADATA`), including IPv4 embedded
    in IPv6 (mapped, NAT64, 6to4, Teredo) when the embedded address is special. Invalid text
    counts as special.
    """
    try:
        address = ip if not isinstance(ip, str) else ipaddress.ip_address(ip)
    except ValueError:
        return True
    return _is_special_one(address) or any(_is_special_one(e) for e in embedded_ipv4(address))


def embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, NAT64, 6to4, Teredo), which a
    translator or tunnel reaches when it is connected to; none for an IPv4 address."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    embedded: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        embedded.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        embedded.append(address.sixtofour)
    if address.teredo is not None:
        embedded.extend(address.teredo)
    if address in _NAT64:
        embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return embedded


def address_allowed(rules: Iterable[HostRule], rule: HostRule, ip: str, port: int | None = None) -> bool:
    """Whether a connection allowed by `rule` may go to the resolved address `ip`.

    A public address is allowed. A special address (see `is_special_address`) is allowed only if
    some IP rule covers it; when `port` is given that rule must also allow the port. An address
    that does not parse is refused.
    """
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if rule.is_ip and not rule.covers(address):
        # an IP rule matched the literal host, so the only address it may lead to is that one
        return False
    if not is_special_address(address):
        return True
    return any(r.is_ip and r.covers(address) and (port is None or r.allows_port(port)) for r in rules)


# -- helpers ---------------------------------------------------------------------------------


def _split_rule_port(text: str) -> tuple[str, int | None]:
    """Split an entry into its host part and port (None when absent)."""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"allow_hosts entry {text!r} has an unclosed '['")
        rest = text[close + 1 :]
        if not rest:
            return text[: close + 1], None
        if not rest.startswith(":"):
            raise ValueError(f"allow_hosts entry {text!r}: expected ':port' after ']' (got {rest!r})")
        return text[: close + 1], _parse_port(text, rest[1:])
    if text.count(":") > 1:
        # bare IPv6 (or IPv6 CIDR): no port possible without brackets
        return text, None
    head, sep, tail = text.partition(":")
    if not sep:
        return text, None
    return head, _parse_port(text, tail)


def _parse_port(text: str, port: str) -> int:
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"allow_hosts entry {text!r}: port must be a number from 1 to 65535 (got {port!r})")
    return int(port)


def _parse_network(text: str, host_text: str, port: int | None) -> HostRule:
    inner = host_text[1:-1] if host_text.startswith("[") and host_text.endswith("]") else host_text
    if host_text.startswith("[") and "." in inner.split("/")[0] and ":" not in inner:
        raise ValueError(f"allow_hosts entry {text!r}: brackets are only for IPv6")
    address, _, length = inner.partition("/")
    if not length.isascii() or not length.isdigit() or "%" in address:
        raise ValueError(f"allow_hosts entry {text!r} has a path; write only the host (and ':port')")
    try:
        canonical = normalize_host(f"[{address}]" if ":" in address else address)
        network = ipaddress.ip_network(f"{canonical}/{int(length)}", strict=True)
    except ValueError as exc:
        raise ValueError(
            f"allow_hosts entry {text!r} is not a valid CIDR block ({exc}); "
            f"a path is not allowed, and host bits must be zero, e.g. '10.0.0.0/8'"
        ) from exc
    return HostRule(text=text, kind=HostKind.NETWORK, host=str(network), port=port, network=network)


def _normalize_rule_name(text: str, host: str) -> str:
    try:
        return normalize_host(host)
    except ValueError as exc:
        raise ValueError(f"allow_hosts entry {text!r}: {exc}") from exc


def _parse_ipv6(text: str) -> ipaddress.IPv6Address:
    if "%" in text:
        raise ValueError(f"IPv6 zone ids are not allowed (got {text!r})")
    try:
        return ipaddress.IPv6Address(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a valid IPv6 address") from exc


def _to_ascii_label(label: str, host: str) -> str:
    if not label:
        raise ValueError(f"host {host!r} has an empty label")
    if label.isascii():
        ascii_label = label.lower()
    else:
        try:
            encoded = label.encode("idna").decode("ascii")
            decoded = encoded.encode("ascii").decode("idna")
        except UnicodeError as exc:
            raise ValueError(f"host {host!r}: label {label!r} is not valid IDNA ({exc})") from exc
        if not encoded.startswith("xn--") or decoded != label.lower():
            # IDNA 2003 maps this label to something else (fullwidth -> ASCII, 'ß' -> 'ss',
            # zero-width -> nothing); other parsers (IDNA 2008, WHATWG) may not, so refuse it.
            raise ValueError(
                f"host {host!r}: label {label!r} is not in canonical form (IDNA maps it to {encoded!r}); "
                f"write the host as its ASCII or punycode form"
            )
        ascii_label = encoded
    if not _LABEL.fullmatch(ascii_label):
        raise ValueError(
            f"host {host!r}: label {label!r} is not a valid DNS label "
            f"(letters, digits, '-', '_'; 1 to 63 characters; no leading or trailing '-')"
        )
    return ascii_label


def is_loopback(host: str) -> bool:
    """Whether `host` (a normalised name or IP literal) is this machine: `localhost` or a loopback IP."""
    return host == "localhost" or (is_ip(host) and ipaddress.ip_address(host).is_loopback)


def no_host(network: IPNetwork) -> tuple[str, bool] | None:
    """Why `network` (one address: a /32 or /128) is or reaches what is never one host to allow (a
    cloud's metadata service, this machine, no one's), and whether only as loopback (this machine's
    services, which a user may open on purpose); None when it is not. The one copy the scan gate,
    `cellblock allow-host` and the proxy's refusals read."""
    found = [network.network_address, network.broadcast_address, *(a for a in _WITHIN if a in network)]
    for one in (b for a in found for b in (a, *embedded_ipv4(a))):
        if one in METADATA or one == ipaddress.ip_address("169.254.169.254"):
            return "a cloud's metadata service, which hands out credentials", False
        what = next((text for test, text in _NO_HOST if getattr(one, test)), None)
        if what is not None:
            return what, what == _NO_HOST[0][1]
    return None


def is_ip(text: str) -> bool:
    """Whether `text` is an IP address literal (IPv4 or IPv6, no brackets)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _ends_in_number(labels: list[str]) -> bool:
    last = labels[-1]
    return last.isdigit() or bool(_HEX_NUMBER.fullmatch(last))


def _unmap(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_special_one(address: IPAddress) -> bool:
    return (
        address in METADATA
        or address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
        or not address.is_global
    )
