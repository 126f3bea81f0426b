"""The spellings a resource URI may be read as, and the strictest verdict among them."""

from __future__ import annotations

import pytest

from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision
from cellblock.policy.uris import spellings


@pytest.mark.parametrize(
    ("uri", "read_as"),
    [
        ("note://%73ecret", "note://secret"),
        ("note://%2573ecret", "note://secret"),
        ("doc://private%2Fkey", "doc://private/key"),
        ("NOTE://secret", "note://secret"),
        ("file:///srv/public/../secret/key", "file:///srv/secret/key"),
        ("file:///srv/public/%2e%2e/secret/key", "file:///srv/secret/key"),
        ("file:///srv//secret/./key", "file:///srv/secret/key"),
        ("file://localhost/etc/passwd", "file:///etc/passwd"),
        ("https://Example.COM/a/./b/", "https://example.com/a/b/"),
    ],
)
def test_a_respelled_uri_is_also_judged_as_the_server_reads_it(uri: str, read_as: str) -> None:
    assert spellings(uri) == (uri, read_as)


@pytest.mark.parametrize("uri", ["note://secret", "file:///srv/public/readme", "file:///", "https://example.com/a/"])
def test_a_plain_uri_has_one_spelling(uri: str) -> None:
    assert spellings(uri) == (uri,)


def test_the_strictest_spelling_decides() -> None:
    rules = [parse_rule_entry("note://*", "allow"), parse_rule_entry("note://secret", "deny")]
    policy = Policy(default=Decision.ASK, rules=rules, kind="resource")
    # the honest control: as written, the respelling is allowed by the wide rule
    assert policy.decide("note://%73ecret", None).decision is Decision.ALLOW
    name = policy.strictest(spellings("note://%73ecret"))
    assert name == "note://secret" and policy.decide(name, None).decision is Decision.DENY
    # an escape that changes nothing the rules see stays allowed
    assert policy.decide(policy.strictest(spellings("note://a%20b")), None).decision is Decision.ALLOW
