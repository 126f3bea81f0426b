"""Finding a value inside string literals however they spell it, and replacing only those characters."""

from __future__ import annotations

import json
import tomllib

import pytest

from cellblock.gateway.clients.literals import fill_literals, replace_in_literals


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


HARD = 'p"a\\ss\n\t\x01\x7f \u00e9\U0001f600 </end>'  # every character a literal must escape, and more
REF = "<keyring:cellblock/e>"


def test_a_value_filled_into_a_json_literal_reads_back_as_itself() -> None:
    text = json.dumps({"env": {"K": f"Bearer {REF}"}, "other": "<keyring:cellblock/e> is a value"}, indent=1)
    filled = fill_literals(text, {REF: HARD})
    assert json.loads(filled) == {"env": {"K": f"Bearer {HARD}"}, "other": f"{HARD} is a value"}


def test_a_value_filled_into_toml_basic_and_literal_strings_reads_back_as_itself() -> None:
    basic = fill_literals(f'a = "{REF}"\n', {REF: HARD}, toml=True)
    assert tomllib.loads(basic)["a"] == HARD
    plain = "C:\\vault\\tok"  # what a TOML literal string held: no ' and no line break, no escapes
    literal = fill_literals(f"b = '{REF}'\n", {REF: plain}, toml=True)
    assert tomllib.loads(literal)["b"] == plain


def test_filling_is_the_inverse_of_taking_out() -> None:
    text = '{"k": "t\\u00f8k\\/x", "j": "y"}'
    taken = replace_in_literals(text, {"tøk/x": REF})
    assert json.loads(fill_literals(taken, {REF: "tøk/x"})) == json.loads(text)


def test_a_reference_outside_any_literal_is_left_for_the_caller_to_refuse() -> None:
    text = f"// {REF}\n{{}}"
    assert fill_literals(text, {REF: "v"}) == text
