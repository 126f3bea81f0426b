"""Reading the audit log back: its events, oldest first through the rotated files, and the
verdict of its MAC chain. `cellblock audit` and the dashboard's timeline share this code.

A line that is not an event (not JSON, not an object, no numeric `ts` or text `event`/`server`)
is given as None, for the reader to count: never dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellblock.gateway.audit.chain import Break, verify
from cellblock.gateway.audit.log import rotated_paths
from cellblock.policy.jsontext import loads

__all__ = ["ChainVerdict", "lines", "parse", "verify_chain"]


def lines(files: list[Path]) -> Iterator[tuple[Path, bytes]]:
    """Each line of `files`, in order, with the file it is in."""
    for path in files:
        try:
            with path.open("rb") as handle:
                for raw in handle:
                    yield path, raw
        except FileNotFoundError:
            continue  # rotated away between listing and reading: its events are in the next file


def parse(raw: bytes) -> dict[str, Any] | None:
    """The event on the line `raw`, or None when it is not one."""
    try:
        event = loads(raw)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    ts = event.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return None
    if not isinstance(event.get("event"), str) or not isinstance(event.get("server"), str):
        return None
    return event


@dataclass(frozen=True)
class ChainVerdict:
    """What `cellblock audit --verify` finds of the chain through a log and its rotated files."""

    files: list[Path]
    checked: int = 0  # lines that check out (before the break, if any)
    broken: Break | None = None  # the first line that does not
    rotated: bool = False  # the oldest file follows one rotation dropped
    left_out: int = 0  # events a budget counted in `suppressed` lines instead of writing them
    summaries: int = 0  # how many such lines
    error: str | None = None  # why it could not be checked (a file or the key unreadable)


def verify_chain(path: Path, key_path: Path) -> ChainVerdict:
    """Check the chain through `path` and its rotated files with the key at `key_path`."""
    paths = rotated_paths(path)
    if not paths:
        return ChainVerdict(paths)
    try:
        checked, broken = verify(paths, key_path.read_bytes())
        if broken is not None:
            return ChainVerdict(paths, checked, broken)
        rotated, left_out, summaries = _not_in_the_chain(paths)
    except OSError as exc:
        return ChainVerdict(paths, error=f"{exc.filename or path}: {exc.strerror or exc}")
    return ChainVerdict(paths, checked, None, rotated, left_out, summaries)


def _not_in_the_chain(paths: list[Path]) -> tuple[bool, int, int]:
    """What a whole chain does not hold: whether the oldest file follows one that rotation dropped
    (its first line names a line before it), and how many events `suppressed` lines stand for, in
    how many lines.

    Raises:
        OSError: a file cannot be read.
    """
    rotated, left_out, summaries = False, 0, 0
    for index, path in enumerate(paths):
        with path.open("rb") as handle:
            for number, line in enumerate(handle):
                first = index == 0 and number == 0
                if not first and b'"event":"suppressed"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # the chain checked it: a line written before the chain began
                if not isinstance(event, dict):
                    continue
                if first:
                    rotated = bool(event.get("prev"))
                if event.get("event") == "suppressed" and isinstance(event.get("count"), int):
                    left_out, summaries = left_out + event["count"], summaries + 1
    return rotated, left_out, summaries
