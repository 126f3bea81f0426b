"""`cellblock scan SERVER`: what a server says it does against what it does, in its jail.

The server runs in the jail the gateway would start it in (never unjailed), under strace, in a
scratch world (copies of its grants, a home with decoys); every tool is called with benign and
hostile arguments made from its schema; the report sets what each tool declares against what it
did, and proposes the smallest jail its benign calls needed (`--apply` writes it). See docs/scan.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

from cellblock.gateway.cli.audit import egress_refused
from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_OK, EXIT_USAGE, load
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.learning import learned_traces
from cellblock.gateway.scan.findings import Severity, findings, report_json, report_table
from cellblock.gateway.scan.fromlearned import read_learned, widen
from cellblock.gateway.scan.proposal import Proposal, apply_proposal, propose, writable
from cellblock.gateway.scan.report import badge_svg, confinement_report
from cellblock.gateway.scan.run import Decoy, scan_run
from cellblock.gateway.scan.saved import save_report, secrets_pattern
from cellblock.gateway.scan.scratch import ScanError, scratch_world
from cellblock.gateway.scrub import scrub
from cellblock.gateway.state import StateWriteError, atomic_write_text, runtime_dir, state_dir
from cellblock.sandbox.trace import Event, Kind
from cellblock.sandbox.types import JailError

__all__ = ["FAIL_ON", "learned_command", "scan_command"]

FAIL_ON = ("info", "low", "medium", "high", "never")


def _say(text: str) -> None:
    for line in text.splitlines():
        print(f"cellblock: {line}", file=sys.stderr)


def scan_command(
    config_path: str | None,
    name: str,
    as_json: bool = False,
    fail_on: str = "medium",
    allow_destructive: bool = False,
    apply: bool = False,
    report: str | None = None,
    badge: str | None = None,
) -> int:
    """Scan one server; exit 1 on a finding at or above `fail_on` (or a scan that cannot run)."""
    config, source = load(config_path, name)
    server = config.servers[name]
    if not isinstance(server, LocalServer):
        _say(f"scan: '{name}' is a remote server: nothing of it runs here to trace")
        return EXIT_USAGE
    if server.jail is False:
        _say(f"scan: '{name}' has jail: false, and a scan never runs a server unjailed; give it a jail first")
        return EXIT_FINDING
    if not sys.platform.startswith("linux"):
        _say(f"scan: tracing a jail needs Linux (bubblewrap and strace); this is {sys.platform}")
        return EXIT_FINDING
    try:
        scratch = scratch_world(name, server)
    except ScanError as exc:
        _say(str(exc))
        return EXIT_FINDING
    decoy = Decoy()
    try:
        moved = scratch.server(server)
        run = anyio.run(
            scan_run, config, source, state_dir(), runtime_dir(), name, moved, scratch, decoy, allow_destructive
        )
        found = findings(run, scratch, decoy)
        proposal = propose(server, run, scratch)
        whole = confinement_report(
            name, server, Path(source), run, scratch, decoy, found, proposal.as_json(), allow_destructive, fail_on
        )
        # a secret the server echoed is no more printed than kept: the same redaction everywhere
        secrets = secrets_pattern(whole, server)
        if as_json:
            print(json.dumps(scrub(report_json(name, run, scratch, found, proposal.as_json()), secrets)[0], indent=2))
        else:
            print(scrub(f"{report_table(name, run, found)}\n\n{proposal.text(name)}", secrets)[0])
        shown: dict[str, Any] = scrub(whole, secrets)[0]
        _keep(name, shown)
        _write_results(shown, report, badge)
    except (JailError, ScanError, StateWriteError) as exc:
        _say(f"scan: '{name}' was not scanned: {exc}")
        return EXIT_FINDING
    finally:
        decoy.close()
        scratch.close()
    if apply:
        try:
            _apply(Path(source), name, proposal, server, "the smallest this scan saw work")
        except ScanError as exc:
            _say(f"scan: {exc}")
            return EXIT_FINDING
    threshold = FAIL_ON.index(fail_on)
    worst = max((int(f.severity) for f in found), default=-1)
    failed = threshold < len(Severity) and worst >= threshold
    return EXIT_FINDING if failed else EXIT_OK


def _keep(name: str, shown: dict[str, Any]) -> None:
    """The latest report of `name`, for the dashboard; a scan is not failed for want of it."""
    try:
        save_report(state_dir(), name, shown)
    except StateWriteError as exc:
        _say(f"scan: the report was not kept for the dashboard: {exc}")


def _write_results(shown: dict[str, Any], report: str | None, badge: str | None) -> None:
    """`--report` and `--badge`, each written whole or not at all."""
    if report:
        atomic_write_text(Path(report), json.dumps(shown, indent=2) + "\n", 0o644)
        _say(f"scan: wrote the report to {report}")
    if badge:
        atomic_write_text(Path(badge), badge_svg(shown["summary"]), 0o644)
        _say(f"scan: wrote the badge to {badge}")


def _apply(source: Path, name: str, proposal: Proposal, server: LocalServer, already: str) -> None:
    """Write a proposal that was shown into the config (--apply)."""
    if not proposal.changes:
        _say(f"scan: the jail of '{name}' is already {already}; nothing to apply")
    else:
        apply_proposal(source, name, proposal, server)
        _say(f"scan: wrote the proposed jail of '{name}' into {source}")


def learned_command(config_path: str | None, name: str, as_json: bool = False, apply: bool = False) -> int:
    """`scan NAME --from-learned`: the grants its learn traces say the jail refused; starts nothing.
    Exit 1 when there is no trace to read."""
    config, source = load(config_path, name)
    server = config.servers[name]
    if not isinstance(server, LocalServer) or server.jail is False:
        _say(f"scan: '{name}' has no jail to widen (a remote server, or jail: false)")
        return EXIT_USAGE
    traces = learned_traces(state_dir(), name)
    if not traces:
        _say(f"scan: no learn traces of '{name}'; set learn: true on it and serve (see docs/scan.md)")
        return EXIT_FINDING
    learned = read_learned(traces)
    # behind network: allowlist, the egress proxy decides by name, outside the trace: its refusals are audited
    since = min((e.ts for e in learned.events), default=0.0)
    for refused in egress_refused(config.audit_file(state_dir()), name, since):
        target = f"{refused.get('host')}:{refused.get('port')}"
        learned.events.append(Event(float(refused["ts"]), 0, Kind.CONNECT, target, "egress", "EACCES"))
    proposal = widen(server, learned, Path(source), writable(config))
    if as_json:
        print(json.dumps({"server": name, "learned": learned.summary(), **proposal.as_json()}, indent=2))
    else:
        print(learned.summary())
        print(proposal.text(name))
    if apply:
        try:
            _apply(Path(source), name, proposal, server, "all its learn traces asked for")
        except ScanError as exc:
            _say(f"scan: {exc}")
            return EXIT_FINDING
    return EXIT_OK
