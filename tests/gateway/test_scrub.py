"""Known secret values are taken out of what a server sends toward the client, whatever their type,
and found in what a call would carry to a server they are not for."""

from __future__ import annotations

import base64
import codecs
import json
from typing import Any
from urllib.parse import quote, quote_plus

import pytest

from cellblock.gateway.scrub import (
    MIN_CARRIED,
    REDACTED,
    UNNAMED,
    HeldSecrets,
    Scrubbed,
    line_pattern,
    pattern_of,
    scrub,
    scrub_result,
)

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


# -- HeldSecrets: whose each secret is, and what a call to another server may not carry ------------

SECRET = "sk+live/" + "9f8e7d6c5b4a" * 3  # a URL escapes its + and /, base64 differs by offset


def held() -> HeldSecrets:
    secrets = HeldSecrets()
    secrets.add(SECRET, "a", "secret API_KEY (keyring entry 'a-key')")
    secrets.add("918273645546372819", "a", "secret PIN (keyring entry 'a-pin')")
    secrets.add("gateway-http-token-0123", name="HTTP token (keyring entry 'cellblock/http-token')")
    return secrets


CARRIED = {
    "as it is": {"k": SECRET},
    "nested, in a longer string": {"a": [{"b": {"c": f"Bearer {SECRET}; more"}}]},
    "as a key": {SECRET: 1},
    "JSON inside a string": {"body": json.dumps({"key": SECRET})},
    "percent-encoded": {"url": "https://x.example/?k=" + quote(SECRET, safe="")},
    "percent-encoded, / kept": {"url": "https://x.example/" + quote(SECRET)},
    "form-encoded": {"body": "k=" + quote_plus(SECRET)},
    "hex": {"k": SECRET.encode().hex()},
    "HEX": {"k": SECRET.encode().hex().upper()},
    **{
        f"base64 after {n} bytes": {"k": base64.b64encode(b"x" * n + SECRET.encode() + b"tail").decode()}
        for n in range(3)
    },
    **{
        f"URL-safe base64 after {n} bytes, unpadded": {
            "k": base64.urlsafe_b64encode(b"y" * n + SECRET.encode()).decode().rstrip("=")
        }
        for n in range(3)
    },
}


@pytest.mark.parametrize("arguments", CARRIED.values(), ids=CARRIED.keys())
def test_another_servers_secret_is_found_in_every_form_and_named(arguments: dict[str, Any]) -> None:
    found = held().carried("b", arguments)
    assert [str(h) for h in found] == ["the secret API_KEY (keyring entry 'a-key') of server 'a'"]
    assert SECRET not in json.dumps(held().hidden("b", arguments))


@pytest.mark.parametrize("size", [MIN_CARRIED, MIN_CARRIED + 1])
def test_a_secret_as_short_as_is_looked_for_is_found_in_base64_at_every_offset(size: int) -> None:
    secret = "Kp3#vX9q!w"[:size]
    secrets = HeldSecrets()
    secrets.add(secret, "a", "secret PIN")
    for n in range(3):
        encoded = base64.b64encode(b"x" * n + secret.encode() + b"tail").decode()
        assert [h.name for h in secrets.carried("b", {"k": encoded})] == ["secret PIN"], f"after {n} bytes"


def test_a_secret_of_digits_passed_as_a_number_is_found() -> None:
    assert [h.name for h in held().carried("b", {"n": 918273645546372819})] == ["secret PIN (keyring entry 'a-pin')"]
    assert held().hidden("b", {"n": 918273645546372819}) == {"n": REDACTED}


def test_a_servers_own_secret_is_not_carried_to_it_but_the_gateways_is() -> None:
    secrets = held()
    assert secrets.carried("a", {"k": SECRET, "n": 918273645546372819}) == []
    assert [str(h) for h in secrets.carried("a", {"k": "gateway-http-token-0123"})] == [
        "the gateway's HTTP token (keyring entry 'cellblock/http-token')"
    ]


def test_what_is_not_looked_for() -> None:
    secrets = held()
    secrets.add("short", "a", "a short secret")  # below MIN_CARRIED: redacted in results only
    misses = [
        {"k": "short"},
        {"k": SECRET[::-1]},  # reversed
        {"k": SECRET[:12], "j": SECRET[12:]},  # split across arguments
        {"k": codecs.encode(SECRET, "rot13")},
        {"k": "hello"},
    ]
    assert [secrets.carried("b", m) for m in misses] == [[]] * len(misses)
    assert secrets.pattern is not None and secrets.pattern.search("short")


def test_nothing_held_for_another_server_reads_nothing() -> None:
    secrets = HeldSecrets()
    secrets.add(SECRET, "a", "secret API_KEY")
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert secrets.carried("a", deep) == [] and HeldSecrets().carried("b", deep) == []  # never read
    with pytest.raises(Scrubbed):
        secrets.carried("b", deep)


def test_a_value_learnt_without_a_name_takes_the_name_it_is_registered_under() -> None:
    secrets = HeldSecrets()
    secrets.add(SECRET, "a")  # told by a connection's callback
    assert [h.name for h in secrets.carried("b", SECRET)] == [UNNAMED]
    secrets.add(SECRET, "a", "secret header X-Api-Key (keyring entry 'a-key')")
    secrets.add(SECRET, "a")
    assert [h.name for h in secrets.carried("b", SECRET)] == ["secret header X-Api-Key (keyring entry 'a-key')"]
