"""A jailed server cannot flush the audit log: catalog churn and refused CONNECTs through the
gateway (in memory, tests/harness.py), with a small log, leave the marker call before them in
place, counted in `suppressed` events; the control replays the same flood as events that are
always written."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit, rotated_paths
from tests.harness import build, connected
from tests.integration.conftest import PROBE, cli, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail, pytest.mark.slow]

FLOOD = PROBE.parent / "flood.py"
SMALL = {"max_bytes": "16KiB", "keep": 1}  # the control's flood is twice what that keeps
MARKER = {"message": "marker-call-before-the-flood"}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for file in rotated_paths(path) for line in file.read_text().splitlines()]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def flood_server(**jail: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(FLOOD)],
        "jail": {"read_only": [str(FLOOD.parent)], **jail},
        "lock": {"enabled": True, "first": "trust"},
    }


def has_marker(found: list[dict[str, Any]]) -> bool:
    return any(e["event"] == "call" and e.get("arguments") == MARKER for e in found)


# The control's flood must be more than this to rotate the marker out of both of its files (16 KiB
# each, keep 1), with room for one line's overshoot.
CONTROL_ROTATES = 3 * (16 << 10)


def churn(found: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The catalog changes written in `found`, and how many more were left out (counted)."""
    changed = [e for e in found if e["event"] == "lock_changed"]
    left_out = sum(e["count"] for e in found if e["event"] == "suppressed" and e["kind"] == "lock_changed")
    return changed, left_out


def churn_bytes(found: list[dict[str, Any]]) -> int:
    """What the control would write of the churn seen in `found`: every change, written or left
    out, as long as the last one written (as `replayed_raw` writes them)."""
    changed, left_out = churn(found)
    return (len(changed) + left_out) * len(json.dumps(changed[-1])) if changed else 0


def replayed_raw(tmp_path: Path, line: dict[str, Any], times: int) -> list[dict[str, Any]]:
    """Control: the same marker and the same flood through a log that writes every event (as decisions are)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    audit = Audit(raw / "audit.jsonl", max_bytes=16 << 10, keep=1)
    audit.write("call", "flood", tool="echo", decision="allow", arguments=MARKER)
    fields = {k: v for k, v in line.items() if k not in ("ts", "event", "server", "prev", "mac")}
    for _ in range(times):
        audit.write("lock_approved", "flood", **fields)
    audit.close()
    return events(raw / "audit.jsonl")


async def test_catalog_churn_cannot_rotate_a_marker_call_out(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, {"flood": flood_server()}, audit=SMALL)
    async with connected(build(config, state)) as client:
        assert not (await client.call_tool("flood__echo", MARKER)).is_error
        # under load the gateway re-reads the catalog less often: churn on until the flood is one
        # the control's log could not hold (a few rounds at most)
        for _ in range(5):
            churned = await client.call_tool("flood__churn", {"seconds": 20})
            assert not churned.is_error, text(churned)
            if churn_bytes(events(state / "audit.jsonl")) > CONTROL_ROTATES:
                break
    found = events(state / "audit.jsonl")
    assert has_marker(found)
    changed, left_out = churn(found)
    assert changed and left_out > 0, "the churn was not held to the budget"
    assert churn_bytes(found) > CONTROL_ROTATES, "the churn was too small for the control to mean anything"
    assert cli({"CELLBLOCK_STATE_DIR": str(state)}, "audit", "--verify", "--config", str(config)).returncode == 0
    # control: the same flood, every event written, rotates the marker out of every file
    assert not has_marker(replayed_raw(tmp_path, changed[-1], len(changed) + left_out))


async def test_refused_connects_from_a_background_thread_cannot_rotate_a_marker_call_out(tmp_path: Path) -> None:
    state = tmp_path / "state"
    jail = {"network": "allowlist", "allow_hosts": ["127.0.0.1:9"]}
    config = write_config(tmp_path, {"flood": flood_server(**jail)}, audit=SMALL)
    async with connected(build(config, state)) as client:
        assert not (await client.call_tool("flood__echo", MARKER)).is_error
        knocked = await client.call_tool("flood__knock", {"seconds": 6})
        made = int(text(knocked).split()[1])
    found = events(state / "audit.jsonl")
    assert has_marker(found)
    refused = [e for e in found if e["event"] == "egress" and e["decision"] == "deny"]
    (summary,) = [e for e in found if e["event"] == "suppressed" and e["kind"] == "egress_refused"]
    assert summary["server"] == "flood" and len(refused) + summary["count"] == made > 1000
    report = cli({"CELLBLOCK_STATE_DIR": str(state)}, "audit", "--config", str(config))
    assert "kind=egress_refused" in report.stdout and f"count={summary['count']}" in report.stdout
    assert not has_marker(replayed_raw(tmp_path, refused[-1] | {"event": "egress"}, made))
