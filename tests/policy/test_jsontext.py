"""JSON from peers and files: strict, and never holding text that cannot be written out again."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellblock.policy.jsontext import loads, more_values_than, scrub


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"hi \\ud800"', "hi \ufffd"),  # a lone high surrogate
        ('"\\udc00 end"', "\ufffd end"),  # a lone low surrogate
        ('"\\ud800\\ud800\\udc00"', "\ufffd\U00010000"),  # a lone one before a valid pair
        ('{"\\ud83d": ["\\uDBFF", {"k": "\\ude00"}]}', {"\ufffd": ["\ufffd", {"k": "\ufffd"}]}),
        ('"\\\\ud800"', "\\ud800"),  # an escaped backslash, then plain letters: left alone
        ('"\\ud83d\\ude00"', "\U0001f600"),  # a valid pair is one character
    ],
)
def test_lone_surrogates_become_the_replacement_character_and_valid_text_is_kept(text: str, expected: Any) -> None:
    parsed = loads(text)
    assert parsed == expected
    json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # can be written out: no exception
    assert loads(text.encode()) == expected


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "[1,", "{'a': 1}", "[" * 100_000])
def test_what_is_not_strict_json_is_refused_with_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


def test_invalid_utf8_bytes_are_replaced_not_refused() -> None:
    assert loads(b'"a\xffb"') == "a\ufffdb"


def test_a_document_as_deep_as_the_parser_allows_is_scrubbed_without_recursion() -> None:
    depth = 900
    value = loads("[" * depth + '"\\ud800"' + "]" * depth)
    for _ in range(depth):
        value = value[0]
    assert value == "\ufffd"


JSON_VALUES = st.recursive(
    st.text() | st.integers() | st.none() | st.booleans(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
)


@given(JSON_VALUES)
def test_any_json_value_comes_back_encodable_and_unchanged_unless_it_held_a_lone_surrogate(value: Any) -> None:
    text = json.dumps(value)  # ensure_ascii: a lone surrogate is written as a \u escape
    parsed = loads(text)
    json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # no exception
    if not re.search("[\ud800-\udfff]", json.dumps(value, ensure_ascii=False)):
        assert parsed == value
    assert scrub(json.loads(text)) == parsed


def test_values_are_counted_to_the_limit_and_not_under_skipped_keys() -> None:
    assert not more_values_than([1, 2, 3], 4) and more_values_than([1, 2, 3], 3)  # the list is one
    assert not more_values_than({"a": [1] * 100, "b": 1}, 3, frozenset({"a"}))
    assert more_values_than({"a": [[1] * 10] * 10}, 100) and not more_values_than({"a": [[1] * 10] * 10}, 112)
    assert more_values_than(list(range(10**7)), 10)  # stops at once, whatever the size
