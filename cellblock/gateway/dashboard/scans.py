"""The dashboard's scans view: the latest `cellblock scan` report of each server, as the scan kept
it in `<state>/scans/NAME.json` (`scan/saved.py`): when, the server as configured, the summary
(counts by severity, the badge's verdict), each finding and the proposed jail.

A report holds what a scanned server did and said (tool names, paths, its error text): hostile
text. Every string is escaped here (`visible`) and the page sets it only as text. The directory
is read bounded: files over `MAX_FILE` bytes, past `MAX_REPORTS`, a link, or anything but a scan
report are each an error line naming the file, and the others still show.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from cellblock.gateway.scan.saved import SCANS
from cellblock.gateway.scan.verdict import REPORT_FORMAT, Severity, badge_text
from cellblock.policy.text import cut, visible

__all__ = ["MAX_FILE", "MAX_FINDINGS", "MAX_REPORTS", "MAX_TEXT", "ScanReports"]

# a report of a server with hundreds of tools is some hundred KiB; past this it is no report of ours
MAX_FILE = 2 * 1024 * 1024
# one per configured server: more than any config has
MAX_REPORTS = 100
# the findings shown per report (the rest counted), and one string's length (cut with "…")
MAX_FINDINGS = 500
MAX_TEXT = 4000
SEVERITIES = tuple(str(s) for s in sorted(Severity, reverse=True))


class NotAReport(ValueError):
    """A file in the scans directory that is not a scan report; the message says why."""


def _text(value: Any) -> str:
    """`value` as the page shows it: escaped, cut at `MAX_TEXT`."""
    shown = visible(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return cut(shown, MAX_TEXT)


def _read(path: Path) -> Any:
    """The JSON in `path`, read no further than `MAX_FILE`; never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise NotAReport(f"cannot be read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAReport("is not a file")
        data = handle.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise NotAReport(f"is over {MAX_FILE} bytes: not shown")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise NotAReport("is not JSON") from None


def _jail_lines(jail: Any) -> list[str]:
    """A jail as `key: value` lines (the value as JSON), escaped."""
    if not isinstance(jail, dict):
        raise NotAReport("has no jail")
    return [_text(f"{key}: {json.dumps(value, ensure_ascii=False)}") for key, value in jail.items()]


def _shown(name: str, report: Any) -> dict[str, Any]:
    """One report for the page, every string escaped.

    Raises:
        NotAReport: it is not a scan report of this format.
    """
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise NotAReport(f"is not a scan report ({REPORT_FORMAT})")
    try:
        server, summary, jail = report["server"], report["summary"], report["jail"]
        findings = report["findings"]
        counts = dict.fromkeys(SEVERITIES, 0)
        for finding in findings:
            if finding["severity"] not in counts:
                raise NotAReport("has a finding of no known severity")
            counts[finding["severity"]] += 1
        configured = [str(server["command"]), *map(str, server["args"])]
        return {
            "file": visible(f"{name}.json"),
            "server": _text(server["name"]),
            "when": _text(report["scanned_at"]),
            "scan": _text(report["scan"]["command"]),
            "config": _text(" ".join(configured)),
            "tools": report["tools"] if isinstance(report["tools"], int) else 0,
            "calls": report["calls"] if isinstance(report["calls"], int) else 0,
            "confined": summary["confined"] is True,
            "badge": _text(badge_text(summary)),
            "counts": counts,
            "findings": [
                {
                    "severity": _text(f["severity"]),
                    "tool": _text(f["where"]),
                    "code": _text(f["code"]),
                    "text": _text(f["text"]),
                }
                for f in findings[:MAX_FINDINGS]
            ],
            "more": max(0, len(findings) - MAX_FINDINGS),
            "proposed": _jail_lines(jail["proposed"]),
            "configured": _jail_lines(jail["configured"]),
            "notes": [_text(n) for n in jail.get("notes") or []],
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise NotAReport(f"is not a scan report (no {exc})") from None


class ScanReports:
    """The reports kept in `<state>/scans`."""

    def __init__(self, state: Path) -> None:
        self.directory = state / SCANS

    def read(self) -> dict[str, Any]:
        reports: list[dict[str, Any]] = []
        errors: list[str] = []
        try:
            names = sorted(p.name for p in self.directory.iterdir() if p.name.endswith(".json"))
        except FileNotFoundError:
            names = []
        except OSError as exc:
            return {"reports": [], "errors": [visible(f"cannot read {self.directory}: {exc.strerror or exc}")]}
        for file in names[:MAX_REPORTS]:
            try:
                reports.append(_shown(file.removesuffix(".json"), _read(self.directory / file)))
            except NotAReport as exc:
                errors.append(visible(f"{self.directory / file} {exc}"))
        if len(names) > MAX_REPORTS:
            errors.append(visible(f"{len(names) - MAX_REPORTS} more report(s) in {self.directory} not shown"))
        return {"directory": visible(str(self.directory)), "reports": reports, "errors": errors}
