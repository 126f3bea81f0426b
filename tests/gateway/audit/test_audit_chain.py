"""The audit log's MAC chain: `cellblock audit --verify` finds an edited, removed, moved or cut line
by file and line number, across rotation and two writers; the plain report alone cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.gateway.audit.chain import KEY_NAME, verify
from cellblock.gateway.audit.log import Audit, rotated_paths


def verify_cli(state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(state), "CELLBLOCK_CONFIG": str(state / "none.yaml")}
    return subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", "audit", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def written_log(state: Path, events: int = 40, max_bytes: int = 2000) -> list[Path]:
    """A real log of `events` calls from two writers on one file, rotated into several files."""
    state.mkdir(mode=0o700, exist_ok=True)
    one = Audit(state / "audit.jsonl", max_bytes=max_bytes, keep=50)
    two = Audit(state / "audit.jsonl", max_bytes=max_bytes, keep=50)
    for n in range(events):
        (one if n % 3 else two).write("call", "files", tool="read_file", decision="allow", arguments={"n": n})
    one.close()
    two.close()
    return rotated_paths(state / "audit.jsonl")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_a_whole_log_verifies_through_rotation_and_two_writers(tmp_path: Path) -> None:
    paths = written_log(tmp_path)
    assert len(paths) >= 4
    assert (tmp_path / KEY_NAME).stat().st_mode & 0o777 == 0o600
    done = verify_cli(tmp_path, "--verify")
    assert done.returncode == 0, done.stderr
    assert f"40 line(s) in {len(paths)} file(s)" in done.stdout
    assert "audit chain whole" in done.stdout and "rotated away" not in done.stdout
    # rotation dropping the oldest file is not a break, but the chain no longer speaks for it
    paths[0].unlink()
    done = verify_cli(tmp_path, "--verify")
    assert done.returncode == 0
    assert "audit chain whole" not in done.stdout
    assert f"older lines were rotated away: {paths[1].name} follows a file no longer kept" in done.stdout


def test_verify_says_what_rotation_dropped_and_what_the_budget_counted_instead_of_whole(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    audit = Audit(tmp_path / "audit.jsonl", max_bytes=2000, keep=2)
    audit.write("call", "files", tool="read_file", decision="allow", arguments={"path": "marker"})
    for n in range(60):  # a server's own events past its budget, among calls that rotate the marker out
        audit.write("lock_changed", "churn", items=[f"tool:t{n}"])
        audit.write("call", "files", tool="read_file", decision="allow", arguments={"n": n})
    audit.close()
    done = verify_cli(tmp_path, "--verify")
    assert done.returncode == 0, done.stderr
    assert "audit chain unbroken from its oldest kept line" in done.stdout and "whole" not in done.stdout
    assert "older lines were rotated away: audit.jsonl.2 follows a file no longer kept" in done.stdout
    kept = [json.loads(line) for path in rotated_paths(tmp_path / "audit.jsonl") for line in lines(path)]
    left_out = sum(e["count"] for e in kept if e["event"] == "suppressed")
    summaries = sum(1 for e in kept if e["event"] == "suppressed")
    assert left_out > 0
    assert f"{left_out} event(s) servers triggered were counted, not written, in {summaries}" in done.stdout


def _edit(path: Path, index: int) -> None:
    text = lines(path)
    text[index] = text[index].replace('"n":', '"n":1')
    path.write_text("".join(text))


def _delete(path: Path, index: int) -> None:
    text = lines(path)
    del text[index]
    path.write_text("".join(text))


def _swap(path: Path, index: int) -> None:
    text = lines(path)
    text[index], text[index + 1] = text[index + 1], text[index]
    path.write_text("".join(text))


def _cut(path: Path, index: int) -> None:
    text = lines(path)
    text[index] = text[index][:30]
    path.write_text("".join(text[: index + 1]))


@pytest.mark.parametrize(
    ("damage", "line", "why"),
    [
        (_edit, 2, "edited or moved"),
        (_delete, 1, "edited or moved, or one before it removed"),
        (_swap, 1, "edited or moved"),
        (_cut, 2, "not a chained record"),
    ],
)
def test_an_edited_removed_moved_or_cut_line_is_named_by_file_and_line(
    tmp_path: Path, damage: object, line: int, why: str
) -> None:
    paths = written_log(tmp_path)
    middle = paths[len(paths) // 2]
    assert len(lines(middle)) >= 3
    damage(middle, line)  # type: ignore[operator]
    # control: the report reads the damaged log without a word (only a cut line is counted there)
    report = verify_cli(tmp_path, "--json")
    assert report.returncode == 0
    done = verify_cli(tmp_path, "--verify")
    assert done.returncode == 1
    assert f"{middle}:{line + 1}: " in done.stderr and why in done.stderr


def test_a_file_missing_between_two_others_is_a_break(tmp_path: Path) -> None:
    paths = written_log(tmp_path)
    paths[1].unlink()
    done = verify_cli(tmp_path, "--verify")
    assert done.returncode == 1 and f"{paths[2]}:1: does not follow the line before it" in done.stderr


def test_removing_the_first_lines_of_the_oldest_file_is_a_break(tmp_path: Path) -> None:
    paths = written_log(tmp_path)
    _delete(paths[0], 0)
    assert verify(paths, (tmp_path / KEY_NAME).read_bytes())[1] is not None


def test_a_line_sealed_with_another_key_does_not_pass(tmp_path: Path) -> None:
    """A server that could write the log but not read the key forges a line with a key of its own."""
    paths = written_log(tmp_path, events=3)
    forger_dir = tmp_path / "forger"
    forger_dir.mkdir()
    forger = Audit(forger_dir / "audit.jsonl")
    forger.write("call", "files", tool="read_file", decision="allow", arguments={"n": 99})
    forger.close()
    forged = json.loads((forger_dir / "audit.jsonl").read_text())
    forged.pop("prev")
    last = json.loads(lines(paths[-1])[-1])
    body = json.dumps({**forged, "mac": last["mac"]}, separators=(",", ":"))
    with paths[-1].open("a") as handle:
        handle.write(body + "\n")
    checked, broken = verify(paths, (tmp_path / KEY_NAME).read_bytes())
    assert checked == 3 and broken is not None and broken.line == len(lines(paths[-1]))
    # control: the forger's own key passes its own line
    assert verify([forger_dir / "audit.jsonl"], (forger_dir / KEY_NAME).read_bytes()) == (1, None)
