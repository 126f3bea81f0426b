"""Finding a value inside string literals however they spell it, and replacing only those characters."""

from __future__ import annotations

import json

import pytest

from cellblock.gateway.clients.literals import replace_in_literals


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"k": "tok"}', '{"k": "<R>"}'),
        ('{"k": "Bearer tok", "j": "tok-tok"}', '{"k": "Bearer <R>", "j": "<R>-<R>"}'),
        ('{"k": "t\\u006fk"}', '{"k": "<R>"}'),  # an escaped letter inside the value
        ('{"k": "a\\/tok\\n"}', '{"k": "a\\/<R>\\n"}'),  # other escapes around it are kept as written
        ('{"k": "\\ud83d\\ude00tok"}', '{"k": "\\ud83d\\ude00<R>"}'),  # a surrogate pair before it
        ('// tok in a comment is not a literal\n{"k": 1}', '// tok in a comment is not a literal\n{"k": 1}'),
        ('{"tok": "x"}', '{"<R>": "x"}'),  # keys are literals too: a secret never survives as a key
    ],
)
def test_json_literals(text: str, expected: str) -> None:
    assert replace_in_literals(text, {"tok": "<R>"}) == expected


def test_toml_literal_strings_have_no_escapes() -> None:
    text = "a = 'C:\\vault\\tok'\nb = \"x\\ttok\"\n"
    assert replace_in_literals(text, {"tok": "<R>"}, toml=True) == "a = 'C:\\vault\\<R>'\nb = \"x\\t<R>\"\n"
    # in JSON a single quote starts nothing
    assert replace_in_literals("{'tok'}", {"tok": "<R>"}) == "{'tok'}"


def test_the_longest_value_wins_where_two_overlap() -> None:
    assert replace_in_literals('"abcdef"', {"abc": "<1>", "abcdef": "<2>"}) == '"<2>"'


def test_the_result_still_parses_and_no_value_remains() -> None:
    value = "pässwört/\u2603-\U0001f600"
    for encoded in (json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value).replace("/", "\\/")):
        text = '{"env": {"P": ' + encoded + "}}"
        out = replace_in_literals(text, {value: "<R>"})
        assert json.loads(out) == {"env": {"P": "<R>"}}
