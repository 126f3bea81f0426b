"""`cellblock audit`: counts per server and tool, time and server filters, bad lines counted, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.cli.audit import RECENT, format_event, parse_since, read_report

NOW = time.time()
HOUR = 3600.0


def line(ts: float, event: str, server: str, **fields: Any) -> str:
    return json.dumps({"ts": ts, "event": event, "server": server, **fields})


def call(ts: float, server: str, tool: str, decision: str, is_error: bool = False) -> str:
    return line(ts, "call", server, tool=tool, decision=decision, rule="r", reason="", is_error=is_error)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """A crafted log over a rotated file and the current one, with two unreadable lines."""
    path = tmp_path / "audit.jsonl"
    old = [
        line(NOW - 10 * 86400, "server_ready", "files", protocol="2025-11-25", tools=2),
        call(NOW - 10 * 86400, "files", "read_file", "allow"),
        "this is not json",
    ]
    new = [
        call(NOW - 2 * HOUR, "files", "read_file", "allow"),
        call(NOW - 2 * HOUR, "files", "read_file", "allow", is_error=True),
        line(NOW - 2 * HOUR, "call_end", "files", tool="read_file", duration_ms=2.5, is_error=True),
        line(NOW - 2 * HOUR, "call_end", "files", tool="read_file", duration_ms=2.5, is_error=False),
        call(NOW - HOUR, "files", "write_file", "deny"),
        call(NOW - HOUR, "files", "write_file", "ask"),
        line(NOW - HOUR, "lock_held", "files", items=["tool:write_file"]),
        line(NOW - HOUR, "egress", "web", host="evil.example", port=443, decision="deny", reason="not allowed"),
        line(NOW - HOUR, "egress", "web", host="api.example", port=443, decision="allow", reason="rule"),
        call(NOW - 60, "web", "fetch", "allow"),
        '{"ts": "yesterday", "event": "call", "server": "web"}',
        line(NOW - 30, "lock_approved", "web", items=["tool:fetch"]),
    ]
    (tmp_path / "audit.jsonl.1").write_text("\n".join(old) + "\n")
    path.write_text("\n".join(new) + "\n")
    return path


def test_summary_counts_calls_by_decision_and_errors(log: Path) -> None:
    report = read_report(log)
    summary = report.as_json()["summary"]
    assert summary["files"]["tools"] == {
        "read_file": {"calls": 3, "allowed": 3, "denied": 0, "asked": 0, "errors": 2},
        "write_file": {"calls": 2, "allowed": 0, "denied": 1, "asked": 1, "errors": 0},
    }
    assert summary["files"]["lock_events"] == 1 and summary["files"]["egress_denied"] == 0
    assert summary["web"]["tools"] == {"fetch": {"calls": 1, "allowed": 1, "denied": 0, "asked": 0, "errors": 0}}
    assert summary["web"]["lock_events"] == 1 and summary["web"]["egress_denied"] == 1


def test_events_a_budget_counted_are_in_the_summary(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    written = [
        line(NOW, "egress", "web", host="evil.example", port=443, decision="deny"),
        line(NOW, "suppressed", "web", kind="egress_refused", count=1966, since=NOW),
        line(NOW, "suppressed", "web", kind="egress_allowed", count=7, since=NOW),
        line(NOW, "suppressed", "web", kind="lock_changed", count=40, since=NOW),
    ]
    path.write_text("\n".join(written) + "\n")
    summary = read_report(path).as_json()["summary"]["web"]
    assert summary["egress_denied"] == 1967 and summary["lock_events"] == 40


def test_a_tool_named_like_a_prompt_is_a_row_apart_from_the_prompt_get(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    written = [
        call(NOW, "h", "prompt:greet", "allow"),  # the server's tool whose own name is "prompt:greet"
        line(NOW, "call", "h", tool="prompt:greet", kind="prompt", decision="allow", rule="r", reason=""),
        line(NOW, "call", "h", tool="prompt:greet", kind="prompt", decision="deny", rule="r", reason=""),
        line(NOW, "call", "h", tool="resource:h://index", kind="resource", decision="ask", rule="r", reason=""),
        line(NOW, "call_end", "h", tool="prompt:greet", kind="prompt", duration_ms=1.0, is_error=True),
    ]
    path.write_text("\n".join(written) + "\n")
    tools = read_report(path).as_json()["summary"]["h"]["tools"]
    assert tools == {
        "prompt:greet": {"calls": 1, "allowed": 1, "denied": 0, "asked": 0, "errors": 0},
        "prompt greet": {"calls": 2, "allowed": 1, "denied": 1, "asked": 0, "errors": 1},
        "resource h://index": {"calls": 1, "allowed": 0, "denied": 0, "asked": 1, "errors": 0},
    }
    # control: without `kind` (as records were before) the tool and the get share one row
    path.write_text("\n".join(written[:3]).replace(', "kind": "prompt"', "") + "\n")
    assert list(read_report(path).as_json()["summary"]["h"]["tools"]) == ["prompt:greet"]


def test_bad_lines_are_counted_not_skipped_silently(log: Path) -> None:
    report = read_report(log)
    assert sum(report.unreadable.values()) == 2
    assert report.unreadable == {log.with_name("audit.jsonl.1"): 1, log: 1}


def test_files_are_read_oldest_first(log: Path) -> None:
    report = read_report(log)
    assert [p.name for p in report.files] == ["audit.jsonl.1", "audit.jsonl"]
    assert report.recent[0]["event"] == "server_ready"
    assert report.recent[-1]["event"] == "lock_approved"


def test_since_and_server_filter(log: Path) -> None:
    recent = read_report(log, since=parse_since("7d", NOW))
    assert recent.as_json()["summary"]["files"]["tools"]["read_file"]["calls"] == 2
    assert recent.matched == 11  # the old file's two events are out; bad lines are never "matched"
    last_half_hour = read_report(log, since=parse_since("30m", NOW))
    assert [e["event"] for e in last_half_hour.recent] == ["call", "lock_approved"]
    web = read_report(log, server="web")
    assert set(web.as_json()["summary"]) == {"web"}
    assert all(e["server"] == "web" for e in web.recent)


@pytest.mark.parametrize(
    ("text", "ago"),
    [("30m", 1800), ("12h", 12 * 3600), ("7d", 7 * 86400), ("45s", 45), ("2w", 14 * 86400), ("1.5h", 5400)],
)
def test_since_durations(text: str, ago: float) -> None:
    assert parse_since(text, NOW) == pytest.approx(NOW - ago)


def test_since_iso_dates() -> None:
    assert parse_since("2026-05-01") == datetime(2026, 5, 1).timestamp()
    assert parse_since("2026-05-01T12:00:00+00:00") == 1777636800.0


@pytest.mark.parametrize("text", ["", "7", "7 days", "-3d", "yesterday", "2026-13-01", "d7"])
def test_bad_since_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration like 30m"):
        parse_since(text, NOW)


def test_only_the_most_recent_events_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(call(NOW - 100 + i, "s", "t", "allow") + "\n" for i in range(RECENT + 15)))
    report = read_report(path)
    assert report.matched == RECENT + 15
    assert len(report.recent) == RECENT
    assert report.recent[0]["ts"] == NOW - 100 + 15


def test_an_event_line_cannot_carry_terminal_escapes(tmp_path: Path) -> None:
    event = {"ts": NOW, "event": "call", "server": "s", "tool": "t\x1b[2J", "reason": "a\nb\x9bc"}
    text = format_event(event)
    assert "\x1b" not in text and "\n" not in text and "\x9b" not in text
    assert "tool=t\\u001b[2J" in text


def test_what_the_gateway_writes_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = Audit(path, max_bytes=500)
    for n in range(10):
        audit.write("call", "s", tool="t", decision="deny" if n % 2 else "allow", arguments={"n": n}, is_error=False)
    audit.close()
    report = read_report(path)
    assert report.unreadable == {}
    assert report.as_json()["summary"]["s"]["tools"]["t"] == {
        "calls": 10,
        "allowed": 5,
        "denied": 5,
        "asked": 0,
        "errors": 0,
    }


# -- the command -----------------------------------------------------------------------------------


def cellblock(state: Path, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(state)}
    env["CELLBLOCK_CONFIG"] = str(config if config is not None else state / "no-such-config.yaml")
    return subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", "audit", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_cli_json_shape(log: Path) -> None:
    done = cellblock(log.parent, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"files", "since", "server", "unreadable_lines", "events_matched", "summary", "events"}
    assert data["unreadable_lines"] == 2 and data["events_matched"] == 13
    assert data["summary"]["web"] == {
        "tools": {"fetch": {"calls": 1, "allowed": 1, "denied": 0, "asked": 0, "errors": 0}},
        "lock_events": 1,
        "egress_denied": 1,
        "server_failed": 0,
    }
    assert [e["event"] for e in data["events"]][-2:] == ["call", "lock_approved"]
    assert "cellblock: 1 unreadable line(s) in" in done.stderr


def test_cli_text_report(log: Path) -> None:
    done = cellblock(log.parent, "--since", "7d", "--server", "files")
    assert done.returncode == 0, done.stderr
    rows = [r.split() for r in done.stdout.splitlines()]
    assert ["server", "tool", "calls", "allowed", "denied", "asked", "errors"] in rows
    assert ["files", "read_file", "2", "2", "0", "0", "2"] in rows
    assert ["files", "write_file", "2", "0", "1", "1", "0"] in rows
    assert "recent events (7 of 7):" in done.stdout
    assert "web" not in done.stdout
    assert all(line.startswith("cellblock: ") for line in done.stderr.splitlines())


def test_cli_bad_since_exits_2(log: Path) -> None:
    done = cellblock(log.parent, "--since", "last tuesday")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("cellblock: --since 'last tuesday': expected a duration")


def test_cli_without_a_log_says_so(tmp_path: Path) -> None:
    done = cellblock(tmp_path, "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["events"] == []
    assert "cellblock: no audit log at" in done.stderr


def test_cli_reads_the_path_the_config_names(tmp_path: Path, log: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\naudit:\n  path: {log}\nservers: {{}}\n")
    state = tmp_path / "elsewhere"
    done = cellblock(state, "--json", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"] == [str(log.with_name("audit.jsonl.1")), str(log)]


def test_cli_a_named_config_that_is_missing_exits_2(tmp_path: Path) -> None:
    done = cellblock(tmp_path, "--config", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2
    assert "no such config file" in done.stderr


def test_an_event_line_leaves_out_the_chains_macs_which_are_kept_in_the_json(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = Audit(path)
    audit.write("call", "s", tool="t", decision="allow")
    audit.close()
    [event] = read_report(path).recent
    assert "mac" in event and "prev" in event  # the record as written, for --json and --verify
    assert "mac=" not in format_event(event) and "prev=" not in format_event(event)
    assert "tool=t decision=allow" in format_event(event)
