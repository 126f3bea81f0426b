"""The audit log: values shortened and secrets redacted, rotation by size, whole lines, visible failures."""

from __future__ import annotations

import json
import os
import shutil
import threading
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from cellblock.gateway.audit.log import (
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_STRING,
    REDACTED,
    Audit,
    AuditUnwritten,
    rotated_paths,
)
from cellblock.gateway.audit.secretnames import is_secret_name


def events(path: Path) -> list[dict[str, Any]]:
    """Every event in `path` and its rotated files, oldest first; fails on any line that is not JSON."""
    found = []
    for file in rotated_paths(path):
        for line in file.read_text(encoding="utf-8").splitlines():
            found.append(json.loads(line))
    return found


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def written(tmp_path: Path, value: Any, secrets: tuple[str, ...] = ()) -> Any:
    """`value` as the audit log records it: the arguments of one call event."""
    audit = Audit(tmp_path / "audit.jsonl")
    for secret in secrets:
        audit.add_secret(secret)
    audit.write("call", "s", tool="t", arguments=value)
    audit.close()
    (event,) = events(tmp_path / "audit.jsonl")
    return event["arguments"]


# -- values are shortened --------------------------------------------------------------------------

LONG = "x" * (MAX_STRING + 44)


def nest(depth: int, leaf: Any = "leaf") -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = {"d": value}
    return value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("short", "short"),
        ("x" * MAX_STRING, "x" * MAX_STRING),
        (LONG, "x" * MAX_STRING + "…(+44 chars)"),
        (42, 42),
        (1.5, 1.5),
        (True, True),
        (None, None),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (2**300, "<integer of 301 bits>"),
        (b"\x00\x01\x02", "<3 bytes>"),
        (("a", "b"), ["a", "b"]),
        ({1: "one"}, {"1": "one"}),
        ({"path": LONG}, {"path": "x" * MAX_STRING + "…(+44 chars)"}),
        (list(range(MAX_ITEMS)), list(range(MAX_ITEMS))),
        (list(range(MAX_ITEMS + 7)), [*range(MAX_ITEMS), "…(+7 items)"]),
        ({f"k{i}": i for i in range(MAX_ITEMS + 3)}, {**{f"k{i}": i for i in range(MAX_ITEMS)}, "…": "(+3 keys)"}),
        (nest(MAX_DEPTH), nest(MAX_DEPTH)),
        # the container past the limit is summarised, its content never written
        (nest(MAX_DEPTH + 1), nest(MAX_DEPTH, "…(nested object, 1 keys)")),
        (nest(MAX_DEPTH + 3), nest(MAX_DEPTH, "…(nested object, 1 keys)")),
        ([[[[[[["deep"]]]]]]], [[[[[["…(nested list, 1 items)"]]]]]]),
    ],
)
def test_long_values_are_cut_and_marked(tmp_path: Path, value: Any, expected: Any) -> None:
    assert written(tmp_path, value) == expected


def test_writing_leaves_the_callers_value_as_it_was(tmp_path: Path) -> None:
    value = {"token": "abc", "items": list(range(60))}
    before = json.dumps(value)
    assert written(tmp_path, value)["token"] == REDACTED
    assert json.dumps(value) == before


def test_input_nested_past_the_recursion_limit_is_written(tmp_path: Path) -> None:
    value: Any = "leaf"
    for _ in range(5000):
        value = [value]
    assert json.dumps(written(tmp_path, value))


# -- secrets are redacted --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "access_token",
        "GITHUB_TOKEN",
        "client_secret",
        "password",
        "db_passwd",
        "api_key",
        "X-Api-Key",
        "apikey",
        "Authorization",
        "Cookie",
        "set-cookie",
        "credentials",
        "private_key",
        "ssh-private-key",
        "max_tokens",
        "session_id",
        "GITHUB_PAT",
        "basic_auth",
    ],
)
def test_secret_looking_keys(key: str) -> None:
    assert is_secret_name(key)


@pytest.mark.parametrize(
    "key", ["path", "content", "url", "query", "author", "keyword", "cookbook", "tokenizer", "monkey"]
)
def test_ordinary_keys_are_kept(tmp_path: Path, key: str) -> None:
    assert not is_secret_name(key)
    assert written(tmp_path, {key: "v"}) == {key: "v"}


@pytest.mark.parametrize(
    ("value", "secrets", "expected"),
    [
        ({"path": "/a", "password": "hunter2"}, (), {"path": "/a", "password": REDACTED}),
        ({"Authorization": {"scheme": "Bearer", "v": "x"}}, (), {"Authorization": REDACTED}),
        ({"token": 12345}, (), {"token": REDACTED}),
        (
            {"request": {"headers": {"Cookie": "s=1", "Accept": "*/*"}, "body": [{"api_key": "k"}, {"n": 1}]}},
            (),
            {"request": {"headers": {"Cookie": REDACTED, "Accept": "*/*"}, "body": [{"api_key": REDACTED}, {"n": 1}]}},
        ),
        ({"note": "s3cr3t-value"}, ("s3cr3t-value",), {"note": REDACTED}),
        ({"cmd": "curl -H 'X: s3cr3t-value' https://x"}, ("s3cr3t-value",), {"cmd": REDACTED}),
        ({"argv": ["ls", "--key=s3cr3t-value"]}, ("s3cr3t-value",), {"argv": ["ls", REDACTED]}),
        ({"a": {"b": {"c": "prefix s3cr3t-value suffix"}}}, ("s3cr3t-value",), {"a": {"b": {"c": REDACTED}}}),
        ({"s3cr3t-value": "x"}, ("s3cr3t-value",), {f"{REDACTED}#0": REDACTED}),
        ({"note": "nothing here"}, ("s3cr3t-value", ""), {"note": "nothing here"}),
    ],
)
def test_secrets_are_redacted(tmp_path: Path, value: Any, secrets: tuple[str, ...], expected: Any) -> None:
    assert written(tmp_path, value, secrets) == expected


def test_what_is_too_deep_to_inspect_is_not_written(tmp_path: Path) -> None:
    value: Any = {"leak": "s3cr3t-value"}
    for _ in range(200):
        value = {"d": value}
    assert "s3cr3t-value" not in json.dumps(written(tmp_path, value, ("s3cr3t-value",)))


# -- the log file ----------------------------------------------------------------------------------


class Decision(Enum):
    ALLOW = "allow"


def test_event_is_one_json_line_with_the_required_fields(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    audit.write("server_ready", "files", protocol="2025-11-25", tools=3)
    audit.write(
        "call",
        "files",
        tool="read_file",
        decision=Decision.ALLOW,
        rule="read_*",
        reason="rule read_*",
        duration_ms=1.235,
        is_error=False,
        arguments={"path": "/tmp/x"},
    )
    audit.close()
    ready, call = events(tmp_path / "audit.jsonl")
    assert isinstance(ready["ts"], float)
    # the chain's fields: the first line of a file names what it follows (nothing, in a new log)
    assert ready.pop("prev") == "" and len(ready.pop("mac")) == len(call.pop("mac")) == 32
    assert ready | {"ts": 0} == {
        "ts": 0,
        "event": "server_ready",
        "server": "files",
        "protocol": "2025-11-25",
        "tools": 3,
    }
    assert call | {"ts": 0} == {
        "ts": 0,
        "event": "call",
        "server": "files",
        "tool": "read_file",
        "decision": "allow",
        "rule": "read_*",
        "reason": "rule read_*",
        "duration_ms": 1.235,
        "is_error": False,
        "arguments": {"path": "/tmp/x"},
    }


def test_a_caller_cannot_overwrite_ts_event_or_server(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    audit.write("egress", "web", ts=0, host="example.com")
    (event,) = events(tmp_path / "audit.jsonl")
    assert event["ts"] > 0 and event["event"] == "egress" and event["host"] == "example.com"


def test_written_arguments_are_shortened_and_redacted(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    audit.add_secret("ghp_0123456789abcdef")
    audit.write(
        "call",
        "gh",
        tool="create_issue",
        decision="ask",
        arguments={
            "body": "y" * 1000 + " ghp_0123456789abcdef",  # the secret sits past the cut: still redacted
            "title": "uses token ghp_0123456789abcdef",
            "headers": {"authorization": "Bearer abc"},
            "labels": [str(i) for i in range(80)],
        },
        reason="the agent pasted ghp_0123456789abcdef",
    )
    line = (tmp_path / "audit.jsonl").read_text(encoding="utf-8")
    assert "ghp_0123456789abcdef" not in line and "Bearer abc" not in line
    (event,) = events(tmp_path / "audit.jsonl")
    assert event["arguments"]["body"] == REDACTED
    assert event["arguments"]["title"] == REDACTED
    assert event["arguments"]["headers"] == {"authorization": REDACTED}
    assert event["arguments"]["labels"][-1] == "…(+30 items)"
    assert event["reason"] == REDACTED


def test_every_field_is_shortened_and_checked_not_only_the_arguments(tmp_path: Path) -> None:
    """The event's own fields (a reason, a tool name a model made up) get the same cuts and
    redaction as arguments, whatever their type."""
    audit = Audit(tmp_path / "audit.jsonl")
    audit.add_secret("ghp_0123456789abcdef")
    audit.write(
        "call",
        "gh",
        tool="t" * 1000,
        reason="ok",
        detail=["x" * 1000],
        note=Decision.ALLOW,
        leaked=f"key {'ghp_0123456789abcdef'}",
        password="hunter2",
        flag=True,
        nothing=None,
    )
    (event,) = events(tmp_path / "audit.jsonl")
    assert event["tool"] == "t" * MAX_STRING + f"…(+{1000 - MAX_STRING} chars)"
    assert event["detail"] == ["x" * MAX_STRING + f"…(+{1000 - MAX_STRING} chars)"]
    assert event["reason"] == "ok" and event["note"] == "allow"
    assert event["leaked"] == REDACTED and event["password"] == REDACTED
    assert event["flag"] is True and event["nothing"] is None


def test_a_secret_passed_as_a_number_is_redacted_and_other_numbers_are_kept(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    audit.add_secret("918273645546372819")
    audit.add_secret("3141592653.5")
    audit.write(
        "call",
        "s",
        tool="t",
        decision="allow",
        arguments={"id": 918273645546372819, "pi": 3141592653.5, "n": 918273645, "f": 2.5},
    )
    (event,) = events(tmp_path / "audit.jsonl")
    assert event["arguments"] == {"id": REDACTED, "pi": REDACTED, "n": 918273645, "f": 2.5}
    assert "918273645546372819" not in (tmp_path / "audit.jsonl").read_text()


def test_new_file_is_0600(tmp_path: Path) -> None:
    Audit(tmp_path / "state" / "audit.jsonl").write("server_ready", "a")
    assert mode(tmp_path / "state" / "audit.jsonl") == 0o600
    assert mode(tmp_path / "state") == 0o700


def test_rotation_keeps_n_files_and_loses_no_event_at_the_rotation_point(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = Audit(path, max_bytes=400, keep=3)
    for seq in range(20):
        audit.write("call", "s", seq=seq, pad="p" * 60)
        assert not audit.failed
    assert all(p.stat().st_size <= 400 for p in rotated_paths(path))
    files = rotated_paths(path)
    assert [p.name for p in files] == ["audit.jsonl.3", "audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"]
    assert all(mode(p) == 0o600 for p in files)
    # oldest files were dropped past `keep`; what is left is contiguous and in order, up to the last event
    seqs = [e["seq"] for e in events(path)]
    assert seqs == list(range(seqs[0], 20))
    assert seqs[0] > 0
    assert not (tmp_path / "audit.jsonl.4").exists()


def test_rotation_between_every_event_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = Audit(path, max_bytes=1, keep=50)  # every event lands in a fresh file
    for seq in range(20):
        audit.write("call", "s", seq=seq)
    assert [e["seq"] for e in events(path)] == list(range(20))
    assert len(rotated_paths(path)) == 20


def test_a_file_rotated_by_another_process_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first, second = Audit(path, max_bytes=300, keep=5), Audit(path, max_bytes=300, keep=5)
    for seq in range(30):
        (first if seq % 2 else second).write("call", "s", seq=seq, pad="p" * 40)
    seqs = [e["seq"] for e in events(path)]
    assert seqs == list(range(seqs[0], 30))
    assert path.stat().st_size <= 300


def test_200_concurrent_writers_produce_200_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = Audit(path, max_bytes=20_000, keep=100)
    start = threading.Barrier(200)

    def writer(n: int) -> None:
        start.wait()
        audit.write("call", "s", tool=f"tool{n}", decision="allow", arguments={"n": n, "blob": "z" * 200})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    found = events(path)  # json.loads fails on any torn or interleaved line
    assert sorted(e["arguments"]["n"] for e in found) == list(range(200))
    assert not audit.failed and audit.failures == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_write_to_a_full_disk_raises_sets_failed_and_logs(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    audit = Audit(Path("/dev/full"), key=tmp_path / "audit.key")
    with pytest.raises(AuditUnwritten, match="cannot be written"):
        audit.write("call", "s", tool="t", arguments={"password": "never-logged"})
    assert audit.failed and audit.failures == 1
    audit.note("server_exit", "s")  # an event whose loss stops nothing: flagged, not raised
    assert audit.failed and audit.failures == 2
    assert "could not write a 'call' event for 's'" in caplog.text
    assert "never-logged" not in caplog.text


def test_a_write_to_an_unwritable_place_sets_failed_then_recovers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    audit = Audit(state / "audit.jsonl")
    audit.write("server_ready", "s")
    assert not audit.failed
    # the directory is replaced by a plain file: no open can succeed there, not even as root
    shutil.rmtree(state)
    state.write_text("not a directory")
    with pytest.raises(AuditUnwritten):
        audit.write("call", "s", tool="t")
    assert audit.failed and audit.failures == 1
    state.unlink()
    state.mkdir()
    audit.write("call", "s", tool="t")
    assert not audit.failed and audit.failures == 1
    assert [e["event"] for e in events(state / "audit.jsonl")] == ["call"]


def test_a_write_after_close_raises_and_sets_failed(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    audit.close()
    with pytest.raises(AuditUnwritten):
        audit.write("call", "s")
    assert audit.failed


def test_a_removed_file_is_recreated_0600(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = Audit(path)
    audit.write("a", "s")
    os.unlink(path)
    audit.write("b", "s")
    assert [e["event"] for e in events(path)] == ["b"]
    assert mode(path) == 0o600


def test_bad_rotation_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep > 0"):
        Audit(tmp_path / "audit.jsonl", keep=0)
