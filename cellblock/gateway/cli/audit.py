"""`cellblock audit`: read the audit log (rotated files included) and summarise it.

Reads `<name>.N` … `<name>.1` then `<name>`, oldest first, one line at a time (`audit/read.py`,
shared with the dashboard). A line that is not an event is counted and reported, never dropped
silently. The summary counts calls per server and tool by decision, plus
lock events and refused egress per server; the most recent events follow, one line each.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cellblock.gateway.audit.chain import FIELDS as CHAIN_FIELDS
from cellblock.gateway.audit.chain import KEY_NAME
from cellblock.gateway.audit.log import rotated_paths
from cellblock.gateway.audit.read import lines, parse, verify_chain
from cellblock.gateway.state import state_dir
from cellblock.policy.text import cut
from cellblock.policy.text import visible as _printable  # event text comes partly from servers

__all__ = [
    "RECENT",
    "AuditReport",
    "audit_command",
    "audit_path",
    "egress_refused",
    "format_event",
    "parse_since",
    "read_report",
    "run",
    "verify_log",
]

RECENT = 20  # events shown after the summary
_LINE_WIDTH = 200  # a recent-event line is cut here so one odd event cannot flood the terminal
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_DECISIONS = {"allow": "allowed", "deny": "denied", "ask": "asked"}
_CALL_ORDER = ("tool", "decision", "rule", "duration_ms", "is_error", "reason", "arguments")


def parse_since(text: str, now: float | None = None) -> float:
    """The unix time `text` stands for: a duration back from now (`30m`, `12h`, `7d`) or an ISO date/time.

    A date or time without a zone is local time.

    Raises:
        ValueError: `text` is neither; the message shows what is accepted.
    """
    now = time.time() if now is None else now
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2).lower()]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since '{text}': expected a duration like 30m, 12h or 7d, or an ISO date like 2026-05-01"
        ) from None
    return moment.timestamp()


def audit_command(config_path: str | None, since: str | None, server: str | None, as_json: bool, check: bool) -> int:
    """`cellblock audit`: the summary, or with `check` (`--verify`) the MAC chain's verdict."""
    if check:
        return verify_log(audit_path(config_path), state_dir() / KEY_NAME)
    return run(audit_path(config_path), since, server, as_json)


def audit_path(config_path: str | None) -> Path:
    """Where the gateway writes the audit log: the config's `audit.path`, else `<state dir>/audit.jsonl`.

    Without `--config` and with no config at the default place, the state-dir path is used.

    Raises:
        ConfigError: the config exists (or was named) but cannot be read or is invalid.
    """
    from cellblock.gateway.config.loading import load_config
    from cellblock.gateway.state import default_config_path

    if config_path is None and not default_config_path().expanduser().exists():
        return state_dir() / "audit.jsonl"
    config, _ = load_config(config_path)
    return config.audit_file(state_dir())


def _counts() -> dict[str, int]:
    return {"calls": 0, "allowed": 0, "denied": 0, "asked": 0, "errors": 0}


@dataclass
class AuditReport:
    """What `read_report` found: per-server counts, the newest events, and how many lines were unreadable."""

    files: list[Path]
    since: float | None = None
    server: str | None = None
    unreadable: dict[Path, int] = field(default_factory=dict)
    matched: int = 0
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT))

    def add(self, event: dict[str, Any]) -> None:
        self.matched += 1
        self.recent.append(event)
        entry = self.servers.setdefault(
            event["server"], {"tools": {}, "lock_events": 0, "egress_denied": 0, "server_failed": 0}
        )
        kind = event["event"]
        count = 1
        if kind == "suppressed" and isinstance(event.get("count"), int):
            # events a budget counted instead of writing count as what they were (audit_budget)
            kind, count = str(event.get("kind")), event["count"]
            if kind == "egress_refused":
                kind, event = "egress", {"decision": "deny"}
        if kind == "call":
            counts = entry["tools"].setdefault(_row(event), _counts())
            counts["calls"] += 1
            outcome = _DECISIONS.get(str(event.get("decision")))
            if outcome is not None:
                counts[outcome] += 1
            if event.get("is_error") is True:
                counts["errors"] += 1
        elif kind == "call_end":
            # the outcome of a call already counted: its `call` event came when it was admitted
            if event.get("is_error") is True:
                entry["tools"].setdefault(_row(event), _counts())["errors"] += 1
        elif kind.startswith("lock_"):
            entry["lock_events"] += count
        elif kind == "egress" and event.get("decision") == "deny":
            entry["egress_denied"] += count
        elif kind == "server_failed":
            entry["server_failed"] += count

    def as_json(self) -> dict[str, Any]:
        return {
            "files": [str(p) for p in self.files],
            "since": self.since,
            "server": self.server,
            "unreadable_lines": sum(self.unreadable.values()),
            "events_matched": self.matched,
            "summary": {
                name: {**entry, "tools": dict(sorted(entry["tools"].items()))}
                for name, entry in sorted(self.servers.items())
            },
            "events": list(self.recent),
        }


def read_report(path: Path, since: float | None = None, server: str | None = None) -> AuditReport:
    """Read `path` and its rotated files, oldest first, keeping events at or after `since` for `server`.

    Raises:
        OSError: a file exists but cannot be read.
    """
    report = AuditReport(files=rotated_paths(path), since=since, server=server)
    for source, raw in lines(report.files):
        if not raw.strip():
            continue
        event = parse(raw)
        if event is None:
            report.unreadable[source] = report.unreadable.get(source, 0) + 1
            continue
        if since is not None and event["ts"] < since:
            continue
        if server is not None and event["server"] != server:
            continue
        report.add(event)
    return report


def egress_refused(path: Path, server: str, since: float) -> list[dict[str, Any]]:
    """The connections the egress proxy refused `server` since `since`, from `path` and its rotated files."""
    found = []
    for _, raw in lines(rotated_paths(path)):
        event = parse(raw) if b'"egress"' in raw else None
        if event is not None and event["event"] == "egress" and event["server"] == server and event["ts"] >= since:
            found += [event] if event.get("decision") == "deny" else []
    return found


def _value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return _printable(value)
    return _printable(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def format_event(event: dict[str, Any]) -> str:
    """One line for one event: local time, event, server, then its fields as `key=value` (not the
    chain's MACs, which `--verify` reads)."""
    when = datetime.fromtimestamp(event["ts"]).strftime("%Y-%m-%d %H:%M:%S")
    rest = {k: v for k, v in event.items() if k not in ("ts", "event", "server") and k not in CHAIN_FIELDS}
    keys = [k for k in _CALL_ORDER if k in rest] + [k for k in rest if k not in _CALL_ORDER]
    parts = [f"{k}={_value(rest[k])}" for k in keys if rest[k] is not None and rest[k] != ""]
    line = f"{when}  {_printable(event['event'])}  {_printable(event['server'])}  {' '.join(parts)}".rstrip()
    return cut(line, _LINE_WIDTH)


def _table(rows: list[list[str]], left: int) -> list[str]:
    """Rows as aligned columns: the first `left` columns flush left, numbers flush right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]


def _row(event: dict[str, Any]) -> str:
    """A call's row: its tool, or "prompt greet" / "resource note://a" for a get or a read (with
    `kind`), so a tool named "prompt:greet" is a row of its own."""
    tool, kind = str(event.get("tool")), event.get("kind")
    return f"{kind} {tool.removeprefix(f'{kind}:')}" if kind in ("prompt", "resource") else tool


def _print_text(report: AuditReport) -> None:
    calls = [["server", "tool", "calls", "allowed", "denied", "asked", "errors"]]
    other = [["server", "lock events", "egress denied", "server failed"]]
    for name, entry in sorted(report.servers.items()):
        for tool, counts in sorted(entry["tools"].items()):
            calls.append([_printable(name), _printable(tool), *(str(counts[k]) for k in _counts())])
        other.append(
            [_printable(name), str(entry["lock_events"]), str(entry["egress_denied"]), str(entry["server_failed"])]
        )
    if len(calls) > 1:
        print("\n".join(_table(calls, left=2)))
        print()
    if len(other) > 1:
        print("\n".join(_table(other, left=1)))
        print()
    shown = len(report.recent)
    print(f"recent events ({shown} of {report.matched}):" if shown else "no events")
    for event in report.recent:
        print(format_event(event))


def verify_log(path: Path, key_path: Path) -> int:
    """`cellblock audit --verify`: check the chain through the log and its rotated files; 0 whole, 1 broken."""
    verdict = verify_chain(path, key_path)
    paths = verdict.files
    if not paths:
        print(f"cellblock: no audit log at {path} yet: nothing to verify", file=sys.stderr)
        return 0
    if verdict.error is not None:
        print(f"cellblock: cannot verify the audit log: {verdict.error}", file=sys.stderr)
        return 1
    if verdict.broken is not None:
        print(f"cellblock: the audit chain breaks at {verdict.broken}", file=sys.stderr)
        print(f"({verdict.checked} line(s) before it check out)", file=sys.stderr)
        return 1
    where = f"{verdict.checked} line(s) in {len(paths)} file(s), oldest {paths[0].name}"
    if not verdict.rotated:
        print(f"audit chain whole: {where}")
    else:  # nothing is broken, but the chain cannot speak for what rotation dropped
        print(f"audit chain unbroken from its oldest kept line: {where}")
        print(f"older lines were rotated away: {paths[0].name} follows a file no longer kept (audit.keep)")
    if verdict.left_out:
        print(
            f"{verdict.left_out} event(s) servers triggered were counted, not written, in {verdict.summaries} "
            "'suppressed' line(s) (the audit budget; `cellblock audit` shows them)"
        )
    return 0


def run(path: Path, since: str | None, server: str | None, as_json: bool) -> int:
    """Print the report for the audit log at `path`; return the exit code (0, or 2 on a bad `--since`)."""
    try:
        cutoff = None if since is None else parse_since(since)
    except ValueError as exc:
        print(f"cellblock: {exc}", file=sys.stderr)
        return 2
    try:
        report = read_report(path, cutoff, server)
    except OSError as exc:
        print(f"cellblock: cannot read the audit log {exc.filename or path}: {exc.strerror}", file=sys.stderr)
        return 1
    if not report.files:
        print(f"cellblock: no audit log at {path} yet (the gateway writes it once a server starts)", file=sys.stderr)
    for source, count in report.unreadable.items():
        print(
            f"cellblock: {count} unreadable line(s) in {source}: not audit events "
            "(damaged, cut short, or not written by cellblock); they are counted, not shown",
            file=sys.stderr,
        )
    if as_json:
        json.dump(report.as_json(), sys.stdout, indent=1, ensure_ascii=False)
        print()
    else:
        _print_text(report)
    return 0
