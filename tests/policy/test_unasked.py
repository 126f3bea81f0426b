"""Tools that run without asking: which a server's marks make eligible, and how a grant is bound to
the definition the lock approved (so a later flip of the marks asks again)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from cellblock.policy.lock import LockError, approve, check, digest
from cellblock.policy.rules import DEFAULT_RULE, READ_ONLY_RULE, Policy
from cellblock.policy.types import Decision, ToolRule
from cellblock.policy.unasked import granted, load_unasked, read_only, save_unasked, unasked_tools


def tool(name: str, **annotations: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}, "annotations": annotations}


LOOK = tool("look", readOnlyHint=True, openWorldHint=False)


@pytest.mark.parametrize(
    ("annotations", "eligible"),
    [
        ({"readOnlyHint": True, "openWorldHint": False}, True),
        ({"readOnlyHint": True, "openWorldHint": False, "destructiveHint": False}, True),
        ({"readOnlyHint": True}, False),  # openWorldHint absent is true (the spec's default)
        ({"readOnlyHint": True, "openWorldHint": True}, False),
        ({"readOnlyHint": True, "openWorldHint": False, "destructiveHint": True}, False),  # contradicts itself
        ({"readOnlyHint": False, "openWorldHint": False}, False),
        ({"openWorldHint": False}, False),  # readOnlyHint absent is false
        ({"readOnlyHint": "true", "openWorldHint": "false"}, False),  # only JSON booleans count
        ({}, False),
    ],
)
def test_only_an_explicit_read_only_and_closed_world_mark_makes_a_tool_eligible(
    annotations: dict[str, Any], eligible: bool
) -> None:
    assert read_only(tool("t", **annotations)) is eligible


def test_a_tool_without_annotations_or_with_junk_annotations_is_not_eligible() -> None:
    assert not read_only({"name": "t"})
    assert not read_only({"name": "t", "annotations": ["readOnlyHint"]})


def test_a_grant_holds_only_for_the_definition_it_was_given_for() -> None:
    lock = approve("s", {"tool:look": LOOK}, 0)
    grants = granted({}, lock.items, lock.snapshot, ["tool:look"])
    assert unasked_tools(grants, lock.items, lock.snapshot) == {"look"}
    changed = approve("s", {"tool:look": {**LOOK, "description": "now it does more"}}, 1)
    assert unasked_tools(grants, changed.items, changed.snapshot) == frozenset()


def test_an_approval_keeps_only_the_grants_of_unchanged_tools_and_grants_read_only_ones_alone() -> None:
    first = approve("s", {"tool:look": LOOK, "tool:tidy": tool("tidy", readOnlyHint=True, openWorldHint=False)}, 0)
    grants = granted({}, first.items, first.snapshot, ["tool:look", "tool:tidy"])
    flipped = tool("tidy", readOnlyHint=False, destructiveHint=True)
    second = approve("s", {"tool:look": LOOK, "tool:tidy": flipped, "tool:erase": flipped}, 1)
    # nothing new asked for: tidy's grant went with its old definition; erase can never be granted
    after = granted(grants, second.items, second.snapshot, ["tool:erase"])
    assert after == {"tool:look": second.items["tool:look"]}
    assert unasked_tools(after, second.items, second.snapshot) == {"look"}


def test_the_lock_holds_a_tool_whose_marks_flip_and_a_lock_blind_to_them_would_have_let_it_run_unasked() -> None:
    before = tool("tidy", readOnlyHint=True, openWorldHint=False)
    lock = approve("s", {"tool:tidy": before}, 0)
    grants = granted({}, lock.items, lock.snapshot, ["tool:tidy"])
    for mark in ("readOnlyHint", "openWorldHint", "destructiveHint"):
        flipped = {**before, "annotations": {**before["annotations"], mark: not before["annotations"].get(mark)}}
        result = check(lock, {"tool:tidy": flipped})
        assert result.held == {"tool:tidy"}, mark  # held: not listed, not called until approved again
        approved_again = approve("s", {"tool:tidy": flipped}, 1)
        assert unasked_tools(grants, approved_again.items, approved_again.snapshot) == frozenset(), mark
    # the control: a digest that left the annotations out would see no change, and the grant,
    # bound to that digest, would let the tool run unasked as the definition approved before
    flipped = {**before, "annotations": {"readOnlyHint": False, "destructiveHint": True}}

    def blind(item: dict[str, Any]) -> str:
        return digest({k: v for k, v in item.items() if k != "annotations"})

    assert blind(flipped) == blind(before) and digest(flipped) != digest(before)
    blind_grants = {"tool:tidy": blind(before)}
    assert unasked_tools(blind_grants, {"tool:tidy": blind(flipped)}, lock.snapshot) == {"tidy"}


def test_a_policy_lets_a_granted_tool_run_unasked_only_where_no_rule_names_it_and_the_default_asks() -> None:
    review = Policy(Decision.ASK, (ToolRule("erase", Decision.ASK), ToolRule("l*", Decision.DENY)), read_only="review")
    verdict = review.decide("peek", {}, unasked=True)
    assert verdict.decision is Decision.ALLOW and verdict.rule == READ_ONLY_RULE
    assert review.decide("peek", {}).decision is Decision.ASK  # not granted
    assert review.decide("erase", {}, unasked=True).decision is Decision.ASK  # a rule naming it wins
    assert review.decide("look", {}, unasked=True).decision is Decision.DENY  # and a glob naming it
    assert Policy(Decision.DENY, read_only="review").decide("look", {}, unasked=True).decision is Decision.DENY
    ask = Policy(Decision.ASK).decide("look", {}, unasked=True)  # read_only: ask (the default) never
    assert ask.decision is Decision.ASK and ask.rule == DEFAULT_RULE


def test_a_policy_refuses_an_unknown_read_only_setting() -> None:
    with pytest.raises(ValueError, match="read_only 'allow' is not one of ask, review"):
        Policy(Decision.ASK, read_only="allow")


def test_grants_are_written_0600_read_back_and_removed_when_none_are_left(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "s.unasked.json"
    assert load_unasked(path) == {}
    save_unasked(path, "s", {"tool:look": "a" * 64})
    assert load_unasked(path) == {"tool:look": "a" * 64}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    save_unasked(path, "s", {})
    assert not path.exists()


def test_a_corrupt_grants_file_is_an_error_that_names_it_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "s.unasked.json"
    path.write_text('{"version": 1, "tools": {"tool:look": 3}}')
    with pytest.raises(LockError, match=r"s\.unasked\.json .* is corrupt; remove it"):
        load_unasked(path)
