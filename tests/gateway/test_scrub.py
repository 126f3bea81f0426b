"""Known secret values are taken out of what a server sends toward the client, whatever their type."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellblock.gateway.scrub import REDACTED, Scrubbed, line_pattern, pattern_of, scrub, scrub_result

TOKEN = "tok-5f1e9a2b77c4"
NUMBER = "918273645546372819"
PATTERN = pattern_of((TOKEN, NUMBER))


def test_every_occurrence_in_strings_keys_and_numbers_is_replaced_and_counted() -> None:
    value: dict[str, Any] = {
        "text": f"authorization: Bearer {TOKEN}; again {TOKEN}",
        f"key-{TOKEN}": [1, int(NUMBER), {"deep": [f"x{NUMBER}y"]}],
        "float": float(NUMBER[:6] + "." + NUMBER[6:]),  # repr "918273.6455463728" does not hold it
        "safe": [True, None, 3.5, "plain"],
    }
    clean, count = scrub(value, PATTERN)
    assert count == 5
    text = json.dumps(clean)
    assert TOKEN not in text and NUMBER not in text
    assert clean["text"] == f"authorization: Bearer {REDACTED}; again {REDACTED}"
    assert clean[f"key-{REDACTED}"] == [1, REDACTED, {"deep": [f"x{REDACTED}y"]}]
    assert clean["safe"] == value["safe"]
    # the control: without the secrets known nothing changes, and the very same object comes back
    assert scrub(value, None) == (value, 0)
    assert scrub(value, pattern_of(("not-there",)))[0] is value


def test_the_longest_secret_wins_so_none_is_left_half_shown() -> None:
    clean, _ = scrub("abcdef", pattern_of(("abc", "abcdef")))
    assert clean == REDACTED


def test_a_result_too_deep_to_check_is_refused_not_passed_on() -> None:
    deep: Any = TOKEN
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(Scrubbed):
        scrub(deep, PATTERN)


def test_a_scrubbed_result_says_so_and_a_clean_one_is_left_alone() -> None:
    result = {"content": [{"type": "text", "text": TOKEN}], "isError": False}
    clean = scrub_result(result, PATTERN)
    assert clean["content"] == [
        {"type": "text", "text": REDACTED},
        {"type": "text", "text": "[Cellblock redacted 1 secret value(s) it holds from this result]"},
    ]
    untouched = {"content": [{"type": "text", "text": "hello"}]}
    assert scrub_result(untouched, PATTERN) is untouched


def test_a_line_pattern_finds_each_long_line_of_a_secret_that_spans_lines() -> None:
    pattern = line_pattern(("one-line-secret", "-----BEGIN-----\nMIIEvQIBADANBgkq\n==\n-----END-----"))
    assert pattern is not None
    found = {m[0] for m in pattern.finditer("one-line-secret MIIEvQIBADANBgkq == -----BEGIN----- -----END-----")}
    assert found == {"one-line-secret", "MIIEvQIBADANBgkq", "-----BEGIN-----", "-----END-----"}  # not "=="
    assert line_pattern(()) is None
