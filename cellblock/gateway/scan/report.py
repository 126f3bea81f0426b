"""What a scan shows others: `--report FILE.json`, a confinement result anyone can reproduce with
the same command, and `--badge FILE.svg`, its one-line summary as a small self-contained image.

The report names the server as configured (its command and arguments; its installed package,
version and tree digest, or the digest of its program), Cellblock's version, the jail as
configured and as proposed, every finding, and a summary per dimension (fs, net, exec). What
differs from run to run in a scan's own world (its scratch directory, the port of the host that is
not allowed) is given a stable name, so two scans of the same server compare equal but for
`scanned_at`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import yaml

from cellblock import __version__
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.packages import read_record
from cellblock.gateway.scan.findings import Finding
from cellblock.gateway.scan.run import Decoy, Run
from cellblock.gateway.scan.scratch import Scratch
from cellblock.gateway.scan.verdict import DIMENSIONS, REPORT_FORMAT, Severity, badge_text

__all__ = ["DIMENSIONS", "badge_svg", "badge_text", "confinement_report", "summary"]

SCRATCH_NAME = "<scan>"
DENIED_PORT = "<denied-port>"


def summary(found: list[Finding], fail_on: str) -> dict[str, Any]:
    """Per dimension: confined, or the codes of the findings at or above `fail_on` in it (the
    findings that make the scan exit 1)."""
    threshold = {str(s): int(s) for s in Severity}.get(fail_on, len(Severity))
    dimensions: dict[str, Any] = {}
    for dimension, codes in DIMENSIONS.items():
        failed = [f for f in found if f.code in codes and int(f.severity) >= threshold]
        dimensions[dimension] = {
            "confined": not failed,
            "failed": sorted({f.code for f in failed}),
            "worst": str(max((f.severity for f in failed), default="none")),
        }
    confined = all(d["confined"] for d in dimensions.values())
    return {"confined": confined, "fail_on": fail_on, **dimensions}


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def _identity(name: str, server: LocalServer, source: Path) -> dict[str, Any]:
    """The server as its config spells it, and what it runs: its installed package, or the digest
    of its program (and of any argument that is a file, such as a script)."""
    try:
        raw = ((yaml.safe_load(source.read_text()) or {}).get("servers") or {}).get(name) or {}
    except (OSError, yaml.YAMLError):
        raw = {}
    identity: dict[str, Any] = {
        "name": name,
        "command": raw.get("command", server.command),
        "args": list(raw.get("args", server.args)),
    }
    if server.install is not None:
        record = read_record(name)
        identity["package"] = {
            "ecosystem": str(server.install.package.ecosystem),
            "name": server.install.package.name,
            "version": record.version if record else None,
            "tree_digest": record.digest if record else None,
        }
        return identity
    program = shutil.which(server.command) if server.command else None
    identity["program_sha256"] = _digest(program) if program else None
    identity["files_sha256"] = {a: d for a in server.args if os.path.isfile(a) and (d := _digest(a))}
    return identity


def _stable(value: Any, scratch: Scratch, decoy: Decoy) -> Any:
    """`value` with the scan's own world named as the user knows it, and the rest of it (the
    scratch directory, the denied host's port) by a name that is the same every run."""
    if isinstance(value, dict):
        return {k: _stable(v, scratch, decoy) for k, v in value.items()}
    if isinstance(value, list):
        return [_stable(v, scratch, decoy) for v in value]
    if not isinstance(value, str):
        return value
    for grant, copy in scratch.copies.items():
        value = value.replace(copy, grant.rstrip("/"))
    value = value.replace(str(scratch.home), "~").replace(str(scratch.root), SCRATCH_NAME)
    return value.replace(f"127.0.0.1:{decoy.port}", f"127.0.0.1:{DENIED_PORT}")


def confinement_report(
    name: str,
    server: LocalServer,
    source: Path,
    run: Run,
    scratch: Scratch,
    decoy: Decoy,
    found: list[Finding],
    proposal: dict[str, Any],
    destructive: bool,
    fail_on: str,
) -> dict[str, Any]:
    """The report `--report` writes (see docs/scan.md)."""
    command = ["cellblock", "scan", name, *(["--destructive"] if destructive else []), "--fail-on", fail_on]
    order = {"start": -1} | {t.name: i for i, t in enumerate(run.tools)}
    ranked = sorted(found, key=lambda f: (order.get(f.where, len(order)), -f.severity, f.code, f.text))
    report = {
        "format": REPORT_FORMAT,
        "cellblock": __version__,
        "scanned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scan": {"command": " ".join(command), "destructive": destructive, "fail_on": fail_on},
        "server": _identity(name, server, source),
        "protocol": run.protocol,
        "tools": len(run.tools),
        "calls": len(run.calls),
        "skipped": list(run.skipped),
        "jail": {"configured": proposal["current"], "proposed": proposal["proposed"], "notes": proposal["notes"]},
        "summary": summary(found, fail_on),
        "findings": [{"severity": str(f.severity), "code": f.code, "where": f.where, "text": f.text} for f in ranked],
    }
    stable: dict[str, Any] = _stable(report, scratch, decoy)
    return stable


def _width(text: str) -> int:
    return 10 + sum(7 if ch.isascii() else 9 for ch in text)


def badge_svg(result: dict[str, Any]) -> str:
    """A flat badge: `cellblock | confined · fs ✓ net ✓ exec ✓`, or what failed (`fs ✗`), in red.
    No external font, image or link; its text is escaped for XML."""
    label = "cellblock"
    value = badge_text(result)
    left, right = _width(label), _width(value)
    colour = "#2e7d32" if result["confined"] else "#c62828"
    title = f"{label}: {value}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + right}" height="20" role="img" '
        f"aria-label={quoteattr(title)}>\n"
        f"  <title>{escape(title)}</title>\n"
        f'  <rect width="{left}" height="20" fill="#555"/>\n'
        f'  <rect x="{left}" width="{right}" height="20" fill="{colour}"/>\n'
        '  <g fill="#fff" font-family="DejaVu Sans,Verdana,Geneva,sans-serif" font-size="11">\n'
        f'    <text x="5" y="14">{escape(label)}</text>\n'
        f'    <text x="{left + 5}" y="14">{escape(value)}</text>\n'
        "  </g>\n"
        "</svg>\n"
    )
