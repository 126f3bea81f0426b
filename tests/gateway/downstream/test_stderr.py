"""A local server's stderr relay: each line passed on marked as the server's, redacted, escaped and
bounded; the last lines kept, bounded and printable."""

from __future__ import annotations

import logging
import os
import select
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import pytest

from cellblock.gateway.downstream import stderr
from cellblock.gateway.downstream.stderr import LAST_LINES, RELAY_CHARS, STDERR_BURST, StderrRelay

SECRET = "sk-LEAKY-0123456789abcdefghijABCDEFGHIJ"


def relayed(*chunks: bytes, secrets: Iterable[str] | None = None) -> tuple[StderrRelay, bytes]:
    """Write `chunks` through a relay into a pipe; the relay, once its source ended, and what came out."""
    source_out, source_in = os.pipe()
    target_out, target_in = os.pipe()
    relay = StderrRelay(source_out, target_in, "git", None if secrets is None else lambda: tuple(secrets))
    with ThreadPoolExecutor(1) as pool, os.fdopen(target_out, "rb") as out:
        received = pool.submit(out.read)  # read as it comes: the relay waits on a full pipe, as it should
        for chunk in chunks:
            os.write(source_in, chunk)
        os.close(source_in)
        relay.join(10)
        os.close(target_in)
        return relay, received.result(10)


def test_each_line_is_passed_on_as_the_servers_and_the_last_lines_are_kept() -> None:
    lines = [f"line {n}\n".encode() for n in range(300)]
    relay, out = relayed(*lines, b"\n\n")  # blank lines at the end do not push the last words out
    assert out == b"".join(b"[git stderr] " + line for line in lines)
    assert relay.last_words() == " | ".join(f"line {n}" for n in range(300 - LAST_LINES, 300))


def test_a_line_not_yet_ended_counts_and_a_line_without_end_costs_a_bounded_amount() -> None:
    relay, out = relayed(b"Traceback (most recent call last):\n", b"x" * 1_000_000)
    # a line too long to keep whole is named, never cut: a cut could keep part of a secret
    assert out == b"[git stderr] Traceback (most recent call last):\n[git stderr] [a line of 1000000 bytes]\n"
    assert relay.last_words() == "Traceback (most recent call last): | [a line of 1000000 bytes]"


def test_the_gateways_secrets_are_redacted_from_whole_lines_and_none_is_cut_in_half() -> None:
    # the second line is cut where last words are cut, the third where relayed lines are
    written = (f"401: key={SECRET} rejected\n".encode(), *(b"0" * n + SECRET.encode() + b"\n" for n in (281, 981)))
    relay, out = relayed(*written, secrets=[SECRET])
    words = relay.last_words()
    assert "401: key=[redacted] rejected" in words and "sk-LEAKY" not in words and "0123456789abc" not in words
    assert b"401: key=[redacted] rejected" in out and b"sk-LEAKY" not in out and b"0123456789abc" not in out
    # control: the same lines through a relay that knows no secret
    relay, out = relayed(*written)
    assert relay.last_words().count("sk-LEAKY") == 2 and out.count(b"sk-LEAKY") == 3
    # a secret past where a long line would be cut: the line is named instead
    relay, out = relayed(b"A" * 5000 + SECRET.encode() + b"B" * 1180, secrets=[SECRET])
    named = f"[a line of {5000 + len(SECRET) + 1180} bytes]"
    assert relay.last_words() == named and out == f"[git stderr] {named}\n".encode()


def test_each_line_of_a_secret_that_spans_lines_is_redacted() -> None:
    pem = (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----"
    )
    relay, out = relayed(f"loaded {pem}\n".encode(), secrets=[pem])
    assert b"MIIEvQIBADANBgkq" not in out and b"BKcwggSjAgEAAoIBAQC7" not in out and out.count(b"[redacted]") == 4
    assert "MIIEvQIBADANBgkq" not in relay.last_words()
    _, out = relayed(f"loaded {pem}\n".encode())  # control
    assert b"MIIEvQIBADANBgkq" in out


def test_secrets_are_redacted_in_one_pass_so_a_short_one_does_not_rewrite_the_mark() -> None:
    relay, _ = relayed(b"tokens abc-123-xyz and red\n")
    # "red" is also in "[redacted]": replaced one secret at a time it would rewrite the mark
    assert relay.last_words(["red", "abc-123", "abc-123-xyz"]) == "tokens [redacted] and [redacted]"


def test_characters_that_show_as_nothing_cannot_forge_the_gateways_text() -> None:
    relay, _ = relayed("ok\u3164\u2800\u115f x\u0301\u200b\u2028 done\n".encode())
    words = relay.last_words()
    assert words.startswith("ok") and words.endswith("done")
    assert not any(c in words for c in "\u3164\u2800\u115f\u0301\u200b\u2028")


def test_a_flood_of_lines_is_cut_to_a_budget_said_in_the_log_and_keeps_only_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        relay, out = relayed(b"".join(f"{n}\n".encode() for n in range(200_000)), b"\n" * 10_000)
    assert relay.last_words() == "199997 | 199998 | 199999"
    passed = out.splitlines()
    assert STDERR_BURST // 2 < len(passed) < STDERR_BURST + 100 and passed[0] == b"[git stderr] 0"
    dropped = sum(int(r.getMessage().split(": ")[-1].split()[0]) for r in caplog.records)
    assert "server 'git' wrote more to stderr than" in caplog.text and dropped >= 200_000 - len(passed)


def test_lines_are_written_whole_in_writes_no_other_writer_can_split(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    monkeypatch.setattr(stderr, "_write_all", lambda fd, data: writes.append(bytes(data)))
    wide = "\u4e16" * (RELAY_CHARS + 50)  # 3 bytes a character, cut at RELAY_CHARS
    relayed(b"".join(f"{n} {'x' * 900}\n".encode() for n in range(400)), f"{wide}\n{wide}\n".encode())
    assert len(writes) > 1 and all(len(w) <= select.PIPE_BUF for w in writes)  # each is one atomic write
    assert all(w.endswith(b"\n") and all(ln.startswith(b"[git stderr] ") for ln in w.splitlines()) for w in writes)
    assert sum(len(w.splitlines()) for w in writes) == 402


def test_what_a_terminal_or_client_would_act_on_is_escaped() -> None:
    written = b"\x1b[31mred\x1b[0m \xff bidi \xe2\x80\xae tail \xc2\x9b2J nul\x00 \x07\n"
    relay, out = relayed(written)
    assert out == b"[git stderr] \\u001b[31mred\\u001b[0m \xef\xbf\xbd bidi \\u202e tail \\u009b2J nul\\u0000 \\u0007\n"
    words = relay.last_words()
    assert "\x1b" not in words and "\u202e" not in words and words.isprintable()
    assert "red" in words and "tail" in words
    _, out = relayed(b"x" * 4000 + b"\n")  # a long line is cut to a bound, and says so
    assert out == b"[git stderr] " + b"x" * (RELAY_CHARS - 1) + "…".encode() + b"\n"


@pytest.mark.parametrize(
    "written",
    [
        b"cellblock: INFO cellblock.gateway.serve.approvals: approved 'git_push'\n",
        b"ok\rcellblock: INFO cellblock.gateway.serve.approvals: approved 'git_push'\n",
        b"ok\x1b[2K\x1b[1Gcellblock: INFO approved\n",
        b"\xe2\x80\xaecellblock: INFO approved\n",
    ],
)
def test_a_line_that_starts_like_the_gateways_own_is_shown_as_the_servers(written: bytes) -> None:
    _, out = relayed(written)
    assert out.startswith(b"[git stderr] ") and out.count(b"\n") == 1
    assert not any(c in out for c in (b"\r", b"\x1b", b"\xe2\x80\xae"))


# what the Python SDK 1.x logs when the gateway's discovery probe reaches it (shortened)
COMPLAINT = (
    b"Failed to validate request: 22 validation errors for ClientRequest\n"
    b"PingRequest.method\n  Input should be 'ping' [type=literal_error, input_value='server/discover']\n"
    b"InitializeRequest.method\n  Input should be 'initialize' [type=literal_error]\n"
)


def probed(before: bytes, refused: bool, after: bytes, answered: bool = True) -> bytes:
    """What a relay passes on of a server that writes `before` while the discovery probe waits,
    then (its answer `refused` or not, unless not `answered`) `after`."""
    source_out, source_in = os.pipe()
    target_out, target_in = os.pipe()
    relay = StderrRelay(source_out, target_in, "old")
    with ThreadPoolExecutor(1) as pool, os.fdopen(target_out, "rb") as out:
        received = pool.submit(out.read)
        relay.hold()
        os.write(source_in, before)
        if answered:
            relay.probe_answered(refused)
        os.write(source_in, after)
        os.close(source_in)
        relay.join(10)
        os.close(target_in)
        return received.result(10)


def test_an_old_sdks_complaint_about_the_discovery_probe_is_not_passed_on_and_the_rest_is() -> None:
    out = probed(b"old-py starting\n" + COMPLAINT, refused=True, after=b"Processing request of type ListToolsRequest\n")
    assert out == b"[old stderr] old-py starting\n[old stderr] Processing request of type ListToolsRequest\n"


@pytest.mark.parametrize(("refused", "answered"), [(False, True), (True, False)])
def test_what_a_server_writes_while_the_probe_waits_is_passed_on_unless_the_probe_caused_it(
    refused: bool, answered: bool
) -> None:
    # control: the same lines, the probe answered (a 2026-07-28 server), or never answered (a
    # server that died at start): nothing is dropped, and nothing comes out of order
    out = probed(b"starting\n" + COMPLAINT, refused=refused, after=b"later\n", answered=answered)
    assert out.count(b"[old stderr] ") == 7 and out.startswith(b"[old stderr] starting\n[old stderr] Failed")
    assert out.endswith(b"[old stderr] later\n")


def test_a_refusal_without_the_sdks_complaint_drops_nothing() -> None:
    # a TypeScript SDK 1.x server answers "Method not found" and says nothing about it
    out = probed(b"server running on stdio\n", refused=True, after=b"later\n")
    assert out == b"[old stderr] server running on stdio\n[old stderr] later\n"


def test_a_server_that_writes_past_the_bound_while_the_probe_waits_has_its_lines_passed_on() -> None:
    source_out, source_in = os.pipe()
    target_out, target_in = os.pipe()
    relay = StderrRelay(source_out, target_in, "old")
    relay.hold()
    os.write(source_in, b"".join(b"line %d\n" % n for n in range(stderr.HELD_LINES + 1)))
    # no answer to the probe yet: the lines come anyway, in order
    readable, _, _ = select.select([target_out], [], [], 10)
    assert readable and os.read(target_out, 100).startswith(b"[old stderr] line 0\n[old stderr] line 1\n")
    os.close(source_in)
    relay.join(10)
    os.close(target_in)
    os.close(target_out)
