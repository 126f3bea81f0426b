"""Host allowlist rules: parsing, normalisation, matching, and the resolved-address check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellblock.policy.hosts import (
    HostKind,
    HostRule,
    address_allowed,
    host_allowed,
    is_special_address,
    normalize_host,
    parse_rule,
)

# -- parse_rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "host", "port"),
    [
        ("api.github.com", HostKind.NAME, "api.github.com", None),
        ("API.GitHub.com.", HostKind.NAME, "api.github.com", None),
        ("*.example.com", HostKind.SUFFIX, "example.com", None),
        ("*.co.uk", HostKind.SUFFIX, "co.uk", None),
        ("h:8443", HostKind.NAME, "h", 8443),
        ("bücher.de:443", HostKind.NAME, "xn--bcher-kva.de", 443),
        ("127.0.0.1:8080", HostKind.ADDRESS, "127.0.0.1", 8080),
        ("[::1]:9000", HostKind.ADDRESS, "::1", 9000),
        ("[0:0:0:0:0:0:0:1]", HostKind.ADDRESS, "::1", None),
        ("::1", HostKind.ADDRESS, "::1", None),
        ("10.0.0.0/8", HostKind.NETWORK, "10.0.0.0/8", None),
        ("10.0.0.0/8:443", HostKind.NETWORK, "10.0.0.0/8", 443),
        ("[fd00::/8]:443", HostKind.NETWORK, "fd00::/8", 443),
        ("fd00::/8", HostKind.NETWORK, "fd00::/8", None),
    ],
)
def test_valid_entries_parse_to_their_canonical_rule(text: str, kind: HostKind, host: str, port: int | None) -> None:
    rule = parse_rule(text)
    assert (rule.kind, rule.host, rule.port) == (kind, host, port)
    assert rule.text == text


def test_an_entry_without_a_port_allows_80_and_443_only() -> None:
    rule = parse_rule("api.github.com")
    assert rule.ports == (80, 443)
    assert parse_rule("h:8443").ports == (8443,)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("*", "every host"),
        ("*.com", "too wide"),
        ("*.xn--p1ai", "too wide"),
        ("*.", "empty"),
        ("*.1.2.3.4", "IP address"),
        ("*.[::1]", "IP address"),
        ("*example.com", "leading '*.'"),
        ("a.*.example.com", "leading '*.'"),
        ("*.*.example.com", "leading '*.'"),
        ("api.github.com ", "whitespace"),
        (" api.github.com", "whitespace"),
        ("api github.com", "whitespace"),
        ("api.github.com\t", "whitespace"),
        ("https://api.github.com", "scheme"),
        ("http://api.github.com/", "scheme"),
        ("api.github.com/repos", "path"),
        ("api.github.com/8", "CIDR"),
        ("10.0.0.1/8", "host bits"),
        ("10.0.0.0/33", "CIDR"),
        ("user@api.github.com", "userinfo"),
        ("api.github.com:", "port"),
        ("api.github.com:0", "port"),
        ("api.github.com:65536", "port"),
        ("api.github.com:https", "port"),
        ("[::1", "unclosed"),
        ("[::1]x", "':port'"),
        ("[127.0.0.1]", "IPv6"),
        ("127.1", "IPv4"),
        ("0x7f.0.0.1", "IPv4"),
        ("0177.0.0.1", "IPv4"),
        ("2130706433", "IPv4"),
        ("fe80::1%eth0", "zone"),
        ("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com", "canonical form"),
        ("-api.github.com", "DNS label"),
        ("api..github.com", "empty label"),
    ],
)
def test_bad_entries_are_refused_with_a_clear_message(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_rule(text)
    assert fragment in str(info.value)


# -- normalize_host --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("example.com", "example.com"),
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("user@example.com", "example.com"),
        ("user:secret@Example.com.", "example.com"),
        ("example.com@evil.com", "evil.com"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("BÜCHER.de", "xn--bcher-kva.de"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        # Cyrillic er, a, u look like Latin p, a, y but encode to another name: no match with paypal.com
        ("\u0440\u0430\u0443\u0440\u0430l.com", "xn--l-7sba6dbr.com"),
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[2001:DB8::0:1]", "2001:db8::1"),
        ("123.example.com", "123.example.com"),
        ("_acme.example.com", "_acme.example.com"),
    ],
)
def test_hosts_normalise_to_one_canonical_form(host: str, expected: str) -> None:
    assert normalize_host(host) == expected
    assert normalize_host(expected) == expected


@pytest.mark.parametrize(
    "host",
    [
        "",
        ".",
        "example.com..",
        "example..com",
        "exa mple.com",
        "ex%61mple.com",
        "evil.com/x",
        "evil.com\x00.example.com",
        "evil.com\r\n.example.com",
        "example.com:443",  # the port belongs to the caller
        # confusable / ambiguous Unicode: IDNA 2003 maps these, IDNA 2008 parsers do not
        "\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com",  # fullwidth letters
        "example。com",  # ideographic full stop
        "straße.de",  # 'ß' -> 'ss' in IDNA 2003, 'xn--strae-oqa' in IDNA 2008
        "a\u200bb.com",  # zero-width space vanishes
        "\uff11\uff12\uff17.\uff10.\uff10.\uff11",  # fullwidth digits would become 127.0.0.1
        "\uff41\uff0fb.com",  # fullwidth solidus becomes '/'
        # IPv4 written any other way than a plain dotted quad
        "127.1",
        "127.0.1",
        "0x7f.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "2130706433",
        "0177.0.0.1",
        "127.0.0.01",
        "1.2.3.4.5",
        "example.0x",
        "256.0.0.1",
        # IPv6 oddities
        "[127.0.0.1]",
        "[::1",
        "::1]",
        "fe80::1%eth0",
        "[fe80::1%25eth0]",
        "[::1]:443",
        "-evil.com",
        "evil-.com",
        "a" * 64 + ".com",
        ".".join(["a" * 63] * 4) + ".com",
    ],
)
def test_hostile_or_ambiguous_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValueError):
        normalize_host(host)


# -- host_allowed ----------------------------------------------------------------------------

RULES = tuple(
    parse_rule(t)
    for t in ("example.com", "*.example.org", "api.test:8443", "127.0.0.1:8080", "[::1]:9000", "10.0.0.0/8")
)


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        # honest controls first
        ("example.com", 443, "example.com"),
        ("example.com", 80, "example.com"),
        ("EXAMPLE.com.", 443, "example.com"),
        ("user@example.com", 443, "example.com"),
        ("a.example.org", 443, "*.example.org"),
        ("a.b.example.org", 80, "*.example.org"),
        ("api.test", 8443, "api.test:8443"),
        ("127.0.0.1", 8080, "127.0.0.1:8080"),
        ("[::1]", 9000, "[::1]:9000"),
        ("::1", 9000, "[::1]:9000"),
        ("0:0:0:0:0:0:0:1", 9000, "[::1]:9000"),
        ("10.1.2.3", 443, "10.0.0.0/8"),
        ("[::ffff:10.1.2.3]", 443, "10.0.0.0/8"),
        # attacks
        ("example.com", 8443, None),
        ("example.com", 22, None),
        ("evil.com", 443, None),
        ("user@evil.com", 443, None),
        ("example.com@evil.com", 443, None),
        ("example.com.evil.com", 443, None),
        ("evil.com.example.com", 443, None),  # not listed: only the exact name is
        ("evilexample.com", 443, None),
        ("example.org", 443, None),  # a suffix rule does not cover the apex
        ("example.org.evil.com", 443, None),
        ("aexample.org", 443, None),
        ("a.example.org", 8443, None),
        ("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com", 443, None),
        ("\u0435xample.com", 443, None),  # Cyrillic ie looks like Latin e
        ("example.com\x00", 443, None),
        ("api.test", 443, None),
        ("127.0.0.1", 80, None),
        ("127.1", 8080, None),
        ("0x7f000001", 8080, None),
        ("2130706433", 8080, None),
        ("0177.0.0.1", 8080, None),
        ("127.0.0.2", 8080, None),
        ("localhost", 8080, None),
        ("::1", 443, None),
        ("[::2]", 9000, None),
        ("10.1.2.3", 22, None),
        ("11.0.0.1", 443, None),
    ],
)
def test_host_allowed_matches_only_what_a_rule_names(host: str, port: int, expected: str | None) -> None:
    rule = host_allowed(RULES, host, port)
    assert (rule.text if rule else None) == expected


def test_no_rules_allow_nothing() -> None:
    assert host_allowed((), "example.com", 443) is None


# -- address_allowed -------------------------------------------------------------------------

NAME = parse_rule("example.com")


def test_a_listed_name_may_reach_a_public_address() -> None:
    assert address_allowed([NAME], NAME, "93.184.216.34")
    assert address_allowed([NAME], NAME, "2606:2800:220:1:248:1893:25c8:1946")


@pytest.mark.parametrize(
    "ip",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "0.0.0.0",
        "::",
        "10.0.0.5",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "fd00:ec2::254",  # AWS's, over IPv6
        "100.100.100.200",  # Alibaba's
        "168.63.129.16",  # Azure's WireServer: an address that reads as public
        "::ffff:168.63.129.16",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "fec0::1",
        "224.0.0.1",
        "ff02::1",
        "100.64.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "not-an-ip",
        "",
    ],
)
def test_a_listed_name_may_not_reach_special_addresses(ip: str) -> None:
    assert is_special_address(ip)
    assert not address_allowed([NAME], NAME, ip)


def test_an_ip_rule_opens_its_special_address_for_a_listed_name() -> None:
    loopback = parse_rule("127.0.0.1:8080")
    rules = [NAME, loopback]
    assert address_allowed(rules, NAME, "127.0.0.1")
    assert address_allowed(rules, NAME, "127.0.0.1", 8080)
    assert not address_allowed(rules, NAME, "127.0.0.1", 443)
    assert not address_allowed(rules, NAME, "127.0.0.2", 8080)


def test_an_ip_rule_leads_only_to_the_addresses_it_covers() -> None:
    network = parse_rule("10.0.0.0/8")
    assert address_allowed([network], network, "10.1.2.3")
    assert not address_allowed([network], network, "11.0.0.1")
    assert not address_allowed([network], network, "93.184.216.34")


def test_rules_are_frozen() -> None:
    rule = parse_rule("example.com")
    assert isinstance(rule, HostRule)
    with pytest.raises(AttributeError):
        rule.host = "evil.com"  # type: ignore[misc]  # checking that assignment fails at runtime


# -- property: a suffix rule stays inside its suffix -----------------------------------------

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
TLD = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)
SUFFIX = st.tuples(st.lists(LABEL, min_size=1, max_size=2), TLD).map(lambda t: ".".join([*t[0], t[1]]))
NAMEISH = st.lists(
    st.one_of(LABEL, st.sampled_from(["", "@", ":", "%2e", "\u3002", "\uff45", "xn--", ".", "*", " "])), max_size=6
).map(".".join)


@given(
    suffix=SUFFIX,
    host=st.one_of(st.text(max_size=40), NAMEISH),
    prefix=st.one_of(st.just(""), NAMEISH),
    joiner=st.sampled_from(["", ".", "@", "-", ".."]),
)
def test_a_suffix_rule_never_matches_a_host_outside_the_suffix(
    suffix: str, host: str, prefix: str, joiner: str
) -> None:
    rule = parse_rule("*." + suffix)
    for candidate in (host, prefix + joiner + suffix, suffix + joiner + prefix, host + joiner + suffix):
        if host_allowed([rule], candidate, 443) is not None:
            canonical = normalize_host(candidate)
            assert canonical.endswith("." + suffix)
            assert canonical != suffix


@given(suffix=SUFFIX, label=LABEL)
def test_a_suffix_rule_matches_every_subdomain_and_not_the_apex(suffix: str, label: str) -> None:
    rule = parse_rule("*." + suffix)
    assert host_allowed([rule], f"{label}.{suffix}", 443) is rule
    assert host_allowed([rule], f"{label}.{label}.{suffix}.", 80) is rule
    assert host_allowed([rule], suffix, 443) is None
    assert host_allowed([rule], f"{label}{suffix}", 443) is None
