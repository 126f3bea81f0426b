"""A local server's stderr relay: everything passed on unchanged, the last lines kept, bounded and printable."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from cellblock.gateway.downstream.stderr import LAST_LINES, StderrRelay


def relayed(*chunks: bytes) -> tuple[StderrRelay, bytes]:
    """Write `chunks` through a relay into a pipe; the relay, once its source ended, and what came out."""
    source_out, source_in = os.pipe()
    target_out, target_in = os.pipe()
    relay = StderrRelay(source_out, target_in)
    with ThreadPoolExecutor(1) as pool, os.fdopen(target_out, "rb") as out:
        received = pool.submit(out.read)  # read as it comes: the relay waits on a full pipe, as it should
        for chunk in chunks:
            os.write(source_in, chunk)
        os.close(source_in)
        relay.join(10)
        os.close(target_in)
        return relay, received.result(10)


def test_everything_is_passed_on_and_the_last_lines_are_kept() -> None:
    lines = [f"line {n}\n".encode() for n in range(1000)]
    relay, out = relayed(*lines, b"\n\n")  # blank lines at the end do not push the last words out
    assert out == b"".join(lines) + b"\n\n"
    assert relay.last_words() == " | ".join(f"line {n}" for n in range(1000 - LAST_LINES, 1000))


def test_a_line_not_yet_ended_counts_and_a_line_without_end_costs_a_bounded_amount() -> None:
    relay, out = relayed(b"Traceback (most recent call last):\n", b"x" * 1_000_000)
    assert len(out) == 35 + 1_000_000
    # a line too long to keep whole is named, never cut: a cut could keep part of a secret
    assert relay.last_words() == "Traceback (most recent call last): | [a line of 1000000 bytes]"


def test_the_gateways_secrets_are_redacted_from_whole_lines_and_none_is_cut_in_half() -> None:
    secret = "sk-LEAKY-0123456789abcdefghijABCDEFGHIJ"
    relay, _ = relayed(f"401: key={secret} rejected\n".encode(), b"0" * 281 + secret.encode() + b"\n")
    words = relay.last_words([secret])
    assert "401: key=[redacted] rejected" in words and "sk-LEAKY" not in words and "0123456789abc" not in words
    assert relay.last_words().count("sk-LEAKY") == 2  # control: the same lines without redaction
    # a secret past where a long line would be cut: the line is named instead
    relay, _ = relayed(b"A" * 5000 + secret.encode() + b"B" * 1180)
    assert relay.last_words([secret]) == f"[a line of {5000 + len(secret) + 1180} bytes]"


def test_secrets_are_redacted_in_one_pass_so_a_short_one_does_not_rewrite_the_mark() -> None:
    relay, _ = relayed(b"tokens abc-123-xyz and red\n")
    # "red" is also in "[redacted]": replaced one secret at a time it would rewrite the mark
    assert relay.last_words(["red", "abc-123", "abc-123-xyz"]) == "tokens [redacted] and [redacted]"


def test_characters_that_show_as_nothing_cannot_forge_the_gateways_text() -> None:
    relay, _ = relayed("ok\u3164\u2800\u115f x\u0301\u200b\u2028 done\n".encode())
    words = relay.last_words()
    assert words.startswith("ok") and words.endswith("done")
    assert not any(c in words for c in "\u3164\u2800\u115f\u0301\u200b\u2028")


def test_a_flood_of_lines_keeps_only_the_last_and_blank_lines_do_not_push_them_out() -> None:
    relay, out = relayed(b"".join(f"{n}\n".encode() for n in range(200_000)), b"\n" * 10_000)
    assert len(out) > 1_000_000 and relay.last_words() == "199997 | 199998 | 199999"


def test_what_a_terminal_or_client_would_act_on_is_replaced() -> None:
    relay, out = relayed(b"\x1b[31mred\x1b[0m \xff bidi \xe2\x80\xae tail\n")
    assert b"\x1b[31m" in out  # passed on as the server wrote it
    words = relay.last_words()
    assert "\x1b" not in words and "\u202e" not in words and words.isprintable()
    assert "red" in words and "tail" in words
