"""Statistics, targets and tables: what every section returns, printed as markdown and saved as JSON."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Summary", "Table", "Target", "fmt", "median", "percentile", "say", "summarize"]


def say(message: str) -> None:
    """Progress for the person waiting: stderr, prefixed `bench:`."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, interpolating between the two nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


@dataclass(frozen=True)
class Summary:
    """Latency percentiles (ms) and throughput of one timed batch of calls."""

    p50: float
    p90: float
    p99: float
    per_second: float

    @staticmethod
    def median_of(rounds: Sequence[Summary]) -> Summary:
        """Each figure's median over repeated rounds."""
        return Summary(
            p50=median([r.p50 for r in rounds]),
            p90=median([r.p90 for r in rounds]),
            p99=median([r.p99 for r in rounds]),
            per_second=median([r.per_second for r in rounds]),
        )


def summarize(times_ms: Sequence[float], seconds: float) -> Summary:
    """Percentiles of `times_ms`, and how many calls a second `seconds` of wall time carried."""
    return Summary(
        p50=percentile(times_ms, 50),
        p90=percentile(times_ms, 90),
        p99=percentile(times_ms, 99),
        per_second=len(times_ms) / seconds,
    )


@dataclass(frozen=True)
class Target:
    """A target from issue 8: `value` must be at most (or, `at_least`, at least) `limit`."""

    limit: float
    unit: str
    at_least: bool = False

    @property
    def text(self) -> str:
        return f"{'≥' if self.at_least else '≤'} {self.limit:g}{self.unit}"

    def verdict(self, value: float | None) -> str:
        """`PASS`, or `MISS` with how far off the value is (absolute and relative), or n/a."""
        if value is None:
            return "n/a"
        passed = value >= self.limit if self.at_least else value <= self.limit
        if passed:
            return f"PASS ({self.text})"
        over = value - self.limit
        share = over / self.limit
        return f"MISS by {over:+.{_digits(over)}f}{self.unit} ({share:+.{0 if abs(share) >= 0.1 else 1}%}; {self.text})"


def fmt(value: float | None, digits: int | None = None) -> str:
    """A number for a table cell: fewer decimals as it grows; n/a for None."""
    if value is None:
        return "n/a"
    return f"{value:.{_digits(value) if digits is None else digits}f}"


def _digits(value: float) -> int:
    size = abs(value)
    return 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 0.1 else 3


@dataclass
class Table:
    """One table of results: formatted cells for people, raw numbers for JSON."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, cells: Sequence[str], **raw: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row has {len(cells)} cells, table '{self.title}' has {len(self.columns)} columns")
        self.rows.append(list(cells))
        self.data.append(raw)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", _line(self.columns), _line(["---"] * len(self.columns))]
        lines += [_line(row) for row in self.rows]
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "data": self.data, "notes": self.notes}


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
