"""A scan's verdict in words, free of the MCP SDK so the dashboard can read kept reports with it:
the severities of findings, the dimensions a summary is given in, and the badge's text."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

__all__ = ["DIMENSIONS", "REPORT_FORMAT", "Severity", "badge_text"]

# what a report `--report` writes and the scans directory keeps says it is (docs/scan.md)
REPORT_FORMAT = "cellblock-scan-report/1"


class Severity(IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3

    def __str__(self) -> str:
        return self.name.lower()


# Each finding's code, by what it is about.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "fs": ("secret-read", "unconfined-path", "read-only-wrote"),
    "net": ("network-at-start", "closed-world-network", "denied-host", "network"),
    "exec": ("exec-shell", "exec"),
}


def badge_text(result: dict[str, Any]) -> str:
    """The badge's verdict of a summary: `confined · fs ✓ net ✓ exec ✓`, or what failed (`fs ✗`)."""
    marks = " ".join(f"{d} {'✓' if result[d]['confined'] else '✗'}" for d in DIMENSIONS)
    return f"{'confined' if result['confined'] else 'not confined'} · {marks}"
