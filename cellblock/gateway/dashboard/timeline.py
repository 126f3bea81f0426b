"""The dashboard's audit view: the newest events of the audit log, filtered here (server, tool,
decision, kind), the charts of the calls and refusals they hold (`charts.py`), and the verdict of
its MAC chain as `cellblock audit --verify` gives it; all read with the code `cellblock audit`
uses (`audit/read.py`).

Everything in the log is hostile text: names, arguments and reasons came from servers and models.
Each string is escaped here (`visible`) and the page sets it only as text.
"""

from __future__ import annotations

import json
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from cellblock.gateway.audit.chain import FIELDS as CHAIN_FIELDS
from cellblock.gateway.audit.log import rotated_paths
from cellblock.gateway.audit.read import lines, parse, verify_chain
from cellblock.gateway.dashboard.charts import Charts
from cellblock.policy.text import cut, visible

__all__ = ["FILTERS", "MAX_CHOICES", "MAX_DETAILS", "MAX_EVENTS", "AuditLog", "Timeline"]

# the page shows a bounded page of the newest events: a log of millions of lines is read through,
# never sent whole
MAX_EVENTS = 500
# the values offered in each filter: a server that names thousands of tools does not flood the page
MAX_CHOICES = 200
# one event's other fields, as `key=value`: an argument of megabytes is cut here, said with "…"
MAX_DETAILS = 4000
# query parameter -> how an event is matched on it
FILTERS = ("server", "tool", "decision", "kind")


class Timeline(Protocol):
    """Where the dashboard's audit view comes from (a fake one in the unit tests)."""

    def read(self, filters: dict[str, str]) -> dict[str, Any]:
        """The newest events matching `filters` (newest first), the filters' choices, the charts of
        those events' calls and refusals, and the chain's verdict."""
        ...


def _field(event: dict[str, Any], name: str) -> str | None:
    """The event's value for the filter `name` as the page shows it (escaped): what the user picks
    is what is matched."""
    value = event.get("event" if name == "kind" else name)
    return visible(value) if isinstance(value, str) else None


class AuditLog:
    """The audit log at `path` (and its rotated files), its chain keyed by `key`."""

    def __init__(self, path: Path, key: Path) -> None:
        self.path, self.key = path, key

    def read(self, filters: dict[str, str]) -> dict[str, Any]:
        kept: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        choices: dict[str, set[str]] = {name: set() for name in FILTERS}
        charts = Charts()
        matched = unreadable = 0
        try:
            for _, raw in lines(rotated_paths(self.path)):
                if not raw.strip():
                    continue
                event = parse(raw)
                if event is None:
                    unreadable += 1
                    continue
                for name, seen in choices.items():
                    value = _field(event, name)
                    if value is not None and len(seen) < MAX_CHOICES:
                        seen.add(value)
                if all(_field(event, name) == wanted for name, wanted in filters.items()):
                    matched += 1
                    kept.append(event)
                    charts.add(event)
            error = None
        except OSError as exc:
            error = visible(f"cannot read the audit log {exc.filename or self.path}: {exc.strerror or exc}")
        return {
            "file": visible(str(self.path)),
            "events": [_shown(event) for event in reversed(kept)],
            "matched": matched,
            "unreadable": unreadable,
            "choices": {name: sorted(seen) for name, seen in choices.items()},
            "charts": charts.result(),
            "chain": self._verdict(),
            "error": error,
        }

    def _verdict(self) -> dict[str, Any]:
        """The chain's verdict in `cellblock audit --verify`'s words, and its first broken line."""
        verdict = verify_chain(self.path, self.key)
        if not verdict.files:
            return {"state": "empty", "text": f"no audit log at {visible(str(self.path))} yet: nothing to verify"}
        if verdict.error is not None:
            return {"state": "error", "text": visible(f"cannot verify the audit log: {verdict.error}")}
        if verdict.broken is not None:
            broken = verdict.broken
            return {
                "state": "broken",
                "text": visible(f"the audit chain breaks at {broken} ({verdict.checked} line(s) before it check out)"),
                "broken": {"file": visible(str(broken.path)), "line": broken.line, "why": visible(broken.why)},
            }
        where = f"{verdict.checked} line(s) in {len(verdict.files)} file(s), oldest {verdict.files[0].name}"
        if verdict.rotated:
            text = f"audit chain unbroken from its oldest kept line: {where}; older lines were rotated away"
        else:
            text = f"audit chain whole: {where}"
        return {"state": "whole", "text": visible(text)}


def _shown(event: dict[str, Any]) -> dict[str, Any]:
    """One event for the page: its time, kind, server, tool and decision, and its other fields as
    `key=value` (not the chain's MACs), every string escaped."""
    rest = {k: v for k, v in event.items() if k not in ("ts", "event", "server", "tool", "decision")}
    parts = [
        f"{k}={json.dumps(v, ensure_ascii=False)}"
        for k, v in rest.items()
        if k not in CHAIN_FIELDS and v is not None and v != ""
    ]
    details = cut(" ".join(parts), MAX_DETAILS)
    try:
        when = datetime.fromtimestamp(event["ts"]).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):  # a time no clock shows: said as the number it is
        when = str(event["ts"])
    return {
        "time": when,
        "kind": visible(event["event"]),
        "server": visible(event["server"]),
        "tool": visible(str(event["tool"])) if event.get("tool") is not None else "",
        "decision": visible(str(event["decision"])) if event.get("decision") is not None else "",
        "details": visible(details),
    }
