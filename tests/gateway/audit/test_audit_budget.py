"""What a server triggers by itself is held to a budget and to half of each file; decisions never are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cellblock.gateway.audit.budget import BURST, REFILL, WINDOW
from cellblock.gateway.audit.log import Audit, rotated_paths
from tests.gateway.conftest import Clock


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for file in rotated_paths(path) for line in file.read_text().splitlines()]


def test_a_burst_then_counted_and_one_summary_per_kind(tmp_path: Path, clock: Clock) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    for n in range(100):
        audit.write("egress", "web", host=f"h{n}", port=443, decision="deny", reason="not allowed")
        audit.write("egress", "web", host="ok", port=443, decision="allow")
    audit.write("call", "web", tool="fetch", decision="allow")  # a decision: written whatever the budget says
    audit.close()
    found = events(tmp_path / "audit.jsonl")
    refused = [e for e in found if e["event"] == "egress" and e["decision"] == "deny"]
    assert len(refused) == BURST and refused[-1]["host"] == f"h{BURST - 1}"
    summaries = {e["kind"]: e for e in found if e["event"] == "suppressed"}
    assert summaries["egress_refused"]["count"] == 100 - BURST
    assert summaries["egress_allowed"]["count"] == 100 - BURST
    assert summaries["egress_refused"]["server"] == "web" and summaries["egress_refused"]["since"] == clock.now
    assert [e["event"] for e in found][-3:] == ["call", "suppressed", "suppressed"]


def test_the_summary_comes_when_the_window_ends_and_the_budget_refills(tmp_path: Path, clock: Clock) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    for _ in range(BURST + 5):
        audit.write("lock_changed", "churn", items=["tool:a"])
    clock.now += WINDOW  # the next event of any kind from anyone writes what is due
    audit.write("call", "other", tool="t", decision="allow")
    found = events(tmp_path / "audit.jsonl")
    assert [e["event"] for e in found][-2:] == ["suppressed", "call"]
    assert found[-2]["count"] == 5 and found[-2]["kind"] == "lock_changed"
    clock.now += REFILL  # one more is allowed again
    audit.write("lock_changed", "churn", items=["tool:b"])
    audit.close()
    assert events(tmp_path / "audit.jsonl")[-1]["items"] == ["tool:b"]


def test_decisions_are_never_counted_away(tmp_path: Path, clock: Clock) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    for n in range(500):
        audit.write("call", "files", tool="read_file", decision="deny", arguments={"n": n})
        audit.write("approval_denied", "files", tool="read_file", reason="no")
        audit.write("lock_approved", "files", items=["tool:x"], removed=[], via="cli")
    audit.close()
    assert len(events(tmp_path / "audit.jsonl")) == 1500


def flood(audit: Audit, event: str, servers: int) -> None:
    """Catalog churn from many servers at once, each within its own budget: about 2 KB per event."""
    items = [f"tool:t{n}" for n in range(40)]
    for round_ in range(BURST):
        for s in range(servers):
            audit.write(event, f"s{s}", items=items, round=round_)


def test_a_flood_fills_only_half_of_each_file_so_it_cannot_rotate_a_decision_out(tmp_path: Path, clock: Clock) -> None:
    audit = Audit(tmp_path / "audit.jsonl", max_bytes=64 << 10, keep=2)
    audit.write("call", "files", tool="read_file", decision="allow", arguments={"path": "marker"})
    flood(audit, "lock_changed", servers=50)  # 1000 events, ~1.5 MB asked for
    audit.close()
    found = events(tmp_path / "audit.jsonl")
    assert found[0]["arguments"] == {"path": "marker"}
    assert len(rotated_paths(tmp_path / "audit.jsonl")) == 1  # no rotation at all
    assert (tmp_path / "audit.jsonl").stat().st_size <= (64 << 10) // 2 + (16 << 10)  # the summaries at close
    left_out = sum(e["count"] for e in found if e["event"] == "suppressed")
    written = sum(1 for e in found if e["event"] == "lock_changed")
    assert written + left_out == 50 * BURST and left_out > 0


def test_control_the_same_flood_as_unbudgeted_events_rotates_the_marker_out(tmp_path: Path, clock: Clock) -> None:
    audit = Audit(tmp_path / "audit.jsonl", max_bytes=64 << 10, keep=2)
    audit.write("call", "files", tool="read_file", decision="allow", arguments={"path": "marker"})
    flood(audit, "lock_approved", servers=50)  # the same bytes, as events that are always written
    audit.close()
    assert not any(e.get("arguments") == {"path": "marker"} for e in events(tmp_path / "audit.jsonl"))


def test_past_half_a_file_of_decisions_a_servers_own_events_are_still_written(tmp_path: Path, clock: Clock) -> None:
    """The half is a share, not a place: in a file that decisions filled past half, a server's
    restart and catalog change are written in full, and a flood still gets no more than half."""
    path = tmp_path / "audit.jsonl"
    audit = Audit(path, max_bytes=64 << 10, keep=2)
    calls = 0
    while path.stat().st_size < 40 << 10:
        audit.write("call", "files", tool="read_file", decision="allow", arguments={"path": "x" * 200})
        calls += 1
    audit.write("server_ready", "git", protocol="2025-11-25", tools=3)
    audit.write("lock_changed", "git", items=["tool:git_status"])
    assert [e["event"] for e in events(path)][-2:] == ["server_ready", "lock_changed"]
    audit.close()
    # a new writer on the same file counts what is there before it judges the next one
    again = Audit(path, max_bytes=64 << 10, keep=2)
    flood(again, "lock_changed", servers=50)
    again.close()
    for file in rotated_paths(path):  # each file: no more than half is the flood's
        lines = file.read_text().splitlines()
        own = sum(len(line) + 1 for line in lines if json.loads(line)["event"] in ("lock_changed", "suppressed"))
        assert own <= (64 << 10) // 2 + (16 << 10)  # the summaries at close
    found = events(path)
    assert sum(1 for e in found if e["event"] == "call") == calls  # not one decision rotated out
    assert sum(e["count"] for e in found if e["event"] == "suppressed") > 0


def test_sampling_and_its_approvals_are_the_servers_own_but_a_tool_named_sampling_is_a_call(
    tmp_path: Path, clock: Clock
) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    for _ in range(100):  # a server asking for the client's model, under `sampling: ask`
        audit.write("approval_asked", "llm", tool="sampling", via="elicitation", kind="sampling")
        audit.write("approval_granted", "llm", tool="sampling", scope="once", via="elicitation", kind="sampling")
        audit.write("sampling", "llm", decision="allow", max_output=10)
        # control: the approvals of a call to a tool that is named "sampling" are decisions
        audit.write("approval_granted", "llm", tool="sampling", scope="once", via="elicitation")
    audit.close()
    found = events(tmp_path / "audit.jsonl")
    calls = [e for e in found if e["event"] == "approval_granted" and "kind" not in e]
    assert len(calls) == 100
    for event, kind in (("approval_asked", "sampling_asked"), ("approval_granted", "sampling_granted")):
        assert sum(1 for e in found if e["event"] == event and e.get("kind") == "sampling") == BURST
        (summary,) = [e for e in found if e["event"] == "suppressed" and e["kind"] == kind]
        assert summary["count"] == 100 - BURST
    assert sum(1 for e in found if e["event"] == "sampling") == BURST


def sampling_flood(audit: Audit, servers: range) -> None:
    """Sampling approvals from many servers, each within its own budget."""
    for _ in range(BURST):
        for s in servers:
            audit.write("approval_asked", f"s{s}", tool="sampling", via="elicitation", kind="sampling", pad="x" * 400)


def test_a_new_writer_counts_the_sampling_approvals_already_in_the_file_as_the_servers_share(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "audit.jsonl"
    first = Audit(path, max_bytes=64 << 10, keep=2)
    sampling_flood(first, range(50))
    first.close()
    again = Audit(path, max_bytes=64 << 10, keep=2)  # it reads the share from the file
    sampling_flood(again, range(50, 100))
    again.close()
    assert len(rotated_paths(path)) == 1  # the second flood found the share taken: no rotation
    own = sum(len(line) + 1 for line in path.read_text().splitlines())
    assert own <= (64 << 10) // 2 + (16 << 10)  # the summaries at close
