"""The smallest jail a scan saw work: from the start and the benign calls, the grants the server
used (read_write only where it wrote), the allowed hosts it reached, the programs it executed;
shown as a diff of the server's `jail:` and, with `--apply`, written into cellblock.yaml in place
of that key alone (the rest of the file, comments included, is kept).

It only narrows: a grant never used is dropped, a read_write grant only read becomes read_only;
what the jail refused that the server seemed to need is a note, never a wider grant.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cellblock.gateway.config.edit import ConfigEditError, raw_jail, write_jail
from cellblock.gateway.config.model import Config, JailConfig, LocalServer
from cellblock.gateway.scan.findings import noise
from cellblock.gateway.scan.gate import NotGrantable
from cellblock.gateway.scan.run import Run
from cellblock.gateway.scan.scratch import ScanError, Scratch, jail_of
from cellblock.gateway.scan.vet import check_written, vet
from cellblock.policy.constraints import within
from cellblock.sandbox.trace import Event, Kind, jail_refused

__all__ = ["Proposal", "apply_proposal", "configured", "inside", "propose", "tidy", "writable"]

KEYS = ("network", "allow_hosts", "read_only", "read_write", "exec")


@dataclass
class Proposal:
    """The jail as configured and as proposed (config keys, paths as the user wrote them)."""

    current: dict[str, Any]
    proposed: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    heading: str = "the smallest jail the benign calls needed:"
    label: str = "smallest seen"
    flags: str = "--apply"  # how `cellblock scan NAME` writes it
    config: Path | None = None  # the config file it is for (Cellblock's own: never granted)
    writable: list[str] = field(default_factory=list)  # the config's other read_write grants

    def __post_init__(self) -> None:
        # what it adds passes the gate, whoever made it (a scan, a learn trace)
        own = [self.config] if self.config else []
        proposed, refused = vet(self.current, self.proposed, own, self.writable)
        self.proposed = tidy(proposed)
        self.notes = list(dict.fromkeys([*self.notes, *refused]))

    @property
    def changes(self) -> bool:
        return self.current != self.proposed

    def as_json(self) -> dict[str, Any]:
        return {"current": self.current, "proposed": self.proposed, "notes": self.notes, "changes": self.changes}

    def diff(self, name: str) -> str:
        def dump(jail: dict[str, Any]) -> list[str]:
            return yaml.safe_dump({"jail": jail}, sort_keys=False, default_flow_style=False).splitlines(keepends=True)

        return "".join(
            difflib.unified_diff(dump(self.current), dump(self.proposed), f"{name}: jail now", f"{name}: {self.label}")
        )

    def text(self, name: str) -> str:
        lines = [self.heading]
        lines += [f"  {line}" for line in (self.diff(name) or "  (the same as now)\n").splitlines()]
        lines += [f"  note: {n}" for n in self.notes]
        if self.changes:
            lines.append(f"  cellblock scan {name} {self.flags} writes it into the config")
        return "\n".join(lines)


def inside(path: str, root: str) -> bool:
    """`path` under `root` as written or as resolved (the trace shows resolved paths)."""
    return within(path, root) or within(path, os.path.realpath(root))


def propose(server: LocalServer, run: Run, scratch: Scratch) -> Proposal:
    """What the start and the benign calls used of `server`'s jail."""
    jail = jail_of(server)
    events: list[Event] = [*run.start_events, *(e for c in run.calls if not c.probe.hostile for e in c.events)]
    notes: list[str] = []

    def used(grant: str) -> bool:
        where = scratch.copies.get(grant, grant)
        return any(inside(e.target, where) and (e.ok or e.kind is Kind.WRITE) for e in events)

    def written(grant: str) -> bool:
        where = scratch.copies.get(grant, grant)
        # a grant the scan showed read-only (not copied) was written if the server tried
        tried = ("EROFS",) if grant in scratch.frozen else ()
        return any(e.kind is Kind.WRITE and (e.ok or e.errno in tried) and inside(e.target, where) for e in events)

    for grant in scratch.frozen:
        notes.append(
            f"{grant} is read_write but the scan showed it read-only: it holds the server's own code or a "
            "package cache, which a scan does not copy; a write there shows as refused (EROFS)"
        )
    for event in events:
        if event.kind is Kind.WRITE and event.errno == "EROFS" and not noise(event):
            notes.append(f"wrote {scratch.to_user(event.target)}, which the jail shows read-only (refused)")
    # a grant only read is shown read-only, unless a tool that may write was not exercised
    unexercised = [t.name for t in run.tools if t.name in run.skipped and t.annotations.get("readOnlyHint") is not True]
    read_write = [g for g in jail.read_write if written(g) or (unexercised and used(g))]
    if unexercised and any(used(g) and not written(g) for g in jail.read_write):
        notes.append(
            f"read_write kept as it is: {', '.join(unexercised)} may write and were not called "
            "(--destructive calls them)"
        )
    read_only = [g for g in jail.read_only if used(g) and g not in read_write]
    read_only += [g for g in jail.read_write if used(g) and g not in read_write]
    current = configured(jail)
    proposed: dict[str, Any] = {}
    reached = {e.target for e in events if e.kind is Kind.CONNECT and e.call == "egress" and e.ok}
    if jail.network == "ask":  # stays ask: what was not listed is asked about as it runs
        proposed |= {
            "network": "ask",
            "allow_hosts": [h for h in jail.allow_hosts if any(_matches(h, r) for r in reached)],
        }
    elif jail.network == "allowlist":
        hosts = [h for h in jail.allow_hosts if any(_matches(h, r) for r in reached)]
        proposed |= {"network": "allowlist", "allow_hosts": hosts} if hosts else {"network": "none"}
    elif jail.network == "open":
        tried = sorted(
            {e.target for e in events if e.kind in (Kind.CONNECT, Kind.LOOKUP) and not e.target.startswith("/")}
        )
        proposed["network"] = "open" if tried else "none"
        if tried:
            notes.append(f"network: open used for {', '.join(tried[:5])}; an allowlist of those hosts would do")
    else:
        proposed["network"] = "none"
    for event in events:
        if event.kind in (Kind.CONNECT, Kind.LOOKUP) and jail_refused(event) and not event.target.startswith("/"):
            notes.append(f"tried {scratch.to_user(event.target)} (refused by the jail); allow it only if it is needed")
    proposed |= {"read_only": read_only, "read_write": read_write}
    # a program run from a copy is the user's file of that name; one of the scan's own world is no one's
    ran = {scratch.to_user(e.target) for e in events if e.kind is Kind.EXEC and e.ok}
    executed = sorted(p for p in ran if p.startswith("/"))
    notes += [f"ran {p}, a file of the scan's own world: not in the proposal" for p in sorted(ran - {*executed})]
    if jail.exec.allow:
        real = {os.path.realpath(p) for p in executed}
        proposed["exec"] = {"allow": [p for p in jail.exec.allow if os.path.realpath(p) in real]}
    else:
        proposed["exec"] = {"allow": executed}
        if executed:
            notes.append("exec.allow also narrows what the jail shows of /usr: scan again after --apply")
    return Proposal(tidy(current), tidy(proposed), list(dict.fromkeys(notes)))


def writable(config: Config) -> list[str]:
    """Every place a jail of `config` may write: its local servers' read_write grants."""
    return [
        p
        for s in config.servers.values()
        if isinstance(s, LocalServer) and s.jail is not False
        for p in s.jail.read_write
    ]


def configured(jail: JailConfig) -> dict[str, Any]:
    """The keys of `jail` a proposal may change, as the config has them (expanded)."""
    current: dict[str, Any] = {"network": jail.network}
    if jail.proxied:
        current["allow_hosts"] = list(jail.allow_hosts)
    current |= {"read_only": list(jail.read_only), "read_write": list(jail.read_write)}
    current["exec"] = {"allow": list(jail.exec.allow)}
    return current


def _matches(rule: str, target: str) -> bool:
    host, _, port = target.rpartition(":")
    name, _, want = rule.partition(":")
    if want and want != port:
        return False
    return host == name or (name.startswith("*.") and host.endswith(name[1:]))


def tidy(jail: dict[str, Any]) -> dict[str, Any]:
    """Without the keys that say only the default."""
    out = dict(jail)
    for key in ("allow_hosts", "read_only", "read_write"):
        if not out.get(key):
            out.pop(key, None)
    if not out.get("exec", {}).get("allow"):
        out.pop("exec", None)
    return out


def _with_user_spelling(proposed: dict[str, Any], original: dict[str, Any], jail: JailConfig) -> dict[str, Any]:
    """The proposed jail written over the config's own `jail:` mapping (`original`, of which `jail` is
    the config's reading): other keys (tmp, limits, exec.sha256) kept, each path in the user's own
    spelling where the config had it."""
    spelled: dict[str, str] = {}
    for key in ("read_only", "read_write"):
        for raw, expanded in zip(original.get(key) or [], getattr(jail, key), strict=False):
            spelled[expanded] = raw
    for raw, expanded in zip((original.get("exec") or {}).get("allow") or [], jail.exec.allow, strict=False):
        spelled[expanded] = raw
    out = {k: v for k, v in original.items() if k not in KEYS}
    out["network"] = proposed["network"]
    for key in ("allow_hosts", "read_only", "read_write"):
        if proposed.get(key):
            out[key] = [spelled.get(p, p) for p in proposed[key]]
    allow = (proposed.get("exec") or {}).get("allow")
    exec_rest = {k: v for k, v in (original.get("exec") or {}).items() if k != "allow"}
    if allow or exec_rest:
        out["exec"] = {**({"allow": [spelled.get(p, p) for p in allow]} if allow else {}), **exec_rest}
    order = [k for k in (*KEYS, *original) if k in out]
    return {k: out[k] for k in dict.fromkeys(order)}


def apply_proposal(source: Path, name: str, proposal: Proposal, server: LocalServer) -> str:
    """Write the proposed jail into the config at `source`; return the new text.

    Raises:
        ScanError: the config cannot be edited in place, the edited config does not load, or it
            would grant what a proposal never may (`gate.py`).
    """
    before = server.jail
    if before is False:
        raise ScanError(f"server '{name}' has no jail in the config, so nothing was written")
    jail = _with_user_spelling(proposal.proposed, raw_jail(source, name), before)

    def gate(edited: Config, written: JailConfig) -> None:
        # as the config reads it back: every spelling expanded, every jail's writable grants
        check_written(before, written, source, writable(edited))

    try:
        return write_jail(source, name, jail, gate)
    except ConfigEditError as exc:
        raise ScanError(str(exc).replace("changed jail", "proposed jail")) from exc
    except NotGrantable as exc:
        raise ScanError(f"the proposed jail of '{name}' was not written: {exc}") from exc
