"""The dashboard's charts: calls and refusals per server over time, counted from the audit events
the timeline reads (and its filters match), in the same pass through the log.

A call is a `call` event: a tool call, prompt get or resource read, allowed or refused, which the
gateway records once (`cellblock audit` counts calls the same way; `call_end` is its outcome, not
another call). A refusal is a `call` whose decision is `deny`: refused by the policy, held by the
lock, routed nowhere, carrying a secret held for another server, or denied by a human or left
unanswered (as telemetry's `cellblock.refusals`). A refused connection (`egress`) is not a call.

The buckets are chosen from the span of the events counted, so that there are at most
`MAX_BUCKETS`; they are aligned on multiples of their length since the epoch (UTC). Each chart
draws its busiest servers and sums the rest. Server names are escaped (`visible`): the page sets
them as text.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from cellblock.policy.text import visible

__all__ = ["MAX_BUCKETS", "SERIES", "STEPS", "Charts"]

MAX_BUCKETS = 60
# lines a chart draws at most: past that, the busiest SERIES - 1 servers and the rest summed
SERIES = 6
# bucket lengths in seconds, each a multiple of the one before (so counts merge exactly as the
# span grows); past a week, weeks doubled
STEPS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400, 604800)
# a time past the year 9999 is no clock's: an edited line, counted as not placed
_LATEST = 253402300799
_NAMES = {1: "second", 60: "minute", 3600: "hour", 86400: "day", 604800: "week"}


def _step_for(span: float) -> int:
    """The shortest bucket that puts `span` seconds in at most MAX_BUCKETS buckets."""
    for step in STEPS:
        if span <= step * (MAX_BUCKETS - 1):
            return step
    step = STEPS[-1]
    while span > step * (MAX_BUCKETS - 1):
        step *= 2
    return step


def per(step: int) -> str:
    """`step` in words: `minute`, `5 minutes`, `2 weeks`."""
    for unit in sorted(_NAMES, reverse=True):
        if step % unit == 0:
            count, name = step // unit, _NAMES[unit]
            return name if count == 1 else f"{count} {name}s"
    raise AssertionError(step)  # every step is a whole number of seconds


class Charts:
    """Counts of calls and refusals per server and bucket, fed one event at a time."""

    def __init__(self) -> None:
        self.step = STEPS[0]
        self.unplaced = 0  # calls whose time no clock shows
        self._low: float | None = None
        self._high: float | None = None
        self._calls: dict[int, Counter[str]] = {}
        self._refusals: dict[int, Counter[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        if event["event"] != "call":
            return
        ts = event["ts"]
        if not 0 <= ts <= _LATEST:  # NaN and infinities too: they compare false
            self.unplaced += 1
            return
        self._low = ts if self._low is None else min(self._low, ts)
        self._high = ts if self._high is None else max(self._high, ts)
        step = _step_for(self._high - self._low)
        if step != self.step:
            self._merge(step)
        key, server = int(ts // self.step), visible(event["server"])
        self._calls.setdefault(key, Counter())[server] += 1
        if event.get("decision") == "deny":
            self._refusals.setdefault(key, Counter())[server] += 1

    def _merge(self, step: int) -> None:
        """Longer buckets: a multiple of the current ones, so each count lands whole in one."""
        for counts in (self._calls, self._refusals):
            merged: dict[int, Counter[str]] = {}
            for key, counter in counts.items():
                merged.setdefault(key * self.step // step, Counter()).update(counter)
            counts.clear()
            counts.update(merged)
        self.step = step

    def result(self) -> dict[str, Any]:
        """What the page draws: each bucket's start (unix seconds), and each chart's series."""
        if self._low is None or self._high is None:
            keys: list[int] = []
        else:
            keys = list(range(int(self._low // self.step), int(self._high // self.step) + 1))
        return {
            "step": self.step,
            "per": per(self.step),
            "times": [key * self.step for key in keys],
            "calls": _series(self._calls, keys),
            "refusals": _series(self._refusals, keys),
            "unplaced": self.unplaced,
        }


def _series(counts: dict[int, Counter[str]], keys: list[int]) -> dict[str, Any]:
    """The busiest servers' counts per bucket, busiest first, and the rest summed as one series."""
    totals: Counter[str] = Counter()
    for counter in counts.values():
        totals.update(counter)
    ranked = sorted(totals, key=lambda name: (-totals[name], name))
    shown = ranked if len(ranked) <= SERIES else ranked[: SERIES - 1]
    rest = ranked[len(shown) :]
    series = [
        {"name": name, "other": False, "counts": [counts.get(key, Counter())[name] for key in keys]} for name in shown
    ]
    if rest:
        summed = [sum(counts.get(key, Counter())[name] for name in rest) for key in keys]
        series.append({"name": f"{len(rest)} other servers", "other": True, "counts": summed})
    return {"total": sum(totals.values()), "series": series}
