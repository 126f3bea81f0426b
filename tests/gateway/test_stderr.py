"""A local server's stderr relay: everything passed on unchanged, the last lines kept, bounded and printable."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from cellblock.gateway.stderr import LAST_LINES, LINE_CHARS, StderrRelay


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
    words = relay.last_words()
    assert words.startswith("Traceback (most recent call last): | xxx") and len(words) < 2 * LINE_CHARS


def test_what_a_terminal_or_client_would_act_on_is_replaced() -> None:
    relay, out = relayed(b"\x1b[31mred\x1b[0m \xff bidi \xe2\x80\xae tail\n")
    assert b"\x1b[31m" in out  # passed on as the server wrote it
    words = relay.last_words()
    assert "\x1b" not in words and "\u202e" not in words and words.isprintable()
    assert "red" in words and "tail" in words
