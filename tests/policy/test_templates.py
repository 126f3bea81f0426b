"""Template matching is linear: a server's template cannot make a read (or `cellblock check`) hang."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest

from cellblock.policy.lint import lint_items
from cellblock.policy.rules import parse_rule_entry
from cellblock.policy.templates import MAX_TEMPLATE, template_matches

# the matcher before this fix: one regex, each expression its operator's pattern, literals escaped
_OLD = {"+": r"[^#]*", "#": r"(?:#.*)?", "/": r"(?:/[^/?#]*)*", ".": r"(?:\.[^/?#.]*)*"}
_OLD |= {";": r"(?:;[^/?#]*)*", "?": r"(?:\?[^#]*)?", "&": r"(?:&[^#]*)?"}


def old_matches(template: str, uri: str) -> bool:
    parts, end = [], 0
    for m in re.finditer(r"\{([^{}]*)\}", template):
        parts += [re.escape(template[end : m.start()]), _OLD.get(m[1][:1], r"[^/?#]*")]
        end = m.end()
    return re.fullmatch("".join(parts) + re.escape(template[end:]), uri, re.DOTALL) is not None


def guarded(work: Callable[[], bool]) -> bool:
    """`work()`, in a thread: a matcher that backtracks never returns, and the test fails, not hangs."""
    out: list[bool] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    thread.join(30)  # the work is microseconds; 30s only stops a regression from hanging the suite
    assert out, "the matcher did not finish"
    return out[0]


REDOS = [
    # (template, a URI the template cannot make (the old regex tries every split), one it can)
    ("h://" + "".join(f"{{+v{i}}}" for i in range(50)) + "!", "h://" + "a" * 200, "h://" + "a" * 200 + "!"),
    ("h://x" + "{/a}" * 50 + "!", "h://x" + "/a" * 100, "h://x" + "/a" * 100 + "!"),
    ("h://" + "{+a}x" * 50, "h://" + "x" * 200 + "#", "h://" + "x" * 200),
    ("h://" + "{x}.{.y}" * 40, "h://" + "." * 200 + "/", "h://" + "." * 200),
]


@pytest.mark.parametrize(("template", "miss", "hit"), REDOS)
def test_a_hostile_template_is_matched_in_one_pass_over_the_uri(template: str, miss: str, hit: str) -> None:
    assert guarded(lambda: template_matches(template, miss)) is False
    assert guarded(lambda: template_matches(template, hit)) is True


def test_control_the_old_regex_tries_every_split_of_stacked_expressions() -> None:
    # the same shape, small enough for the old regex to finish (with 50 expressions on 200
    # characters it would not, in any time): both give the same answers
    template, miss, hit = "h://" + "{+v}" * 4 + "!", "h://" + "a" * 12, "h://" + "a" * 12 + "!"
    assert old_matches(template, miss) is template_matches(template, miss) is False
    assert old_matches(template, hit) is template_matches(template, hit) is True


OPERATORS = [
    ("note://{title}", "note://hello", True),
    ("note://{title}", "note://", True),
    ("note://{title}", "note://a/b", False),
    ("note://{title}", "note://a#b", False),
    ("file:///{+path}", "file:///etc/passwd?x=1", True),
    ("file:///{+path}", "file:///a#frag", False),
    ("page{#section}", "page#a/b?c#d", True),
    ("page{#section}", "page", True),
    ("page{#section}", "pagex", False),
    ("file:///docs{/path}", "file:///docs/a/b", True),
    ("file:///docs{/path}", "file:///docs", True),
    ("file:///docs{/path}", "file:///docsa", False),
    ("file:///docs{/path}", "file:///docs/a?q", False),
    ("file{.ext}", "file.tar.gz", True),
    ("file{.ext}", "file.a/b", False),
    ("map{;x,y}", "map;x=1;y=2", True),
    ("map{;x,y}", "map;x=1/2", False),
    ("search://q{?query,limit}", "search://q?query=x&limit=1", True),
    ("search://q{?query,limit}", "search://q&query=x", False),
    ("search://q?a=1{&b}", "search://q?a=1&b=2", True),
    ("search://q?a=1{&b}", "search://q?a=1?b=2", False),
    ("h://{a}{b}{c}", "h://abc", True),  # merged: still any split of non-'/' text
    ("h://{/a}{?q}{#f}", "h:///x/y?q=1#f", True),
    ("h://{/a}{?q}{#f}", "h://?q=1/x", True),  # '?' then the query may hold '/'
    ("h://{/a}{?q}{#f}", "h://x", False),
    ("a.b://{x}", "aXb://y", False),  # the literal text is literal, not a regex
    ("probe://item/{id}", "probe://item/7/../../secret", False),
]


@pytest.mark.parametrize(("template", "uri", "matches"), OPERATORS)
def test_each_rfc_6570_operator_matches_what_it_can_expand_to(template: str, uri: str, matches: bool) -> None:
    assert template_matches(template, uri) is matches
    assert old_matches(template, uri) is matches  # the same answers as the regex it replaces


def test_a_template_past_the_cap_matches_nothing_and_cellblock_check_names_it() -> None:
    huge = "h://" + "{x}" * (MAX_TEMPLATE // 3) + "!"
    assert not template_matches(huge, "h://a!")
    rules = [parse_rule_entry("h://a!", "allow", "resource")]
    found = lint_items("h", "resource", rules, [huge, "h://index"])
    assert any("longer than 1024 characters" in f and "matches no URI" in f for f in found)
    assert not lint_items("h", "resource", [parse_rule_entry("h://index", "allow", "resource")], ["h://index"])
