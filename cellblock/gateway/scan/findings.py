"""What a scan found: what each tool claims against what the trace shows it did, as findings
with a severity, and the report (a table for the terminal, JSON for machines)."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from cellblock.gateway.scan.run import Call, Decoy, Run, ToolInfo
from cellblock.gateway.scan.scratch import Scratch
from cellblock.gateway.scan.verdict import Severity
from cellblock.policy.constraints import within
from cellblock.sandbox.trace import Event, Kind, jail_refused

__all__ = ["Finding", "Severity", "findings", "noise", "observed", "report_json", "report_table"]

# What every program reads or touches to run: not worth a line of the report.
SYSTEM = ("/usr", "/etc", "/proc", "/sys", "/dev", "/lib", "/lib64", "/bin", "/sbin", "/run/cellblock")
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox", "csh", "tcsh"}
SECRET_PARTS = (
    *("/.ssh/", "/.aws/", "/.gnupg/", "/.netrc", "/.config/gh/", "/.kube/", "/.docker/config"),
    *("/.local/share/keyrings/", "/.password-store/"),
)
# The name service's own sockets, which the C library tries before any lookup.
NAME_SERVICE = ("/var/run/nscd/socket", "/run/nscd/socket", "/run/systemd/resolve/io.systemd.Resolve")
# setuptools' editable install puts this name on sys.path (`__editable__.cellblock-0.1.0.finder.__path_hook__`)
EDITABLE_HOOK = re.compile(r"__editable__\.[^/]+\.__path_hook__")


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    where: str  # "start" or the tool's name
    code: str  # a stable name: secret-read, unconfined-path, read-only-wrote, exec-shell, exec, connect, ...
    text: str


def noise(event: Event) -> bool:
    """What every program does: looks, system files, interpreter caches, its own descriptors."""
    if event.kind is Kind.LOOK:
        return True
    if event.kind in (Kind.CONNECT, Kind.LOOKUP):
        return event.target in NAME_SERVICE
    if "/__pycache__" in event.target or event.target.endswith(".pyc"):
        return True
    if not event.ok and EDITABLE_HOOK.fullmatch(posixpath.basename(event.target)):
        # an editable install's import hook is a name on sys.path, which Python tries (and fails)
        # to open as a directory where it runs: no file of anyone's
        return True
    return event.kind is not Kind.EXEC and any(within(event.target, s) for s in SYSTEM)


def _outcome(event: Event) -> str:
    if event.ok:
        return ""
    return f" (refused by the jail: {event.errno})" if jail_refused(event) else f" ({event.errno})"


def _verb(event: Event) -> str:
    return {
        Kind.READ: "opened",
        Kind.WRITE: "wrote",
        Kind.EXEC: "executed",
        Kind.CONNECT: "connected to",
        Kind.LOOKUP: "looked up",
        Kind.LOOK: "looked at",
    }[event.kind]


def observed(events: list[Event], scratch: Scratch, code: tuple[str, ...] = ()) -> list[str]:
    """What the server did, in words, without what every program does (nor its reads of its own
    installation, nor the misses of a search path); each thing once."""

    def running(e: Event) -> bool:
        if e.kind is Kind.READ and e.errno == "ENOENT" and not jail_refused(e):
            return True
        return e.kind is Kind.READ and any(within(e.target, c) for c in code)

    lines = [f"{_verb(e)} {scratch.to_user(e.target)}{_outcome(e)}" for e in events if not noise(e) and not running(e)]
    return list(dict.fromkeys(lines))


def _secret(path: str, scratch: Scratch) -> bool:
    return (
        within(path, str(scratch.home))
        or within(path, str(scratch.outside.parent))
        or any(part in path for part in SECRET_PARTS)
    )


def _aim(call: Call, scratch: Scratch) -> str | None:
    """The host path a hostile probe aims at."""
    target = call.probe.target
    if not call.probe.hostile or target is None or "://" in target:
        return None
    if target.startswith("~/"):
        target = str(scratch.home / target[2:])
    return os.path.normpath(target)


def _named(call: Call, cwd: str) -> set[str]:
    """The paths a call's string arguments name, as a server that takes them as they are opens
    them: an absolute one as it is, any other from its working directory."""
    values = [v for value in call.probe.arguments.values() for v in (value if isinstance(value, list) else [value])]
    return {os.path.normpath(os.path.join(cwd, v)) for v in values if isinstance(v, str) and v and "://" not in v}


def _call_text(call: Call, scratch: Scratch) -> str:
    arguments = ", ".join(
        f"{k}={scratch.to_user(v) if isinstance(v, str) else v!r}" for k, v in call.probe.arguments.items()
    )
    return f"{call.tool}({arguments})"


def findings(run: Run, scratch: Scratch, decoy: Decoy) -> list[Finding]:
    """Every finding of the run: at the start, then per call."""
    found = _events_findings("start", run.start_events, scratch, decoy, None, None, None, set())
    tools = {t.name: t for t in run.tools}
    opened = (Kind.READ, Kind.WRITE, Kind.EXEC)
    # what a tool opens whatever it is asked (its benign call too) says nothing of its arguments
    unasked = {(c.tool, e.target) for c in run.calls if not c.probe.hostile for e in c.events if e.kind in opened}
    for call in run.calls:
        tool = tools[call.tool]
        aim = _aim(call, scratch)
        asked = aim if (call.tool, aim) not in unasked else None
        named = _named(call, run.cwd or str(scratch.home))
        found += _events_findings(call.tool, call.events, scratch, decoy, call, tool, asked, named)
        if aim is not None and asked is not None:
            touched = [e for e in call.events if e.kind in opened and e.target == aim]
            shown = scratch.to_user(aim)
            if touched:
                event = touched[0]
                how = "refused by the jail" if jail_refused(event) else "got through" if event.ok else event.errno
                severity = Severity.HIGH if event.ok else Severity.MEDIUM
                found.append(
                    Finding(
                        severity,
                        call.tool,
                        "unconfined-path",
                        f"{_call_text(call, scratch)} {_verb(event)} {shown}: {how}; "
                        "the server does not confine paths itself",
                    )
                )
            else:
                said = f": {call.error}" if call.error else ""
                found.append(
                    Finding(
                        Severity.INFO,
                        call.tool,
                        "confined-path",
                        f"{_call_text(call, scratch)} ({call.probe.label}): the server did not open {shown}; "
                        f"it refused the path itself{said}",
                    )
                )
    return _dedupe(found)


def _events_findings(
    where: str,
    events: list[Event],
    scratch: Scratch,
    decoy: Decoy,
    call: Call | None,
    tool: ToolInfo | None,
    asked: str | None,
    named: set[str],
) -> list[Finding]:
    found: list[Finding] = []
    prefix = "at start: " if call is None else f"{call.tool}: "
    for event in events:
        if noise(event):
            continue
        target = scratch.to_user(event.target)
        outcome = _outcome(event)
        if event.kind in (Kind.READ, Kind.WRITE, Kind.EXEC) and _secret(event.target, scratch):
            # asked for: reported as unconfined-path; named by the call as the server reads it
            # (`~/x` as a name relative to its working directory): what it was told to open
            if event.target != asked and event.target not in named:
                found.append(
                    Finding(Severity.HIGH, where, "secret-read", f"{prefix}{_verb(event)} {target} unasked{outcome}")
                )
            continue
        if event.kind is Kind.WRITE and tool is not None and tool.annotations.get("readOnlyHint") is True:
            found.append(
                Finding(
                    Severity.MEDIUM,
                    where,
                    "read-only-wrote",
                    f"readOnlyHint tool {tool.name} wrote {target}{outcome}",
                )
            )
        elif event.kind is Kind.EXEC:
            shell = os.path.basename(event.target) in SHELLS
            found.append(
                Finding(
                    Severity.HIGH if shell else Severity.LOW,
                    where,
                    "exec-shell" if shell else "exec",
                    f"{prefix}executes {event.target}{outcome}",
                )
            )
        elif event.kind in (Kind.CONNECT, Kind.LOOKUP):
            found.append(_network(where, prefix, event, target, outcome, decoy, call, tool))
    return found


def _network(
    where: str,
    prefix: str,
    event: Event,
    target: str,
    outcome: str,
    decoy: Decoy,
    call: Call | None,
    tool: ToolInfo | None,
) -> Finding:
    verb = _verb(event)
    if target.endswith(f":{decoy.port}") and call is not None and call.probe.target == decoy.url:
        reached = event.ok or decoy.reached > 0
        severity = Severity.HIGH if reached else Severity.LOW
        how = "reached it" if reached else "refused by the jail"
        return Finding(
            severity, where, "denied-host", f"{prefix}fetches a URL of a host that is not allowed ({target}): {how}"
        )
    if tool is not None and tool.annotations.get("openWorldHint") is False:
        return Finding(
            Severity.MEDIUM, where, "closed-world-network", f"openWorldHint: false tool {verb} {target}{outcome}"
        )
    if call is None:
        return Finding(Severity.MEDIUM, where, "network-at-start", f"{prefix}{verb} {target}{outcome}")
    return Finding(Severity.LOW, where, "network", f"{prefix}{verb} {target}{outcome}")


def _dedupe(found: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(found))


def _declared(tool: ToolInfo) -> dict[str, Any]:
    hints: dict[str, Any] = {
        k: tool.annotations[k] for k in ("readOnlyHint", "destructiveHint", "openWorldHint") if k in tool.annotations
    }
    return {"description": tool.description.strip().splitlines()[0] if tool.description.strip() else "", **hints}


def report_json(
    name: str, run: Run, scratch: Scratch, found: list[Finding], proposal: dict[str, Any] | None
) -> dict[str, Any]:
    """The report as JSON: the start, each tool (declared, each call and what it did), the findings."""
    tools = []
    for tool in run.tools:
        calls = [
            {
                "probe": c.probe.label,
                "call": _call_text(c, scratch),
                "error": c.error,
                "observed": observed(c.events, scratch, run.code),
            }
            for c in run.calls
            if c.tool == tool.name
        ]
        tools.append(
            {
                "name": tool.name,
                "declared": _declared(tool),
                "schema": tool.schema,
                "destructive": tool.destructive,
                "skipped": tool.name in run.skipped,
                "calls": calls,
                "findings": [_finding(f) for f in found if f.where == tool.name],
            }
        )
    return {
        "server": name,
        "protocol": run.protocol,
        "start": {
            "observed": observed(run.start_events, scratch, run.code),
            "findings": [_finding(f) for f in found if f.where == "start"],
        },
        "tools": tools,
        "findings": [_finding(f) for f in found],
        "proposal": proposal,
    }


def _finding(finding: Finding) -> dict[str, Any]:
    return {"severity": str(finding.severity), "where": finding.where, "code": finding.code, "text": finding.text}


def report_table(name: str, run: Run, found: list[Finding]) -> str:
    """The report for a terminal: one row per tool (what it declares, its calls, its worst finding),
    then every finding above info."""
    rows = [("tool", "declares", "calls", "worst finding")]
    start = [f for f in found if f.where == "start"]
    rows.append(("(start)", "", "", str(max((f.severity for f in start), default="none"))))
    for tool in run.tools:
        hints = _declared(tool)
        declares = " ".join(
            f"{k.removesuffix('Hint')}={str(v).lower()}" for k, v in hints.items() if k != "description"
        )
        own = [f for f in found if f.where == tool.name and f.severity > Severity.INFO]
        calls = sum(1 for c in run.calls if c.tool == tool.name)
        worst = str(max((f.severity for f in own), default="none"))
        rows.append(
            (tool.name, declares or "-", "skipped (destructive)" if tool.name in run.skipped else str(calls), worst)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"{name}: {len(run.tools)} tools, {len(run.calls)} calls"]
    lines += ["  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    serious = sorted((f for f in found if f.severity > Severity.INFO), key=lambda f: -f.severity)
    if serious:
        lines.append("")
        lines += [f"  {str(f.severity).upper():<6}  {f.text}" for f in serious]
    confined = [f for f in found if f.code == "confined-path"]
    if confined:
        lines.append(f"\n  {len(confined)} hostile path probes were refused by the server itself (see --json)")
    return "\n".join(lines)
