"""Prompt and resource rules: the tool rules' machinery, in their own words, and resource templates."""

from __future__ import annotations

from typing import Any

import pytest

from cellblock.policy.lint import lint_items
from cellblock.policy.rules import DEFAULT_RULE, Policy, parse_rule_entry
from cellblock.policy.templates import template_matches
from cellblock.policy.types import Decision, Verdict


def policy(kind: str, default: str = "deny", **entries: str | dict[str, Any]) -> Policy:
    rules = tuple(parse_rule_entry(p, b, kind) for p, b in entries.items())
    return Policy(default=Decision(default), rules=rules, kind=kind)


def test_a_prompt_rule_decides_by_name_and_speaks_of_a_prompt() -> None:
    prompts = policy("prompt", greet="allow")
    assert prompts.decide("greet", {}) == Verdict(Decision.ALLOW, "greet", "prompt 'greet' is allowed by rule 'greet'")
    assert prompts.decide("other", None) == Verdict(
        Decision.DENY, DEFAULT_RULE, "prompt 'other' matches no rule and the default denies it"
    )
    assert prompts.hidden("other") and not prompts.hidden("greet")


def test_a_prompts_arguments_meet_the_tool_constraints() -> None:
    prompts = policy("prompt", greet={"decision": "allow", "args": {"name": {"one_of": ["Ada"]}}})
    assert prompts.decide("greet", {"name": "Ada"}).decision is Decision.ALLOW
    refused = prompts.decide("greet", {"name": "Mallory"})
    assert refused.decision is Decision.DENY and refused.reason == "argument 'name' 'Mallory' is not one of 'Ada'"
    assert prompts.decide("greet", None).decision is Decision.DENY  # a constrained argument that is missing


def test_resource_globs_match_the_servers_uri_exact_beats_glob_and_the_longer_glob_wins() -> None:
    resources = policy("resource", "allow", **{"note://*": "ask", "note://private/*": "deny", "note://a": "allow"})
    assert resources.decide("note://hello", None).decision is Decision.ASK
    assert resources.decide("note://private/key", None).reason == (
        "resource 'note://private/key' is denied by rule 'note://private/*'"
    )
    assert resources.decide("note://a", None).decision is Decision.ALLOW
    assert resources.decide("file:///etc/passwd", None).rule == DEFAULT_RULE
    assert resources.rule_for("file:///etc/passwd") == (DEFAULT_RULE, None)


def test_a_resource_rule_cannot_constrain_arguments_and_a_bad_decision_is_named() -> None:
    with pytest.raises(ValueError, match="resource rule 'note://\\*': a resource read has no arguments"):
        parse_rule_entry("note://*", {"decision": "allow", "args": {"x": {"one_of": ["1"]}}}, "resource")
    with pytest.raises(ValueError, match=r"prompt rule 'greet': decision 'maybe' is not one of allow, deny, ask"):
        parse_rule_entry("greet", "maybe", "prompt")
    with pytest.raises(ValueError, match=r"resources\.default 'x'"):
        Policy(default="x", kind="resource")  # type: ignore[arg-type]  # the wrong value is the test


@pytest.mark.parametrize(
    ("template", "uri", "matches"),
    [
        ("note://{title}", "note://hello", True),
        ("note://{title}", "note://a/b", False),  # a simple expansion never holds a '/'
        ("note://{title}", "note://hello?x=1", False),
        ("note://{title}", "notes://hello", False),
        ("file:///{+path}", "file:///etc/passwd", True),
        ("file:///docs{/path}", "file:///docs/a/b", True),
        ("file:///docs{/path}", "file:///other/a", False),
        ("search://q{?query,limit}", "search://q?query=x&limit=1", True),
        ("probe://item/{id}", "probe://item/7", True),
        ("probe://item/{id}", "probe://item/7/../../secret", False),
        ("a.b://{x}", "aXb://y", False),  # the literal text is literal, not a regex
        ("probe://static/readme", "probe://static/readme", True),
    ],
)
def test_a_uri_matches_the_templates_that_can_expand_to_it(template: str, uri: str, matches: bool) -> None:
    assert template_matches(template, uri) is matches


def test_lint_names_prompt_and_resource_rules_that_match_nothing_locked() -> None:
    prompts = [parse_rule_entry(p, "allow", "prompt") for p in ("greet", "gret", "sum*")]
    found = lint_items("notes", "prompt", prompts, ["greet", "summarize_notes"])
    assert found == [
        "server 'notes': prompts.rules.gret matches no prompt of the locked catalog; "
        "check it (rules use the server's own prompt names)"
    ]
    resources = [parse_rule_entry(p, "allow", "resource") for p in ("note://*", "note://hello", "cellblock://notes/*")]
    found = lint_items("notes", "resource", resources, ["note://{title}"])
    assert len(found) == 1 and "resources.rules.cellblock://notes/* matches no resource or template" in found[0]
    assert lint_items("notes", "prompt", prompts, None) == []  # no lock yet: nothing to compare with
